"""What the judge is asked and how its answers are read: pairwise (A, B or tie) and pointwise (a score on a
rubric's scale, with the judge's reason), each optionally guided by a reference answer.

    >>> messages = pairwise_messages("What is 2 + 3?", "5", "7")
    >>> [m["role"] for m in messages], messages[-1]["content"].splitlines()[-1]
    (['system', 'user'], 'Which response is better? Answer with one letter: A, B, or T for a tie.')
    >>> parse_choice("B"), parse_choice("Response A is better."), parse_choice("T"), parse_choice("I cannot say")
    ('B', 'A', 'T', None)
    >>> choice_margin({"A": -0.1, "B": -2.5, "The": -3.0})      # P(A) vs P(B) among the first token's options
    0.834
    >>> rubric = Rubric(name="helpful", scale=(1, 5), criteria="5: answers fully; 1: does not answer.")
    >>> parse_score("Score: 4\\nReason: mostly right.", rubric)
    (4, 'mostly right.')
    >>> parse_score("Score: 9", rubric)
    (None, 'Score: 9')
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from smolforge.errors import RecipeError

__all__ = ["CHOICES", "Rubric", "load_rubric", "render", "pairwise_messages", "pointwise_messages", "parse_choice",
           "first_probability", "choice_margin", "parse_score", "swap"]

CHOICES = ("A", "B", "T")   # the first response, the second, a tie

PAIRWISE_SYSTEM = ("You are a fair and careful judge. You compare two responses to the same request and say which "
                   "one is more helpful, correct and honest. The order of the responses must not matter.")
POINTWISE_SYSTEM = "You are a fair and careful judge. You grade one response to a request on the scale you are given."


@dataclass(frozen=True)
class Rubric:
    """A pointwise rubric: its name, the score range and the criteria the judge reads."""

    name: str
    scale: tuple[int, int]
    criteria: str

    @property
    def sha256(self) -> str:
        text = f"{self.name}\n{self.scale[0]}-{self.scale[1]}\n{self.criteria}"
        return hashlib.sha256(text.encode()).hexdigest()


def load_rubric(path: str | Path) -> Rubric:
    """A rubric YAML file: ``name``, ``scale: [low, high]`` and ``criteria`` (text); a RecipeError naming the
    file and the field otherwise."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"rubric: file '{path}' not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise RecipeError(f"rubric {path}: not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"rubric {path}: expected a mapping with name, scale and criteria")
    scale = data.get("scale")
    if not (isinstance(scale, list) and len(scale) == 2 and all(isinstance(v, int) for v in scale)
            and scale[0] < scale[1]):
        raise RecipeError(f"rubric {path}: field 'scale' must be [low, high] with integers low < high, got {scale!r}")
    criteria = data.get("criteria")
    if not isinstance(criteria, str) or not criteria.strip():
        raise RecipeError(f"rubric {path}: field 'criteria' must be non-empty text")
    return Rubric(name=str(data.get("name") or path.stem), scale=(scale[0], scale[1]), criteria=criteria.strip())


def render(conversation: str | list[dict]) -> str:
    """A prompt or response as plain text: a string as it is, a conversation as ``role: content`` lines."""
    if isinstance(conversation, str):
        return conversation
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in conversation)


def pairwise_messages(prompt: str | list[dict], first: str, second: str, reference: str | None = None) -> list[dict]:
    """The chat the judge answers for one order of a pair (``first`` is shown as Response A)."""
    parts = [f"[Request]\n{render(prompt)}"]
    if reference is not None:
        parts.append(f"[Reference answer]\n{reference}")
    parts += [f"[Response A]\n{first}", f"[Response B]\n{second}",
              "Which response is better? Answer with one letter: A, B, or T for a tie."]
    return [{"role": "system", "content": PAIRWISE_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def pointwise_messages(prompt: str | list[dict], response: str, rubric: Rubric,
                       reference: str | None = None) -> list[dict]:
    """The chat the judge answers to grade one response on ``rubric``."""
    low, high = rubric.scale
    parts = [f"[Criteria: {rubric.name}]\n{rubric.criteria}", f"[Request]\n{render(prompt)}"]
    if reference is not None:
        parts.append(f"[Reference answer]\n{reference}")
    parts += [f"[Response]\n{response}",
              f"Grade the response from {low} to {high}. Reply as 'Score: N' on the first line, then 'Reason: ...'."]
    return [{"role": "system", "content": POINTWISE_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


_CHOICE = re.compile(r"\b(A|B|T|tie)\b", re.IGNORECASE)


def parse_choice(reply: str) -> str | None:
    """A, B or T from the judge's reply (its first standalone A, B, T or "tie"), else None."""
    match = _CHOICE.search(reply.strip())
    if match is None:
        return None
    word = match.group(1).upper()
    return "T" if word == "TIE" else word


def choice_margin(top: dict[str, float] | None) -> float | None:
    """How sure the judge was: |P(A) - P(B)| / (P(A) + P(B)) over its first token's top log-probs (tokens
    compared without spaces and case), rounded to 3 places; None where neither letter is among them."""
    first = first_probability(top)
    return None if first is None else round(abs(2 * first - 1), 3)


def first_probability(top: dict[str, float] | None) -> float | None:
    """P(A) / (P(A) + P(B)) over the first token's top log-probs (tokens compared without spaces and case):
    how strongly the judge leans to the response shown first; None where neither letter is among them.
    A letter missing from the top log-probs is at most as likely as the least likely one listed, which
    stands in for it (so one order's reading is never a certain 1 or 0 just because the list is short).

    >>> round(first_probability({"A": math.log(0.6), " B": math.log(0.2), "The": -0.1}), 3)
    0.75
    >>> round(first_probability({"A": math.log(0.9), "The": math.log(0.05)}), 3)   # B below 0.05
    0.947
    >>> first_probability({"The": -0.1}) is None
    True
    """
    if not top:
        return None
    prob = {"A": 0.0, "B": 0.0}
    for token, logprob in top.items():
        letter = token.strip().upper()
        if letter in prob:
            prob[letter] += math.exp(logprob)
    if prob["A"] + prob["B"] == 0:
        return None
    floor = math.exp(min(top.values()))
    prob = {letter: p or floor for letter, p in prob.items()}
    return prob["A"] / (prob["A"] + prob["B"])


def swap(choice: str | None) -> str | None:
    """A choice read in the other order (A ↔ B; T and None stay)."""
    return {"A": "B", "B": "A"}.get(choice, choice) if choice else choice


_SCORE = re.compile(r"score\s*[:=]?\s*(-?\d+)", re.IGNORECASE)
_REASON = re.compile(r"reason\s*[:=]\s*(.*)", re.IGNORECASE | re.DOTALL)


def parse_score(reply: str, rubric: Rubric) -> tuple[int | None, str]:
    """(the score, the reason) from a pointwise reply: ``Score: N`` (else the first integer), within the
    rubric's scale, else None; the reason is the text after ``Reason:`` (else the whole reply)."""
    match = _SCORE.search(reply) or re.search(r"(-?\d+)", reply)
    score = int(match.group(1)) if match else None
    if score is not None and not rubric.scale[0] <= score <= rubric.scale[1]:
        score = None
    reason = _REASON.search(reply)
    return score, (reason.group(1).strip() if reason else reply.strip())
