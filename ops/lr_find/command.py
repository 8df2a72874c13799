"""``smolforge lr-find``: load the recipe, find the module that sweeps its stage, sweep, print.

A package's ``commands`` module declares that module (``StageSpec("pretrain", ..., lr_find=
"smolforge.ops.lr_find.pretrain")``); it has ``lr_find(recipe, runs, sweep: Sweep) -> Run``. Stdlib and
spine imports only at the top: the CLI builds its parser from :func:`add_arguments`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from smolforge.errors import RecipeError

from .arithmetic import fmt_lr
from .sweep import Sweep

__all__ = ["summary", "add_arguments", "command"]


def summary(result: dict[str, Any]) -> str:
    """The lines ``smolforge lr-find`` prints.

    >>> print(summary({"recipe": "p", "stage": "pretrain", "steps": 4, "steps_run": 4, "min": 1e-4, "max": 1.0,
    ...                "stopped": None, "min_loss_lr": 0.1, "min_loss": 1.5, "suggestion": 0.01,
    ...                "rule": "minimum/10", "rule_text": "one tenth of ...", "note": None,
    ...                "cross_check": {"rule": "steepest", "rule_text": "...", "lr": 1e-3}, "recipe_lr": 3e-3,
    ...                "plot": "runs/lrfind-p/lr_find.svg"}))
    lr-find p (pretrain): 4 of 4 steps, LR 1e-4 → 1 (never diverged: raise --max to see the edge)
      minimum of the smoothed loss: 1.5 at LR 0.1
      suggested LR 0.01 (rule: minimum/10, one tenth of ...)
      cross-check: steepest 1e-3 (...)
      the recipe's LR: 3e-3
    plot: runs/lrfind-p/lr_find.svg
    """
    stop = f"stopped: {result['stopped']}" if result["stopped"] else "never diverged: raise --max to see the edge"
    lines = [f"lr-find {result['recipe']} ({result['stage']}): {result['steps_run']} of {result['steps']} steps, "
             f"LR {fmt_lr(result['min'])} → {fmt_lr(result['max'])} ({stop})",
             f"  minimum of the smoothed loss: {result['min_loss']:.4g} at LR {fmt_lr(result['min_loss_lr'])}",
             f"  suggested LR {fmt_lr(result['suggestion'])} (rule: {result['rule']}, {result['rule_text']})"]
    if result.get("note"):
        lines.append(f"  note: {result['note']}")
    cross = result["cross_check"]
    lines.append(f"  cross-check: {cross['rule']} {fmt_lr(cross['lr'])} ({cross['rule_text']})")
    if result.get("recipe_lr") is not None:
        lines.append(f"  the recipe's LR: {fmt_lr(result['recipe_lr'])}")
    window = result.get("window")
    if window:
        span = (f"{fmt_lr(window['low'])} - {fmt_lr(window['high'])}" if window.get("low") is not None
                else "none")
        why = "; ".join(filter(None, [window.get("rule"), window.get("note")]))
        lines.append(f"  window: {span} ({why})")
    lines.append(f"plot: {result['plot']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE", help="a stage recipe YAML (pretrain or sft)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key, e.g. train.micro_batch_size=8 (repeatable)")
    p.add_argument("--min", type=float, default=1e-6, metavar="LR", help="first learning rate (default 1e-6)")
    p.add_argument("--max", type=float, default=1.0, metavar="LR", help="last learning rate (default 1)")
    p.add_argument("--steps", type=int, default=100, metavar="N",
                   help="optimizer steps from --min to --max (default 100)")


def command(args: argparse.Namespace, ctx) -> int:
    """``smolforge lr-find``: load the recipe, find the module its stage's package declared, sweep, print."""
    import importlib

    from smolforge import recipe as recipes
    from smolforge.registry import load_stage, stage_specs

    sweep = Sweep(args.min, args.max, args.steps)
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise RecipeError("lr-find runs in one process (a short test at small scale); run it without a launcher")
    stage, data = recipes.load_recipe(args.config, args.set)
    finders = {name: spec.lr_find for name, spec in stage_specs().items() if spec.lr_find}
    if stage not in finders:
        raise RecipeError(f"{args.config}: lr-find sweeps {' and '.join(sorted(finders))} recipes; "
                          f"this one is for stage '{stage}'")
    # with --json, stdout holds only the JSON object: what libraries print (on import, while training) goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if ctx.json else contextlib.nullcontext():
        module = load_stage(stage)
        recipe = recipes.build_stage_recipe(module, data, source=str(args.config))
        runs = ctx.runs
        module.validate(recipe, runs)
        run = importlib.import_module(finders[stage]).lr_find(recipe, runs, sweep)
    result = sweep.result
    if ctx.json:
        print(json.dumps(result, indent=2))
    else:
        print(summary(result))
        print(f"run {run.name} {run.status} → {run.path}")
    return 0
