"""Environments for tool-using GRPO: stateful tools plus a reward the environment owns.

TRL's ``GRPOTrainer(environment_factory=...)`` makes one instance per rollout, calls ``reset(**row)``
with the prompt row before generation, exposes the instance's public methods as tools (their
docstrings are the schemas the chat template renders) and, where the class defines ``get_reward()``,
scores each finished rollout with it (logged as ``rewards/<ClassName>/mean``, weight 1, beside the
recipe's ``rewards:``). A recipe names one here: ``environment: sums``.

    >>> env = SumsEnvironment()
    >>> env.reset(prompt=[{"role": "user", "content": "What is 443 plus 803?"}], answer="The answer is 1246.")
    >>> env.calculator("443 + 803"), env.get_reward()
    ('1246', 1.0)
    >>> env.reset(answer="The answer is 1246."); env.calculator("443 + 830"), env.get_reward()
    ('1273', 0.0)
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from smolforge.errors import RecipeError

from .tools import calculator as _calculate

__all__ = ["ENVIRONMENTS", "STATELESS_TOOLS", "SumsEnvironment", "offered_tools", "resolve_environment"]


class SumsEnvironment:
    """The embedded world's tool task (sums of two three-digit numbers) as an environment: a calculator
    that remembers its results, and a reward of 1 when one of them is the row's answer, so the policy is
    paid for getting the right number out of the tool, whatever it then writes."""

    def __init__(self) -> None:
        self.expected: str | None = None
        self.results: list[str] = []

    def reset(self, **row) -> None:
        numbers = re.findall(r"-?\d+", str(row.get("answer", "")))
        self.expected = numbers[-1] if numbers else None
        self.results = []

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly and return the result.

        Args:
            expression: Arithmetic on numbers with + - * / // % ** and parentheses, e.g. "(17 + 25) * 3".
        """
        result = _calculate(expression)
        self.results.append(result)
        return result

    def get_reward(self) -> float:
        return float(self.expected is not None and self.expected in self.results)


ENVIRONMENTS: dict[str, Callable[[], object]] = {"sums": SumsEnvironment}
# The stateless tools (generation/tools.py) that behave as an environment's tools do, for what is
# answered outside TRL's loop (the held-out reward before and after training, the tools suite).
STATELESS_TOOLS: dict[str, list[str]] = {"sums": ["calculator"]}


def resolve_environment(name: str | None) -> Callable[[], object] | None:
    """The factory TRL takes for the recipe's ``environment:`` (None: no environment)."""
    if name is None:
        return None
    if name not in ENVIRONMENTS:
        close = difflib.get_close_matches(str(name), list(ENVIRONMENTS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise RecipeError(f"environment: unknown environment '{name}'{hint}; known: {', '.join(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]


def offered_tools(recipe) -> list[str]:
    """The tool names a recipe offers the policy: its ``tools:`` and its environment's.

    >>> from types import SimpleNamespace
    >>> offered_tools(SimpleNamespace(tools=[], environment="sums")), offered_tools(SimpleNamespace(tools=["python"]))
    (['calculator'], ['python'])
    """
    names = list(getattr(recipe, "tools", None) or [])
    environment = getattr(recipe, "environment", None)
    return names + [t for t in STATELESS_TOOLS.get(environment, []) if t not in names] if environment else names
