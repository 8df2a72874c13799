"""The three row shapes the stages consume, validated with file/line/field errors.

- ``text``: ``{"text": str}`` — pretraining documents;
- ``chat``: ``{"messages": [{"role", "content"}, ...]}`` with at least one assistant turn — SFT;
- ``preference``: ``{"prompt", "chosen", "rejected"}``, each a string (plain) or a list of
  messages (conversational) — DPO and reward models;
- ``prompt``: ``{"prompt"}`` (a string or messages), optionally ``"answer"`` for verifiers — online RL;
- ``feedback``: ``{"prompt", "completion", "label"}``, unpaired feedback (``label`` true: a desirable
  answer) as in ``trl-lib/kto-mix-14k`` — KTO. A preference row read as feedback becomes two rows:
  its chosen answer with ``true``, its rejected one with ``false``.

Rows in a public dataset's own layout (smoltalk, UltraFeedback, HH-RLHF, GSM8K, MATH, OpenR1…)
are read into these shapes first (:mod:`smolforge.data.shapes`, detected from the row's keys), so a
stage's ``data: file.jsonl`` takes them as published.

    >>> import tempfile, pathlib, json
    >>> uf = pathlib.Path(tempfile.mkdtemp()) / "uf.jsonl"
    >>> turn = {"role": "user", "content": "Name a prime."}
    >>> _ = uf.write_text(json.dumps({"prompt": "Name a prime.", "score_chosen": 9.0, "score_rejected": 2.0,
    ...     "chosen": [turn, {"role": "assistant", "content": "7"}],
    ...     "rejected": [turn, {"role": "assistant", "content": "9"}]}) + "\\n")
    >>> load_rows(uf, "preference")[0]["prompt"], load_rows(uf, "preference")[0]["rejected"]
    ([{'role': 'user', 'content': 'Name a prime.'}], [{'role': 'assistant', 'content': '9'}])

    >>> load_rows("tests/data/does-not-exist.jsonl", "text")
    Traceback (most recent call last):
    ...
    smolforge.errors.DataError: tests/data/does-not-exist.jsonl: file not found
"""
from __future__ import annotations

from pathlib import Path

from smolforge.errors import DataError

from .jsonl import read_jsonl
from .shapes import AUTO, normalize

SCHEMAS = {"text": ("text",), "chat": ("messages",), "preference": ("prompt", "chosen", "rejected"),
           "prompt": ("prompt",), "feedback": ("prompt", "completion", "label")}
ROLES = ("system", "user", "assistant", "tool")


def _check_messages(where: str, field: str, value, need_assistant: bool) -> None:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field '{field}' must be a non-empty list of messages, found {type(value).__name__}")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise DataError(f"{where}: field '{field}[{i}]' must be an object with a string 'content'")
        if message.get("role") not in ROLES:
            raise DataError(f"{where}: field '{field}[{i}].role' is {message.get('role')!r} (expected one of {', '.join(ROLES)})")
        if message.get("tool_calls") is not None:
            _check_tool_calls(where, f"{field}[{i}].tool_calls", message)
    if need_assistant and not any(m["role"] == "assistant" for m in value):
        raise DataError(f"{where}: field '{field}' has no assistant turn to train on")


def _check_tool_calls(where: str, field: str, message: dict) -> None:
    """An assistant message's ``tool_calls`` in the OpenAI layout: ``[{"type": "function", "function":
    {"name": str, "arguments": {...} or a JSON string}}]`` (a bare ``{"name", "arguments"}`` too).

    >>> _check_tool_calls("f.jsonl line 3", "messages[1].tool_calls", {"role": "assistant", "tool_calls": [
    ...     {"type": "function", "function": {"name": "calculator", "arguments": 5}}]})
    Traceback (most recent call last):
    ...
    smolforge.errors.DataError: f.jsonl line 3: field 'messages[1].tool_calls[0].function.arguments' must be an object or a JSON string, found int
    """
    calls = message["tool_calls"]
    if message.get("role") != "assistant" or not isinstance(calls, list):
        raise DataError(f"{where}: field '{field}' must be a list on an assistant message")
    for j, call in enumerate(calls):
        function = call.get("function", call) if isinstance(call, dict) else None
        path = f"{field}[{j}]" + (".function" if isinstance(call, dict) and "function" in call else "")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise DataError(f"{where}: field '{path}.name' must be the tool's name (a non-empty string)")
        if not isinstance(function.get("arguments"), (dict, str)):
            raise DataError(f"{where}: field '{path}.arguments' must be an object or a JSON string, "
                            f"found {type(function.get('arguments')).__name__}")


