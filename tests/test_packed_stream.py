"""Pretraining data streamed from disk: packed rows stay memory-mapped in their compact dtypes, and
each rank reads only its own rows, batch by batch, into exactly the batches the int64 copy gave."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from smolforge.data.packed_store import PackedRows, PackedWriter, load_packed
from smolforge.data.packing import IGNORE_INDEX, pack_documents
from smolforge.errors import DataError
from smolforge.pretrain.batches import KEYS, in_memory, micro_batches, rank_picks

SEQ_LEN = 16


def documents(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 50_000) for _ in range(rng.randrange(1, 40))] + [0] for _ in range(count)]


@pytest.fixture
def corpus(tmp_path) -> dict[str, list[list[int]]]:
    docs = {"web": documents(0, 120), "code": documents(1, 70)}
    with PackedWriter(tmp_path, seq_len=SEQ_LEN) as writer:
        for domain, domain_docs in docs.items():
            for doc in domain_docs:
                writer.add(domain, doc)
    return docs


def int64_copy(folder) -> dict[str, dict[str, torch.Tensor]]:
    """What loading did before streaming: every row of every domain as int64 tensors."""
    out = {}
    for domain, rows in load_packed(folder).items():
        ids = np.asarray(rows.ids).astype(np.int64)
        positions = np.asarray(rows.positions).astype(np.int64)
        labels = np.where(positions == 0, IGNORE_INDEX, ids)
        out[domain] = {k: torch.from_numpy(v) for k, v in zip(KEYS, (ids, positions, labels))}
    return out


def stacked(domains: dict[str, dict[str, torch.Tensor]], picks, micro_batch_size, grad_accum, rank, world):
    """The batches the int64 copy gave: each pick's row stacked, per micro-step."""
    return [{k: torch.stack([domains[d][k][i] for d, i in chunk]) for k in KEYS}
            for chunk in rank_picks(picks, micro_batch_size, grad_accum, rank, world)]


def random_picks(sizes: dict[str, int], count: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    names = sorted(sizes)
    return [(d, rng.randrange(sizes[d])) for d in (rng.choice(names) for _ in range(count))]


def test_load_packed_maps_the_files_in_their_compact_dtypes(tmp_path, corpus):
    domains = load_packed(tmp_path)
    assert set(domains) == {"web", "code"}
    for rows in domains.values():
        assert isinstance(rows, PackedRows) and len(rows) > 0 and rows.seq_len == SEQ_LEN
        assert isinstance(rows.ids, np.memmap) and rows.ids.dtype == np.uint32
        assert isinstance(rows.positions, np.memmap) and rows.positions.dtype == np.uint16
        assert rows.ids.shape == rows.positions.shape == (len(rows), SEQ_LEN)


def test_read_rows_equal_the_int64_copy_and_packing_in_memory(tmp_path, corpus):
    mapped, copy = load_packed(tmp_path), int64_copy(tmp_path)
    packed_here = in_memory({d: pack_documents(docs, SEQ_LEN) for d, docs in corpus.items()}, SEQ_LEN)
    for domain, rows in mapped.items():
        indices = [3, 0, len(rows) - 1, 3]
        for source in (rows, packed_here[domain]):
            read = source.read(indices)
            for k in KEYS:
                assert read[k].dtype == torch.int64
                assert torch.equal(read[k], copy[domain][k][indices])
        assert packed_here[domain].ids.dtype == np.uint32 and packed_here[domain].positions.dtype == np.uint16
        assert np.array_equal(rows["labels"], copy[domain]["labels"].numpy())


def test_micro_batches_equal_the_int64_batches_for_one_and_two_processes(tmp_path, corpus):
    mapped, copy = load_packed(tmp_path), int64_copy(tmp_path)
    picks = random_picks({d: len(r) for d, r in mapped.items()}, count=8 * 3, seed=7)
    one = list(micro_batches(mapped, picks, micro_batch_size=8, grad_accum=3, rank=0, world=1))
    two = [list(micro_batches(mapped, picks, micro_batch_size=4, grad_accum=3, rank=r, world=2)) for r in (0, 1)]
    for got, want in zip(one, stacked(copy, picks, 8, 3, 0, 1)):
        assert all(torch.equal(got[k], want[k]) for k in KEYS)
    for m in range(3):  # 1 process x micro 8 == 2 processes x micro 4, row for row
        for k in KEYS:
            assert torch.equal(torch.cat([two[0][m][k], two[1][m][k]]), one[m][k])
    for r in (0, 1):
        for got, want in zip(two[r], stacked(copy, picks, 4, 3, r, 2)):
            assert all(torch.equal(got[k], want[k]) for k in KEYS)


def test_ranks_read_disjoint_slices_that_together_are_the_global_batch():
    picks = [("web", i) for i in range(2 * 3 * 4)]
    shares = [rank_picks(picks, micro_batch_size=2, grad_accum=4, rank=r, world=3) for r in range(3)]
    flat = [[p for chunk in share for p in chunk] for share in shares]
    assert all(len(f) == 2 * 4 for f in flat)
    assert not set(flat[0]) & set(flat[1]) and not set(flat[1]) & set(flat[2]) and not set(flat[0]) & set(flat[2])
    assert [p for m in range(4) for share in shares for p in share[m]] == picks


def test_micro_batches_read_only_when_asked(tmp_path, corpus):
    class Counting(PackedRows):
        reads: list[list[int]] = []

        def read(self, indices):
            Counting.reads.append(list(indices))
            return super().read(indices)

    domains = {d: Counting(r.ids, r.positions) for d, r in load_packed(tmp_path).items()}
    picks = [("web", 0), ("web", 1), ("web", 2), ("web", 3)]
    batches = micro_batches(domains, picks, micro_batch_size=1, grad_accum=2, rank=1, world=2)
    assert Counting.reads == []
    next(batches)
    assert Counting.reads == [[1]]  # this rank's row of the first micro-step, nothing else


def test_a_truncated_packed_file_names_the_file(tmp_path, corpus):
    path = tmp_path / "web.ids.bin"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(DataError, match="web.ids.bin holds"):
        load_packed(tmp_path)
