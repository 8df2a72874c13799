"""Pretraining rows: documents grouped by domain, tokenized, packed padding-free per domain.

Rows of ``pretrain.jsonl`` may carry a ``domain`` field (default ``"default"``); each domain is
packed separately so a mixture can weight them. A global batch of ``(domain, row)`` pairs is
split so every process gets a contiguous slice of each micro-step's rows: 1 process with micro
batch 8 and 2 processes with micro batch 4 train on exactly the same data.

    >>> rows = as_tensors({"d": [{"input_ids": [1, 2], "position_ids": [0, 1], "labels": [-100, 2]}] * 4})
    >>> picks = [("d", 0), ("d", 1), ("d", 2), ("d", 3)]
    >>> [tuple(b["input_ids"].shape) for b in micro_batches(rows, picks, micro_batch_size=1, grad_accum=2, rank=1, world=2)]
    [(1, 2), (1, 2)]
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from smolforge.data.packing import pack_documents
from smolforge.data.schemas import load_many
from smolforge.data.tokenizer import DOC_SEPARATOR
from smolforge.errors import DataError

if TYPE_CHECKING:
    import torch

KEYS = ("input_ids", "position_ids", "labels")


def load_domains(data_run_path: Path, tokenizer, seq_len: int) -> tuple[dict[str, dict[str, "torch.Tensor"]], str]:
    """``{domain: {key: LongTensor[rows, seq_len]}}`` from a data run, and how they were obtained.

    The data run's ``packed/`` rows are used when they were packed at this ``seq_len``; otherwise
    its text shards are tokenized and packed here (same rows, just slower to start).
    """
    import torch

    from smolforge.data.packed import load_packed, packed_meta

    meta = packed_meta(data_run_path / "packed")
    if meta is not None and meta["seq_len"] == seq_len:
        arrays = load_packed(data_run_path / "packed")
        for domain, rows in arrays.items():
            if not len(rows["input_ids"]):
                raise DataError(f"{data_run_path}: domain '{domain}' holds fewer than seq_len={seq_len} tokens; "
                                "lower train.seq_len or add documents")
        return ({d: {k: torch.from_numpy(v) for k, v in rows.items()} for d, rows in arrays.items()},
                f"packed/ of the data run (seq_len {seq_len})")
    why = "it has no packed/" if meta is None else f"its packed/ has seq_len {meta['seq_len']}"
    return as_tensors(pack_shards(data_run_path, tokenizer, seq_len)), f"packed at load ({why}, recipe seq_len {seq_len})"


def pack_shards(data_run_path: Path, tokenizer, seq_len: int) -> dict[str, list[dict]]:
    """``{domain: packed rows}`` from a data run's pretraining shards (documents end with the separator)."""
    from smolforge.data.shards import kind_files

    sep = tokenizer.convert_tokens_to_ids(DOC_SEPARATOR)
    if sep is None or sep == tokenizer.unk_token_id:
        sep = tokenizer.eos_token_id
    texts: dict[str, list[str]] = defaultdict(list)
    for row in load_many(kind_files(data_run_path, "pretrain"), "text"):
        texts[str(row.get("domain", "default"))].append(row["text"])
    packed = {}
    for domain, docs in sorted(texts.items()):
        ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
        packed[domain] = pack_documents([doc + [sep] for doc in ids], seq_len)
        if not packed[domain]:
            raise DataError(f"{data_run_path}: domain '{domain}' holds fewer than seq_len={seq_len} tokens; "
                            "lower train.seq_len or add documents")
    return packed


def as_tensors(domains: dict[str, list[dict]]) -> dict[str, dict[str, "torch.Tensor"]]:
    """``{domain: {key: LongTensor[rows, seq_len]}}``: batches are then one index-select away."""
    import torch

    return {d: {k: torch.tensor([r[k] for r in rows], dtype=torch.long) for k in KEYS} for d, rows in domains.items()}


def micro_batches(domains: dict[str, dict], picks: list[tuple[str, int]], micro_batch_size: int,
                  grad_accum: int, rank: int, world: int) -> list[dict]:
    """This rank's ``grad_accum`` micro-batches (tensors) from a global batch of (domain, row) picks."""
    import torch

    per_micro = micro_batch_size * world
    out = []
    for m in range(grad_accum):
        chunk = picks[m * per_micro:(m + 1) * per_micro][rank * micro_batch_size:(rank + 1) * micro_batch_size]
        out.append({k: torch.stack([domains[d][k][i] for d, i in chunk]) for k in KEYS})
    return out
