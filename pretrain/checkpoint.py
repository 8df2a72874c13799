"""Checkpoints that survive crashes: atomic folders, checksum manifests, keep-last-K, fallback.

A checkpoint is ``checkpoints/step-N/``, holding the DeepSpeed engine state (model, optimizer,
LR scheduler, one shard per rank), ``trainer_state.json`` (step, data sampler, spike guard,
RNG states) and ``manifest.json`` (sha256 of every file). It is written under a temp name and
renamed only when complete, so a kill mid-write leaves no ``step-N``. On resume the newest
checkpoint whose files match their manifest wins; a corrupt one is reported and skipped.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> (folder / "step-4").mkdir(); _ = (folder / "step-4" / "a.bin").write_bytes(b"x")
    >>> write_manifest(folder / "step-4")
    >>> newest_valid(folder).name
    'step-4'
    >>> _ = (folder / "step-4" / "a.bin").write_bytes(b"y")   # corrupted after the fact
    >>> newest_valid(folder) is None
    True
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from smolforge.runs import write_json_atomic

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
STATE = "trainer_state.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    write_json_atomic(folder / MANIFEST, {str(p.relative_to(folder)): _sha256(p) for p in files})


def verify(folder: Path) -> str | None:
    """Why ``folder`` is not a usable checkpoint, or None when every file matches the manifest."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "no manifest.json"
    try:
        expected = json.loads(manifest.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"unreadable manifest ({exc})"
    for name, digest in expected.items():
        path = folder / name
        if not path.is_file():
            return f"missing {name}"
        if _sha256(path) != digest:
            return f"checksum mismatch in {name}"
    return None


def step_of(folder: Path) -> int:
    return int(folder.name.split("-", 1)[1])


def checkpoints(root: Path) -> list[Path]:
    """Complete (renamed) checkpoint folders, newest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit()]
    return sorted(found, key=step_of, reverse=True)


def newest_valid(root: Path) -> Path | None:
    """The newest checkpoint that passes :func:`verify`; corrupt ones are logged and skipped.

    It reads every byte of the checkpoints it tries (tens of GB at 3B scale): call it on one rank
    and share the answer (:func:`smolforge.pretrain.stage.resume_point`).
    """
    for folder in checkpoints(root):
        problem = verify(folder)
        if problem is None:
            return folder
        log.warning("checkpoint %s is unusable (%s); falling back to an older one", folder, problem)
    return None


def staging_dir(root: Path, step: int) -> Path:
    """Where every rank writes step ``step`` before :func:`publish` renames it."""
    return root / f".step-{step}.tmp"


def publish(root: Path, step: int, trainer_state: dict, keep: int) -> Path:
    """Rank 0, after all ranks wrote into :func:`staging_dir`: add state + manifest, rename, prune."""
    tmp = staging_dir(root, step)
    write_json_atomic(tmp / STATE, trainer_state)
    write_manifest(tmp)
    final = root / f"step-{step}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in checkpoints(root)[keep:] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(folder: Path) -> dict:
    return json.loads((folder / STATE).read_text())
