"""Reference-free preference optimisation (ORPO) of a run's model with TRL's ORPOTrainer.

    smolforge orpo --config recipes/demo/orpo.yaml
    smolforge orpo --config recipes/demo/orpo.yaml --set trainer.beta=0.2 --set parent=sft-demo

ORPO adds an odds-ratio term to the NLL of the chosen answers: no reference model, one forward
pass of chosen+rejected per step. Reads a parent run and preference pairs exactly like the ``dpo``
stage (same rows, same checks: empty answers and identical pairs are DataErrors); writes a run whose
``model/`` is a plain HF model. ``trainer:`` takes any ``ORPOConfig`` field; ``beta`` is ORPO's λ,
the weight of the odds-ratio term (not DPO's KL strength, so the 0.1-0.3 DPO range does not apply).

Why ORPO over SimPO: TRL 1.16 keeps both in ``trl.experimental`` (``orpo`` and ``cpo`` with
``loss_type="simpo"``), both train on the demo; ORPO needs one hyperparameter (λ) where SimPO needs
β and a target margin γ and is documented by TRL as a CPO variant. Two TRL behaviours to know:
its NLL term covers the whole chosen sequence, prompt tokens included (TRL's comment: "orpo chosen
nll loss is computed over the full prompt and response"), so on an SFT model trained with
assistant-only loss the logged ``nll_loss`` starts high; and its batches carry ``chosen_input_ids``
rather than ``input_ids``, so Trainer cannot count tokens (``train/tokens`` is 0).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from trl.import_utils import TRLExperimentalWarning

from smolforge.determinism import DeterminismSpec
from smolforge.eval_watch import EvalWhileTraining
from smolforge.profiling import ProfileSpec
from smolforge.runs import Run, Runs

from .common import TrackingSpec, load_trainable, quiet_tracking, train_from_parent, trainer_defaults
from .dpo import check_beta_positive, final_metrics, validate_preferences

with warnings.catch_warnings():
    warnings.simplefilter("ignore", TRLExperimentalWarning)  # chosen knowingly; see the docstring
    from trl.experimental.orpo import ORPOConfig


def defaults() -> dict:
    """Recipe values applied beneath the YAML: the DPO stage's, with the ORPO paper's λ = 0.1.

    Token counting is off: ORPO's batches have no ``input_ids`` for Trainer to count.
    """
    return {"trainer": trainer_defaults(max_steps=150, per_device_train_batch_size=16, learning_rate=1e-5,
                                        lr_scheduler_type="cosine", warmup_steps=5, beta=0.1, max_length=128,
                                        include_num_input_tokens_seen="no")}


@dataclass
class Recipe:
    name: str = "orpo-demo"           # run name
    parent: str = "sft-demo"          # run whose model/ is the policy to start from (no reference model)
    data: str = "data-demo"           # data run (its data/prefs.jsonl) or a .jsonl of preference rows
    trainer: ORPOConfig = field(default_factory=lambda: ORPOConfig(**defaults()["trainer"]))  # any ORPOConfig field
    tracking: TrackingSpec = field(default_factory=quiet_tracking)  # report_to: tensorboard | trackio | wandb; prometheus_port
    profile: ProfileSpec = field(default_factory=ProfileSpec)  # torch.profiler trace of a step range into profile/ (off)
    eval_while_training: EvalWhileTraining = field(default_factory=EvalWhileTraining)  # {every: N, suites, stop_on}:
                                      #   checkpoints scored while training; a breach stops it (smolforge.eval_watch)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # seed, fixed threads, deterministic kernels (null: on for CPU runs)


def validate(recipe: Recipe, runs: Runs) -> None:
    check_beta_positive(recipe.trainer.beta)
    validate_preferences("orpo", recipe, runs)


def trainer_factory(recipe: Recipe):
    """``make_trainer(model_dir, dataset, tokenizer, callbacks)``: TRL's ORPOTrainer as this recipe trains,
    on the parent's weights in fp32 (:func:`~.common.load_trainable`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TRLExperimentalWarning)
        from trl.experimental.orpo import ORPOTrainer

    def make_trainer(model_dir, dataset, tokenizer, callbacks):
        return ORPOTrainer(model=load_trainable(model_dir), args=recipe.trainer,
                           train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)

    return make_trainer


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    def summarize(trainer) -> dict:
        return final_metrics(trainer, ("rewards/accuracies", "rewards/margins", "nll_loss", "log_odds_ratio"))

    return train_from_parent("orpo", recipe, runs, trainer_factory(recipe), overwrite=overwrite, summarize=summarize)
