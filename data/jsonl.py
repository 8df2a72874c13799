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


def json_line(row: dict, default=None) -> str:
    """``row`` as one JSON line: UTF-8 text as is, unless it holds lone surrogates (which UTF-8 cannot
    carry): then ASCII with ``\\uXXXX`` escapes, which reads back to the same string.

    >>> json_line({"t": "é"}), json_line({"t": "bad \\ud800"})
    ('{"t": "é"}\\n', '{"t": "bad \\\\ud800"}\\n')
    """
    line = json.dumps(row, ensure_ascii=False, default=default)
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = json.dumps(row, default=default)
    return line + "\n"


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Write rows atomically (temp file in the same folder, then rename)."""
    with atomic_writer(path) as handle:
        for row in rows:
            handle.write(json_line(row))
