"""The JSON form of a built recipe (or any dataclass tree): what ``run.json`` stores under ``recipe``.

Below the recipe loader and the run folders alike, so both use it without importing each other.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class R:
    ...     lr: float = 1e-4
    >>> to_dict(R())
    {'lr': 0.0001}
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["to_dict"]


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, enum.Enum):
        return _plain(obj.value)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if not isinstance(obj, type):
        method = getattr(obj, "to_dict", None)
        if callable(method):
            try:
                return _plain(method())
            except Exception:  # noqa: BLE001 - fall back to the dataclass walk / str
                pass
        if dataclasses.is_dataclass(obj):
            return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return str(obj)


def to_dict(obj: Any) -> dict:
    """JSON-serialisable form of a built recipe (dataclasses, ``to_dict()`` objects, Paths, enums).

    >>> from dataclasses import dataclass
    >>> from pathlib import Path
    >>> @dataclass
    ... class R:
    ...     out: Path = Path("runs/x")
    ...     tags: tuple = ("a",)
    >>> to_dict(R())
    {'out': 'runs/x', 'tags': ['a']}
    """
    out = _plain(obj)
    if not isinstance(out, dict):
        raise TypeError(f"to_dict() expects a dataclass or mapping, got {type(obj).__name__}")
    return out
