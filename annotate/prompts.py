"""The prompts a review push starts from: a JSONL file, a data run's prompts, or an eval suite.

``source`` is one of:

- ``path/to/prompts.jsonl``: rows ``{"prompt": text or messages, "answer"?: reference}``;
- ``suite:NAME`` or ``suite:NAME/TASK``: an eval suite's rows (``evals/suites/`` or
  ``$SMOLFORGE_SUITES``) as chat prompts: a row's ``messages``, else its ``prompt`` or
  ``question`` as one user message, with its ``answer`` when it has one;
- anything else: a data run whose ``data/prompts/`` shards are read (e.g. ``data-demo``).

Rows are validated (file, line and field in the error), duplicates of a prompt are dropped
(the first wins), and ``limit`` keeps the first N.

    >>> rows, run = load_prompts("suite:embedded/instruct", runs=None, limit=2)
    >>> rows[0]["prompt"][0]["role"], "answer" in rows[0], run is None
    ('user', True, True)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smolforge.data.jsonl import read_jsonl
from smolforge.data.schemas import load_many, resolve_data, validate_row
from smolforge.errors import DataError, RecipeError

__all__ = ["load_prompts", "suite_rows"]


def suite_rows(spec: str) -> list[dict]:
    """Prompt rows of ``NAME`` or ``NAME/TASK`` from a registered eval suite."""
    from smolforge.registry import suite_folders

    name, _, task = spec.partition("/")
    folders = suite_folders()
    if name not in folders:
        raise RecipeError(f"prompts: unknown suite '{name}' (known: {', '.join(sorted(folders))})")
    files = sorted(folders[name].glob("*.jsonl"))
    if task:
        files = [f for f in files if f.stem == task]
        if not files:
            known = ", ".join(sorted(f.stem for f in folders[name].glob("*.jsonl")))
            raise RecipeError(f"prompts: suite '{name}' has no task '{task}' (tasks: {known})")
    rows = []
    for path in files:
        for line, raw in read_jsonl(path):
            text = raw.get("prompt", raw.get("question"))
            if isinstance(raw.get("messages"), list):
                row: dict[str, Any] = {"prompt": raw["messages"]}
            elif isinstance(text, str):
                row = {"prompt": [{"role": "user", "content": text}]}
            elif isinstance(text, list):
                row = {"prompt": text}
            else:
                raise DataError(f"{path} line {line}: a suite row needs 'messages', 'prompt' or 'question' "
                                "to push for review")
            if isinstance(raw.get("answer"), str):
                row["answer"] = raw["answer"]
            validate_row(row, "prompt", f"{path} line {line}")
            rows.append(row)
    return rows


def _key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def load_prompts(source: str, runs: Any, limit: int | None = None) -> tuple[list[dict], Any]:
    """``(rows, data run or None)``; each row has ``prompt`` and, when known, ``answer``."""
    source = str(source).strip()
    if not source:
        raise RecipeError("prompts: empty; give a .jsonl file, a data run, or suite:NAME[/TASK]")
    data_run = None
    if source.startswith("suite:"):
        rows = suite_rows(source[len("suite:"):])
    else:
        if source.endswith(".jsonl") and not Path(source).is_file():
            raise DataError(f"{source}: file not found (prompts: a .jsonl of {{\"prompt\": ...}} rows)")
        paths, data_run = resolve_data(source, runs, "prompts")
        rows = load_many(paths, "prompt")
    seen: set[str] = set()
    unique = []
    for row in rows:
        key = _key(row["prompt"])
        if key not in seen:
            seen.add(key)
            unique.append({"prompt": row["prompt"], **({"answer": row["answer"]} if "answer" in row else {})})
    if limit is not None:
        if limit < 1:
            raise RecipeError(f"limit must be at least 1, got {limit}")
        unique = unique[:limit]
    if not unique:
        raise DataError(f"prompts: {source} has no prompts")
    return unique, data_run
