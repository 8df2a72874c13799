"""The learning-rate range test of an SFT recipe (``smolforge lr-find``; :mod:`smolforge.ops.lr_find`).

    smolforge lr-find --config recipes/demo/sft.yaml
    smolforge lr-find --config recipes/demo/sft.yaml --min 1e-6 --max 1 --steps 100 --json

TRL's SFTTrainer as the stage builds it (:func:`smolforge.alignment.sft.trainer_factory`: the parent's
model, the chat template, assistant-only loss, LoRA) on the stage's training split of the conversations
(:func:`smolforge.alignment.common.load_inputs`, :func:`~smolforge.alignment.common.split_heldout`), with
Trainer's own AdamW (the recipe's weight decay and betas) and, in place of the recipe's schedule, a
``LambdaLR`` from ``--min`` multiplied by a constant factor every step. The scheduler is set on the trainer before ``train()``:
Trainer keeps a scheduler it was given (as through ``optimizers=``), which could not be passed at
construction because the optimizer must hold the parameters SFTTrainer itself creates (LoRA). Every
step is logged (``logging_steps: 1``, NaN losses kept); nothing is evaluated or saved.

Besides the suggestion it reports the playbook's window for SFT, 1/10-1/5 of the peak LR of the
pretraining run in the parent's lineage (:func:`smolforge.alignment.sft.pretraining_lr`), and the LR the recipe would
train with (:func:`smolforge.alignment.sft.resolve_learning_rate`).
"""
from __future__ import annotations

import copy
import dataclasses
import shutil

from smolforge.alignment.common import load_inputs, split_heldout
from smolforge.alignment.sft import (Recipe, attention, prepare_rows, pretraining_lr, resolve_learning_rate,
                                     trainer_factory)
from smolforge.generation.prompts import load_tokenizer
from smolforge.runs import Run, Runs

from .arithmetic import fmt_lr
from .sweep import Sweep

WINDOW_RULE = "the playbook's SFT LR: 1/10-1/5 of pretraining's peak"


def window(runs: Runs, parent: str) -> dict:
    """The playbook's SFT window from the lineage's pretraining peak LR (low/high None without one)."""
    peak = pretraining_lr(runs, parent)
    if peak is None:
        return {"low": None, "high": None, "pretraining_lr": None, "rule": WINDOW_RULE,
                "note": f"no pretraining run in the lineage of '{parent}'"}
    return {"low": float(f"{peak / 10:.12g}"), "high": float(f"{peak / 5:.12g}"), "pretraining_lr": peak,
            "rule": WINDOW_RULE}


def sweep_args(recipe: Recipe, sweep: Sweep, output_dir: str):
    """The recipe's ``trainer:`` for the sweep: its steps and starting LR, a log line per step, no
    warmup, evaluation or checkpoints."""
    return dataclasses.replace(recipe.trainer, output_dir=output_dir, max_steps=sweep.steps,
                               learning_rate=sweep.lr_min, warmup_steps=0, eval_strategy="no", save_strategy="no",
                               load_best_model_at_end=False, logging_steps=1, logging_nan_inf_filter=False,
                               report_to="none", disable_tqdm=True)


def lr_find(recipe: Recipe, runs: Runs, sweep: Sweep) -> Run:
    """Sweep the LR on the recipe's SFTTrainer; the run ``lrfind-<name>`` holds the plot and result."""
    import torch
    from datasets import Dataset
    from tqdm.auto import tqdm
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    parent, data_run, _, rows = load_inputs("sft", recipe, runs)
    if recipe.eval_fraction > 0:
        rows = split_heldout(rows, recipe.eval_fraction, recipe.trainer.seed)[0]
    tokenizer = load_tokenizer(parent.model_dir)
    rows = prepare_rows(recipe)(rows, tokenizer)   # assistant masks where the template has no markers
    resolved = copy.deepcopy(recipe)
    resolve_learning_rate(resolved, runs)
    parents = [parent] + ([data_run] if data_run else [])
    bar = tqdm(total=sweep.steps, desc=f"lr-find {recipe.name}", unit="step")

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and "learning_rate" in logs:
                bar.update(1)
                bar.set_postfix(lr=fmt_lr(logs["learning_rate"]), loss=f"{logs['loss']:.3f}")
                if sweep.record(logs["learning_rate"], logs["loss"]):
                    control.should_training_stop = True

    try:
        with sweep.run(runs, "sft", recipe, parents) as run:
            swept = dataclasses.replace(recipe, trainer=sweep_args(recipe, sweep, str(run.trainer_dir)),
                                        early_stopping_patience=0)
            trainer = trainer_factory(swept, attention(swept, runs))(parent.model_dir, Dataset.from_list(rows), tokenizer, [Record()])
            trainer.remove_callback(PrinterCallback)  # one JSON object on stdout with --json, not a log line a step
            trainer.create_optimizer()
            trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, sweep.multiplier)
            trainer.train()
            shutil.rmtree(run.trainer_dir, ignore_errors=True)  # nothing saved there: no empty folder left
            sweep.finish(run, stage="sft", recipe_name=recipe.name, recipe_lr=resolved.trainer.learning_rate,
                         window=window(runs, recipe.parent))
    finally:
        bar.close()
    return run.reload()
