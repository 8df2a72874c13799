"""The learning-rate range test of a pretrain recipe (``smolforge lr-find``; :mod:`smolforge.ops.lr_find`).

    smolforge lr-find --config recipes/demo/pretrain.yaml
    smolforge lr-find --config recipes/demo/pretrain.yaml --min 1e-5 --max 1 --steps 60 --json

The stage's own setup, :func:`smolforge.pretrain.stage.load_data` and :class:`~smolforge.pretrain.stage.Loop`
(the model, or the ``init:`` parent with its ``context:``; AdamW with the recipe's betas and weight decay;
the DeepSpeed engine; the mixture sampler; clipping; precision), and its step,
:meth:`~smolforge.pretrain.stage.Loop.step`, with
these changes: the LR schedule is the sweep's exponential one (from ``--min``, multiplied by a
constant factor every step) instead of the recipe's warmup and decay; ``max_steps`` is the sweep's;
the spike guard never arms on finite losses (it only turns a NaN into a skipped step, after which
the sweep stops); no checkpoints, no tracker, no ``model/``.
"""
from __future__ import annotations

import dataclasses

from smolforge.pretrain.distributed import distributed
from smolforge.pretrain.stage import CheckpointSpec, Loop, Recipe, SpikeSpec, load_data
from smolforge.runs import Run, Runs

from .arithmetic import fmt_lr
from .sweep import Sweep


def sweep_recipe(recipe: Recipe, sweep: Sweep) -> Recipe:
    """The recipe the sweep trains with: the sweep's steps and starting LR, no warmup, nothing saved.

    >>> swept = sweep_recipe(Recipe(), Sweep(1e-5, 1.0, steps=30))
    >>> swept.train.max_steps, swept.train.learning_rate, swept.spike.min_history > 30, swept.tracking.report_to
    (30, 1e-05, True, ['none'])
    """
    train = dataclasses.replace(recipe.train, max_steps=sweep.steps, learning_rate=sweep.lr_min, warmup_steps=0,
                                log_every=sweep.steps)
    return dataclasses.replace(
        recipe, train=train, checkpoint=CheckpointSpec(every_steps=0, every_minutes=0.0),
        spike=SpikeSpec(action="skip", min_history=sweep.steps + 1),
        tracking=dataclasses.replace(recipe.tracking, report_to=["none"], prometheus_port=None))


def lr_find(recipe: Recipe, runs: Runs, sweep: Sweep) -> Run:
    """Sweep the LR on the recipe's training setup; the run ``lrfind-<name>`` holds the plot and result."""
    from tqdm.auto import tqdm

    swept = sweep_recipe(recipe, sweep)
    data_run, tokenizer, domains = load_data(swept, runs)
    parents = [data_run] + ([runs.get(recipe.init)] if recipe.init else [])
    with distributed() as (deepspeed, rank, world), sweep.run(runs, "pretrain", recipe, parents) as run:
        loop = Loop(swept, runs, run, deepspeed, tokenizer, domains, rank, world, schedule=sweep.multiplier)
        bar = tqdm(total=sweep.steps, desc=f"lr-find {recipe.name}", unit="step")
        try:
            loop.engine.train()
            for step in range(1, sweep.steps + 1):
                loss, _, _ = loop.step(step)
                bar.update(1)
                bar.set_postfix(lr=fmt_lr(loop.step_lr), loss=f"{loss:.3f}")
                if sweep.record(loop.step_lr, loss):
                    break
        finally:
            bar.close()
            if loop.tracker is not None:
                loop.tracker.close()
            loop.engine.destroy()
        sweep.finish(run, stage="pretrain", recipe_name=recipe.name, recipe_lr=recipe.train.learning_rate)
    return run.reload()