def _check_answer(where: str, field: str, messages: list) -> None:
    """A conversational pair's chosen/rejected side needs text in every message (a plain answer's
    emptiness is caught as a string)."""
    for i, message in enumerate(messages):
        if not message["content"].strip():
            raise DataError(f"{where}: field '{field}[{i}].content' is empty; a preference pair needs two "
                            "non-empty answers")


def validate_row(row: dict, schema: str, where: str) -> None:
    """Raise DataError naming ``where`` (file and line) and the field at fault."""
    expected = SCHEMAS[schema]
    for field in expected:
        if field not in row:
            raise DataError(f"{where}: field '{field}' is missing (expected {', '.join(expected)})")
    if schema == "text":
        if not isinstance(row["text"], str) or not row["text"].strip():
            raise DataError(f"{where}: field 'text' must be a non-empty string")
    elif schema == "chat":
        _check_messages(where, "messages", row["messages"], need_assistant=True)
    elif schema == "feedback":
        if not isinstance(row["label"], bool):
            raise DataError(f"{where}: field 'label' must be true (a desirable answer) or false, "
                            f"found {row['label']!r}")
        conversational = isinstance(row["prompt"], list)
        if conversational:
            _check_messages(where, "prompt", row["prompt"], need_assistant=False)
            _check_messages(where, "completion", row["completion"], need_assistant=True)
            _check_answer(where, "completion", row["completion"])
        else:
            for field in ("prompt", "completion"):
                if not isinstance(row[field], str) or not row[field].strip():
                    raise DataError(f"{where}: field '{field}' must be a non-empty string (or, for "
                                    f"conversational data, a list of messages)")
    elif schema == "prompt":
        if isinstance(row["prompt"], list):
            _check_messages(where, "prompt", row["prompt"], need_assistant=False)
        elif not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise DataError(f"{where}: field 'prompt' must be a non-empty string or a list of messages")
        if "answer" in row and (not isinstance(row["answer"], str) or not row["answer"].strip()):
            raise DataError(f"{where}: field 'answer' must be a non-empty string when present")
    else:
        conversational = isinstance(row["prompt"], list)
        for field in expected:
            value = row[field]
            if conversational:
                _check_messages(where, field, value, need_assistant=field != "prompt")
                if field != "prompt":
                    _check_answer(where, field, value)
            elif not isinstance(value, str) or not value.strip():
                raise DataError(f"{where}: field '{field}' must be a non-empty string (or, for "
                                f"conversational data, a list of messages like 'prompt')")
        if row["chosen"] == row["rejected"]:
            raise DataError(f"{where}: fields 'chosen' and 'rejected' are identical; the pair teaches nothing")


def load_rows(path: str | Path, schema: str, shape: str = AUTO) -> list[dict]:
    """Read a whole JSONL file into ``schema`` rows (each read as ``shape``, by default the one its keys
    tell) and validate them; an empty file is an error too."""
    if schema not in SCHEMAS:
        raise ValueError(f"unknown schema {schema!r}; expected one of {', '.join(SCHEMAS)}")
    rows = []
    for line_no, row in read_jsonl(path):
        where = f"{path} line {line_no}"
        if schema == "feedback" and not {"label", "completion"} & set(row):   # a pair: two pieces of feedback
            pair = normalize(row, "preference", where, shape)
            validate_row(pair, "preference", where)
            rows += [{"prompt": pair["prompt"], "completion": pair[side], "label": side == "chosen"}
                     for side in ("chosen", "rejected")]
            continue
        row = normalize(row, schema, where, shape)
        validate_row(row, schema, where)
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no rows (expected JSONL with {schema} rows: {', '.join(SCHEMAS[schema])})")
    return rows


def load_many(paths: list[Path], schema: str, shape: str = AUTO) -> list[dict]:
    """Rows of several JSONL files (a data run's shards), validated, in order."""
    rows = []
    for path in paths:
        rows += load_rows(path, schema, shape)
    return rows


def resolve_data(ref: str, runs, kind: str | tuple[str, ...]) -> tuple[list[Path], "object | None"]:
    """A stage's ``data:`` value → (JSONL files, data run or None).

    ``ref`` is a ``.jsonl`` file, or the name/path of a data run whose ``data/<kind>/`` shards
    are used; with several kinds, the first the run has shards of (KTO: ``feedback``, else ``prefs``).
    """
    from .shards import kind_files

    if ref.endswith(".jsonl"):
        path = Path(ref)
        if not path.is_file():
            raise DataError(f"{ref}: file not found")
        return [path], None
    run = runs.get(ref)
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    for each in kinds:
        paths = kind_files(run.path, each)
        if paths:
            return paths, run
    folders = " nor ".join(f"data/{each}/" for each in kinds)
    raise DataError(f"run '{run.name}' has no {folders} shards (is it a data run? its stage is {run.stage})")
