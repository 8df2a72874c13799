"""Pretraining pieces alone: per-document attention from packed rows, NoPE layers, sizes, LR schedules."""
from __future__ import annotations

import math

import pytest
import torch

from smolforge.data.packing import pack_documents
from smolforge.pretrain.model import ModelShape, build_model, count_parameters, model_config, no_rope_layers
from smolforge.pretrain.schedule import SCHEDULES, lr_multiplier

TINY = ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                  max_position_embeddings=128)
VOCAB = 300


@pytest.fixture(scope="module")
def tiny_model():
    torch.set_num_threads(2)
    model = build_model(TINY, vocab_size=VOCAB).eval()
    assert next(model.parameters()).dtype == torch.float32
    return model


@pytest.fixture(scope="module")
def packed():
    generator = torch.Generator().manual_seed(0)
    docs = [torch.randint(4, VOCAB, (n,), generator=generator).tolist() + [0] for n in (11, 23, 6)]
    total = sum(len(d) for d in docs)
    [row] = pack_documents(docs, seq_len=total)
    return docs, row


def logits(model, ids, position_ids=None):
    with torch.no_grad():
        kwargs = {"position_ids": torch.tensor([position_ids])} if position_ids is not None else {}
        return model(input_ids=torch.tensor([ids]), use_cache=False, **kwargs).logits[0]


def test_packed_row_logits_equal_each_document_alone(tiny_model, packed):
    docs, row = packed
    assert row["position_ids"].count(0) == 3  # three documents, three restarts
    together = logits(tiny_model, row["input_ids"], row["position_ids"])
    start = 0
    for doc in docs:
        alone = logits(tiny_model, doc)
        diff = (together[start:start + len(doc)] - alone).abs().max().item()
        assert diff <= 1e-5, f"document at {start} sees other documents (max diff {diff})"
        start += len(doc)
    assert start == len(row["input_ids"])


def test_without_position_restart_documents_leak_into_each_other(tiny_model, packed):
    docs, row = packed
    leaky = logits(tiny_model, row["input_ids"], list(range(len(row["input_ids"]))))
    start = len(docs[0])
    alone = logits(tiny_model, docs[1])
    diff = (leaky[start:start + len(docs[1])] - alone).abs().max().item()
    assert diff > 1e-3
    # The first document has nothing before it, so it is unaffected either way.
    assert (leaky[:len(docs[0])] - logits(tiny_model, docs[0])).abs().max().item() <= 1e-5


def test_smollm3_nope_pattern_drops_rope_every_fourth_layer():
    mask = no_rope_layers(36, 4)
    assert len(mask) == 36
    assert [i for i, m in enumerate(mask) if m == 0] == list(range(3, 36, 4))
    assert mask.count(0) == 9 and set(mask) == {0, 1}
    from transformers import SmolLM3Config
    assert SmolLM3Config(num_hidden_layers=36).no_rope_layers == mask  # matches upstream's default


def test_tiny_models_still_get_a_nope_layer():
    assert no_rope_layers(2, 4) == [1, 0]
    assert no_rope_layers(4, 4) == [1, 1, 1, 0]
    assert no_rope_layers(8, 4) == [1, 1, 1, 0, 1, 1, 1, 0]
    assert no_rope_layers(3, 0) == [1, 1, 1]


def test_built_model_carries_the_nope_layers(tiny_model):
    assert tiny_model.config.model_type == "smollm3"
    assert list(tiny_model.config.no_rope_layers) == [1, 0]
    assert tiny_model.config.tie_word_embeddings
    assert tiny_model.get_input_embeddings().weight.data_ptr() == tiny_model.get_output_embeddings().weight.data_ptr()
    assert tiny_model.config.num_key_value_heads == 1 and tiny_model.config.vocab_size == VOCAB


