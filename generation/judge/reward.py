"""An LLM judge as an RL reward: each completion graded on a rubric through an endpoint, scaled to [0, 1].

A recipe's ``rewards:`` entry ``{judge: {endpoint, model, rubric, …}}`` (beside verifiers and reward-model
runs, :func:`smolforge.alignment.rewards.resolve`) becomes a :class:`JudgeReward`. Replies are cached
(the same prompt and completion graded again cost nothing), requests are rate-limited and time out,
and an endpoint that is down is an error naming its URL (at ``validate``, where the endpoint is asked
for its models, and during training): never a silent zero reward. A reply the rubric cannot read
(no score in range) is ``None``, which TRL leaves out of the sum, and is counted in
:attr:`JudgeReward.unreadable`.

    >>> JudgeReward.from_spec({"endpoint": "http://127.0.0.1:9/v1", "model": "j"})
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: rewards: a judge reward needs rubric: (a rubric YAML: name, scale, criteria)
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError

from ..verifiers import completion_text, prompt_text
from .endpoint import JudgeEndpoint, cache_for
from .prompts import load_rubric, parse_score, pointwise_messages

__all__ = ["JudgeReward", "JUDGE_FIELDS"]

JUDGE_FIELDS = ("endpoint", "model", "rubric", "api_key_env", "max_tokens", "workers", "rate", "timeout")


class JudgeReward:
    """``fn(prompts, completions, **columns) -> [score in [0, 1] or None]``, graded by ``judge``."""

    def __init__(self, judge: JudgeEndpoint, rubric, *, max_tokens: int = 64) -> None:
        self.judge, self.rubric, self.max_tokens = judge, rubric, max_tokens
        self.__name__ = f"judge_{rubric.name}"
        self.unreadable = 0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], cache_dir: str | Path | None = None) -> "JudgeReward":
        """From a recipe's ``{judge: {...}}`` mapping; the endpoint is asked for its models first."""
        unknown = sorted(set(spec) - set(JUDGE_FIELDS))
        if unknown:
            raise RecipeError(f"rewards: unknown judge field(s) {', '.join(unknown)}; expected {', '.join(JUDGE_FIELDS)}")
        if not spec.get("endpoint"):
            raise RecipeError("rewards: a judge reward needs endpoint: (an OpenAI-compatible base URL)")
        if not spec.get("rubric"):
            raise RecipeError("rewards: a judge reward needs rubric: (a rubric YAML: name, scale, criteria)")
        rubric = load_rubric(spec["rubric"])
        judge = JudgeEndpoint(spec["endpoint"], spec.get("model") or "", api_key_env=spec.get("api_key_env"),
                              workers=int(spec.get("workers", 4)), rate=float(spec.get("rate", 0.0)),
                              timeout=float(spec.get("timeout", 60.0)))
        judge.check_model("rewards: judge model")
        if cache_dir is not None:
            judge.cache = cache_for(cache_dir, judge.identity)
        return cls(judge, rubric, max_tokens=int(spec.get("max_tokens", 64)))

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float | None]:
        chats = [pointwise_messages(prompt_text(p), completion_text(c), self.rubric)
                 for p, c in zip(prompts, completions)]
        low, high = self.rubric.scale
        out: list[float | None] = []
        for answer in self.judge.ask(chats, max_tokens=self.max_tokens, what=self.__name__):
            score, _ = parse_score(answer["reply"], self.rubric)
            if score is None:
                self.unreadable += 1
            out.append(None if score is None else (score - low) / (high - low))
        return out
