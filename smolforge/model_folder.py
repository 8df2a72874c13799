"""Check a model folder before a command loads it, and name what is broken.

Loading a damaged folder fails deep inside transformers, safetensors or vLLM, often minutes in
and with a traceback that does not say which file is wrong. These checks read only headers:
``config.json`` parses and names a ``model_type``; every safetensors file named (``model.safetensors``
or the shards of ``model.safetensors.index.json``) exists and is as long as its header says
(a copy cut short is caught here); a tokenizer is there and ``tokenizer.json`` parses.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp()) / "model"
    >>> check_model_folder(folder, "run 'x'")
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: run 'x': model/ is not a model folder (no config.json)
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import RunError

__all__ = ["check_model_folder", "check_safetensors"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


# folders that passed, by what they held then: a stage checks its parent several times (validate, run,
# each helper that loads it), and a released tokenizer.json is megabytes of JSON (0.3 s a parse for
# SmolLM2's on 2 cores)
_PASSED: set = set()


def _identity(folder: Path, tokenizer: bool) -> tuple:
    """What a check of ``folder`` depends on: each top-level file's name, size and mtime (weights, config,
    index and tokenizer files all sit there)."""
    with os.scandir(folder) as listing:
        files = [(entry.name, entry.stat()) for entry in listing if entry.is_file()]
    entries = sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in files)
    return str(folder.resolve()), tokenizer, tuple(entries)


def check_model_folder(folder: str | Path, owner: str, *, tokenizer: bool = True) -> None:
    """RunError naming ``owner`` and the broken file when ``folder`` cannot be loaded as a model.
    A folder that passed is not read again while its files are unchanged."""
    folder = Path(folder)
    try:
        identity = _identity(folder, tokenizer)
    except OSError:
        identity = None          # missing or unreadable: the checks below say what is wrong
    if identity is not None and identity in _PASSED:
        return
    _check_model_folder(folder, owner, tokenizer=tokenizer)
    if identity is not None:
        _PASSED.add(identity)


def _check_model_folder(folder: Path, owner: str, *, tokenizer: bool) -> None:
    where = f"{owner}: model/" if folder.name == "model" else f"{owner}: {folder}"
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise RunError(f"{where} is not a model folder (no config.json)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunError(f"{where} config.json is not readable JSON ({exc})") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise RunError(f"{where} config.json has no model_type (expected a transformers model config)")
    for weights in _weight_files(folder, where):
        check_safetensors(weights, where)
    if tokenizer:
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise RunError(f"{where} has no tokenizer (expected {' or '.join(TOKENIZER_FILES)} next to the weights)")
        if (folder / "tokenizer.json").is_file():
            try:
                json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise RunError(f"{where} tokenizer.json is not readable JSON ({exc})") from None


def _weight_files(folder: Path, where: str) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RunError(f"{where} model.safetensors.index.json is not a weight index ({exc})") from None
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            raise RunError(f"{where} is missing weight shard(s) {', '.join(missing)} named in model.safetensors.index.json")
        return [folder / name for name in shards]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise RunError(f"{where} holds pickle weights (.bin/.pt) only; smolforge loads safetensors "
                       "(convert them, e.g. save_pretrained(..., safe_serialization=True))")
    raise RunError(f"{where} has no weights (no model.safetensors or model.safetensors.index.json)")


def check_safetensors(path: Path, where: str = "") -> None:
    """RunError when ``path`` is not a whole safetensors file (header unreadable, or data cut short).

    >>> import tempfile, pathlib
    >>> broken = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
    >>> _ = broken.write_bytes(b"\\x10")
    >>> check_safetensors(broken, "run 'x': model/")
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: run 'x': model/ .../model.safetensors: not a safetensors file (1 bytes)
    """
    from .model_import import read_safetensors_header

    try:
        read_safetensors_header(path)
    except RunError as err:
        raise RunError(f"{where} {err}" if where else str(err)) from None
