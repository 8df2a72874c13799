"""How a stage starts on N ranks: launch specs, launcher command lines, what a run records, --local_rank."""
from __future__ import annotations

import os

import pytest
import yaml

from smolforge.errors import RecipeError
from smolforge.launchers import LaunchSpec, launch_command, launch_info


@pytest.mark.parametrize(("value", "message"), [
    ({"processes": 2, "launchr": "torchrun"}, "unknown key 'launchr' (did you mean 'launcher'?)"),
    ({"processes": 0}, "processes must be an integer >= 1, got 0"),
    ({"processes": "8"}, "processes must be an integer >= 1, got '8'"),
    ({"processes": 2, "launcher": "mpirun"}, "launcher 'mpirun' is not one of torchrun, deepspeed, accelerate"),
    ({"processes": 2, "launcher": "torchrun", "config": "z.yaml"}, "config is an accelerate config file; launcher is torchrun"),
    ({"processes": 2, "launcher": "accelerate", "config": "missing.yaml"}, "missing.yaml not found"),
    ([2, "torchrun"], "launch must be a mapping"),
])
def test_bad_launch_specs_are_named(tmp_path, value, message):
    with pytest.raises(RecipeError) as error:
        LaunchSpec.parse(value, "p.yaml: pipeline step 2", tmp_path)
    assert str(error.value).startswith("p.yaml: pipeline step 2 launch") and message in str(error.value)


def test_each_launcher_gets_its_own_command_line(tmp_path):
    (tmp_path / "z3.yaml").write_text("distributed_type: DEEPSPEED\n")
    args = ["--runs-dir", "r", "sft", "--config", "s.yaml"]
    assert launch_command(LaunchSpec(), args, python="py") == ["py", "-m", "smolforge", *args]
    assert launch_command(LaunchSpec(2, "deepspeed"), args, python="py", port=7) == [
        "py", "-m", "deepspeed.launcher.runner", "--num_accelerators", "2", "--master_addr", "127.0.0.1",
        "--master_port", "7", "--module", "smolforge", *args]
    spec = LaunchSpec.parse({"processes": 4, "launcher": "accelerate", "config": "z3.yaml"}, "here", tmp_path)
    assert launch_command(spec, args, python="py", port=7) == [
        "py", "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "z3.yaml"), "--num_processes", "4",
        "--main_process_ip", "127.0.0.1", "--main_process_port", "7", "-m", "smolforge", *args]


@pytest.mark.parametrize(("env", "expected"), [
    ({}, {}),
    ({"WORLD_SIZE": "1"}, {}),
    ({"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}, {"train/processes": 2, "train/launcher": "torchrun"}),
    ({"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x", "ACCELERATE_USE_DEEPSPEED": "true"},
     {"train/processes": 2, "train/launcher": "accelerate"}),
    ({"WORLD_SIZE": "8", "CROSS_RANK": "0"}, {"train/processes": 8, "train/launcher": "deepspeed"}),
    ({"WORLD_SIZE": "1", "SMOLFORGE_LAUNCHER": "torchrun"}, {"train/processes": 1, "train/launcher": "torchrun"}),
])
def test_a_run_records_how_it_was_launched(monkeypatch, tmp_path, env, expected):
    for key in list(os.environ):
        if key.startswith("ACCELERATE_") or key in ("WORLD_SIZE", "TORCHELASTIC_RUN_ID", "CROSS_RANK",
                                                     "SMOLFORGE_LAUNCHER"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert launch_info() == expected
    from smolforge.runs import Runs

    with Runs(tmp_path).start("sft", "launched", recipe={}) as run:
        assert run.metrics == expected


def test_pipeline_steps_say_how_they_start(tmp_path):
    from smolforge.pipeline import load_pipeline

    (tmp_path / "acc.yaml").write_text("distributed_type: MULTI_CPU\n")
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump({"stage": "sft", "name": "s"}))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "pipeline": [{"stage": "data", "name": "d"},
                     {"recipe": "sft.yaml", "launch": {"processes": 4, "launcher": "accelerate", "config": "acc.yaml"}},
                     {"stage": "dpo", "name": "p", "launch": {"processes": 1}},
                     {"stage": "grpo", "name": "g"}],
        "launch": {"processes": 2, "launcher": "deepspeed"}}))
    data, sft, dpo, grpo = load_pipeline(tmp_path / "p.yaml").steps
    assert data.launch is None                                     # data steps run as one process
    assert (sft.launch.processes, sft.launch.launcher, sft.launch.config) == (4, "accelerate", str(tmp_path / "acc.yaml"))
    assert (dpo.launch.processes, "launch" in dpo.recipe) == (1, False)  # the step's own wins; not a recipe key
    assert (grpo.launch.processes, grpo.launch.launcher) == (2, "deepspeed")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"pipeline": [{"recipe": "sft.yaml", "launch": {"procs": 2}}]}))
    with pytest.raises(RecipeError, match="pipeline step 1 launch: unknown key 'procs'"):
        load_pipeline(tmp_path / "bad.yaml")


def test_the_deepspeed_launchers_local_rank_is_taken_by_every_command(monkeypatch, tmp_path, capsys):
    from smolforge.cli import main

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("LOCAL_RANK")  # recorded, so the value main() sets is undone after the test
    assert main(["runs", "--runs-dir", str(tmp_path), "--local_rank=3"]) == 0
    assert os.environ["LOCAL_RANK"] == "3"
    monkeypatch.setenv("LOCAL_RANK", "1")  # the launcher's own variable wins
    assert main(["--local_rank", "5", "runs", "--runs-dir", str(tmp_path)]) == 0
    assert os.environ["LOCAL_RANK"] == "1"
    assert main(["runs", "--local_rank", "x"]) == 2
    assert "--local_rank needs a process index" in capsys.readouterr().err
