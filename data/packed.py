"""The tokenized, packed form of a pretraining corpus: fixed-length rows per domain on disk.

``PackedWriter`` streams tokenized documents (each ending with its separator) into rows exactly
as :func:`smolforge.data.packing.pack_documents` would, and appends them to two flat binary files per
domain, ``packed/<domain>.ids.bin`` (uint32 token ids) and ``packed/<domain>.pos.bin`` (uint16
or uint32 position ids), nanoGPT-style; ``packed/meta.json`` holds the shapes. Labels are not
stored: they are the ids with -100 wherever a position restarts at 0. ``load_packed`` maps the
files back as ``[rows, seq_len]`` arrays without reading them into memory.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with PackedWriter(folder, seq_len=4) as writer:
    ...     writer.add("web", [5, 6, 0]); writer.add("web", [7, 8, 9, 0])
    >>> rows = load_packed(folder)["web"]
    >>> rows["input_ids"][0].tolist(), rows["position_ids"][0].tolist(), rows["labels"][0].tolist()
    ([5, 6, 0, 7], [0, 1, 2, 0], [-100, 6, 0, -100])
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from smolforge.errors import DataError
from smolforge.runs import write_json_atomic

from .packing import IGNORE_INDEX

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
        self.pos_dtype = np.uint16 if seq_len <= 65536 else np.uint32
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


def load_packed(folder: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """``{domain: {"input_ids", "position_ids", "labels"}}`` as ``[rows, seq_len]`` int64 arrays."""
    folder = Path(folder)
    meta = packed_meta(folder)
    if meta is None:
        raise DataError(f"{folder}: no meta.json (not a packed corpus)")
    out = {}
    for name, stats in meta["domains"].items():
        shape = (stats["rows"], meta["seq_len"])
        if not stats["rows"]:
            empty = np.zeros(shape, dtype=np.int64)
            out[name] = {"input_ids": empty, "position_ids": empty, "labels": empty}
            continue
        ids = np.memmap(folder / f"{name}.ids.bin", dtype=meta["ids_dtype"], mode="r", shape=shape)
        pos = np.memmap(folder / f"{name}.pos.bin", dtype=meta["pos_dtype"], mode="r", shape=shape)
        input_ids, position_ids = ids.astype(np.int64), pos.astype(np.int64)
        labels = np.where(position_ids == 0, IGNORE_INDEX, input_ids)
        out[name] = {"input_ids": input_ids, "position_ids": position_ids, "labels": labels}
    return out
