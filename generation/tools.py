"""Tools a policy may call while it answers (TRL's ``tools=``): a calculator and a sandboxed Python.

Each tool is a plain function with type hints and a Google-style docstring: transformers turns it
into the JSON schema the chat template shows the model, and TRL calls it with the arguments the
model wrote. A tool never raises on bad input from the model: it answers with an error text the
model reads, as a person at a terminal would.

    >>> calculator("123456789 * 987654321")
    '121932631112635269'
    >>> calculator("2 ** 10000")
    'error: the result would have more than 1000 digits'
    >>> calculator("__import__('os')")
    'error: only numbers and + - * / // % ** ( ) are allowed'
    >>> python_tool("print(6 * 7)")
    '42\\n'
    >>> resolve_tools(["calculator", "pyton"])
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: tools: unknown tool 'pyton' (did you mean 'python'?); known: calculator, python
"""
from __future__ import annotations

import ast
import difflib
import operator
from collections.abc import Callable

from smolforge.errors import RecipeError

from .sandbox import run_python

__all__ = ["TOOLS", "calculator", "python_tool", "resolve_tools"]

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
              ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_DIGITS = 1000


def _evaluate(node: ast.AST):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                and right * len(str(abs(left))) > MAX_DIGITS + 10:
            raise OverflowError(f"the result would have more than {MAX_DIGITS} digits")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError("only numbers and + - * / // % ** ( ) are allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: Arithmetic on numbers with + - * / // % ** and parentheses, e.g. "(17 + 25) * 3".
    """
    try:
        value = _evaluate(ast.parse(str(expression).strip(), mode="eval"))
    except (SyntaxError, ValueError, TypeError, OverflowError, ZeroDivisionError, RecursionError) as err:
        return f"error: {err}"
    text = str(value)
    return text if len(text) <= MAX_DIGITS else f"error: the result would have more than {MAX_DIGITS} digits"


def python_tool(code: str) -> str:
    """Run a short Python program and return what it printed.

    Args:
        code: A complete Python program; print() what you want to see. No files outside its own folder, no network.
    """
    result = run_python(str(code))
    if result.ok:
        return result.stdout
    detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    return f"{result.stdout}error ({result.outcome}): {detail}".strip()


python_tool.__name__ = "python"     # the name the model calls it by

TOOLS: dict[str, Callable[..., str]] = {"calculator": calculator, "python": python_tool}


def resolve_tools(names: list) -> list[Callable[..., str]]:
    """The recipe's ``tools:`` (names of :data:`TOOLS`) as the callables TRL takes."""
    if not isinstance(names, list):
        raise RecipeError(f"tools: expected a list of tool names ({', '.join(TOOLS)}), got {names!r}")
    out = []
    for name in names:
        if name not in TOOLS:
            close = difflib.get_close_matches(str(name), list(TOOLS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise RecipeError(f"tools: unknown tool '{name}'{hint}; known: {', '.join(TOOLS)}")
        out.append(TOOLS[name])
    return out
