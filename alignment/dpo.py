"""Direct preference optimisation of a run's model with TRL's DPOTrainer.

    smolforge dpo --config recipes/demo/dpo.yaml
    smolforge dpo --config recipes/demo/dpo.yaml --set trainer.beta=0.2 --set parent=sft-demo

Reads a parent run (an SFT model) and preference pairs (a data run's ``data/prefs.jsonl`` or a
JSONL file of ``{"prompt","chosen","rejected"}`` rows, plain or conversational); the reference
model is the parent itself. Writes a run whose ``model/`` is a plain HF model, with the final
preference accuracy and reward margin of the training pairs. ``trainer:`` takes any
``trl.DPOConfig`` field (``beta``, ``loss_type``, ``precompute_ref_log_probs``…).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trl import DPOConfig

from smolforge.errors import RecipeError
from smolforge.recipe import to_dict
from smolforge.runs import Run, Runs

from .common import lineage_fingerprints, load_tokenizer, model_parent, run_logger, trainer_defaults, train_summary

log = logging.getLogger(__name__)


def defaults() -> dict:
    """Recipe values applied beneath the YAML (the playbook: beta 0.1-0.3)."""
    return {"trainer": trainer_defaults(max_steps=150, per_device_train_batch_size=16, learning_rate=5e-5,
                                        lr_scheduler_type="cosine", warmup_steps=5, beta=0.1, max_length=128)}


@dataclass
class Recipe:
    name: str = "dpo-demo"            # run name
    parent: str = "sft-demo"          # run whose model/ is the policy (and the reference)
    data: str = "data-demo"           # data run (its data/prefs.jsonl) or a .jsonl of preference rows
    trainer: DPOConfig = field(default_factory=lambda: DPOConfig(**defaults()["trainer"]))  # any trl.DPOConfig field


def validate(recipe: Recipe, runs: Runs) -> None:
    from data.schemas import load_rows, resolve_data

    if recipe.trainer.beta <= 0:
        raise RecipeError(f"trainer.beta must be > 0, got {recipe.trainer.beta}")
    if not 0.1 <= recipe.trainer.beta <= 0.3:
        log.warning("trainer.beta=%s is outside the playbook's 0.1-0.3 range", recipe.trainer.beta)
    model_parent(runs, recipe.parent)
    path, _ = resolve_data(recipe.data, runs, "prefs")
    load_rows(path, "preference")


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOTrainer

    from data.schemas import load_rows, resolve_data

    parent = model_parent(runs, recipe.parent)
    path, data_run = resolve_data(recipe.data, runs, "prefs")
    rows = load_rows(path, "preference")
    config = recipe.trainer
    parents = [parent] + ([data_run] if data_run else [])
    with runs.start("dpo", recipe.name, to_dict(recipe), parents=parents,
                    data_fingerprints=lineage_fingerprints(parents, {"prefs": path}), overwrite=overwrite) as run:
        config.output_dir = str(run.checkpoints_dir)
        tokenizer = load_tokenizer(parent.model_dir)
        model = AutoModelForCausalLM.from_pretrained(parent.model_dir)
        ref_model = AutoModelForCausalLM.from_pretrained(parent.model_dir)
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=config, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer, callbacks=[run_logger(run)])
        result = trainer.train()
        run.save_model(trainer.model, tokenizer)
        summary = train_summary(trainer, result)
        last = next((h for h in reversed(trainer.state.log_history) if "rewards/accuracies" in h), {})
        for key in ("rewards/accuracies", "rewards/margins"):
            if key in last:
                summary[f"train/{key.split('/')[1]}"] = round(last[key], 5)
        run.finish(metrics=summary)
    return run
