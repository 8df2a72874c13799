"""Both orders of a pair → one verdict, and the figures over many: agreement with known answers, and
how often the judge changes its mind when the responses swap places (position bias).

A pair is judged twice: (x, y) and (y, x). Read back in the first order, the two choices agree or they
do not. Two rules turn them into a verdict (``"A"``: the first response, ``"B"``: the second, ``"T"``:
a tie):

- ``agree`` (the default): only an agreeing pair gets a verdict; one whose two readings differ (or cannot
  be read) has none: it is *unsure*.
- ``balanced``: the probability that x wins, averaged over both orders (P(A) in the first, P(B) in the
  second, from the first token's log-probs), decides, and the margin is how far that average is from
  one half. A judge that always answers "A" still separates pairs this way where it leans harder to A
  for the better response shown first (balanced position calibration, Wang et al. 2023, "Large
  Language Models are not Fair Evaluators"). Without log-probs, or with no lean at all, a pair is
  unsure (this rule never gives a tie).

    >>> combine("A", "B")                  # x first: A; y first: B (= x again)
    {'verdict': 'A', 'consistent': True}
    >>> combine("A", "A")                  # whichever came first won: position, not content
    {'verdict': None, 'consistent': False}
    >>> balanced(0.9, 0.8)                 # leans to x first (0.9), a bit less to y first (0.8)
    {'verdict': 'A', 'margin': 0.1}
    >>> balanced(0.9, None)
    {'verdict': None, 'margin': None}
    >>> rows = [{"verdict": "A", "consistent": True, "label": "A"}, {"verdict": None, "consistent": False, "label": "A"},
    ...         {"verdict": "B", "consistent": True, "label": "A"}, {"verdict": "A", "consistent": True}]
    >>> summarise(rows)
    {'pairs': 4, 'verdicts': 3, 'position_bias': 0.25, 'first_wins': 0.5, 'second_wins': 0.25, 'ties': 0.0, 'labelled': 3, 'label_agreement': 0.333}
"""
from __future__ import annotations

from .prompts import swap

__all__ = ["RULES", "combine", "combined_margin", "balanced", "summarise"]

RULES = ("agree", "balanced")


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


def balanced(first: float | None, second: float | None) -> dict:
    """The verdict and margin of the ``balanced`` rule from P(first shown wins) in each order (None: unread)."""
    if first is None or second is None:
        return {"verdict": None, "margin": None}
    x_wins = (first + (1.0 - second)) / 2
    if x_wins == 0.5:        # no lean either way: the judge did not say "tie", it said nothing
        return {"verdict": None, "margin": 0.0}
    return {"verdict": "A" if x_wins > 0.5 else "B", "margin": round(abs(2 * x_wins - 1), 3)}


def summarise(rows: list[dict]) -> dict:
    """Counts and rates over judged pairs (``label``, where a row has one: the known better response)."""
    pairs = len(rows)
    decided = [r for r in rows if r["verdict"] is not None]
    labelled = [r for r in rows if r.get("label")]
    share = (lambda n: round(n / pairs, 3)) if pairs else (lambda n: 0.0)
    return {"pairs": pairs, "verdicts": len(decided), "position_bias": share(sum(not r["consistent"] for r in rows)),
            "first_wins": share(sum(r["verdict"] == "A" for r in decided)),
            "second_wins": share(sum(r["verdict"] == "B" for r in decided)),
            "ties": share(sum(r["verdict"] == "T" for r in decided)),
            "labelled": len(labelled),
            "label_agreement": round(sum(r["verdict"] == r["label"] for r in labelled) / len(labelled), 3)
            if labelled else None}
