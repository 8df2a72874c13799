"""The learning-rate range test (Leslie Smith): its arithmetic, its plot, its run folder, its command.

    smolforge lr-find --config recipes/demo/pretrain.yaml
    smolforge lr-find --config recipes/demo/sft.yaml --min 1e-6 --max 1 --steps 100 --json

One short run of the stage's own training setup whose learning rate is multiplied by a constant
factor every optimizer step, from ``--min`` to ``--max``, the loss recorded at each step. The sweep
stops early when the smoothed loss exceeds 4x its minimum so far, or a loss is not finite.

- **Smoothed loss**: the mean of the losses within ``half`` steps either side (``half`` =
  steps / 40, at least 1): centred, so its minimum does not lag behind the raw curve; while the
  sweep runs, the newest points have only their past side (a trailing mean), and that is what the
  stop rule sees.
- **The suggestion** (the rule named in the output): one tenth of the LR at the smoothed loss's
  minimum. The minimum is where training stopped improving; an order of magnitude below it the
  loss still falls fast and a full run, warmup and decay included, stays clear of the edge. Where
  the minimum lies within a decade of ``--min`` the suggestion is ``--min`` and a note says to
  lower it.
- **Cross-check**: the LR where the smoothed loss falls fastest per decade of LR, before its minimum
  (steepest descent). It needs no factor of 10 but is noisier, a slope of noisy points: on the demo
  it moved from 2.2e-3 to 6.6e-3 with the smoothing window while minimum/10 stayed at 1.0-1.1e-3
  (docs/pretraining.md).

The stage packages do the training: a package's ``commands`` module declares the module that sweeps
its stage (``cli.stage("pretrain", lr_find="smolforge.pretrain.lr_find")``); that module has
``lr_find(recipe, runs, sweep: Sweep) -> Run``, runs its setup under :meth:`Sweep.run` with the LR
multiplier :meth:`Sweep.multiplier`, reports every step through :meth:`Sweep.record` and ends with
:meth:`Sweep.finish`. The code here names no stage and imports no ML library.

The sweep is a run, ``lrfind-<recipe name>`` (stage ``lr-find``; parents: the stage's inputs):
``lr_find.svg`` (the plot), ``lr_find.json`` (what ``--json`` prints), ``metrics.jsonl`` (LR and loss
per step). Each sweep replaces the previous one of that name; a sweep that fails leaves nothing.

    >>> lrs = exponential_lrs(1e-4, 1.0, 5)
    >>> losses = [5.0, 4.0, 2.0, 1.5, 30.0]          # falls, bottoms at 0.1, blows up at 1
    >>> found = suggest(lrs, losses, half=0)         # half=0: no smoothing, to follow by hand
    >>> found["min_loss_lr"], found["suggestion"], found["cross_check"]["lr"], found["diverged_lr"]
    (0.1, 0.01, 0.001, 1.0)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from smolforge.errors import RecipeError, RunError
from smolforge.svg_plot import Band, Layout, Mark, Series, line_chart, padded

__all__ = ["Sweep", "exponential_lrs", "check_range", "half_window", "smooth", "divergence", "slopes", "suggest",
           "svg_plot", "fmt_lr", "summary", "add_arguments", "command", "STAGE", "RULE", "DIVERGE_FACTOR"]

STAGE = "lr-find"                 # the stage recorded in the sweep's run.json
DIVERGE_FACTOR = 4.0              # stop when the smoothed loss exceeds this x its minimum so far
RULES = {
    "minimum/10": "one tenth of the LR at the smoothed loss's minimum",
    "steepest": "the LR where the smoothed loss falls fastest per decade, before its minimum",
}
RULE = "minimum/10"               # THE suggestion; the other rule is shown as a cross-check


# --------------------------------------------------------------------------- the arithmetic


def exponential_lrs(lr_min: float, lr_max: float, steps: int) -> list[float]:
    """``steps`` learning rates from ``lr_min`` to ``lr_max``, each a constant factor times the last.

    >>> [fmt_lr(lr) for lr in exponential_lrs(1e-4, 1e-1, 4)]
    ['1e-4', '1e-3', '0.01', '0.1']
    >>> exponential_lrs(1e-6, 1.0, 3)[-1]
    1.0
    """
    check_range(lr_min, lr_max, steps)
    ratio = lr_max / lr_min
    lrs = [float(f"{lr_min * ratio ** (i / (steps - 1)):.12g}") for i in range(steps)]  # 0.1, not 0.09999999999999998
    lrs[0], lrs[-1] = lr_min, lr_max
    return lrs


def check_range(lr_min: float, lr_max: float, steps: int) -> None:
    """--min, --max and --steps make a sweep, or a RecipeError says which does not.

    >>> check_range(1e-2, 1e-3, 100)
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: lr-find: --min 0.01 must be below --max 1e-3
    """
    if not (math.isfinite(lr_min) and lr_min > 0):
        raise RecipeError(f"lr-find: --min must be a positive number, got {lr_min}")
    if not (math.isfinite(lr_max) and lr_max > lr_min):
        raise RecipeError(f"lr-find: --min {fmt_lr(lr_min)} must be below --max {fmt_lr(lr_max)}")
    if steps < 3:
        raise RecipeError(f"lr-find: --steps must be at least 3, got {steps}")


def half_window(steps: int) -> int:
    """Steps either side that the smoothed loss averages: ``steps`` / 40, at least 1.

    >>> half_window(25), half_window(100), half_window(400)
    (1, 2, 10)
    """
    return max(1, round(steps / 40))


def smooth(losses: Sequence[float], half: int = 1) -> list[float]:
    """The mean of the losses within ``half`` steps either side, over the finite losses at the start
    (the list ends at the first NaN or inf).

    >>> [round(x, 4) for x in smooth([4, 2, 2, 6], half=1)]   # (4+2)/2, (4+2+2)/3, (2+2+6)/3, (2+6)/2
    [3.0, 2.6667, 3.3333, 4.0]
    >>> smooth([3.0, float("nan"), 1.0], half=1)
    [3.0]
    """
    finite: list[float] = []
    for loss in losses:
        if not math.isfinite(loss):
            break
        finite.append(float(loss))
    out = []
    for i in range(len(finite)):
        window = finite[max(0, i - half): i + half + 1]
        out.append(sum(window) / len(window))
    return out


def divergence(losses: Sequence[float], factor: float = DIVERGE_FACTOR, half: int = 1) -> int | None:
    """The first step (0-based) at which the sweep stops: its loss is not finite, or the smoothed loss
    so far (trailing at that step) exceeds ``factor`` x its minimum so far; None if it never does.

    >>> divergence([5.0, 2.0, 1.0, 2.0, 9.0], half=0)    # 9 > 4 x 1
    4
    >>> divergence([5.0, 2.0, float("inf")], half=0), divergence([5.0, 4.0, 3.0], half=0)
    (2, None)
    """
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            return i
        so_far = smooth(losses[: i + 1], half)
        if so_far[-1] > factor * min(so_far):
            return i
    return None


def slopes(lrs: Sequence[float], values: Sequence[float]) -> list[float]:
    """d(value)/d(log10 LR) at each point: central differences inside, one-sided at the ends.

    >>> slopes([1e-3, 1e-2, 1e-1], [4.0, 3.0, 1.0])       # (3-4)/1, (1-4)/2, (1-3)/1
    [-1.0, -1.5, -2.0]
    """
    x = [math.log10(lr) for lr in lrs[: len(values)]]
    n = len(values)
    if n < 2:
        return [0.0] * n
    out = []
    for i in range(n):
        lo, hi = max(0, i - 1), min(n - 1, i + 1)
        out.append((values[hi] - values[lo]) / (x[hi] - x[lo]))
    return out


def suggest(lrs: Sequence[float], losses: Sequence[float], half: int = 1,
            factor: float = DIVERGE_FACTOR) -> dict[str, Any]:
    """The suggested LR by :data:`RULE`, the other rule's LR as a cross-check, and what they rest on.

    Only the steps up to the divergence (:func:`divergence`) count. Keys: ``suggestion``, ``rule``,
    ``rule_text``, ``cross_check`` ({rule, lr}), ``min_loss_lr``, ``min_loss``, ``steepest_lr``,
    ``diverged_lr`` (None when the sweep never diverged), ``smoothed``, ``note`` (or None).

    A curve whose minimum sits in its first decade: the suggestion is the lowest LR swept, and says so.

    >>> found = suggest(exponential_lrs(1e-3, 1.0, 4), [2.0, 3.0, 9.0, 20.0], half=0)
    >>> found["suggestion"], found["diverged_lr"], found["note"]
    (0.001, 0.1, 'the loss never fell: lower --min')
    """
    stop = divergence(losses, factor, half)
    end = len(losses) if stop is None else stop + 1
    smoothed = smooth(losses[:end], half)
    if len(smoothed) < 3:
        where = f"diverged at LR {fmt_lr(lrs[stop])}" if stop is not None else "recorded"
        raise RunError(f"lr-find: only {len(smoothed)} finite losses before the sweep {where}; "
                       "lower --min or raise --steps")
    i_min = min(range(len(smoothed)), key=smoothed.__getitem__)
    slope = slopes(lrs, smoothed)
    i_steep = min(range(i_min + 1), key=slope.__getitem__)
    steepest_lr = lrs[i_steep] if i_min > 0 and slope[i_steep] < 0 else None
    min_loss_lr = lrs[i_min]
    by_rule = {"minimum/10": min_loss_lr / 10, "steepest": steepest_lr}
    suggestion, note = by_rule[RULE], None
    if i_min == 0:
        suggestion, note = lrs[0], "the loss never fell: lower --min"
    elif suggestion is None or suggestion < lrs[0]:
        suggestion, note = lrs[0], f"the {RULE} rule points below --min: lower --min"
    other = next(rule for rule in RULES if rule != RULE)
    return {"suggestion": suggestion, "rule": RULE, "rule_text": RULES[RULE],
            "cross_check": {"rule": other, "rule_text": RULES[other], "lr": by_rule[other]},
            "min_loss_lr": min_loss_lr, "min_loss": smoothed[i_min], "steepest_lr": steepest_lr,
            "diverged_lr": lrs[stop] if stop is not None else None, "smoothed": smoothed, "note": note}


def fmt_lr(lr: float | None) -> str:
    """A learning rate as people write it.

    >>> fmt_lr(0.0032), fmt_lr(1e-6), fmt_lr(0.02), fmt_lr(1.0), fmt_lr(None)
    ('3.2e-3', '1e-6', '0.02', '1', '-')
    """
    if lr is None:
        return "-"
    lr = float(f"{lr:.2g}")
    if 1e-2 <= abs(lr) < 1e3:
        return f"{lr:.2g}"
    text = f"{lr:.1e}".replace(".0e", "e")
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{int(exponent)}"


# --------------------------------------------------------------------------- the plot

LAYOUT = Layout(width=640, height=340, left=60, right=20, top=30, bottom=44, kind="lr-find", standalone=True,
                legend_col=190, legend_chars=None)
LOSS_COLOR, SMOOTHED_COLOR = "#9db4d0", "#1d3557"


def svg_plot(lrs: Sequence[float], losses: Sequence[float], smoothed: Sequence[float],
             marks: Sequence[tuple[str, float, str]] = (), band: tuple[str, float, float] | None = None,
             title: str = "LR range test") -> str:
    """A standalone SVG: loss and smoothed loss against the LR (log axis), vertical lines at ``marks``
    (label, LR, colour) and a shaded ``band`` (label, low LR, high LR).

    >>> svg = svg_plot([1e-3, 1e-2, 1e-1], [3.0, 2.0, 9.0], [2.5, 4.7, 5.5], marks=[("suggested", 1e-3, "#2a9d8f")])
    >>> svg.startswith("<svg") and svg.count('class="series"') == 2 and svg.count('class="mark"') == 1
    True
    """
    raw = [(lr, loss) for lr, loss in zip(lrs, losses) if math.isfinite(loss)]
    ys = [y for _, y in raw] or [0.0, 1.0]
    top = max(smoothed) if smoothed else max(ys)  # a blow-up past the smoothed curve is clipped at the top
    series = [Series("loss", raw, LOSS_COLOR, width=1.2, markers=False),
              Series("smoothed", list(zip(lrs, smoothed)), SMOOTHED_COLOR, width=2.2, markers=False)]
    return line_chart(title, series, xlabel="learning rate (log scale)", ylabel="loss", log_x=True,
                      x_range=(lrs[0], lrs[-1] if len(lrs) > 1 else lrs[0] * 10),
                      y_range=padded(min(ys), max(top, min(ys) + 1e-6), 0.06),
                      marks=[Mark(*mark) for mark in marks], band=Band(*band) if band else None,
                      x_format=fmt_lr, layout=LAYOUT)


# --------------------------------------------------------------------------- the sweep


class Sweep:
    """One LR range test: the planned LRs, the losses recorded so far, the stop rule, the run folder.

    >>> sweep = Sweep(1e-3, 1.0, steps=4)
    >>> [round(sweep.multiplier(s), 6) for s in range(5)]        # LambdaLR's factor of --min, by step
    [1.0, 10.0, 100.0, 1000.0, 1000.0]
    >>> [sweep.record(lr, loss) for lr, loss in zip(sweep.lrs, [3.0, 2.0, 1.0, float("nan")])]
    [False, False, False, True]
    >>> sweep.stopped
    'loss nan at LR 1'
    """

    def __init__(self, lr_min: float = 1e-6, lr_max: float = 1.0, steps: int = 100,
                 factor: float = DIVERGE_FACTOR) -> None:
        self.lr_min, self.lr_max, self.steps, self.factor = lr_min, lr_max, steps, factor
        self.lrs = exponential_lrs(lr_min, lr_max, steps)
        self.half = half_window(steps)
        self.seen_lrs: list[float] = []
        self.losses: list[float] = []
        self.stopped: str | None = None
        self.result: dict[str, Any] | None = None
        self._run = None

    def multiplier(self, step: int) -> float:
        """The LR of 0-based optimizer step ``step`` as a multiple of ``lr_min`` (a ``LambdaLR`` lambda)."""
        return self.lrs[min(step, self.steps - 1)] / self.lr_min

    def record(self, lr: float, loss: float) -> bool:
        """Note one step's LR (as applied) and loss; True when the sweep should stop here."""
        self.seen_lrs.append(float(lr))
        self.losses.append(float(loss))
        smoothed = smooth(self.losses, self.half)
        finite = len(smoothed) == len(self.losses)
        if self._run is not None:
            self._run.log(len(self.losses), lr=float(lr), loss=_finite(loss), smoothed=smoothed[-1] if finite else None)
        if not finite:
            self.stopped = f"loss {loss} at LR {fmt_lr(lr)}"
            return True
        if smoothed[-1] > self.factor * min(smoothed):
            self.stopped = (f"smoothed loss {smoothed[-1]:.4g} > {self.factor:g}x its minimum {min(smoothed):.4g} "
                            f"at LR {fmt_lr(lr)}")
            return True
        return False

    @contextlib.contextmanager
    def run(self, runs, stage: str, recipe: Any, parents: Sequence[Any]) -> Iterator[Any]:
        """The sweep's run ``lrfind-<recipe name>``: created (replacing an earlier sweep of that name,
        never a run of another stage) and yielded; removed again if the body raises."""
        from smolforge.recipe import to_dict

        name = f"lrfind-{recipe.name}"
        path = runs.root / name
        if runs.exists(name):
            existing = runs.get(name, require_done=False)
            if existing.stage != STAGE:
                raise RunError(f"run '{name}' exists and is a {existing.stage} run, not an lr-find sweep; "
                               "rename one of them")
        settings = {"stage": stage, "min": self.lr_min, "max": self.lr_max, "steps": self.steps,
                    "factor": self.factor, "half_window": self.half}
        fingerprints: dict = {}
        for parent in parents:
            fingerprints.update(parent.info.get("data_fingerprints") or {})
        try:
            with runs.start(STAGE, name, {"stage": stage, **to_dict(recipe), "lr_find": settings}, parents=parents,
                            data_fingerprints=fingerprints, overwrite=True) as run:
                self._run = run
                yield run
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        finally:
            self._run = None

    def finish(self, run, *, stage: str, recipe_name: str, recipe_lr: float | None = None,
               window: dict[str, Any] | None = None) -> dict[str, Any]:
        """Analyse the recorded steps, write ``lr_find.svg`` and ``lr_find.json``, finish the run.

        ``recipe_lr``: the LR the recipe itself trains with. ``window``: a range the stage's practice
        allows (``{"low", "high", "rule", ...}``; SFT: 1/10-1/5 of the lineage's pretraining peak),
        shaded in the plot and kept in the result."""
        from smolforge.runs import atomic_writer, write_json_atomic

        found = suggest(self.seen_lrs, self.losses, self.half, self.factor)
        cross = found["cross_check"]
        marks = [(f"suggested {fmt_lr(found['suggestion'])} ({found['rule']})", found["suggestion"], "#2a9d8f"),
                 (f"{cross['rule']} {fmt_lr(cross['lr'])}", cross["lr"], "#f4a261"),
                 (f"minimum {fmt_lr(found['min_loss_lr'])}", found["min_loss_lr"], "#6c757d"),
                 (f"diverged {fmt_lr(found['diverged_lr'])}", found["diverged_lr"], "#e63946"),
                 (f"recipe's LR {fmt_lr(recipe_lr)}", recipe_lr, "#7b2cbf")]
        marks = [mark for mark in marks if mark[1] is not None]
        band = None
        if window and window.get("low") is not None:
            band = (f"window {fmt_lr(window['low'])}-{fmt_lr(window['high'])}", window["low"], window["high"])
        plot = run.lr_find_plot_path
        with atomic_writer(plot) as fh:
            fh.write(svg_plot(self.seen_lrs, self.losses, found["smoothed"], marks, band,
                              title=f"LR range test: {recipe_name} ({stage})"))
        result = {"run": run.name, "path": str(run.path), "stage": stage, "recipe": recipe_name,
                  "min": self.lr_min, "max": self.lr_max, "steps": self.steps, "steps_run": len(self.losses),
                  "stopped": self.stopped, "lrs": self.seen_lrs, "losses": [_finite(x) for x in self.losses],
                  **found, "recipe_lr": recipe_lr, "plot": str(plot)}
        if window is not None:
            result["window"] = window
        write_json_atomic(run.lr_find_result_path, result)
        metrics = {"lr_find/suggested_lr": found["suggestion"], "lr_find/min_loss_lr": found["min_loss_lr"],
                   "lr_find/steps": len(self.losses)}
        metrics.update({f"lr_find/{key}": found[key] for key in ("steepest_lr", "diverged_lr") if found[key]})
        run.finish(metrics=metrics)
        self.result = result
        return result


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


# --------------------------------------------------------------------------- the command


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
