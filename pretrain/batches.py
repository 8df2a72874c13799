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

from data.packing import pack_documents
from data.schemas import load_rows
from data.tokenizer import DOC_SEPARATOR
from smolforge.errors import DataError

if TYPE_CHECKING:
    import torch

KEYS = ("input_ids", "position_ids", "labels")


def load_domains(path: Path, tokenizer, seq_len: int) -> dict[str, list[dict]]:
    """``{domain: packed rows}`` from a text JSONL file (documents end with the separator token)."""
    sep = tokenizer.convert_tokens_to_ids(DOC_SEPARATOR)
    if sep is None or sep == tokenizer.unk_token_id:
        sep = tokenizer.eos_token_id
    texts: dict[str, list[str]] = defaultdict(list)
    for row in load_rows(path, "text"):
        texts[str(row.get("domain", "default"))].append(row["text"])
    packed = {}
    for domain, docs in sorted(texts.items()):
        ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
        packed[domain] = pack_documents([doc + [sep] for doc in ids], seq_len)
        if not packed[domain]:
            raise DataError(f"{path}: domain '{domain}' holds fewer than seq_len={seq_len} tokens; "
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
