"""The tokenized, packed form of a pretraining corpus: fixed-length rows per domain on disk.

``PackedWriter`` streams tokenized documents (each ending with its separator) into rows exactly
as :func:`smolforge.data.packing.pack_documents` would, and appends them to two flat binary files per
domain, ``packed/<domain>.ids.bin`` (uint32 token ids) and ``packed/<domain>.pos.bin`` (uint16
or uint32 position ids), nanoGPT-style; ``packed/meta.json`` holds the shapes. Labels are not
stored: they are the ids with -100 wherever a position restarts at 0. ``load_packed`` maps the
files back as :class:`PackedRows`, ``[rows, seq_len]`` views in the files' own dtypes; ``read``
turns the rows it is asked for (and only those) into int64 tensors, labels included, so memory
does not grow with the corpus.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with PackedWriter(folder, seq_len=4) as writer:
    ...     writer.add("web", [5, 6, 0]); writer.add("web", [7, 8, 9, 0])
    >>> rows = load_packed(folder)["web"]
    >>> len(rows), rows.ids.dtype, rows.positions.dtype
    (1, dtype('uint32'), dtype('uint16'))
    >>> {k: v.tolist() for k, v in rows.read([0]).items()}
    {'input_ids': [[5, 6, 0, 7]], 'position_ids': [[0, 1, 2, 0]], 'labels': [[-100, 6, 0, -100]]}
"""
from __future__ import annotations

import contextlib
import json
import os
import mmap
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smolforge.errors import DataError
from smolforge.runs import write_json_atomic

from .packing import IGNORE_INDEX

if TYPE_CHECKING:
    import torch

_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


class _Domain:
    def __init__(self, folder: Path, name: str, seq_len: int, pos_dtype) -> None:
        self.ids_path = folder / f"{name}.ids.bin"
        self.pos_path = folder / f"{name}.pos.bin"
        self.ids_file = self.ids_path.open("wb")
        self.pos_file = self.pos_path.open("wb")
        self.seq_len, self.pos_dtype = seq_len, pos_dtype
        self.ids: list[int] = []
        self.pos: list[int] = []
        self.rows = self.documents = self.tokens = 0

    def add(self, doc: list[int]) -> None:
        self.documents += 1
        self.tokens += len(doc)
        start = 0
        while start < len(doc):
            take = min(len(doc) - start, self.seq_len - len(self.ids))
            self.ids += doc[start:start + take]
            self.pos += range(take)
            start += take
            if len(self.ids) == self.seq_len:
                np.asarray(self.ids, dtype=np.uint32).tofile(self.ids_file)
                np.asarray(self.pos, dtype=self.pos_dtype).tofile(self.pos_file)
                self.rows += 1
                self.ids, self.pos = [], []

    def close(self) -> dict:
        for handle in (self.ids_file, self.pos_file):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        return {"rows": self.rows, "documents": self.documents, "tokens": self.tokens,
                "dropped_tail_tokens": len(self.ids)}


class PackedWriter:
    """Pack documents per domain into ``seq_len`` rows (padding-free, the tail dropped)."""

    def __init__(self, folder: str | Path, seq_len: int) -> None:
        if seq_len < 2:
            raise ValueError(f"seq_len must be at least 2, got {seq_len}")
        self.folder = Path(folder)
        self.seq_len = seq_len
        self.pos_dtype = position_dtype(seq_len)
        self.domains: dict[str, _Domain] = {}
        self.meta: dict | None = None

    def __enter__(self) -> "PackedWriter":
        self.folder.mkdir(parents=True, exist_ok=True)
        return self

    def add(self, domain: str, doc: list[int]) -> None:
        if domain not in self.domains:
            if not _SAFE.match(domain):
                raise DataError(f"domain name {domain!r} must use letters, digits, '.', '_' or '-'")
            self.domains[domain] = _Domain(self.folder, domain, self.seq_len, self.pos_dtype)
        self.domains[domain].add(doc)

    def __exit__(self, exc_type, *exc) -> None:
        stats = {name: d.close() for name, d in sorted(self.domains.items())}
        if exc_type is None:
            self.meta = {"seq_len": self.seq_len, "ids_dtype": "uint32",
                         "pos_dtype": np.dtype(self.pos_dtype).name, "domains": stats}
            write_json_atomic(self.folder / "meta.json", self.meta)


def packed_meta(folder: str | Path) -> dict | None:
    """``packed/meta.json`` of a data run, or None when it was not packed."""
    path = Path(folder) / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else None


