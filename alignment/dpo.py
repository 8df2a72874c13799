"""Direct preference optimisation of a run's model with TRL's DPOTrainer.

    smolforge dpo --config recipes/demo/dpo.yaml
    smolforge dpo --config recipes/demo/dpo.yaml --set trainer.beta=0.2 --set parent=sft-demo
    smolforge dpo --config recipes/demo/dpo.yaml --set trainer.loss_type=ipo --set trainer.loss_weights=null
    smolforge dpo --config recipes/demo/dpo.yaml --set lora.r=16 --set reference=none

Reads a parent run (an SFT model) and preference pairs (a data run's ``data/prefs.jsonl`` or a
JSONL file of ``{"prompt","chosen","rejected"}`` rows, plain or conversational). Writes a run
whose ``model/`` is a plain HF model (a LoRA adapter is merged into it and kept in ``adapter/``),
with the final preference accuracy and reward margin of the training pairs. ``trainer:`` takes any
``trl.DPOConfig`` field:
``beta``, ``loss_type`` (one name or a list combined with ``loss_weights``, e.g. ``[sigmoid, sft]``),
``label_smoothing`` (robust, exo_pair), ``precompute_ref_log_probs``...

The reference model (``reference:``):

- ``parent`` (default): the parent model, frozen. With ``lora:`` this is the base model with the
  adapter disabled (the same weights, no second copy in memory).
- ``none``: TRL's implicit reference, the adapter-disabled base; needs ``lora:``.
- ``run:<name>`` or a folder (a run, or a HF model folder): an explicit frozen reference.

``packing: true`` runs each batch's sequences as one row, chosen and rejected answers as separate
documents (per-document positions and attention), no padding: the same loss
(:mod:`smolforge.alignment.packed_preference`).

``trainer.precompute_ref_log_probs: true`` makes TRL run the reference once over the whole training
set before step 1 (one no-grad pass) and store the log-probs as dataset columns; training steps
then skip the reference forward and no reference model is kept in memory
(``bench/dpo_reference.py`` measures the difference).

Bad input is refused before a run folder exists: beta <= 0, an unknown loss name (with the closest
TRL name), ``reference: none`` without ``lora:``, rows whose chosen equals rejected or whose chosen
or rejected answer is empty (DataError naming file and line).

    >>> from types import SimpleNamespace as Trainer
    >>> check_loss_types(Trainer(loss_type=["sigmoid", "sft"], label_smoothing=0.0))
    >>> check_loss_types(Trainer(loss_type=["ipoo"], label_smoothing=0.0))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: trainer.loss_type: unknown DPO loss 'ipoo' (did you mean 'ipo'?)
"""
from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from trl import DPOConfig

from smolforge.errors import RecipeError
from smolforge.determinism import DeterminismSpec
from smolforge.eval_watch import EvalWhileTraining
from smolforge.profiling import ProfileSpec
from smolforge.runs import Run, Runs, is_run

from .common import (LoraSpec, TrackingSpec, check_lora, export_merged, load_frozen, load_trainable, lora_config,
                     model_parent, quiet_tracking, train_from_parent, trainer_defaults, validate_inputs)

log = logging.getLogger(__name__)

# TRL 1.16's DPO losses; the list is read from DPOConfig's own help text when it can be.
_KNOWN_LOSSES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                 "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")


def defaults() -> dict:
    """Recipe values applied beneath the YAML (the playbook: LR about 1e-5, beta 0.1-0.3)."""
    return {"trainer": trainer_defaults(max_steps=150, per_device_train_batch_size=16, learning_rate=1e-5,
                                        lr_scheduler_type="cosine", warmup_steps=5, beta=0.1, max_length=128)}


