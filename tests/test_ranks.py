"""TRL stages on two ranks (real launchers, gloo on this CPU), failures on one rank, and resume.

One pipeline drives it all, each step started by ``accelerate launch`` on two processes with
DeepSpeed ZeRO-3: DPO from the session's SFT model (gathering off: smolforge gathers the weights),
then GRPO, which trains one step (rollouts from the partitioned policy) before its reward function
fails on rank 1 only. SFT on two ZeRO-3 ranks with DeepSpeed gathering the weights it saves is
bench/gpu_check.sh's ``sft_zero3`` part, which tests/test_gpu_check.py runs on this CPU.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from conftest import DEMO, REPO, TINY
from smolforge.errors import RunError
from smolforge.recipe import deep_merge, load_recipe
from smolforge.runs import Runs

ZERO3 = {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
         "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
         "train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": False}}
# CPU ranks over gloo on every machine (a GPU machine too), so 1 and 2 ranks compare in fp32
SMALL = {"max_steps": 4, "per_device_train_batch_size": 4, "logging_steps": 1, "save_steps": 4,
         "use_cpu": True, "bf16": False, "gradient_checkpointing": False}

FAILING_REWARD = '''
import os


def fails_on_rank_1(completions, trainer_state=None, **columns):
    """Scores 0, except on rank 1 from the second training step on, where its (pretend) service is down."""
    if trainer_state is not None and trainer_state.global_step >= 1 and os.environ.get("RANK") == "1":
        raise ConnectionError("reward service on rank 1 is unreachable")
    return [0.0 for _ in completions]
'''


def accelerate_config(folder, name: str, gather_on_save: bool):
    """An accelerate config for two CPU processes under DeepSpeed ZeRO-3 (zero.Init while loading)."""
    ds = folder / f"{name}.json"
    ds.write_text(json.dumps({**ZERO3, "zero_optimization": {
        "stage": 3, "stage3_gather_16bit_weights_on_model_save": gather_on_save}}))
    config = folder / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "num_machines": 1,
        "num_processes": 2, "use_cpu": True,
        "deepspeed_config": {"deepspeed_config_file": str(ds), "zero3_init_flag": True}}))
    return config.name


DPO_2R = {"name": "dpo-2r", "trainer": {"max_length": 64, "learning_rate": 1e-4}}


def step(stage: str, config: str, **recipe) -> dict:
    trainer = {**SMALL, **recipe.pop("trainer", {})}
    return {"stage": stage, **recipe, "trainer": trainer,
            "launch": {"processes": 2, "launcher": "accelerate", "config": config}}


def full_weights_from_partitions(checkpoint) -> dict:
    """The trainer's own parameters, rebuilt from the ZeRO-3 shards of its last checkpoint."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))


