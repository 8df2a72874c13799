"""An ablation's arithmetic: a variant's scores against the baseline's, seed by seed, and a verdict
only where the difference exceeds the noise.

Per task, each side (baseline, variant) has one final score per seed. The difference is
``mean(variant) - mean(baseline)``; its noise is the standard error of that difference,
``sqrt(sd_b² / n_b + sd_v² / n_v)`` with ``sd`` the across-seed standard deviation (ddof=1), so the
spread of the seeds, not of a single eval, decides. The verdict is ``better`` or ``worse`` (in the
task's own direction: accuracy up, perplexity down) when ``|difference| > factor x noise`` (factor 2:
about a 95 % two-sided interval), ``within noise`` otherwise, and ``no verdict`` when a side has
fewer than two seeds (its spread is unknown).

    >>> row = compare([0.50, 0.52, 0.51], [0.60, 0.61, 0.59])
    >>> round(row["difference"], 3), round(row["noise"], 4), row["verdict"]
    (0.09, 0.0082, 'better')
    >>> compare([0.50, 0.52, 0.51], [0.51, 0.50, 0.53])["verdict"]
    'within noise'
    >>> compare([8.0, 8.1], [7.0, 7.1], higher_is_better=False)["verdict"]    # perplexity fell
    'better'
    >>> compare([0.5], [0.7])["verdict"]
    'no verdict'
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["NOISE_FACTOR", "mean", "stdev", "compare", "RULE"]

NOISE_FACTOR = 2.0
RULE = ("|difference| > {factor:g} x noise, noise = sqrt(sd_b^2/n_b + sd_v^2/n_v) "
        "(the standard error of the difference of the seed means)")


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean.

    >>> mean([1.0, 2.0, 4.0])
    2.3333333333333335
    """
    return sum(values) / len(values)


def stdev(values: Sequence[float]) -> float | None:
    """The sample standard deviation (ddof=1); None below two values.

    >>> round(stdev([0.50, 0.52, 0.51]), 4), stdev([0.5])
    (0.01, None)
    """
    if len(values) < 2:
        return None
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def compare(baseline: Sequence[float], variant: Sequence[float], *, higher_is_better: bool = True,
            factor: float = NOISE_FACTOR) -> dict[str, Any]:
    """One task's comparison of a variant's seed scores with the baseline's (see the module docstring)."""
    if not baseline or not variant:
        raise ValueError("compare needs at least one score on each side")
    sd_b, sd_v = stdev(baseline), stdev(variant)
    difference = mean(variant) - mean(baseline)
    row: dict[str, Any] = {"baseline_mean": mean(baseline), "baseline_sd": sd_b, "variant_mean": mean(variant),
                           "variant_sd": sd_v, "n_baseline": len(baseline), "n_variant": len(variant),
                           "difference": difference, "noise": None, "ratio": None}
    if sd_b is None or sd_v is None:
        row["verdict"] = "no verdict"
        return row
    noise = math.sqrt(sd_b ** 2 / len(baseline) + sd_v ** 2 / len(variant))
    row["noise"] = noise
    row["ratio"] = abs(difference) / noise if noise > 0 else (math.inf if difference else 0.0)
    if row["ratio"] > factor:
        improved = difference > 0 if higher_is_better else difference < 0
        row["verdict"] = "better" if improved else "worse"
    else:
        row["verdict"] = "within noise"
    return row
