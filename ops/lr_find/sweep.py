"""One LR range test as it runs: the LRs it plans, the losses it records, when it stops, its run folder.

The sweep is a run, ``lrfind-<recipe name>`` (stage ``lr-find``; parents: the stage's inputs):
``lr_find.svg`` (the plot), ``lr_find.json`` (what ``--json`` prints), ``metrics.jsonl`` (LR and loss
per step). Each sweep replaces the previous one of that name; a sweep that fails leaves nothing.
"""
from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

from smolforge.errors import RunError

from .arithmetic import DIVERGE_FACTOR, exponential_lrs, fmt_lr, half_window, smooth, suggest
from .plot import svg_plot

__all__ = ["Sweep", "STAGE"]

STAGE = "lr-find"                 # the stage recorded in the sweep's run.json


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