def position_dtype(seq_len: int) -> type:
    """The smallest unsigned dtype that holds every position of a ``seq_len`` row.

    >>> position_dtype(4096).__name__, position_dtype(131072).__name__
    ('uint16', 'uint32')
    """
    return np.uint16 if seq_len <= 65536 else np.uint32


class PackedRows:
    """One domain's packed rows in their compact dtypes (memory-mapped when loaded from disk).

    ``ids`` and ``positions`` are ``[rows, seq_len]`` arrays; labels are derived when rows are read.

        >>> rows = PackedRows.from_rows([{"input_ids": [5, 6, 0, 7], "position_ids": [0, 1, 2, 0]}], seq_len=4)
        >>> len(rows), rows.seq_len, rows.read([0, 0])["labels"].tolist()
        (1, 4, [[-100, 6, 0, -100], [-100, 6, 0, -100]])
    """

    def __init__(self, ids: np.ndarray, positions: np.ndarray) -> None:
        if ids.ndim != 2 or ids.shape != positions.shape:
            raise ValueError(f"ids {ids.shape} and positions {positions.shape} must be the same [rows, seq_len]")
        self.ids, self.positions = ids, positions

    @classmethod
    def from_rows(cls, rows: list[dict], seq_len: int) -> "PackedRows":
        """Rows as :func:`~smolforge.data.packing.pack_documents` returns them, stored compactly."""
        ids = np.array([r["input_ids"] for r in rows], dtype=np.uint32).reshape(len(rows), seq_len)
        positions = np.array([r["position_ids"] for r in rows], dtype=position_dtype(seq_len))
        return cls(ids, positions.reshape(len(rows), seq_len))

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.ids.shape[1]

    def read(self, indices: Sequence[int]) -> dict[str, "torch.Tensor"]:
        """``input_ids``, ``position_ids``, ``labels`` of rows ``indices`` as int64 ``[n, seq_len]`` tensors."""
        import torch

        at = np.asarray(indices, dtype=np.int64)
        ids = torch.from_numpy(np.asarray(self.ids[at], dtype=np.int64))
        positions = torch.from_numpy(np.asarray(self.positions[at], dtype=np.int64))
        _unmap_read_pages(self.ids)
        _unmap_read_pages(self.positions)
        return {"input_ids": ids, "position_ids": positions,
                "labels": ids.masked_fill(positions == 0, IGNORE_INDEX)}

    def __getitem__(self, key: str) -> np.ndarray:
        """A whole column, for inspection: ids and positions as stored, labels computed in full (int64)."""
        if key == "input_ids":
            return self.ids
        if key == "position_ids":
            return self.positions
        if key == "labels":
            return np.where(self.positions == 0, IGNORE_INDEX, self.ids.astype(np.int64))
        raise KeyError(key)


def _unmap_read_pages(rows: np.ndarray) -> None:
    """Drop from this process the file pages a read mapped in (they stay in the page cache).

    Without it a rank's resident set grows with every row it reads, by far more than the row:
    each page fault maps the cached pages around it too (measured: about 35-190 KB per 1 KB row),
    so over a long run the whole corpus would end up counted in every rank's RSS. The copy the
    read returned is the rank's own; the next read of these rows maps them again.
    """
    mapped = getattr(rows, "_mmap", None)
    if mapped is not None:
        with contextlib.suppress(OSError, ValueError):
            mapped.madvise(mmap.MADV_DONTNEED)


def _mapped(path: Path, dtype: str, shape: tuple[int, int]) -> np.ndarray:
    if not shape[0]:
        return np.zeros(shape, dtype=dtype)  # an empty file cannot be mapped
    expected = shape[0] * shape[1] * np.dtype(dtype).itemsize
    size = path.stat().st_size if path.is_file() else None
    if size != expected:
        found = "is missing" if size is None else f"holds {size} bytes"
        raise DataError(f"{path} {found}, meta.json expects {expected} ({shape[0]} rows x seq_len {shape[1]} "
                        f"x {dtype}); prepare the data run again")
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def load_packed(folder: str | Path) -> dict[str, PackedRows]:
    """``{domain: PackedRows}`` memory-mapped over ``packed/<domain>.{ids,pos}.bin``: nothing is read yet."""
    folder = Path(folder)
    meta = packed_meta(folder)
    if meta is None:
        raise DataError(f"{folder}: no meta.json (not a packed corpus)")
    out = {}
    for name, stats in meta["domains"].items():
        shape = (stats["rows"], meta["seq_len"])
        out[name] = PackedRows(_mapped(folder / f"{name}.ids.bin", meta["ids_dtype"], shape),
                               _mapped(folder / f"{name}.pos.bin", meta["pos_dtype"], shape))
    return out
