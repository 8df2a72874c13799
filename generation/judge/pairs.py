"""Judge many rows at once: pairs in both orders (one verdict each, by a rule of :mod:`.verdicts`), single
responses on a rubric. What ``smolforge judge``, judge-assisted review and synthetic data share.

    judge = JudgeEndpoint("http://127.0.0.1:8000/v1", "smollm2-135m")
    judged = judge_pairs(judge, [{"prompt": "2+3?", "response_a": "5", "response_b": "7"}], max_tokens=8)
    judged[0]["verdict"], judged[0]["consistent"], judged[0]["margin"]   # ('A', True, 0.93)
"""
from __future__ import annotations

from .endpoint import JudgeEndpoint
from .prompts import choice_margin, first_probability, pairwise_messages, parse_choice, parse_score, pointwise_messages
from .verdicts import RULES, balanced, combine, combined_margin

__all__ = ["judge_pairs", "judge_points"]


def judge_pairs(judge: JudgeEndpoint, rows: list[dict], *, max_tokens: int, what: str = "pairs",
                rule: str = "agree") -> list[dict]:
    """Each row (``prompt``, ``response_a``, ``response_b``, optional ``reference``) judged in both orders:
    its two readings, whether they agree, the verdict by ``rule`` (``agree`` or ``balanced``), the margin."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    chats = []
    for row in rows:
        chats.append(pairwise_messages(row["prompt"], row["response_a"], row["response_b"], row.get("reference")))
        chats.append(pairwise_messages(row["prompt"], row["response_b"], row["response_a"], row.get("reference")))
    answers = judge.ask(chats, max_tokens=max_tokens, what=what)
    judged = []
    for row, first, second in zip(rows, answers[0::2], answers[1::2]):
        readings = [{"reply": a["reply"], "choice": parse_choice(a["reply"]), "margin": choice_margin(a["top"]),
                     "first_probability": _rounded(first_probability(a["top"]))} for a in (first, second)]
        verdict = combine(readings[0]["choice"], readings[1]["choice"])
        if rule == "balanced":
            verdict |= balanced(readings[0]["first_probability"], readings[1]["first_probability"])
        else:
            verdict["margin"] = combined_margin(readings[0]["margin"], readings[1]["margin"], verdict["consistent"])
        judged.append({**row, "orders": readings, **verdict})
    return judged


def judge_points(judge: JudgeEndpoint, rows: list[dict], rubric, *, max_tokens: int) -> list[dict]:
    """Each response graded on ``rubric``: the score (None when unreadable) and the judge's reason."""
    chats = [pointwise_messages(r["prompt"], r["response"], rubric, r.get("reference")) for r in rows]
    judged = []
    for row, answer in zip(rows, judge.ask(chats, max_tokens=max_tokens, what="responses")):
        score, reason = parse_score(answer["reply"], rubric)
        judged.append({**row, "reply": answer["reply"], "score": score, "reason": reason})
    return judged


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
