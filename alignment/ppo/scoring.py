"""Step 2 of PPO: one score per sampled completion, from the reward functions and whether it ended.

The score is Σ weight·reward over the recipe's reward functions (TRL's call convention, None =
"does not apply" adds nothing), minus ``missing_eos_penalty`` when the completion never reached
an end token. Plain Python on token ids and texts; no torch, so :mod:`smolforge.alignment.ppo.stage`
imports it at the top and its ``validate`` probes the rewards without loading a model.

    >>> class Tok: eos_token_id = 2
    >>> rows = [{"prompt": "Add 1 and 2.", "answer": "3"}] * 2
    >>> def exact(prompts, completions, answer, **kw):
    ...     return [float(c == a) for c, a in zip(completions, answer)]
    >>> score(rows, ["3", "3"], [[9, 2], [9, 9]], [exact], None, Tok(), missing_eos_penalty=0.5)
    Scores(total=[1.0, 0.5], ended=[True, False], means={'exact': 1.0})
"""
from __future__ import annotations

from typing import NamedTuple

from smolforge.errors import RecipeError
from smolforge.generation.prompts import eos_ids

__all__ = ["Scores", "as_completions", "score_completions", "ended", "score"]


class Scores(NamedTuple):
    total: list[float]                # Σ weight·reward, minus missing_eos_penalty where not ended
    ended: list[bool]                 # the completion's last token is an end token
    means: dict[str, float]           # each reward function's mean over the completions it applies to


def as_completions(rows: list[dict], texts: list[str]) -> list:
    """TRL's completion format: assistant messages for conversational prompts, else the text."""
    return [[{"role": "assistant", "content": text}] if isinstance(row["prompt"], list) else text
            for row, text in zip(rows, texts)]


def score_completions(reward_fns: list, weights: list | None, rows: list[dict], texts: list[str],
                      completion_ids: list[list[int]]) -> tuple[list[float], dict[str, float]]:
    """(score per completion, mean of each reward function) with TRL's call convention.

    Each function gets ``prompts=``, ``completions=``, ``completion_ids=`` and every other column
    of the rows as a keyword list; the score is Σ weight·reward over the functions that apply
    (None = not applicable).

        >>> rows = [{"prompt": "Add 1 and 2.", "answer": "3"}, {"prompt": "Add 2 and 2.", "answer": "4"}]
        >>> def exact(prompts, completions, answer, **kw):
        ...     return [float(c == a) for c, a in zip(completions, answer)]
        >>> score_completions([exact], [2.0], rows, ["3", "5"], [[], []])
        ([2.0, 0.0], {'exact': 0.5})
    """
    weights = weights or [1.0] * len(reward_fns)
    prompts = [row["prompt"] for row in rows]
    completions = as_completions(rows, texts)
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if k != "prompt"]
    columns = {k: [row.get(k) for row in rows] for k in keys}
    scores = [0.0] * len(rows)
    means = {}
    for fn, weight in zip(reward_fns, weights):
        name = getattr(fn, "__name__", repr(fn))
        values = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        if len(values) != len(rows):  # checked() says so first; a bare callable gets the same message
            raise RecipeError(f"reward function '{name}' returned {len(values)} values for {len(rows)} completions")
        applied = [float(v) for v in values if v is not None]
        means[name] = sum(applied) / len(applied) if applied else float("nan")
        for i, value in enumerate(values):
            if value is not None:
                scores[i] += float(weight) * float(value)
    return scores, means


def ended(completion_ids: list[list[int]], tokenizer, policy=None) -> list[bool]:
    """Whether each completion stopped at an end token (an empty one has not).

    The end tokens are those the samplers stop at (:func:`smolforge.generation.prompts.eos_ids`):
    the tokenizer's eos and the ones the policy's ``generation_config`` names (a chat model's
    end-of-turn token is often only there).

    >>> class Tok: eos_token_id = 2
    >>> class Config: eos_token_id = [2, 7]
    >>> class Policy: generation_config = Config()
    >>> ended([[5, 7], [5, 2], [5, 6], []], Tok(), Policy())
    [True, True, False, False]
    """
    ends = eos_ids(tokenizer, policy)
    return [bool(ids) and ids[-1] in ends for ids in completion_ids]


def score(rows: list[dict], texts: list[str], completion_ids: list[list[int]], reward_fns: list,
          weights: list | None, tokenizer, policy=None, missing_eos_penalty: float | None = None) -> Scores:
    """Each completion's score: the weighted rewards, minus ``missing_eos_penalty`` where it never ended."""
    total, means = score_completions(reward_fns, weights, rows, texts, completion_ids)
    done = ended(completion_ids, tokenizer, policy)
    if missing_eos_penalty is not None:
        total = [t if end else t - missing_eos_penalty for t, end in zip(total, done)]
    return Scores(total, done, means)
