"""Judge replies kept by request: a judged item is never asked again, and a killed judge resumes.

One append-only JSON Lines file per judge (endpoint and model) under the runs folder's cache
(``<runs>/.cache/judge/``). Each line is ``{"key", "reply", "top"}``: the sha256 of the request
(the judge, the exact messages, the sampling settings), the reply's text and the first token's
top log-probs. A line is written (and flushed) as soon as its reply arrives; a line cut short by a
kill is skipped when the file is read again, and the next reply starts on a line of its own.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "judge.jsonl"
    >>> cache = JudgeCache(path)
    >>> key = request_key("http://127.0.0.1:8000/v1#judge", [{"role": "user", "content": "A or B?"}], 4)
    >>> cache.get(key) is None
    True
    >>> cache.put(key, {"reply": "A", "top": {"A": -0.1}})
    >>> JudgeCache(path).get(key)["reply"]      # a new process reads it back
    'A'
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["JudgeCache", "request_key"]


def request_key(judge: str, messages: list[dict], max_tokens: int, **settings: Any) -> str:
    """The cache key of one request: the judge's identity, the messages and the settings, hashed."""
    blob = json.dumps({"judge": judge, "messages": messages, "max_tokens": max_tokens, **settings}, sort_keys=True,
                      ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class JudgeCache:
    """The replies in ``path`` by key; :meth:`put` appends one (thread-safe)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        self._torn = False      # the file ends inside a line: the next entry starts on a new one
        if self.path.is_file():
            with open(self.path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                if handle.tell():
                    handle.seek(-1, os.SEEK_END)
                    self._torn = handle.read(1) != b"\n"
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue                      # the last line of a killed judge
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    self._entries[entry["key"]] = entry

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> dict | None:
        return self._entries.get(key)

    def put(self, key: str, value: dict) -> None:
        entry = {"key": key, **value}
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(("\n" if self._torn else "") + line)
                self._torn = False
                handle.flush()
                os.fsync(handle.fileno())
            self._entries[key] = entry
