"""Bit-reproducible CPU runs (smolforge/determinism.py): the same recipe and seed on this machine give the
same loss at every step and the same weights, bit for bit, for pretraining, SFT, DPO and GRPO with HF
rollouts.

Each stage runs twice from the tiny chain, a few steps each. Between the two runs the process is disturbed
the way a pipeline sharing one process, or a test before this one, disturbs it: torch's thread count is
changed (vLLM's CPU worker, accelerate's CPU launcher and tests set their own; a reduction split over 2
threads adds in another order than over 1) and the random streams are drawn from. With
``determinism: {deterministic: false}`` the two DPO runs here end 1.9e-9 apart (at these sizes few kernels
split; on the demo's model 1 thread against 2 puts pretraining 1.5e-5 apart in 8 steps, docs/alignment.md).
"""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from conftest import run_stage, tiny_recipe
from smolforge.determinism import DeterminismSpec, default_threads, reproducible
from smolforge.errors import RecipeError
from smolforge.registry import load_stage

# A few steps of each stage, logging every step; parents from the session's tiny chain.
STAGES = {
    "pretrain": dict(train={"max_steps": 4, "log_every": 1, "warmup_steps": 1}, checkpoint={"every_steps": 0}),
    "sft": dict(trainer={"max_steps": 2, "logging_steps": 1}),
    "dpo": dict(trainer={"max_steps": 2, "logging_steps": 1}),
    "grpo": dict(generation="hf", eval_max_new_tokens=8, rewards=["test_reproducible:even_token_share"],
                 trainer={"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4,
                          "max_completion_length": 8, "logging_steps": 1}),
}
PARENTS = {"pretrain": "data_run", "sft": "pretrain_run", "dpo": "sft_run", "grpo": "sft_run"}


def even_token_share(prompts, completions, completion_ids, **kwargs):
    """A reward that differs between the tiny policy's sampled answers (the verifier's is 0 for all of them,
    which would leave GRPO's advantages, and so its update, at zero)."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


@pytest.fixture
def torch_threads():
    """torch's thread count as the test found it, put back afterwards."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def disturb() -> None:
    """What may happen in a process between two runs: another thread count, random numbers drawn."""
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
    torch.rand(5)
    random.random()
    np.random.rand(3)


def logged_losses(run) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    return [(m["step"], m["loss"]) for m in lines if "loss" in m]


def max_weight_difference(a, b) -> float:
    """The largest absolute difference between two runs' weights, over every tensor of every safetensors file."""
    from safetensors.torch import load_file

    files = sorted(p.name for p in a.model_dir.glob("*.safetensors"))
    assert files and files == sorted(p.name for p in b.model_dir.glob("*.safetensors"))
    worst = 0.0
    for name in files:
        first, second = load_file(a.model_dir / name), load_file(b.model_dir / name)
        assert first.keys() == second.keys()
        for key, tensor in first.items():
            assert tensor.dtype == second[key].dtype and tensor.shape == second[key].shape, key
            worst = max(worst, float((tensor.double() - second[key].double()).abs().max()))
    return worst


@pytest.mark.parametrize("stage", list(STAGES))
def test_the_same_recipe_twice_gives_identical_losses_and_weights(stage, runs, request, torch_threads):
    parent = request.getfixturevalue(PARENTS[stage])
    changes = {**STAGES[stage], **({"data": parent.name} if stage == "pretrain" else {"parent": parent.name})}
    first = run_stage(stage, runs, name=f"{stage}-repro-1", **changes)
    disturb()
    disturbed = torch.get_num_threads()
    second = run_stage(stage, runs, name=f"{stage}-repro-2", **changes)
    losses = logged_losses(first)
    assert len(losses) == (STAGES[stage].get("train") or STAGES[stage]["trainer"])["max_steps"]
    if stage != "pretrain":
        assert max_weight_difference(first, parent) > 0                # it trained: the weights moved
    assert logged_losses(second) == losses                       # every step, bit for bit
    assert max_weight_difference(first, second) == 0.0
    assert second.metrics["determinism/threads"] == first.metrics["determinism/threads"] == default_threads()
    assert first.metrics["determinism/nondeterministic"] == []          # HF rollouts: nothing left unfixed
    assert torch.get_num_threads() == disturbed                  # the stage put back what it found
    assert not torch.are_deterministic_algorithms_enabled()


def test_run_json_records_the_determinism_settings(runs, pretrain_run):
    """The chain's runs say what made them reproducible: on (a CPU run), the seed, the thread count."""
    metrics = pretrain_run.metrics
    assert metrics["determinism/deterministic"] is True
    assert metrics["determinism/seed"] == pretrain_run.info["recipe"]["train"]["seed"]
    assert metrics["determinism/threads"] == default_threads() >= 1
    assert metrics["determinism/nondeterministic"] == []
    from smolforge.pipeline import score_columns

    assert not [key for key in score_columns([metrics]) if key.startswith("determinism/")]   # not eval scores


def test_a_named_component_is_recorded_with_its_seed():
    """vLLM's sampling cannot be fixed by torch's settings: GRPO on the vLLM server names it, with its seed."""
    from smolforge.alignment.online import unfixed_sampling

    [server] = unfixed_sampling("vllm-server", 7)
    assert server["component"] == "vllm-server sampling" and server["seed"] == 7
    assert unfixed_sampling("hf", 7) == ()


def test_off_leaves_the_process_as_it_was_and_says_so(torch_threads):
    torch.set_num_threads(1)
    with reproducible(DeterminismSpec(deterministic=False, threads=2), seed=5) as record:
        assert torch.get_num_threads() == 1 and not torch.are_deterministic_algorithms_enabled()
    assert record == {"deterministic": False, "seed": 5, "threads": 1, "nondeterministic": []}
    with reproducible(DeterminismSpec(threads=2), seed=5, cuda=False) as record:
        assert torch.get_num_threads() == 2 and torch.are_deterministic_algorithms_enabled()
    assert record["deterministic"] is True and record["threads"] == 2
    assert torch.get_num_threads() == 1 and not torch.are_deterministic_algorithms_enabled()


def test_a_bad_thread_count_is_refused_before_any_run(runs, pretrain_run):
    recipe = tiny_recipe("sft", name="sft-bad-threads", parent=pretrain_run.name, determinism={"threads": 0})
    with pytest.raises(RecipeError, match="determinism.threads must be >= 1"):
        load_stage("sft").validate(recipe, runs)
    assert not (runs.root / "sft-bad-threads").exists()