@dataclass
class Recipe:
    name: str = "dpo-demo"            # run name
    parent: str = "sft-demo"          # run whose model/ is the policy to start from
    data: str = "data-demo"           # data run (its data/prefs.jsonl) or a .jsonl of preference rows
    reference: str = "parent"         # frozen reference: parent | none (LoRA only) | run:<name> | a model folder
    lora: LoraSpec | None = None      # train a LoRA adapter instead of all weights; merged into model/ at the end
    packing: bool = False             # each batch's sequences as one document-masked row, no padding
                                      #   (smolforge.alignment.packed_preference; the same loss, less padding)
    trainer: DPOConfig = field(default_factory=lambda: DPOConfig(**defaults()["trainer"]))  # any trl.DPOConfig field
    tracking: TrackingSpec = field(default_factory=quiet_tracking)  # report_to: tensorboard | trackio | wandb; prometheus_port
    profile: ProfileSpec = field(default_factory=ProfileSpec)  # torch.profiler trace of a step range into profile/ (off)
    eval_while_training: EvalWhileTraining = field(default_factory=EvalWhileTraining)  # {every: N, suites, stop_on}:
                                      #   checkpoints scored while training; a breach stops it (smolforge.eval_watch)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # seed, fixed threads, deterministic kernels (null: on for CPU runs)


def dpo_loss_types() -> list[str]:
    """The loss names TRL's DPOTrainer accepts (from DPOConfig's help text, else TRL 1.16's list).

    >>> {"sigmoid", "ipo", "robust", "sft"} <= set(dpo_loss_types())
    True
    """
    help_text = DPOConfig.__dataclass_fields__["loss_type"].metadata.get("help", "")
    return re.findall(r"`'(\w+)'`", help_text) or list(_KNOWN_LOSSES)


def check_loss_types(trainer) -> None:
    """Every name in ``trainer.loss_type`` is a TRL loss, with the settings that loss needs."""
    known = dpo_loss_types()
    names = trainer.loss_type
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
        raise RecipeError(f"trainer.loss_type must be a loss name or a list of them (e.g. [sigmoid, sft]), got {names!r}")
    if not names:
        raise RecipeError(f"trainer.loss_type is empty (expected one or more of: {', '.join(known)})")
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known)}"
            raise RecipeError(f"trainer.loss_type: unknown DPO loss '{name}' ({hint})")
    if "robust" in names and not 0.0 <= trainer.label_smoothing < 0.5:
        raise RecipeError(f"trainer.label_smoothing must be in [0, 0.5) for the robust loss (the probability a "
                          f"label is flipped; the paper suggests 0.1), got {trainer.label_smoothing}")
    if "robust" in names and trainer.label_smoothing == 0.0:
        log.warning("loss 'robust' with trainer.label_smoothing=0 is plain sigmoid DPO; set it to e.g. 0.1")
    if "exo_pair" in names and trainer.label_smoothing <= 0.0:
        raise RecipeError("trainer.label_smoothing must be > 0 for the exo_pair loss (the EXO paper suggests 1e-3)")


def check_beta_positive(beta: float) -> None:
    if beta <= 0:
        raise RecipeError(f"trainer.beta must be > 0, got {beta}")


def check_beta(beta: float) -> None:
    """beta <= 0 cannot train; outside 0.1-0.3 is allowed with a warning (the playbook's range)."""
    check_beta_positive(beta)
    if not 0.1 <= beta <= 0.3:
        log.warning("trainer.beta=%s is outside the playbook's 0.1-0.3 range", beta)


def _is_model_folder(text: str) -> bool:
    return "/" in text or text.startswith(("~", "."))


