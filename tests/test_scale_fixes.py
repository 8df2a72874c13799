"""Fixes for runs at scale and on one card: resume verified once per job, the GPU a rank binds, and an
eval parity check whose two sides share the card and the dtype.

No GPU here: the GPU decisions are pure functions checked with real numbers (an 8-GPU node, a
one-GPU-per-task binding, an 80 GiB card), and the CPU paths run for real (two gloo ranks resuming,
HF scoring a tiny model)."""
from __future__ import annotations

import json
import multiprocessing
import weakref

import pytest
import torch

from conftest import tiny_recipe
from smolforge.devices import local_device_index
from smolforge.errors import RecipeError, RunError, ServiceError
from smolforge.runs import Runs

GIB = 2**30


# --------------------------------------------------------------------------- resume: hashed once per job

def _unfinished_run(runs: Runs, name: str, files: dict[str, bytes]) -> None:
    """A pretraining run killed after writing checkpoint step-4 (``files`` + its manifest)."""
    from smolforge.pretrain import checkpoint as ckpt

    with pytest.raises(RuntimeError), runs.start("pretrain", name, recipe={}) as run:
        folder = run.checkpoints_dir / "step-4"
        for relative, data in files.items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_bytes(data)
        ckpt.write_manifest(folder)
        raise RuntimeError("node lost")


def _resume_on_rank(rank: int, store: str, runs_root: str, recipes: list, answers) -> None:
    """One of two gloo ranks: each asks where to resume each run; how many files did it hash?"""
    import torch.distributed as dist

    from smolforge.pretrain import checkpoint as ckpt
    from smolforge.pretrain import stage

    hashed: list[str] = []
    real_sha256 = ckpt._sha256
    ckpt._sha256 = lambda path: (hashed.append(path.name), real_sha256(path))[1]   # count, then hash for real
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        found = []
        for recipe in recipes:
            try:
                found.append(stage.resume_point(recipe, Runs(runs_root), overwrite=False).name)
            except RunError as exc:
                found.append(f"RunError: {exc}")
        answers.put((rank, len(hashed), found))
    except BaseException as exc:  # noqa: BLE001 - reported to the test instead of a silent exit code
        answers.put((rank, -1, [repr(exc)]))
    finally:
        dist.destroy_process_group()


