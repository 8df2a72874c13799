"""Verifiers: score a completion against a known answer, with no model. Used by RL rewards and by
scripted annotators alike, so they live below both.

Every verifier has TRL's reward signature ``fn(prompts, completions, **columns) -> list[float | None]``:
dataset columns arrive as keyword lists (``answer=[...]``), and a completion is a string or, for
conversational data, ``[{"role": "assistant", "content": "..."}]``. ``None`` means "does not
apply to this sample".

    >>> prompts = [[{"role": "user", "content": "Add 3 and 4."}]] * 3
    >>> completions = [[{"role": "assistant", "content": "3 plus 4 is 7."}],
    ...                [{"role": "assistant", "content": "It is 7"}],
    ...                [{"role": "assistant", "content": "3 plus 4 is 8."}]]
    >>> answer_match(prompts, completions, answer=["3 plus 4 is 7."] * 3)
    [1.0, 0.5, 0.0]
    >>> arith_verifier(prompts, completions)
    [1.0, 1.0, 0.0]
    >>> math_match(["Half of 3?"] * 3, [r"So it is $\\boxed{\\frac{3}{2}}$.", "#### 1.5", "About 2."],
    ...            answer=[r"\\frac{3}{2}"] * 3)
    [1.0, 0.0, 0.0]
"""
from __future__ import annotations

import re
from typing import Any

from smolforge.errors import DataError

__all__ = ["answer_match", "arith_verifier", "completion_text", "final_answer", "math_match", "prompt_text"]

_TRAILING = ".!?,;: \t\n"
_SUM = re.compile(r"(-?\d+)\s*(?:and|plus|\+)\s*(-?\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+")
_DECIMAL = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


# --------------------------------------------------------------------------- text of a sample


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, a message, or a list of messages (their contents joined).

    >>> completion_text([{"role": "assistant", "content": "Hi."}]), completion_text(None)
    ('Hi.', '')
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        return "\n".join(completion_text(m) for m in completion if m is not None)
    return str(completion)


def prompt_text(prompt: Any) -> str:
    """The text of a prompt: a string, or the last user message of a conversation.

    >>> prompt_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 1 and 2."}])
    'Add 1 and 2.'
    """
    if isinstance(prompt, (list, tuple)):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return completion_text((users or list(prompt))[-1:])
    return completion_text(prompt)


def _normalise(text: str) -> str:
    """Lower case, single spaces, no trailing punctuation: ``' The Sum IS 7 .'`` → ``'the sum is 7'``."""
    return " ".join(text.lower().split()).rstrip(_TRAILING)


def _last_word(text: str) -> str:
    words = _normalise(text).split()
    return words[-1].strip("\"'()[]{}.,;:!?") if words else ""


# --------------------------------------------------------------------------- verifiers


def answer_match(prompts: list, completions: list, answer: list[str] | None = None, **kwargs) -> list[float]:
    """1.0 when the completion states the answer, 0.5 when it ends with the answer's key value, else 0.

    Both sides are normalised (case, whitespace, trailing punctuation). "States the answer": the
    completion equals the answer or ends with it ("Sure, 3 plus 4 is 7."). The key value is the
    answer's last word (the sum, or the colour/town/food); partial credit needs it as the
    completion's *last* word, so "3 plus 7 is 10" earns nothing for "3 plus 4 is 7" and listing
    every candidate earns no more than naming one. Empty or None completions score 0.
    """
    if answer is None:
        raise DataError("answer_match needs an 'answer' column (prompt rows with answers, e.g. a data "
                        "run's prompts); use arith_verifier or a reward model for prompts without one")
    if len(answer) != len(completions):
        raise DataError(f"answer_match got {len(answer)} answers for {len(completions)} completions")
    scores = []
    for completion, expected in zip(completions, answer):
        text, gold = _normalise(completion_text(completion)), _normalise(expected or "")
        if not text or not gold:
            scores.append(0.0)
        elif text == gold or text.endswith(" " + gold):
            scores.append(1.0)
        elif _last_word(text) == _last_word(gold):
            scores.append(0.5)
        else:
            scores.append(0.0)
    return scores


def arith_verifier(prompts: list, completions: list, **kwargs) -> list[float | None]:
    """1.0 when the completion's last number is a+b for the sum the prompt asks ("a and b", "a plus b",
    "a + b"), else 0.0; None for a prompt that asks no sum (TRL leaves it out of the total).

    Needs no stored answer: it recomputes the sum from the prompt.

    >>> arith_verifier(["Add 2 and 9.", "Where does Kalo live?"], ["That makes 11", "Kesh"])
    [1.0, None]
    """
    scores: list[float | None] = []
    for prompt, completion in zip(prompts, completions):
        found = _SUM.search(prompt_text(prompt))
        if found is None:
            scores.append(None)
            continue
        numbers = _NUMBER.findall(completion_text(completion))
        expected = int(found.group(1)) + int(found.group(2))
        scores.append(1.0 if numbers and int(numbers[-1]) == expected else 0.0)
    return scores


def final_answer(text: str) -> str:
    """The answer a worked solution ends on: its last ``\\boxed{…}`` (nested braces kept), else what
    follows its last ``####`` (GSM8K), else its last number; ``''`` when it states none.

    >>> final_answer(r"x = \\boxed{\\frac{1}{2}}"), final_answer("3 + 4 = 7\\n#### 7"), final_answer("It is 1,234 cm.")
    ('\\\\frac{1}{2}', '7', '1,234')
    """
    boxed = None
    for match in _BOXED.finditer(text):        # the data layer's MATH shape reads boxes the same way
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            boxed = text[match.end():i - 1]
    if boxed is not None:
        return boxed.strip()
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else ""
    numbers = _DECIMAL.findall(text)
    return numbers[-1] if numbers else ""


def _canonical(answer: str) -> str:
    """``'$1,234.$'`` → ``'1234'``; ``'\\dfrac{1}{2}'`` → ``'\\frac{1}{2}'``: spacing, dollars and
    ``\\left``/``\\right`` dropped, thousands commas and a trailing full stop too."""
    text = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    text = "".join(text.replace("$", "").replace("\\!", "").split()).rstrip(".")
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)


def math_match(prompts: list, completions: list, answer: list[str] | None = None, **kwargs) -> list[float]:
    """1.0 when the completion's :func:`final_answer` equals the row's ``answer``, else 0.0: the reward
    for GSM8K- and MATH-style prompt rows (``answer`` = ``"72"``, ``"\\frac{3}{2}"``).

    Compared as numbers when both read as one (``1,234`` = ``1234.0``), else as text without spacing,
    dollars or ``\\left``/``\\right``.
    """
    if answer is None:
        raise DataError("math_match needs an 'answer' column (prompt rows with answers, e.g. GSM8K or MATH "
                        "rows read by the data layer's gsm8k/math shapes)")
    if len(answer) != len(completions):
        raise DataError(f"math_match got {len(answer)} answers for {len(completions)} completions")
    scores = []
    for completion, expected in zip(completions, answer):
        found, gold = _canonical(final_answer(completion_text(completion))), _canonical(str(expected or ""))
        if not found or not gold:
            scores.append(0.0)
            continue
        try:
            same = abs(float(found) - float(gold)) <= 1e-9 * max(1.0, abs(float(gold)))
        except ValueError:
            same = found == gold
        scores.append(1.0 if same else 0.0)
    return scores
