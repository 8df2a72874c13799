"""`smolforge launch` on a real one-machine Slurm cluster (tests/slurm_cluster.py): a pretraining job
on two tasks (srun + torchrun), the pre-timeout signal → checkpoint → requeue → resume, and scancel."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, ZERO_TRAIN, events, losses
from conftest import write_pretrain_recipe as write_recipe


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _status(run_dir) -> str | None:
    try:
        return json.loads((run_dir / "run.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None


def _launch(runs, recipe_args, name, slurm, *extra, tasks: int = 2) -> str:
    out = subprocess.run([sys.executable, "-m", "smolforge", *recipe_args[2:4], "launch", "pretrain",
                          *recipe_args[5:], "--set", f"name={name}", "--tasks-per-node", str(tasks), "--time", "10",
                          "--json", *extra], capture_output=True, text=True, cwd=REPO, env=slurm.env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)["slurm_job_id"]


@pytest.mark.slow
def test_slurm_job_signalled_before_its_time_limit_requeues_and_matches_the_local_run(runs, data_run, slurm, tmp_path,
                                                                                   deepspeed_zero3_run):
    """`smolforge launch` → sbatch → srun + torchrun (2 ranks); USR1 as the time limit would send it:
    checkpoint, stop, requeue, resume; every step's loss equals the local 2-rank run's (deepspeed launcher)."""
    reference = deepspeed_zero3_run.path
    recipe = write_recipe(tmp_path / "slurm.yaml", runs, "pretrain-slurm", data_run.name,
                          train={**ZERO_TRAIN, "zero_stage": 3, "micro_batch_size": 4})
    run_dir = runs.root / "pretrain-slurm"
    job = _launch(runs, recipe, "pretrain-slurm", slurm)
    assert _status(run_dir) in ("queued", "running")
    # as soon as the stage runs (still building its engine): it stops after its first step
    _wait_for(lambda: _status(run_dir) == "running", 120, "the job to start the stage")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True, env=slurm.env, timeout=30)
    _wait_for(lambda: _status(run_dir) == "done", 240, "the requeued job to finish")
    log = (run_dir / "slurm" / f"job-{job}.out").read_text()
    assert "stop asked (USR1)" in log and f"requeueing job {job}" in log
    stopped, resumed = events(run_dir, "stopped"), events(run_dir, "resume")
    assert len(stopped) == 1 and len(resumed) == 1 and resumed[0]["step"] == stopped[0]["step"] < ZERO_TRAIN["max_steps"]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["launch"]["slurm_job_id"] == job and info["metrics"]["train/launcher"] == "slurm-torchrun"
    assert info["metrics"]["train/resumes"] == 1
    mine, theirs = losses(run_dir), losses(reference)
    assert list(mine) == list(theirs)
    np.testing.assert_allclose(list(mine.values()), list(theirs.values()), rtol=1e-6)


@pytest.mark.slow
def test_scancel_of_a_running_job_never_leaves_the_run_done(runs, data_run, slurm, tmp_path):
    recipe = write_recipe(tmp_path / "cancel.yaml", runs, "pretrain-cancelled", data_run.name,
                          train={**ZERO_TRAIN, "max_steps": 2000, "zero_stage": 2, "micro_batch_size": 4},
                          checkpoint={"every_steps": 5})
    run_dir = runs.root / "pretrain-cancelled"
    job = _launch(runs, recipe, "pretrain-cancelled", slurm, "--no-requeue", tasks=1)
    # in the training loop: SIGTERM then reaches Python between steps (a rank still starting up may sit in
    # a C call past Slurm's KillWait and be SIGKILLed, leaving the run `running`: unfinished, not done)
    _wait_for(lambda: run_dir.joinpath("metrics.jsonl").is_file() and max(losses(run_dir), default=0) > 5, 120,
              "the first checkpoint")
    subprocess.run(["scancel", job], check=True, env=slurm.env, timeout=30)
    _wait_for(lambda: subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True,
                                     env=slurm.env).stdout.strip() == "", 60, "Slurm to end the job")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] != "done"
    if info["status"] == "failed":  # the rank that unwound first wrote why: SIGTERM, or its peer's lost connection
        assert info["error"], info
    else:  # a rank SIGKILLed inside a C call after KillWait: unfinished, and resumable from its checkpoint
        from smolforge.pretrain.checkpoint import newest_valid

        assert info["status"] == "running" and newest_valid(run_dir / "checkpoints") is not None
    listed = subprocess.run([sys.executable, "-m", "smolforge", "--runs-dir", str(runs.root), "runs"],
                            capture_output=True, text=True, env=slurm.env, cwd=REPO, timeout=60)
    row = next(line for line in listed.stdout.splitlines() if line.startswith("pretrain-cancelled"))
    assert info["status"] in row and job in row
