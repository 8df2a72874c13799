"""Plain-text tables for summaries (runs, lineage, pipeline), with rich on a terminal.

    >>> print(render_table(["run", "wall s"], [["sft-demo", 12.5], ["dpo-demo", None]]))
    run       wall s
    --------  ------
    sft-demo    12.5
    dpo-demo       -
"""
from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["render_table", "print_table", "format_cell"]

_NUMBER = re.compile(r"^[-+]?\d[\d,_]*(\.\d+)?([eE][-+]?\d+)?( \(.*\))?$")


def format_cell(value: Any) -> str:
    """Text of one cell: None → ``-``, floats to 4 significant digits, the rest via str().

    >>> format_cell(0.41234), format_cell(None), format_cell(12000), format_cell(54321.9)
    ('0.4123', '-', '12000', '54322')
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if value != value or abs(value) == float("inf"):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _cells(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> tuple[list[str], list[list[str]]]:
    cells = [[format_cell(v) for v in row] for row in rows]
    ncols = max([len(headers)] + [len(r) for r in cells])
    heads = [str(h) for h in headers] + [""] * (ncols - len(headers))
    return heads, [r + [""] * (ncols - len(r)) for r in cells]


def _numeric_columns(cells: list[list[str]], ncols: int) -> list[bool]:
    return [
        bool(cells) and all(_NUMBER.match(r[i]) or r[i] in ("-", "") for r in cells)
        for i in range(ncols)
    ]


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned plain-text table; numeric-looking cells are right-aligned.

    >>> render_table(["a"], [])
    'a\\n-'
    """
    heads, cells = _cells(headers, rows)
    widths = [max([len(heads[i])] + [len(r[i]) for r in cells]) for i in range(len(heads))]
    numeric = _numeric_columns(cells, len(heads))

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ]
        return "  ".join(parts).rstrip()

    out = [line(heads), "  ".join("-" * w for w in widths).rstrip()]
    out += [line(r) for r in cells]
    return "\n".join(out)


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    title: str | None = None,
    file: TextIO | None = None,
) -> None:
    """Print a table: with rich when writing to a terminal and rich is installed, else plain."""
    stream = file or sys.stdout
    if stream.isatty():
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            pass
        else:
            from rich.text import Text

            heads, cells = _cells(headers, rows)
            table = Table(title=title)
            for head, numeric in zip(heads, _numeric_columns(cells, len(heads))):
                table.add_column(Text(head), justify="right" if numeric else "left")
            for row in cells:
                table.add_row(*(Text(c) for c in row))  # Text: no markup parsing of names
            Console(file=stream).print(table)
            return
    if title:
        print(title, file=stream)
    print(render_table(headers, rows), file=stream)
