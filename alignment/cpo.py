"""Reference-free preference optimisation with TRL's CPOTrainer: CPO, and SimPO as its ``simpo`` loss.

    smolforge cpo --config recipes/demo/simpo.yaml
    smolforge cpo --config recipes/demo/simpo.yaml --set trainer.simpo_gamma=1.0
    smolforge cpo --config recipes/demo/simpo.yaml --set trainer.loss_type=sigmoid --set trainer.cpo_alpha=1.0  # CPO

Reads a parent run and preference pairs exactly like the ``dpo`` stage; no reference model is
loaded. ``trainer.loss_type``:

- ``simpo`` (SimPO, its paper's eq. 6): −log σ(β/|y_w|·log π(y_w|x) − β/|y_l|·log π(y_l|x) − γ), the
  length-normalised log-likelihoods of the two answers with a target margin γ
  (``trainer.simpo_gamma``); ``cpo_alpha: 0`` leaves the loss at that (SimPO has no NLL term).
- ``sigmoid`` (CPO): −log σ(β·(log π(y_w|x) − log π(y_l|x))) on summed log-probs, plus
  ``cpo_alpha`` × the NLL of the chosen answer.

TRL logs β × each answer's (mean or summed) log-probability as ``rewards/chosen`` and
``rewards/rejected``; tests/test_dpo_family.py checks the logged loss against both formulas on
those values. TRL keeps CPO in ``trl.experimental`` (its warning is silenced here, chosen knowingly).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from trl.import_utils import TRLExperimentalWarning

from smolforge.errors import RecipeError
from smolforge.determinism import DeterminismSpec
from smolforge.eval_watch import EvalWhileTraining
from smolforge.profiling import ProfileSpec
from smolforge.runs import Run, Runs

from .common import TrackingSpec, load_trainable, quiet_tracking, train_from_parent, trainer_defaults
from .dpo import check_beta_positive, final_metrics, validate_preferences

with warnings.catch_warnings():
    warnings.simplefilter("ignore", TRLExperimentalWarning)
    from trl.experimental.cpo import CPOConfig

LOSSES = ("simpo", "sigmoid", "hinge", "ipo")


def defaults() -> dict:
    """Recipe values beneath the YAML: SimPO with the paper's β = 2 and γ = 1 (γ/β = 0.5), no NLL term.

    Token counting is off: CPO's batches carry ``chosen_input_ids``, not ``input_ids``.
    """
    return {"trainer": trainer_defaults(max_steps=150, per_device_train_batch_size=16, learning_rate=1e-6,
                                        lr_scheduler_type="cosine", warmup_steps=5, beta=2.0, loss_type="simpo",
                                        simpo_gamma=1.0, cpo_alpha=0.0, max_length=128,
                                        include_num_input_tokens_seen="no")}


@dataclass
class Recipe:
    name: str = "simpo-demo"          # run name
    parent: str = "sft-demo"          # run whose model/ is the policy to start from (no reference model)
    data: str = "data-demo"           # data run (its data/prefs.jsonl) or a .jsonl of preference rows
    trainer: CPOConfig = field(default_factory=lambda: CPOConfig(**defaults()["trainer"]))  # any CPOConfig field
    tracking: TrackingSpec = field(default_factory=quiet_tracking)  # report_to: tensorboard | trackio | wandb; prometheus_port
    profile: ProfileSpec = field(default_factory=ProfileSpec)  # torch.profiler trace of a step range into profile/ (off)
    eval_while_training: EvalWhileTraining = field(default_factory=EvalWhileTraining)  # {every: N, suites, stop_on}:
                                      #   checkpoints scored while training; a breach stops it (smolforge.eval_watch)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # seed, fixed threads, deterministic kernels (null: on for CPU runs)


def check_loss(trainer: CPOConfig) -> None:
    """The loss is one TRL's CPOTrainer has, with settings it can train on.

    >>> from types import SimpleNamespace
    >>> check_loss(SimpleNamespace(loss_type="simpo", beta=2.0, simpo_gamma=-1.0, cpo_alpha=0.0))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: trainer.simpo_gamma is SimPO's target margin γ (the paper: 0.5-1.5 with β 2-2.5), must be >= 0, got -1.0
    """
    check_beta_positive(trainer.beta)
    if trainer.loss_type not in LOSSES:
        raise RecipeError(f"trainer.loss_type must be one of {', '.join(LOSSES)} (simpo: SimPO; sigmoid: CPO), "
                          f"got {trainer.loss_type!r}")
    if trainer.loss_type == "simpo" and trainer.simpo_gamma < 0:
        raise RecipeError(f"trainer.simpo_gamma is SimPO's target margin γ (the paper: 0.5-1.5 with β 2-2.5), "
                          f"must be >= 0, got {trainer.simpo_gamma}")
    if trainer.cpo_alpha < 0:
        raise RecipeError(f"trainer.cpo_alpha weighs the chosen answers' NLL, must be >= 0, got {trainer.cpo_alpha}")


def validate(recipe: Recipe, runs: Runs) -> None:
    check_loss(recipe.trainer)
    validate_preferences("cpo", recipe, runs)


def trainer_factory(recipe: Recipe):
    """``make_trainer(model_dir, dataset, tokenizer, callbacks)``: TRL's CPOTrainer on the parent in fp32."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TRLExperimentalWarning)
        from trl.experimental.cpo import CPOTrainer

    def make_trainer(model_dir, dataset, tokenizer, callbacks):
        return CPOTrainer(model=load_trainable(model_dir), args=recipe.trainer, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=callbacks)

    return make_trainer


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    def summarize(trainer) -> dict:
        return final_metrics(trainer, ("rewards/accuracies", "rewards/margins", "nll_loss"))

    return train_from_parent("cpo", recipe, runs, trainer_factory(recipe), overwrite=overwrite, summarize=summarize)
