"""Attention over packed rows without a (batch x length)² mask: the implementations agree with each
document run alone, ``attn_implementation:`` resolves as documented, and bad values stop before a run."""
from __future__ import annotations

import pytest
import torch

from conftest import DEMO
from smolforge.attention import CHOICES, FLASH_PACKAGES, choose_attention, installed_flash_packages, resolve_attention
from smolforge.cli import main
from smolforge.data.packing import pack_documents
from smolforge.errors import RecipeError
from smolforge.pretrain.model import ModelShape, build_model, use_attention, varlen_kwargs

# head_dim 32, GQA, the last of two layers NoPE
TINY = ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                  max_position_embeddings=256)
VOCAB = 300


@pytest.fixture(scope="module")
def documents():
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(4, VOCAB, (n,), generator=generator).tolist() + [0] for n in (40, 7, 70, 23, 90, 20)]


@pytest.fixture(scope="module")
def rows(documents):
    """Two packed rows of 128 tokens: documents back to back, one of them cut across the rows."""
    packed = pack_documents(documents, seq_len=128)
    assert len(packed) == 2 and [r["position_ids"].count(0) for r in packed] == [4, 3]
    return {k: torch.tensor([r[k] for r in packed]) for k in ("input_ids", "position_ids")}


def pieces(rows) -> list[tuple[int, int, int]]:
    """(row, start, end) of every document piece in the packed rows."""
    found = []
    for r, positions in enumerate(rows["position_ids"].tolist()):
        starts = [i for i, p in enumerate(positions) if p == 0] + [len(positions)]
        found += [(r, a, b) for a, b in zip(starts, starts[1:])]
    return found


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(TINY, vocab_size=VOCAB).eval()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("implementation", ["sdpa", "flex_attention"])
def test_packed_rows_equal_each_document_alone(model, rows, implementation):
    """On CPU flex runs uncompiled (``force_eager``: PyTorch's reference flex over transformers' BlockMask):
    compiling it took 10-15 s here (60 s with a cold Inductor cache); bench/packed_attention.py checks
    the compiled kernel against sdpa."""
    model.set_attn_implementation("sdpa")
    stance = "force_eager" if implementation == "flex_attention" and not torch.cuda.is_available() else "default"
    with torch.no_grad():
        alone = {(r, a, b): model(input_ids=rows["input_ids"][r:r + 1, a:b], use_cache=False).logits[0]
                 for r, a, b in pieces(rows)}
        model.set_attn_implementation(implementation)
        with torch.compiler.set_stance(stance):
            packed = model(**rows, use_cache=False).logits
    assert model.config._attn_implementation == implementation
    for (r, a, b), expected in alone.items():
        diff = (packed[r, a:b] - expected).abs().max().item()
        assert diff <= 2e-5, f"{implementation}: row {r} tokens {a}-{b} see other documents (max diff {diff})"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_cannot_train_on_cpu_so_it_is_never_chosen_there(model, rows):
    """The fact behind the resolver's refusal: PyTorch refuses a flex forward that would need a backward on CPU."""
    model.set_attn_implementation("flex_attention")
    with torch.compiler.set_stance("force_eager"), \
            pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        model(**rows, use_cache=False)
    with pytest.raises(RecipeError, match="flex_attention trains on a CUDA GPU only"):
        choose_attention("flex_attention", packed=True, cuda=False, installed=set())


def test_flash_attention_document_bounds_are_the_rows_documents(rows):
    """Flash attention cannot run on this CPU; the boundaries the loop hands it are checked against the
    packed-sequence ids transformers builds the sdpa and flex masks from."""
    from transformers.masking_utils import find_packed_sequence_indices

    kwargs = varlen_kwargs(rows["position_ids"], "flash_attention_2")
    bounds = kwargs["cu_seq_lens_q"].tolist()
    length = rows["position_ids"].shape[1]
    assert bounds == [r * length + a for r, a, _ in pieces(rows)] + [rows["position_ids"].numel()]
    segments = torch.repeat_interleave(torch.arange(len(bounds) - 1), torch.tensor(bounds).diff())
    per_row = find_packed_sequence_indices(rows["position_ids"])
    offset = torch.cumsum(torch.tensor([0] + [int(row.max()) + 1 for row in per_row[:-1]]), 0)
    assert torch.equal(segments.view_as(per_row), per_row + offset[:, None])
    assert kwargs["max_length_q"] == max(b - a for _, a, b in pieces(rows))
    assert torch.equal(kwargs["cu_seq_lens_k"], kwargs["cu_seq_lens_q"])
    assert varlen_kwargs(rows["position_ids"], "flex_attention") == {}


