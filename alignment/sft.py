"""Supervised fine-tuning of a run's model on chat conversations with TRL's SFTTrainer.

    smolforge sft --config recipes/demo/sft.yaml
    smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20 --learning_rate 3e-4

Reads a parent run (``model/``) and chat data (a data run's ``data/sft.jsonl`` or a JSONL file of
``{"messages": [...]}`` rows); trains with assistant-only loss on padding-free packed sequences;
writes a run whose ``model/`` is a plain HF model. ``trainer:`` takes any ``trl.SFTConfig`` field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from trl import SFTConfig

from smolforge.runs import Run, Runs

from .common import train_from_parent, trainer_defaults, validate_inputs


def defaults() -> dict:
    """Recipe values applied beneath the YAML (the playbook: SFT LR 1/10-1/5 of pretraining).

    Packing is on only with a GPU: TRL's padding-free packing flattens a batch into one row,
    and without flash-attention's varlen kernels SDPA then computes the whole (batch x length)^2
    attention under a mask. On this CPU that was 5x slower per token than padded batches
    (1.05 s vs 0.15 s a step, 3.4k vs 16.6k tokens/s, tiny demo model).
    """
    from .common import cuda_available

    return {"trainer": trainer_defaults(max_steps=300, per_device_train_batch_size=64, learning_rate=6e-4,
                                        lr_scheduler_type="cosine", warmup_steps=10, weight_decay=0.0,
                                        packing=cuda_available(), assistant_only_loss=True, max_length=256)}


@dataclass
class Recipe:
    name: str = "sft-demo"            # run name
    parent: str = "pretrain-demo"     # run whose model/ is fine-tuned
    data: str = "data-demo"           # data run (its data/sft.jsonl) or a .jsonl of {"messages"} rows
    trainer: SFTConfig = field(default_factory=lambda: SFTConfig(**defaults()["trainer"]))  # any trl.SFTConfig field


def validate(recipe: Recipe, runs: Runs) -> None:
    validate_inputs("sft", recipe, runs)


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    def make_trainer(model_dir, dataset, tokenizer, callbacks):
        return SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=recipe.trainer,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)

    return train_from_parent("sft", recipe, runs, make_trainer, overwrite=overwrite)