def test_two_ranks_resuming_hash_the_checkpoint_once_and_share_the_answer(tmp_path):
    """Rank 0 alone verifies the checkpoints: each file is hashed once in the whole job (3 of the killed
    run, 1 of the corrupt one), none by rank 1. Both ranks resume the killed run from step-4, and both
    refuse the corrupt one with the same message."""
    runs = Runs(tmp_path / "runs")
    _unfinished_run(runs, "killed", {"a.bin": b"x" * 100, "b.bin": b"y", "state/c.pt": b"z" * 10})
    _unfinished_run(runs, "corrupt", {"a.bin": b"x"})
    (runs.root / "corrupt" / "checkpoints" / "step-4" / "a.bin").write_bytes(b"damaged")
    recipes = [tiny_recipe("pretrain", name="killed"), tiny_recipe("pretrain", name="corrupt")]

    context = multiprocessing.get_context("fork")   # the ranks inherit this process's imports: no second torch import
    answers = context.Queue()
    ranks = [context.Process(target=_resume_on_rank, args=(r, str(tmp_path / "store"), str(runs.root), recipes, answers))
             for r in (0, 1)]
    for process in ranks:
        process.start()
    try:
        got = sorted(answers.get(timeout=120) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    refusal = ("RunError: run 'corrupt' exists unfinished (status failed) without a usable checkpoint; "
               "or pass --overwrite to start over")
    assert got == [(0, 3 + 1, ["step-4", refusal]), (1, 0, ["step-4", refusal])]


# --------------------------------------------------------------------------- which GPU a rank binds

def test_a_rank_binds_its_local_rank_or_the_one_gpu_its_task_was_given():
    assert local_device_index(3, 8) == 3          # 8 GPUs visible on the node: cuda:LOCAL_RANK
    assert local_device_index(3, 1) == 0          # Slurm/containers bind one GPU per task: it is cuda:0
    assert local_device_index(0, 1) == 0
    assert local_device_index(9, 8) == 1          # more ranks than cards: they share, round robin
    with pytest.raises(ValueError, match="no device to bind local rank 2"):
        local_device_index(2, 0)


def test_burnin_binds_the_task_gpu_and_still_refuses_two_ranks_on_one_card():
    from smolforge.ops.burnin import compute_device

    assert compute_device("cuda", 3, device_count=8) == torch.device("cuda", 3)
    assert compute_device("auto", 3, device_count=1) == torch.device("cuda", 0)
    assert compute_device("auto", 3, device_count=0) == torch.device("cpu")
    with pytest.raises(RecipeError, match="local rank 9 has no GPU \\(8 visible\\)"):
        compute_device("cuda", 9, device_count=8)


# --------------------------------------------------------------------------- eval parity on one card, one dtype

def test_vllm_asks_for_the_share_of_the_card_that_is_free_now():
    from smolforge.generation.vllm_memory import gpu_share

    assert gpu_share(80 * GIB, 80 * GIB) == 0.9                    # an empty H100: vLLM's own default
    share = gpu_share(30 * GIB, 80 * GIB)                          # something else holds 50 GiB
    assert share == 0.36 and share * 80 * GIB <= 30 * GIB - GIB    # vLLM checks share × total <= free
    assert gpu_share(30 * GIB, 80 * GIB, needed=6 * GIB) == 0.36
    with pytest.raises(ServiceError, match="vLLM needs 6.0 GiB of GPU memory but only 5.0 of 80.0 GiB are free"):
        gpu_share(5 * GIB, 80 * GIB, needed=6 * GIB)
    with pytest.raises(ServiceError, match="only 0.5 of 24.0 GiB are free"):
        gpu_share(GIB // 2, 24 * GIB)


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """The same tiny Llama saved in fp32 and in bf16 (config ``dtype`` says which)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    folders = {}
    for dtype in (torch.float32, torch.bfloat16):
        folders[dtype] = tmp_path_factory.mktemp(str(dtype).split(".")[1])
        model.to(dtype).save_pretrained(folders[dtype])
    return folders


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_vllm_scores_in_the_dtype_hf_loads(model_folders, device):
    """For an fp32 and a bf16 checkpoint, on CPU and on a GPU: the vLLM server's --dtype and the in-process
    engine's dtype are the dtype HF loads the model in (YaRN stretch included)."""
    from smolforge.evals.backends import scoring_dtype, vllm_engine_args
    from smolforge.evals.long_context import load_model
    from smolforge.generation.vllm_server import VLLMServer

    yarn = {"rope_type": "yarn", "factor": 2}
    for folder in model_folders.values():
        dtype = scoring_dtype(folder, device)
        hf = load_model(folder, yarn, device="cpu", dtype=dtype)
        assert hf.config.rope_parameters["rope_type"] == "yarn"
        command = VLLMServer(folder, port=8000, dtype=dtype).command(cpu=device == "cpu")
        assert getattr(torch, command[command.index("--dtype") + 1]) == hf.dtype
        engine = vllm_engine_args(folder, max_length=128, rope_scaling=yarn, dtype=dtype,
                                  gpu_memory_utilization=0.36, cpu=device == "cpu")
        assert getattr(torch, engine["dtype"]) == hf.dtype
        assert engine["hf_overrides"]["rope_parameters"]["rope_type"] == "yarn"
        assert engine.get("gpu_memory_utilization") == (0.36 if device == "cuda" else None)
    assert scoring_dtype(model_folders[torch.bfloat16], device) == ("bfloat16" if device == "cuda" else "float32")


def test_parity_tolerance_follows_the_dtype_and_is_recorded():
    """A 0.1 log-likelihood gap on one document and a 1 % gap in a margin: real differences in fp32,
    rounding in bf16."""
    from smolforge.evals.parity import compare

    def scored(backend: str, dtype: str | None, loglik: float, margin: float) -> dict:
        return {"backend": backend, "dtype": dtype, "scores": {"t": {"acc": 1.0, "margin": margin}},
                "samples": [{"task": "t", "doc_id": 0, "resps": [[loglik, True]]}]}

    fp32 = compare(scored("hf", "float32", -2.0, 2.0), scored("vllm", "float32", -2.1, 2.02))
    bf16 = compare(scored("hf", "bfloat16", -2.0, 2.0), scored("vllm", "bfloat16", -2.1, 2.02))
    assert (fp32["dtype"], fp32["agree"], fp32["tasks"]["t"]["documents_differing"]) == ("float32", False, 1)
    assert not fp32["tasks"]["t"]["metrics"]["margin"]["ok"]
    assert (bf16["dtype"], bf16["agree"], bf16["tasks"]["t"]["documents_differing"]) == ("bfloat16", True, 0)
    assert fp32["tolerance"]["loglik_atol"] < 0.1 < bf16["tolerance"]["loglik_atol"]
    assert fp32["tolerance"]["metric_rtol"] < 0.01 < bf16["tolerance"]["metric_rtol"]
    assert compare(scored("hf", "float32", -2.0, 2.0), scored("endpoint", None, -2.0, 2.0))["dtype"] == "float32"


class _VLLMStarts(Exception):
    """Raised where vLLM (an engine or a server) would start: the test has seen what it came for."""


@pytest.mark.parametrize("backend", ["vllm", "endpoint"])
def test_hf_scores_first_and_its_model_is_gone_when_vllm_starts(runs, pretrain_run, monkeypatch, backend):
    """A suite with a position-perplexity task (HF scores it, whatever the backend) and an lm-eval task: on
    one GPU, HF's model must be loaded, used and garbage before a vLLM engine or server sizes itself from
    the memory free at that moment."""
    from smolforge.evals import backends, long_context, stage
    from smolforge.evals.suite import load_suite
    from smolforge.generation.vllm_server import VLLMServer
    from smolforge.recipe import build_stage_recipe

    loaded, seen = [], []
    real_load, real_make_lm = long_context.load_model, backends.make_lm

    def load_model(*args, **kwargs):
        model = real_load(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    def vllm_starts(*args, **kwargs):
        seen.append([ref() is not None for ref in loaded])
        raise _VLLMStarts

    monkeypatch.setattr(long_context, "load_model", load_model)
    monkeypatch.setattr(backends, "make_lm", lambda which, *a, **k: (vllm_starts if which == "vllm" else real_make_lm)(
        which, *a, **k))
    monkeypatch.setattr(VLLMServer, "start", vllm_starts)
    recipe = build_stage_recipe(stage, {"run": pretrain_run.name, "suite": "longctx", "limit": 1, "batch_size": 2,
                                        "backend": backend}, source="eval (test)")
    with pytest.raises(_VLLMStarts):
        stage.score(recipe, pretrain_run, load_suite("longctx"), ["position_ppl", "passkey_256"], backend)
    assert seen == [[False]]   # one HF model was loaded (position_ppl scored), and it is gone


def test_the_eval_json_records_the_dtype_the_scoring_ran_in(tmp_path):
    from smolforge.evals import stage
    from smolforge.evals.suite import load_suite
    from smolforge.recipe import build_stage_recipe

    with Runs(tmp_path).start("sft", "scored", recipe={}) as target:
        recipe = build_stage_recipe(stage, {"run": "scored", "suite": "embedded"}, source="eval (test)")
        for dtype in ("bfloat16", None):   # a GPU scoring a bf16 checkpoint; an external endpoint (unknown)
            stage._write(target, load_suite("embedded"), ["facts"], recipe,
                         {"backend": "hf", "endpoint": None, "dtype": dtype, "scores": {}, "samples": [], "seconds": 1})
            assert json.loads((target.eval_dir / "embedded.json").read_text())["settings"]["dtype"] == dtype
