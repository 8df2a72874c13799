"""What a judge is given: JSON Lines of pairs or of single responses, checked row by row.

Pairwise (and reference-guided) rows hold a ``prompt`` (text, or a conversation: a list of
``{"role", "content"}`` messages) and two responses: ``response_a``/``response_b``, or the
preference shape ``chosen``/``rejected`` (the known better one first: its ``label`` is ``"A"``, and
the judge's agreement with it is reported). A response may itself be a conversation, as in
UltraFeedback's layout: its last assistant message is judged. Pointwise rows hold ``prompt`` and
``response``. A ``reference`` answer is shown to the judge where a row has one (required by the
``reference`` mode); an ``id`` is kept (else the line number).

    >>> rows = parse_rows([{"prompt": "2+3?", "chosen": "5", "rejected": "7"}], "pairwise", "pairs.jsonl")
    >>> rows[0]["response_a"], rows[0]["response_b"], rows[0]["label"], rows[0]["id"]
    ('5', '7', 'A', '1')
    >>> parse_rows([{"prompt": "2+3?", "response": ""}], "pointwise", "points.jsonl")
    Traceback (most recent call last):
    ...
    smolforge.errors.DataError: points.jsonl line 1: field 'response' must be a non-empty string (or a conversation ending in an assistant message)
"""
from __future__ import annotations

import json
from pathlib import Path

from smolforge.errors import DataError

__all__ = ["MODES", "read_rows", "parse_rows", "BUILTIN_SANITY"]

MODES = ("pairwise", "pointwise", "reference")
BUILTIN_SANITY = Path(__file__).with_name("sanity.jsonl")


def read_rows(path: str | Path, mode: str, *, limit: int | None = None) -> list[dict]:
    """The rows of ``path`` for ``mode``, checked (a DataError names the file, line and field)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"items: file '{path}' not found")
    raw = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path} line {number}: not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        raw.append((number, row))
        if limit is not None and len(raw) >= limit:
            break
    if not raw:
        raise DataError(f"{path}: holds no rows")
    return [_parse(row, mode, f"{path} line {number}", number) for number, row in raw]


def parse_rows(rows: list[dict], mode: str, source: str) -> list[dict]:
    """:func:`read_rows` for rows already in memory (``source`` names them in errors)."""
    return [_parse(row, mode, f"{source} line {i}", i) for i, row in enumerate(rows, 1)]


def _parse(row: dict, mode: str, where: str, number: int) -> dict:
    prompt = row.get("prompt")
    if not (isinstance(prompt, str) and prompt.strip()) and not _is_conversation(prompt):
        raise DataError(f"{where}: field 'prompt' must be a non-empty string or a list of messages")
    reference = row.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise DataError(f"{where}: field 'reference' must be a string")
    if mode == "reference" and not (reference or "").strip():
        raise DataError(f"{where}: mode reference needs a field 'reference' (the reference answer) in every row")
    out = {"id": str(row.get("id", number)), "prompt": prompt, "reference": reference}
    if mode == "pointwise":
        return {**out, "response": _response(row, "response", where)}
    if "chosen" in row or "rejected" in row:
        return {**out, "response_a": _response(row, "chosen", where), "response_b": _response(row, "rejected", where),
                "label": "A"}
    return {**out, "response_a": _response(row, "response_a", where), "response_b": _response(row, "response_b", where),
            "label": row.get("label") if row.get("label") in ("A", "B", "T") else None}


def _is_conversation(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "content" in m for m in value)


def _response(row: dict, field: str, where: str) -> str:
    value = row.get(field)
    if _is_conversation(value):
        answers = [m for m in value if m.get("role") == "assistant"]
        value = answers[-1]["content"] if answers else None
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field '{field}' must be a non-empty string (or a conversation ending in an "
                        "assistant message)")
    return value
