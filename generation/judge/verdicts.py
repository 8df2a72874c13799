"""Both orders of a pair → one verdict, and the figures over many: agreement with known answers, and
how often the judge changes its mind when the responses swap places (position bias).

A pair is judged twice: (x, y) and (y, x). Read back in the first order, the two choices agree or they
do not; only an agreeing pair gets a verdict (``"A"``: the first response, ``"B"``: the second, ``"T"``:
a tie). A pair whose two readings differ (or cannot be read) has none: it is *unsure*.

    >>> combine("A", "B")                  # x first: A; y first: B (= x again)
    {'verdict': 'A', 'consistent': True}
    >>> combine("A", "A")                  # whichever came first won: position, not content
    {'verdict': None, 'consistent': False}
    >>> rows = [{"verdict": "A", "consistent": True, "label": "A"}, {"verdict": None, "consistent": False, "label": "A"},
    ...         {"verdict": "B", "consistent": True, "label": "A"}, {"verdict": "A", "consistent": True}]
    >>> summarise(rows)
    {'pairs': 4, 'verdicts': 3, 'position_bias': 0.25, 'first_wins': 0.5, 'second_wins': 0.25, 'ties': 0.0, 'labelled': 3, 'label_agreement': 0.333}
"""
from __future__ import annotations

from .prompts import swap

__all__ = ["combine", "combined_margin", "summarise"]


def combine(first: str | None, second: str | None) -> dict:
    """The verdict of a pair from its two readings (``second`` as the judge gave it, in the swapped order)."""
    back = swap(second)
    consistent = first is not None and first == back
    return {"verdict": first if consistent else None, "consistent": consistent}


def combined_margin(first: float | None, second: float | None, consistent: bool) -> float | None:
    """The pair's confidence: the mean of both orders' margins where they agree (None without log-probs)."""
    if not consistent or first is None or second is None:
        return None
    return round((first + second) / 2, 3)


def summarise(rows: list[dict]) -> dict:
    """Counts and rates over judged pairs (``label``, where a row has one: the known better response)."""
    pairs = len(rows)
    decided = [r for r in rows if r["consistent"]]
    labelled = [r for r in rows if r.get("label")]
    share = (lambda n: round(n / pairs, 3)) if pairs else (lambda n: 0.0)
    return {"pairs": pairs, "verdicts": len(decided), "position_bias": share(pairs - len(decided)),
            "first_wins": share(sum(r["verdict"] == "A" for r in decided)),
            "second_wins": share(sum(r["verdict"] == "B" for r in decided)),
            "ties": share(sum(r["verdict"] == "T" for r in decided)),
            "labelled": len(labelled),
            "label_agreement": round(sum(r["verdict"] == r["label"] for r in labelled) / len(labelled), 3)
            if labelled else None}
