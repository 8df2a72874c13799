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
from smolforge.runs import Run, Runs

from .common import train_from_parent, trainer_defaults, validate_inputs

log = logging.getLogger(__name__)


def defaults() -> dict:
    """Recipe values applied beneath the YAML (the playbook: LR about 1e-5, beta 0.1-0.3)."""
    return {"trainer": trainer_defaults(max_steps=150, per_device_train_batch_size=16, learning_rate=1e-5,
                                        lr_scheduler_type="cosine", warmup_steps=5, beta=0.1, max_length=128)}


@dataclass
class Recipe:
    name: str = "dpo-demo"            # run name
    parent: str = "sft-demo"          # run whose model/ is the policy (and the reference)
    data: str = "data-demo"           # data run (its data/prefs.jsonl) or a .jsonl of preference rows
    trainer: DPOConfig = field(default_factory=lambda: DPOConfig(**defaults()["trainer"]))  # any trl.DPOConfig field


def validate(recipe: Recipe, runs: Runs) -> None:
    if recipe.trainer.beta <= 0:
        raise RecipeError(f"trainer.beta must be > 0, got {recipe.trainer.beta}")
    if not 0.1 <= recipe.trainer.beta <= 0.3:
        log.warning("trainer.beta=%s is outside the playbook's 0.1-0.3 range", recipe.trainer.beta)
    validate_inputs("dpo", recipe, runs)


def _final_rewards(trainer) -> dict:
    last = next((h for h in reversed(trainer.state.log_history) if "rewards/accuracies" in h), {})
    return {f"train/{key.split('/')[1]}": round(last[key], 5)
            for key in ("rewards/accuracies", "rewards/margins") if key in last}


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from transformers import AutoModelForCausalLM
    from trl import DPOTrainer

    def make_trainer(model_dir, dataset, tokenizer, callbacks):
        # The reference is the parent model itself, loaded twice so the policy can move away from it.
        return DPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                          ref_model=AutoModelForCausalLM.from_pretrained(model_dir), args=recipe.trainer,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)

    return train_from_parent("dpo", recipe, runs, make_trainer, overwrite=overwrite, summarize=_final_rewards)
