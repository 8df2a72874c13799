"""The LR range test's arithmetic: the planned LRs, the smoothed loss, the stop rule, the suggestion.

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

    >>> lrs = exponential_lrs(1e-4, 1.0, 5)
    >>> losses = [5.0, 4.0, 2.0, 1.5, 30.0]          # falls, bottoms at 0.1, blows up at 1
    >>> found = suggest(lrs, losses, half=0)         # half=0: no smoothing, to follow by hand
    >>> found["min_loss_lr"], found["suggestion"], found["cross_check"]["lr"], found["diverged_lr"]
    (0.1, 0.01, 0.001, 1.0)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from smolforge.errors import RecipeError, RunError

__all__ = ["exponential_lrs", "check_range", "half_window", "smooth", "divergence", "slopes", "suggest", "fmt_lr",
           "RULE", "RULES", "DIVERGE_FACTOR"]

DIVERGE_FACTOR = 4.0              # stop when the smoothed loss exceeds this x its minimum so far
RULES = {
    "minimum/10": "one tenth of the LR at the smoothed loss's minimum",
    "steepest": "the LR where the smoothed loss falls fastest per decade, before its minimum",
}
RULE = "minimum/10"               # THE suggestion; the other rule is shown as a cross-check


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