def test_build_model_is_seeded():
    a, b = build_model(TINY, VOCAB, seed=3), build_model(TINY, VOCAB, seed=3)
    c = build_model(TINY, VOCAB, seed=4)
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_bad_head_counts_are_rejected():
    with pytest.raises(ValueError, match="num_kv_heads"):
        model_config(ModelShape(hidden_size=64, num_heads=4, num_kv_heads=3), vocab_size=VOCAB)
    with pytest.raises(ValueError, match="num_heads"):
        model_config(ModelShape(hidden_size=64, num_heads=5, num_kv_heads=1), vocab_size=VOCAB)


def test_smollm3_3b_shape_counts_about_three_billion_parameters():
    shape = ModelShape(hidden_size=2048, intermediate_size=11008, num_layers=36, num_heads=16,
                       num_kv_heads=4, tie_word_embeddings=True)
    n = count_parameters(shape, vocab_size=128256)
    assert abs(n - 3.08e9) / 3.08e9 < 0.01, n
    untied = count_parameters(ModelShape(**{**shape.__dict__, "tie_word_embeddings": False}), 128256)
    assert untied - n == 2048 * 128256


def test_count_parameters_matches_a_real_tiny_model(tiny_model):
    assert count_parameters(TINY, VOCAB) == sum(p.numel() for p in tiny_model.parameters())


# ---- schedules -------------------------------------------------------------------------------------

def values(kind, total=100, warmup=10, min_ratio=0.1, decay_fraction=0.2):
    f = lr_multiplier(kind, total_steps=total, warmup_steps=warmup, min_ratio=min_ratio,
                      decay_fraction=decay_fraction)
    return [f(s) for s in range(total)]


@pytest.mark.parametrize("kind", SCHEDULES)
def test_warmup_is_linear_and_reaches_the_peak(kind):
    v = values(kind, warmup=10)
    assert v[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    steps = [b - a for a, b in zip(v[:10], v[1:10])]
    assert steps == pytest.approx([0.1] * 9)
    assert v[9] == 1.0 and max(v) == 1.0


def test_cosine_decays_monotonically_to_min_ratio():
    v = values("cosine", total=100, warmup=10, min_ratio=0.1)
    after = v[9:]
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:]))
    assert v[10] == pytest.approx(1.0)
    assert v[-1] == pytest.approx(0.1)
    assert min(v[10:]) == pytest.approx(0.1)
    # Halfway through the decay the cosine sits halfway between peak and floor.
    assert lr_multiplier("cosine", 21, 0, min_ratio=0.0)(10) == pytest.approx(0.5)


def test_wsd_is_flat_then_decays_linearly_to_min_ratio():
    total, warmup, fraction, floor = 100, 10, 0.2, 0.05
    v = values("wsd", total=total, warmup=warmup, min_ratio=floor, decay_fraction=fraction)
    decay_steps = round(total * fraction)
    stable = v[warmup:total - decay_steps]
    decay = v[total - decay_steps:]
    assert stable and all(x == 1.0 for x in stable)
    assert len(decay) == decay_steps and all(x < 1.0 for x in decay)
    deltas = [b - a for a, b in zip(decay, decay[1:])]
    assert deltas == pytest.approx([deltas[0]] * len(deltas))  # a straight line
    assert deltas[0] == pytest.approx(-(1 - floor) / decay_steps)
    assert decay[-1] == pytest.approx(floor)


def test_constant_stays_at_peak_after_warmup():
    v = values("constant", total=50, warmup=5, min_ratio=0.1)
    assert v[4:] == [1.0] * 46
    assert values("constant", total=5, warmup=0) == [1.0] * 5


def test_unknown_schedule_kind_is_a_value_error():
    with pytest.raises(ValueError, match="'linear'"):
        lr_multiplier("linear", total_steps=10, warmup_steps=1)


def test_schedules_never_go_negative_or_above_peak():
    for kind in SCHEDULES:
        for total, warmup in [(1, 0), (2, 1), (7, 3), (1000, 50)]:
            v = values(kind, total=total, warmup=warmup, min_ratio=0.0, decay_fraction=0.3)
            assert all(0.0 <= x <= 1.0 and not math.isnan(x) for x in v), (kind, total, warmup)
