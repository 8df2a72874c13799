"""The eval audit's score cache: ``<run>/eval/audit/<step>.json``, one entry per suite and limit.

    {"run": "pretrain-s0", "step": 8, "results": {"embedded|limit=50": {"suite": "embedded",
     "suite_path": "...", "limit": 50, "source": "checkpoints/step-8", "scores": {task: {metric: value}}}}}

Writing one entry keeps the file's entries for other suites and limits. An unreadable file is
ignored with a warning (the next write replaces it). A cached step stays in the audit after its
checkpoint was pruned.

    >>> import tempfile
    >>> from smolforge.runs import Runs
    >>> with Runs(tempfile.mkdtemp()).start("pretrain", "s0", recipe={}) as run:
    ...     key = cache_key("embedded", 50)
    ...     store_scores(run, 8, key, {"suite": "embedded", "scores": {"facts": {"acc": 0.5}}})
    >>> key, cached_steps(run, key)[8]["scores"], cached_steps(run, cache_key("embedded", None))
    ('embedded|limit=50', {'facts': {'acc': 0.5}}, {})
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from smolforge.runs import Run, write_json_atomic

log = logging.getLogger(__name__)

__all__ = ["AUDIT_DIR", "cache_key", "cached_steps", "store_scores"]

AUDIT_DIR = "audit"              # under <run>/eval/


def cache_key(suite_name: str, limit: int | None) -> str:
    """The key of a suite and limit's entry in a step's file.

    >>> cache_key("embedded", None)
    'embedded|limit=all'
    """
    return f"{suite_name}|limit={'all' if limit is None else limit}"


def _read_cache(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("audit: ignoring unreadable cache %s (%s)", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def cached_steps(run: Run, key: str) -> dict[int, dict]:
    """``{step: entry}`` for every step of ``run`` with an entry under ``key``."""
    folder = run.eval_dir / AUDIT_DIR
    found = {}
    for path in folder.glob("*.json") if folder.is_dir() else []:
        if path.stem.isdigit():
            entry = _read_cache(path).get("results", {}).get(key)
            if entry:
                found[int(path.stem)] = entry
    return found


def store_scores(run: Run, step: int, key: str, entry: dict) -> None:
    """Write ``entry`` under ``key`` in ``run``'s file for ``step`` (atomically)."""
    path = run.eval_dir / AUDIT_DIR / f"{step}.json"
    data = _read_cache(path)
    write_json_atomic(path, {"run": run.name, "step": step, "results": {**data.get("results", {}), key: entry}})
