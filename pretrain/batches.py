"""Pretraining rows: documents grouped by domain, tokenized, packed padding-free per domain.

Rows of ``pretrain.jsonl`` may carry a ``domain`` field (default ``"default"``); each domain is
packed separately so a mixture can weight them. Rows stay compact (memory-mapped from the data
run's ``packed/`` when it matches the recipe's ``seq_len``) and each rank reads only its own rows,
one micro-batch at a time. A global batch of ``(domain, row)`` pairs is split so every process gets
a contiguous slice of each micro-step's rows: 1 process with micro batch 8 and 2 processes with
micro batch 4 train on exactly the same data.

    >>> rows = in_memory({"d": [{"input_ids": [1, 2], "position_ids": [0, 1]}] * 4}, seq_len=2)
    >>> picks = [("d", 0), ("d", 1), ("d", 2), ("d", 3)]
    >>> rank_picks(picks, micro_batch_size=1, grad_accum=2, rank=1, world=2)
    [[('d', 1)], [('d', 3)]]
    >>> [tuple(b["input_ids"].shape) for b in micro_batches(rows, picks, micro_batch_size=1, grad_accum=2, rank=1, world=2)]
    [(1, 2), (1, 2)]
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from smolforge.data.packed_store import PackedRows, load_packed, packed_meta
from smolforge.data.packing import pack_documents
from smolforge.data.schemas import load_many
from smolforge.data.tokenizer import DOC_SEPARATOR
from smolforge.errors import DataError
from smolforge.runs import RunLayout

if TYPE_CHECKING:
    import torch

KEYS = ("input_ids", "position_ids", "labels")


def load_domains(data_run_path: Path, tokenizer, seq_len: int,
                 whole_documents: bool = False) -> tuple[dict[str, PackedRows], str]:
    """``{domain: PackedRows}`` from a data run, and how they were obtained.

    The data run's ``packed/`` rows are memory-mapped when they were packed at this ``seq_len``;
    otherwise its text shards are tokenized and packed here (same rows, kept compactly in memory,
    just slower to start). ``whole_documents`` always packs here, never cutting a document that
    fits in a row (:func:`~smolforge.data.packing.pack_documents` with a pad id).
    """
    if whole_documents:
        return (in_memory(pack_shards(data_run_path, tokenizer, seq_len, whole_documents=True), seq_len),
                f"packed at load, documents kept whole (seq_len {seq_len})")
    packed = RunLayout(data_run_path).packed_dir
    meta = packed_meta(packed)
    if meta is not None and meta["seq_len"] == seq_len:
        domains = load_packed(packed)
        for domain, rows in domains.items():
            if not len(rows):
                raise DataError(f"{data_run_path}: domain '{domain}' holds fewer than seq_len={seq_len} tokens; "
                                "lower train.seq_len or add documents")
        return domains, f"packed/ of the data run (seq_len {seq_len}, memory-mapped)"
    why = "it has no packed/" if meta is None else f"its packed/ has seq_len {meta['seq_len']}"
    return (in_memory(pack_shards(data_run_path, tokenizer, seq_len), seq_len),
            f"packed at load ({why}, recipe seq_len {seq_len})")


def pack_shards(data_run_path: Path, tokenizer, seq_len: int, whole_documents: bool = False) -> dict[str, list[dict]]:
    """``{domain: packed rows}`` from a data run's pretraining shards (documents end with the separator)."""
    from smolforge.data.shards import kind_files

    sep = tokenizer.convert_tokens_to_ids(DOC_SEPARATOR)
    if sep is None or sep == tokenizer.unk_token_id:
        sep = tokenizer.eos_token_id
    texts: dict[str, list[str]] = defaultdict(list)
    for row in load_many(kind_files(data_run_path, "pretrain"), "text"):
        texts[str(row.get("domain", "default"))].append(row["text"])
    pad = (sep if tokenizer.pad_token_id is None else tokenizer.pad_token_id) if whole_documents else None
    packed = {}
    for domain, docs in sorted(texts.items()):
        ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
        packed[domain] = pack_documents([doc + [sep] for doc in ids], seq_len, pad_id=pad)
        if not packed[domain]:
            raise DataError(f"{data_run_path}: domain '{domain}' holds fewer than seq_len={seq_len} tokens; "
                            "lower train.seq_len or add documents")
    return packed


def in_memory(domains: dict[str, list[dict]], seq_len: int) -> dict[str, PackedRows]:
    """``{domain: PackedRows}`` over rows packed here, in the compact dtypes of ``packed/`` (labels dropped)."""
    return {d: PackedRows.from_rows(rows, seq_len) for d, rows in domains.items()}


def rank_picks(picks: list[tuple[str, int]], micro_batch_size: int, grad_accum: int, rank: int,
               world: int) -> list[list[tuple[str, int]]]:
    """This rank's share of each of the ``grad_accum`` micro-steps of a global batch of picks."""
    per_micro = micro_batch_size * world
    return [picks[m * per_micro:(m + 1) * per_micro][rank * micro_batch_size:(rank + 1) * micro_batch_size]
            for m in range(grad_accum)]


def read_picks(domains: dict[str, PackedRows], picks: list[tuple[str, int]]) -> dict[str, "torch.Tensor"]:
    """The rows ``picks`` names, in order, as int64 ``[len(picks), seq_len]`` tensors (one read per domain)."""
    import torch

    slots: dict[str, list[int]] = defaultdict(list)
    rows: dict[str, list[int]] = defaultdict(list)
    for slot, (domain, row) in enumerate(picks):
        slots[domain].append(slot)
        rows[domain].append(row)
    seq_len = next(iter(domains.values())).seq_len
    out = {k: torch.empty((len(picks), seq_len), dtype=torch.long) for k in KEYS}
    for domain in slots:
        read = domains[domain].read(rows[domain])
        at = torch.tensor(slots[domain])
        for k in KEYS:
            out[k][at] = read[k]
    return out


def micro_batches(domains: dict[str, PackedRows], picks: list[tuple[str, int]], micro_batch_size: int,
                  grad_accum: int, rank: int, world: int) -> Iterator[dict[str, "torch.Tensor"]]:
    """This rank's ``grad_accum`` micro-batches (int64 tensors) from a global batch of (domain, row)
    picks, each read from ``domains`` only when the loop asks for it."""
    for chunk in rank_picks(picks, micro_batch_size, grad_accum, rank, world):
        yield read_picks(domains, chunk)
