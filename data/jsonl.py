"""JSONL reading and writing that names the file and line of every problem.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.jsonl"
    >>> write_jsonl(p, [{"text": "hi"}])
    >>> list(read_jsonl(p))
    [(1, {'text': 'hi'})]
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import TextIO
from pathlib import Path

from smolforge.errors import DataError
from smolforge.runs import atomic_writer


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line; DataError on anything malformed."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path} line {line_no}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path} line {line_no}: expected a JSON object, found {type(obj).__name__}")
            yield line_no, obj


def write_row(handle: TextIO, row: dict, default=None) -> None:
    """Write ``row`` as one JSON line to a UTF-8 text ``handle``. Text goes as is, except in a row with
    lone surrogates (which UTF-8 cannot carry): that row goes as ASCII JSON, ``\\ud800`` escaped,
    which reads back to the same string.

    >>> import io
    >>> out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    >>> write_row(out, {"t": "é"}); write_row(out, {"t": "bad \\ud800"}); out.flush()
    >>> out.buffer.getvalue().decode().splitlines()
    ['{"t": "é"}', '{"t": "bad \\\\ud800"}']
    """
    try:        # the text layer encodes the whole string before it buffers any of it
        handle.write(json.dumps(row, ensure_ascii=False, default=default) + "\n")
    except UnicodeEncodeError:
        handle.write(json.dumps(row, default=default) + "\n")


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Write rows atomically (temp file in the same folder, then rename)."""
    with atomic_writer(path) as handle:
        for row in rows:
            write_row(handle, row)
