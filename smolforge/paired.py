"""Paired comparison of two runs scored on the same items: the difference, its noise, and a verdict.

A promotion gate asks "is the new run worse than its reference by more than the tolerance?". On a
suite of n items a score moves by about sqrt(p(1-p)/n) from noise alone (0.048 on 96 items at p = 0.5),
so a point comparison against a tolerance of 0.05 passes or fails on drift. Both runs answer the *same*
items, so the per-item differences d_i = new_i − ref_i carry the comparison: their mean is the change,
and resampling the items (a paired bootstrap) gives its spread, with the items' shared difficulty
cancelled out. The verdict at confidence c, for a metric where higher is better and a tolerance t
(``max_drop``):

- **fail**: the change is below −t with confidence c (the one-sided upper bound of the change < −t);
- **pass**: the change is above −t with confidence c (the one-sided lower bound ≥ −t);
- **inconclusive**: the interval holds −t: the suite cannot tell at this size.

For a metric where lower is better (``max_rise``: attack success) the signs turn: fail when the lower
bound of the change is above +t, pass when the upper bound is at most +t.

    >>> same = [1, 0] * 200                                   # 400 items, no change at all
    >>> compare(same, same, tolerance=0.05, higher_is_better=True).verdict
    'pass'
    >>> worse = [0, 0] * 100 + [1, 0] * 100                   # 200 items: 0.25 against the reference's 0.5
    >>> result = compare(worse, [1, 0] * 200, tolerance=0.05, higher_is_better=True)
    >>> result.verdict, round(result.difference, 3)
    ('fail', -0.25)
    >>> compare([1, 0, 1, 0, 0, 1], [1, 1, 0, 0, 1, 0], tolerance=0.05, higher_is_better=True).verdict
    'inconclusive'
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PairedResult", "compare", "minimum_detectable", "VERDICTS"]

VERDICTS = ("pass", "fail", "inconclusive")
RESAMPLES = 4000


@dataclass(frozen=True)
class PairedResult:
    """The paired comparison of a run against its reference on the same items."""

    verdict: str              # pass | fail | inconclusive
    difference: float         # mean of new − reference over the items
    stderr: float             # standard error of that mean (paired bootstrap)
    low: float                # one-sided lower bound of the difference at the confidence
    high: float               # one-sided upper bound
    items: int                # items both runs answered
    confidence: float
    tolerance: float

    def describe(self) -> str:
        """The interval in words.

        >>> PairedResult("pass", -0.01, 0.012, -0.03, 0.01, 400, 0.95, 0.05).describe()
        'Δ -0.010 ± 0.012 (95 % bounds [-0.030, 0.010], 400 paired items, tolerance 0.050): pass'
        """
        return (f"Δ {self.difference:+.3f} ± {self.stderr:.3f} ({100 * self.confidence:g} % bounds "
                f"[{self.low:+.3f}, {self.high:+.3f}], {self.items} paired items, tolerance "
                f"{self.tolerance:.3f}): {self.verdict}").replace("+", "")

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "difference": round(self.difference, 5), "stderr": round(self.stderr, 5),
                "low": round(self.low, 5), "high": round(self.high, 5), "items": self.items,
                "confidence": self.confidence, "tolerance": self.tolerance}


def compare(new: Sequence[float], reference: Sequence[float], *, tolerance: float, higher_is_better: bool,
            confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = 0) -> PairedResult:
    """The paired verdict of ``new`` against ``reference`` (per-item scores, the same items in the same order)."""
    import numpy as np

    if len(new) != len(reference):
        raise ValueError(f"paired scores need the same items: {len(new)} against {len(reference)}")
    if not new:
        raise ValueError("paired scores need at least one item")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be between 0.5 and 1, got {confidence}")
    diffs = np.asarray(new, dtype=float) - np.asarray(reference, dtype=float)
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    low, high = (float(v) for v in np.quantile(means, [1 - confidence, confidence]))
    mean, stderr = float(diffs.mean()), float(means.std(ddof=1))
    if higher_is_better:
        verdict = "fail" if high < -tolerance else "pass" if low >= -tolerance else "inconclusive"
    else:
        verdict = "fail" if low > tolerance else "pass" if high <= tolerance else "inconclusive"
    return PairedResult(verdict, mean, stderr, low, high, len(diffs), confidence, tolerance)


def minimum_detectable(items: int, *, p: float = 0.5, confidence: float = 0.95) -> float:
    """The smallest change a suite of ``items`` 0/1 items tells from noise at ``confidence`` (one-sided),
    for two runs answering independently at rate ``p``: z·sqrt(2p(1−p)/n). Paired runs that agree on
    most items do better; this is the suite's floor to state on its card.

    >>> round(minimum_detectable(96), 3), round(minimum_detectable(400), 3)
    (0.119, 0.058)
    """
    from statistics import NormalDist

    return NormalDist().inv_cdf(confidence) * math.sqrt(2 * p * (1 - p) / items)