def assert_model_matches_partitions(run) -> None:
    """model/ loads as a plain HF model whose every tensor equals the trainer's, rebuilt from its shards."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(run.model_dir).state_dict()
    shards = full_weights_from_partitions(run.checkpoints_dir / "checkpoint-4")
    assert set(shards) <= set(loaded) and all(value.numel() for value in loaded.values())
    for key, value in shards.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


@pytest.fixture(scope="module")
def two_rank_pipeline(tmp_path_factory, runs, data_run, sft_run):
    """The two-step pipeline, run once; ``(runs, the RunError it ended with)``."""
    from smolforge.pipeline import load_pipeline, run_pipeline

    folder = tmp_path_factory.mktemp("ranks")
    (folder / "failing_rewards.py").write_text(FAILING_REWARD)
    gathered = accelerate_config(folder, "zero3", gather_on_save=True)
    own_gather = accelerate_config(folder, "zero3-nogather", gather_on_save=False)
    common = {"data": data_run.name}
    rl = {"generation": "hf", "eval_max_new_tokens": 4, "heldout_fraction": 0.05, "rewards": ["answer_match"],
          "trainer": {"num_generations": 4, "max_completion_length": 6}}
    pipeline = {"pipeline": [
        step("dpo", own_gather, **DPO_2R, parent=sft_run.name, **common),
        step("grpo", gathered, name="grpo-fails", parent="dpo-2r",
             **{**rl, "rewards": ["failing_rewards:fails_on_rank_1"]}, **common),
    ]}
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    saved_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), saved_path]))
    try:
        with pytest.raises(RunError) as failure:
            run_pipeline(load_pipeline(path), runs.root)
    finally:
        if saved_path is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved_path
    return runs, failure.value


@pytest.mark.slow
def test_two_rank_zero3_stage_writes_one_run_with_gathered_weights(two_rank_pipeline):
    runs, _ = two_rank_pipeline
    run = runs.get("dpo-2r")
    assert (run.status, run.metrics["train/processes"], run.metrics["train/launcher"]) == ("done", 2, "accelerate")
    assert run.metrics["train/steps"] == 4
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == [1, 2, 3, 4]  # logged once, not per rank
    # stage3_gather_16bit_weights_on_model_save off: smolforge gathered the parameters itself
    assert_model_matches_partitions(run)


@pytest.mark.slow
def test_two_rank_dpo_follows_the_one_rank_losses_on_the_same_global_batch(two_rank_pipeline, sft_run, data_run):
    from smolforge.alignment import dpo
    from smolforge.recipe import build_stage_recipe
    from smolforge.registry import load_stage

    runs, _ = two_rank_pipeline
    one_rank = step("dpo", "-", **{**DPO_2R, "name": "dpo-1r"}, parent=sft_run.name, data=data_run.name)
    one_rank.pop("launch"), one_rank.pop("stage")
    one_rank["trainer"]["per_device_train_batch_size"] = 8          # the two ranks' global batch of 2 x 4
    dpo.run(build_stage_recipe(load_stage("dpo"), one_rank, source="dpo-1r (test)"), runs, overwrite=True)
    one, two = (
        [json.loads(line)["loss"] for line in runs.get(name).metrics_path.read_text().splitlines()
         if "loss" in json.loads(line)] for name in ("dpo-1r", "dpo-2r"))
    assert len(one) == len(two) == 4
    assert one[-1] < one[0]  # it trained
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one), rtol=2e-3, atol=2e-3)


@pytest.mark.slow
def test_a_failure_on_rank_1_fails_the_run_with_rank_1s_error(two_rank_pipeline):
    runs, failure = two_rank_pipeline
    assert "grpo-fails" in str(failure)
    run = runs.get("grpo-fails", require_done=False)
    assert run.status == "failed"
    assert run.info["error"].startswith("rank 1: ")  # not rank 0's lost-peer error that followed
    assert "ConnectionError: reward service on rank 1 is unreachable" in run.info["error"]
    # before that, GRPO scored its held-out prompts and trained a step from the partitioned policy
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == [1]


# --------------------------------------------------------------------------- resume after SIGKILL


@pytest.mark.slow
def test_a_killed_sft_run_resumes_from_its_checkpoint(runs, data_run, pretrain_run, tmp_path):
    from smolforge.cli import main

    trainer = {"max_steps": 40, "save_steps": 10, "per_device_train_batch_size": 8, "max_length": 64,
               "logging_steps": 1, "learning_rate": 1e-3}
    _, recipe = load_recipe(DEMO / "sft.yaml")
    recipe = deep_merge(deep_merge(recipe, TINY["sft"]), {
        "name": "sft-killed", "parent": pretrain_run.name, "data": data_run.name, "eval_fraction": 0,
        "early_stopping_patience": 0, "trainer": trainer})
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump({"stage": "sft", **recipe}))
    command = ["--runs-dir", str(runs.root), "sft", "--config", str(path)]
    child = subprocess.Popen([sys.executable, "-m", "smolforge", *command, "--overwrite"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = runs.root / "sft-killed" / "checkpoints" / "checkpoint-10" / "trainer_state.json"
    try:
        deadline = time.monotonic() + 120
        while not _whole(first) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        _, stderr = child.communicate()
    assert first.is_file(), stderr[-3000:]
    killed = runs.get("sft-killed", require_done=False)
    assert killed.status == "running"  # SIGKILL: nothing got to say otherwise

    assert main(command) == 0  # the same command again resumes instead of refusing
    resumed = runs.get("sft-killed")
    steps = [json.loads(line)["step"] for line in resumed.metrics_path.read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == list(range(1, 41))  # no step logged twice, none missing
    assert resumed.metrics["train/steps"] == 40

    assert main([*command, "--set", "name=sft-whole"]) == 0
    from safetensors.torch import load_file

    a = load_file(resumed.model_dir / "model.safetensors")
    b = load_file(runs.root / "sft-whole" / "model" / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def _whole(path) -> bool:
    """The Trainer wrote ``path`` (JSON) to its end (it writes it in place: an early look can see it half-written)."""
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def test_an_unfinished_run_without_a_checkpoint_is_not_resumed(runs, tmp_path):
    from smolforge.alignment.ranks import resume_point

    with Runs(tmp_path).start("sft", "half", recipe={}) as run:
        run.info["status"] = "running"
        run._write()
        with pytest.raises(RunError, match="without a complete checkpoint .* pass --overwrite"):
            resume_point(run.path, overwrite=False)
        assert resume_point(run.path, overwrite=True) is None
        (run.checkpoints_dir / "checkpoint-5").mkdir(parents=True)
        with pytest.raises(RunError, match="without a complete checkpoint"):  # killed while saving
            resume_point(run.path, overwrite=False)
        (run.checkpoints_dir / "checkpoint-5" / "trainer_state.json").write_text("{}")
        assert resume_point(run.path, overwrite=False).name == "checkpoint-5"
    with pytest.raises(RunError, match="already exists \\(status done\\)"):
        resume_point(run.path, overwrite=False)
