"""Kahneman-Tversky Optimisation (KTO) of a run's model on unpaired feedback, with TRL's KTOTrainer.

    smolforge kto --config recipes/demo/kto.yaml
    smolforge kto --config recipes/demo/kto.yaml --set data=feedback.jsonl --set trainer.undesirable_weight=1.5

KTO learns from single answers marked good or bad, the feedback a product collects (thumbs up or
down), where DPO needs two answers to one prompt ranked. ``data:`` is a data run or a ``.jsonl``. A
data run gives its ``feedback`` kind when it has one (``sources: {feedback: ...}`` in the data recipe:
``{"prompt", "completion", "label"}`` rows, ``label`` true: desirable; the layout of
``trl-lib/kto-mix-14k``, plain text or messages), else its ``prefs``; the stage says which on stderr
and records it in ``run.json``'s ``data_fingerprints``. A ``.jsonl`` holds feedback rows or preference
pairs. Each pair becomes two rows: its chosen answer desirable, its rejected one not. Rows are checked
before a run exists (:mod:`smolforge.data.schemas`, schema ``feedback``).

The loss (the KTO paper's eq. 7, TRL's ``loss_type: kto``) with r = log π/π_ref and z₀ the batch's
KL estimate (from mismatched prompt/answer pairs, clamped at 0):
λ_D·(1 − σ(β(r − z₀))) for a desirable answer, λ_U·(1 − σ(β(z₀ − r))) for an undesirable one, averaged
over the batch. ``trainer.desirable_weight`` (λ_D) and ``undesirable_weight`` (λ_U) balance the
two kinds: the paper keeps λ_D·n_D / (λ_U·n_U) in [1, 4/3]; a run outside that range is logged with
the weights that would bring it back. tests/test_dpo_family.py checks TRL's logged loss against the
formula on the rewards and KL it logged.

``packing: true`` runs each forward's sequences (the batch's prompt+answer rows, and the mismatched
rows of the KL estimate) as one document-masked row without padding, as DPO's packing does
(:mod:`smolforge.alignment.packed_preference`): the same losses, rewards and KL.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trl import KTOConfig

from smolforge.errors import DataError, RecipeError
from smolforge.determinism import DeterminismSpec
from smolforge.eval_watch import EvalWhileTraining
from smolforge.profiling import ProfileSpec
from smolforge.runs import Run, Runs

from .common import (TrackingSpec, load_frozen, load_trainable, quiet_tracking, train_from_parent,
                     trainer_defaults, validate_inputs)
from .dpo import check_beta_positive, final_metrics

log = logging.getLogger(__name__)

LOSSES = ("kto", "apo_zero_unpaired")
BALANCE = (1.0, 4 / 3)        # the paper's range for λ_D·n_D / (λ_U·n_U)


def defaults() -> dict:
    """Recipe values beneath the YAML: the DPO stage's CPU settings with the paper's β = 0.1."""
    return {"trainer": trainer_defaults(max_steps=100, per_device_train_batch_size=16, learning_rate=5e-6,
                                        lr_scheduler_type="cosine", warmup_steps=5, beta=0.1, max_length=128)}


@dataclass
class Recipe:
    name: str = "kto-demo"            # run name
    parent: str = "sft-demo"          # run whose model/ is the policy; its frozen copy is the reference
    data: str = "data-demo"           # data run (its feedback, else its prefs unpaired) or a .jsonl of feedback rows or pairs
    trainer: KTOConfig = field(default_factory=lambda: KTOConfig(**defaults()["trainer"]))  # any trl.KTOConfig field
    tracking: TrackingSpec = field(default_factory=quiet_tracking)  # report_to: tensorboard | trackio | wandb; prometheus_port
    profile: ProfileSpec = field(default_factory=ProfileSpec)  # torch.profiler trace of a step range into profile/ (off)
    eval_while_training: EvalWhileTraining = field(default_factory=EvalWhileTraining)  # {every: N, suites, stop_on}:
                                      #   checkpoints scored while training; a breach stops it (smolforge.eval_watch)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # seed, fixed threads, deterministic kernels (null: on for CPU runs)
    packing: bool = False             # each forward's sequences as one document-masked row, no padding
                                      #   (smolforge.alignment.packed_preference; the same loss, less padding)


def balance(rows: list[dict], desirable_weight: float, undesirable_weight: float) -> float:
    """λ_D·n_D / (λ_U·n_U): the KTO paper keeps it in [1, 4/3].

    >>> rows = [{"label": True}] * 3 + [{"label": False}]
    >>> balance(rows, 1.0, 1.0), round(balance(rows, 1.0, 2.25), 3)
    (3.0, 1.333)
    """
    good = sum(bool(row["label"]) for row in rows)
    return desirable_weight * good / (undesirable_weight * (len(rows) - good))


def check_feedback(rows: list[dict], trainer: KTOConfig) -> None:
    """Both kinds of feedback are present; the weights are positive; an imbalance beyond the paper's
    range is logged with the λ_U that would fix it."""
    good = sum(bool(row["label"]) for row in rows)
    if good == 0 or good == len(rows):
        kind = "desirable (label true)" if good == 0 else "undesirable (label false)"
        raise DataError(f"KTO needs both kinds of feedback: {len(rows)} rows and no {kind} one")
    for name in ("desirable_weight", "undesirable_weight"):
        if not getattr(trainer, name) > 0:
            raise RecipeError(f"trainer.{name} must be > 0, got {getattr(trainer, name)}")
    ratio = balance(rows, trainer.desirable_weight, trainer.undesirable_weight)
    if not BALANCE[0] <= ratio <= BALANCE[1]:
        target = trainer.desirable_weight * good / ((len(rows) - good) * 1.15)
        log.warning("kto: λ_D·n_D / (λ_U·n_U) = %.2f (%d desirable, %d undesirable rows) is outside the paper's "
                    "[1, 4/3]; e.g. --set trainer.undesirable_weight=%.3g", ratio, good, len(rows) - good, target)


def validate(recipe: Recipe, runs: Runs) -> None:
    check_beta_positive(recipe.trainer.beta)
    if recipe.trainer.loss_type not in LOSSES:
        raise RecipeError(f"trainer.loss_type must be one of {', '.join(LOSSES)}, got {recipe.trainer.loss_type!r}")
    check_feedback(validate_inputs("kto", recipe, runs), recipe.trainer)


def trainer_factory(recipe: Recipe):
    """``make_trainer(model_dir, dataset, tokenizer, callbacks)``: TRL's KTOTrainer on the parent in fp32,
    the parent's frozen copy as the reference."""
    from trl import KTOTrainer

    def make_trainer(model_dir, dataset, tokenizer, callbacks):
        trainer = KTOTrainer(model=load_trainable(model_dir), ref_model=load_frozen(model_dir, bf16=recipe.trainer.bf16),
                             args=recipe.trainer, train_dataset=dataset, processing_class=tokenizer,
                             callbacks=callbacks)
        if recipe.packing:   # KTO's forwards (answers, KL rows, reference) go through TRL's fused LM head as DPO's
            from .packed_preference import add_packed_forward

            add_packed_forward(trainer.model)
            if trainer.ref_model is not None:
                add_packed_forward(trainer.ref_model)
        return trainer

    return make_trainer


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    def summarize(trainer) -> dict:
        return final_metrics(trainer, ("rewards/chosen", "rewards/rejected", "rewards/margins", "kl"))

    return train_from_parent("kto", recipe, runs, trainer_factory(recipe), overwrite=overwrite, summarize=summarize)