@pytest.mark.parametrize("facts, expected", [
    ({"packed": True, "cuda": True, "installed": {"flash_attn"}, "half_precision": True}, "flash_attention_2"),
    ({"packed": False, "cuda": True, "installed": {"flash_attn"}, "half_precision": True}, "flash_attention_2"),
    ({"packed": True, "cuda": True, "installed": {"flash_attn"}, "half_precision": False}, "flex_attention"),
    ({"packed": True, "cuda": True, "installed": {"flash_attn_interface"}, "half_precision": True}, "flex_attention"),
    ({"packed": True, "cuda": True, "installed": set(), "half_precision": True}, "flex_attention"),
    ({"packed": True, "cuda": True, "installed": set(), "dropout": 0.1}, "sdpa"),
    ({"packed": False, "cuda": True, "installed": set(), "half_precision": True}, "sdpa"),
    ({"packed": True, "cuda": False, "installed": {"flash_attn"}, "half_precision": True}, "sdpa"),
])
def test_auto_picks_varlen_kernels_where_they_can_run(facts, expected):
    assert choose_attention("auto", **facts) == expected


def test_explicit_choices_are_kept_or_refused_with_the_reason():
    cpu = {"packed": True, "cuda": False, "installed": set()}
    for name in ("sdpa", "eager"):
        assert choose_attention(name, **cpu) == name
    assert choose_attention("flex_attention", **{**cpu, "cuda": True}) == "flex_attention"
    assert choose_attention("flash_attention_3", packed=True, cuda=True, installed={"flash_attn_interface"},
                            half_precision=True) == "flash_attention_3"
    refused = [
        ("flash_attn2", cpu, "attn_implementation is 'flash_attn2'; expected one of " + ", ".join(CHOICES)
         + r" \(did you mean 'flash_attention_2'\?\)"),
        ("flash_attention_2", {**cpu, "cuda": True, "half_precision": True}, "needs the `flash_attn` package"),
        ("flash_attention_3", {**cpu, "cuda": True, "installed": {"flash_attn"}, "half_precision": True},
         "needs the `flash_attn_interface` package"),
        ("flash_attention_2", {**cpu, "installed": {"flash_attn"}, "half_precision": True}, "CUDA GPU only"),
        ("flash_attention_2", {**cpu, "cuda": True, "installed": {"flash_attn"}}, "bf16/fp16 only"),
        ("flex_attention", cpu, r"CUDA GPU only \(PyTorch's FlexAttention has no backward pass on CPU\)"),
        ("flex_attention", {**cpu, "cuda": True, "dropout": 0.1}, "no attention dropout"),
    ]
    for name, facts, message in refused:
        with pytest.raises(RecipeError, match=message):
            choose_attention(name, **facts, field="attn_implementation")


def test_this_machine_s_facts_reach_the_choice(model):
    cuda, installed = torch.cuda.is_available(), installed_flash_packages()
    for name, package in FLASH_PACKAGES.items():   # fp32: refused everywhere, for this machine's first reason
        reason = (f"needs the `{package}` package" if package not in installed
                  else "runs on a CUDA GPU only" if not cuda else "computes in bf16/fp16 only")
        with pytest.raises(RecipeError, match=f"train.x: {name} {reason}"):
            resolve_attention(name, packed=True, half_precision=False, field="train.x")
    expected = "flex_attention" if torch.cuda.is_available() else "sdpa"   # fp32: never flash
    assert resolve_attention("auto", packed=True, half_precision=False) == expected
    assert use_attention(model, "auto", half_precision=False) == model.config._attn_implementation == expected


def test_pretraining_records_the_implementation_it_ran(pretrain_run):
    expected = "flex_attention" if torch.cuda.is_available() else "sdpa"
    assert pretrain_run.metrics["train/attn_implementation"] == expected
    assert pretrain_run.info["recipe"]["train"]["attn_implementation"] == "auto"


@pytest.mark.parametrize("value, message", [
    ("flash", "train.attn_implementation is 'flash'; expected one of auto, sdpa, flex_attention"),
    ("flash_attention_2", "train.attn_implementation: flash_attention_2 "),
])
def test_a_bad_choice_stops_the_pretrain_command_before_a_run_exists(runs, data_run, capsys, value, message):
    code = main(["--runs-dir", str(runs.root), "pretrain", "--config", str(DEMO / "pretrain.yaml"),
                 "--set", "name=attn-refused", "--set", f"data={data_run.name}",
                 "--set", f"train.attn_implementation={value}"])
    err = capsys.readouterr().err
    assert code == 2 and f"RecipeError: {DEMO / 'pretrain.yaml'}: {message}" in err and "Traceback" not in err
    assert not (runs.root / "attn-refused").exists()
