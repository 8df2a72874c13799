"""Inter-annotator agreement: Cohen's kappa for two annotators, Krippendorff's alpha for any number.

Both take missing answers: Cohen's kappa uses the items both annotators answered; Krippendorff's
alpha takes reliability data as ``{unit: {coder: value}}`` (or rows of values with ``None`` for
"not answered") and ignores units with fewer than two answers, as his method prescribes.

Undefined cases return ``None`` instead of a number (and never NaN, which JSON cannot hold):

- no item (kappa) or no pairable unit (alpha);
- no variation at all: every answer is the same category, so chance agreement is already perfect
  and the statistic is 0/0. Perfect agreement *with* variation gives exactly 1.0.

Cohen's 2x2 textbook table (20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no: p_o = 0.7, p_e = 0.5):

    >>> a = ["y"] * 25 + ["n"] * 25
    >>> b = ["y"] * 20 + ["n"] * 5 + ["y"] * 10 + ["n"] * 15
    >>> round(cohen_kappa(a, b), 3)
    0.4
    >>> cohen_kappa(["x", "x"], ["x", "x"]) is None   # one category only: undefined
    True

Krippendorff's own 2-coder binary example (alpha = 0.095):

    >>> round(krippendorff_alpha([[0, 1, 0, 0, 0, 0, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]]), 3)
    0.095
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping, Sequence
from itertools import permutations
from typing import Literal

__all__ = ["cohen_kappa", "krippendorff_alpha", "coincidences", "Level", "ReliabilityData"]

Level = Literal["nominal", "ordinal", "interval"]


def cohen_kappa(a: Sequence[Hashable | None], b: Sequence[Hashable | None]) -> float | None:
    """Cohen's kappa of two annotators' labels for the same items (``None`` = not answered).

    Items either annotator left unanswered are skipped. ``None`` when no item is left or when
    chance agreement is 1 (both used one and the same category throughout).

    >>> cohen_kappa(["A", "B", None], ["A", "B", "A"])
    1.0
    >>> round(cohen_kappa(["A", "A", "B", "B"], ["A", "B", "A", "B"]), 3)
    0.0
    """
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa needs two equally long label lists, got {len(a)} and {len(b)}")
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if not pairs:
        return None
    n = len(pairs)
    observed = sum(x == y for x, y in pairs) / n
    left, right = Counter(x for x, _ in pairs), Counter(y for _, y in pairs)
    expected = sum(left[c] * right[c] for c in left) / (n * n)
    if expected == 1.0:
        return None
    return (observed - expected) / (1.0 - expected)


ReliabilityData = Mapping[Hashable, Mapping[Hashable, Hashable | None]] | Sequence[Sequence[Hashable | None]]


def _units(data: ReliabilityData) -> list[list[Hashable]]:
    """The answered values of each unit, from ``{unit: {coder: value}}`` or coder rows."""
    if isinstance(data, Mapping):
        return [[v for v in by_coder.values() if v is not None] for by_coder in data.values()]
    rows = [list(row) for row in data]
    if len({len(row) for row in rows}) > 1:
        raise ValueError("krippendorff_alpha: every coder row must have one entry per unit (None when missing)")
    return [[row[u] for row in rows if row[u] is not None] for u in range(len(rows[0]) if rows else 0)]


def coincidences(units: list[list[Hashable]]) -> dict[tuple[Hashable, Hashable], float]:
    """Krippendorff's coincidence matrix ``o[c, k]``: each ordered pair of values from different
    coders in a unit with ``m`` answers adds ``1 / (m - 1)``; units with one answer add nothing.

    >>> coincidences([["a", "a"], ["a", "b"], ["b"]])
    {('a', 'a'): 2.0, ('a', 'b'): 1.0, ('b', 'a'): 1.0}
    """
    matrix: dict[tuple[Hashable, Hashable], float] = defaultdict(float)
    for values in units:
        m = len(values)
        if m < 2:
            continue
        for c, k in permutations(values, 2):
            matrix[(c, k)] += 1.0 / (m - 1)
    return dict(matrix)


def _distance(level: Level, totals: dict[Hashable, float], order: list[Hashable]):
    if level == "nominal":
        return lambda c, k: 0.0 if c == k else 1.0
    if level == "interval":
        return lambda c, k: float(c - k) ** 2
    if level == "ordinal":
        position = {v: i for i, v in enumerate(order)}

        def ordinal(c, k):
            lo, hi = sorted((position[c], position[k]))
            between = sum(totals[order[g]] for g in range(lo, hi + 1))
            return (between - (totals[c] + totals[k]) / 2.0) ** 2
        return ordinal
    raise ValueError(f"unknown level {level!r} (expected nominal, ordinal or interval)")


def krippendorff_alpha(data: ReliabilityData, level: Level = "nominal") -> float | None:
    """Krippendorff's alpha for any number of coders with missing values.

    ``data`` is ``{unit: {coder: value}}`` or one row per coder with one entry per unit (``None``
    when that coder did not answer). ``level``: ``nominal`` (labels), ``ordinal`` (ranks, ratings:
    values must sort) or ``interval`` (numbers). ``None`` when no unit has two answers or every
    pairable answer is the same value.

    >>> krippendorff_alpha({"r1": {"ann": "A", "bob": "A"}, "r2": {"ann": "B", "bob": "B"}})
    1.0
    >>> krippendorff_alpha({"r1": {"ann": "A", "bob": "A"}, "r2": {"ann": "A"}}) is None
    True
    """
    matrix = coincidences(_units(data))
    totals: dict[Hashable, float] = defaultdict(float)
    for (c, _), weight in matrix.items():
        totals[c] += weight
    n = sum(totals.values())
    if n <= 1:
        return None
    order = sorted(totals)
    delta = _distance(level, totals, order)
    observed = sum(weight * delta(c, k) for (c, k), weight in matrix.items())
    expected = sum(totals[c] * totals[k] * delta(c, k) for c in order for k in order)
    if expected == 0.0:
        return None
    return 1.0 - (n - 1) * observed / expected