def reference_dir(recipe: Recipe, runs: Runs) -> Path | None:
    """The folder of the frozen reference model, or None when TRL's implicit (adapter-disabled) one is used."""
    ref = recipe.reference.strip()
    if ref == "none" or (ref == "parent" and recipe.lora is not None):
        if recipe.lora is None:
            raise RecipeError("reference: none needs lora: (the implicit reference is the base model with the "
                              "adapter disabled); add e.g. lora: {r: 16}, or use reference: parent")
        return None
    if ref == "parent":
        return model_parent(runs, recipe.parent).model_dir
    if ref.startswith("run:"):
        return model_parent(runs, ref[len("run:"):]).model_dir
    if _is_model_folder(ref):
        path = Path(ref).expanduser()
        if is_run(path):
            return model_parent(runs, ref).model_dir
        if (path / "config.json").is_file():
            return path
        raise RecipeError(f"reference: '{ref}' is neither a run folder nor a model folder (no run.json or config.json)")
    close = difflib.get_close_matches(ref, ["parent", "none"], n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"for a run, write reference: run:{ref}"
    raise RecipeError(f"reference: '{ref}' is not parent, none, run:<name> or a model folder ({hint})")


def _check_same_vocab(reference: Path, policy: Path) -> None:
    import json

    sizes = [json.loads((p / "config.json").read_text()).get("vocab_size") for p in (reference, policy)]
    if sizes[0] != sizes[1]:
        raise RecipeError(f"reference model {reference} has vocab_size {sizes[0]} but the parent's is {sizes[1]}; "
                          "the reference must share the policy's tokenizer")


def validate_preferences(stage: str, recipe, runs: Runs) -> None:
    """Parent model and preference rows (the preference schema: both answers non-empty, also in
    conversational pairs) of a preference stage."""
    validate_inputs(stage, recipe, runs)


def validate(recipe: Recipe, runs: Runs) -> None:
    check_beta(recipe.trainer.beta)
    check_loss_types(recipe.trainer)
    check_lora(recipe.lora)
    if recipe.lora is not None and recipe.trainer.sync_ref_model:
        raise RecipeError("trainer.sync_ref_model does not work with lora: (TRL has no reference copy to sync)")
    if recipe.trainer.sync_ref_model and recipe.trainer.precompute_ref_log_probs:
        raise RecipeError("trainer.sync_ref_model and trainer.precompute_ref_log_probs exclude each other "
                          "(a moving reference cannot be precomputed)")
    reference = reference_dir(recipe, runs)
    if reference is not None:
        _check_same_vocab(reference, model_parent(runs, recipe.parent).model_dir)
    validate_preferences("dpo", recipe, runs)


def reference_run(recipe: Recipe, runs: Runs) -> Run | None:
    """The run behind an explicit ``reference: run:<name>`` (or a run folder): a parent of the DPO run."""
    ref = recipe.reference.strip()
    if ref.startswith("run:"):
        return model_parent(runs, ref[len("run:"):])
    if ref not in ("parent", "none") and is_run(Path(ref).expanduser()):
        return model_parent(runs, ref)
    return None


def final_metrics(trainer, keys=("rewards/accuracies", "rewards/margins")) -> dict:
    """The last logged value of each of ``keys`` as ``train/<name>``."""
    last = {}
    for entry in trainer.state.log_history:
        last.update({k: entry[k] for k in keys if k in entry})
    return {f"train/{key.split('/')[-1]}": round(value, 5) for key, value in last.items()}


def trainer_factory(recipe: Recipe, reference: Path | None):
    """``make_trainer(model_dir, dataset, tokenizer, callbacks)``: TRL's DPOTrainer as this recipe trains
    (``trainer:`` as its args, LoRA): the policy in fp32 (:func:`~.common.load_trainable`), the frozen
    ``reference`` (:func:`reference_dir`; None: TRL's implicit one) in :func:`~.common.frozen_dtype`."""
    from trl import DPOTrainer

    precompute = recipe.trainer.precompute_ref_log_probs

    def make_trainer(model_dir, dataset, tokenizer, callbacks):
        # With precomputed log-probs and the parent as reference, TRL runs the policy itself (still
        # untrained) over the data before step 1, so no second copy is loaded at all.
        load_reference = reference is not None and not (precompute and reference.resolve() == model_dir.resolve())
        # The reference takes no optimizer steps, so it needs no fp32 master copy: bf16 when training is
        # bf16 (its matmuls run in bf16 under autocast anyway; half the memory), fp32 otherwise.
        trainer = DPOTrainer(
            model=load_trainable(model_dir),
            ref_model=load_frozen(reference, bf16=recipe.trainer.bf16) if load_reference else None,
            args=recipe.trainer, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks,
            peft_config=lora_config(recipe.lora) if recipe.lora is not None else None)
        if recipe.packing:
            from .packed_preference import add_packed_forward

            add_packed_forward(trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model")
                               else trainer.model)
            if trainer.ref_model is not None:
                add_packed_forward(trainer.ref_model)
        if precompute:
            trainer.ref_model = None  # its log-probs are dataset columns now; TRL would keep it in memory
        return trainer

    return make_trainer


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    reference_parent = reference_run(recipe, runs)
    return train_from_parent("dpo", recipe, runs, trainer_factory(recipe, reference_dir(recipe, runs)),
                             overwrite=overwrite, summarize=final_metrics,
                             export=export_merged if recipe.lora is not None else None,
                             extra_parents=(reference_parent,) if reference_parent else ())
