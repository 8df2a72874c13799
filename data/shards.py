"""A data run's processed rows: JSONL shards per kind, written atomically, read back in order.

A data run holds ``data/<kind>/part-00000.jsonl``, ``part-00001.jsonl``… (``kind`` is pretrain,
sft or prefs); each shard is written to a temporary name and renamed when complete. A kind's
fingerprint is the sha256 of its shards' bytes in order, the same value whichever stage
computes it, so lineage can compare them.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with ShardWriter(root / "data" / "sft", rows_per_shard=2) as writer:
    ...     for i in range(3):
    ...         writer.write({"i": i})
    >>> [p.name for p in kind_files(root, "sft")]
    ['part-00000.jsonl', 'part-00001.jsonl']
    >>> [row["i"] for _, row in read_kind(root, "sft")]
    [0, 1, 2]
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from smolforge.errors import DataError
from smolforge.runs import RunLayout

from .jsonl import read_jsonl, write_row


class ShardWriter:
    """Write rows into numbered JSONL shards of at most ``rows_per_shard`` rows."""

    def __init__(self, folder: str | Path, rows_per_shard: int = 50_000) -> None:
        if rows_per_shard < 1:
            raise ValueError(f"rows_per_shard must be at least 1, got {rows_per_shard}")
        self.folder = Path(folder)
        self.rows_per_shard = rows_per_shard
        self.rows = 0
        self.paths: list[Path] = []
        self._handle = None
        self._tmp: Path | None = None

    def __enter__(self) -> "ShardWriter":
        self.folder.mkdir(parents=True, exist_ok=True)
        return self

    def write(self, row: dict) -> None:
        if self._handle is None or self.rows % self.rows_per_shard == 0:
            self._seal()
            final = self.folder / f"part-{len(self.paths):05d}.jsonl"
            self._tmp = final.with_name(f".{final.name}.tmp")
            self._handle = self._tmp.open("w", encoding="utf-8")
            self.paths.append(final)
        # default=str: source columns such as Parquet timestamps pass through as text
        write_row(self._handle, row, default=str)
        self.rows += 1

    def _seal(self) -> None:
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            os.replace(self._tmp, self.paths[-1])
            self._handle = None

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self._seal()
        elif self._handle is not None:
            self._handle.close()
            self._tmp.unlink(missing_ok=True)
            self._handle = None


def kind_files(run_path: str | Path, kind: str) -> list[Path]:
    """The shards of ``kind`` in a data run (or the single ``data/<kind>.jsonl`` of older runs)."""
    folder = RunLayout(run_path)
    shards = sorted(folder.data_shard_dir(kind).glob("part-*.jsonl"))
    if shards:
        return shards
    single = folder.data_dir / f"{kind}.jsonl"
    return [single] if single.is_file() else []


def read_kind(run_path: str | Path, kind: str) -> Iterator[tuple[str, dict]]:
    """``(where, row)`` for every row of a kind, shard after shard."""
    files = kind_files(run_path, kind)
    if not files:
        raise DataError(f"{run_path}: no data/{kind}/ shards (is it a data run?)")
    yield from read_files(files)


def read_files(paths: list[Path]) -> Iterator[tuple[str, dict]]:
    """``(where, row)`` for every row of these JSONL files, in order."""
    for path in paths:
        for line_no, row in read_jsonl(path):
            yield f"{path} line {line_no}", row


def files_fingerprint(paths: list[Path]) -> str:
    """``"sha256:<hex>"`` of the files' bytes concatenated in order (one file: its own sha256)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"
