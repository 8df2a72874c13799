"""``smolforge launch``: the Slurm job script (dry run), its errors, and what a queued run looks like."""
from __future__ import annotations

import json

import pytest

from conftest import DEMO
from smolforge.cli import main


def launch(tmp_path, *args: str) -> list[str]:
    return ["--runs-dir", str(tmp_path / "runs"), "launch", *args]


def test_dry_run_prints_a_two_node_eight_gpu_script_with_the_rendezvous_and_writes_nothing(tmp_path, capsys):
    code = main(launch(tmp_path, "pretrain", "--config", str(DEMO / "pretrain.yaml"), "--nodes", "2",
                       "--gpus-per-node", "8", "--partition", "hopper", "--time", "2-00:00:00", "--account", "llm",
                       "--sbatch=--exclusive", "--env", "NCCL_DEBUG=WARN", "--dry-run"))
    script = capsys.readouterr().out
    assert code == 0 and script.startswith("#!/bin/bash\n")
    lines = script.splitlines()
    for expected in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                     "#SBATCH --partition=hopper", "#SBATCH --time=2-00:00:00", "#SBATCH --account=llm",
                     "#SBATCH --exclusive", "#SBATCH --signal=B:USR1@300", "#SBATCH --requeue",
                     "export NCCL_DEBUG=WARN",
                     'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'):
        assert expected in lines, expected
    assert '  --nnodes "$SLURM_JOB_NUM_NODES" --nproc_per_node 8 \\' in lines
    # the requeue is said before it is asked: slurmctld kills the script as it requeues the job
    said = lines.index('  echo "smolforge: requeueing job $SLURM_JOB_ID (the stage checkpointed and stopped)"')
    assert lines[said + 1].startswith('  scontrol requeue "$SLURM_JOB_ID" || ')
    assert '  --rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \\' in lines
    # the rendezvous port stays out of the range free_port() hands out (20000 up to the ephemeral ports)
    from smolforge.processes import free_port

    master = next(line for line in lines if line.startswith("export MASTER_PORT="))
    for job_id in (1, 2, 9999, 123456):
        port = eval(master.split("$((")[1].split("))")[0].replace("SLURM_JOB_ID", str(job_id)))  # noqa: S307
        assert 10000 <= port < 20000
    assert free_port() >= 20000
    assert not (tmp_path / "runs").exists()  # a dry run creates nothing


def test_srun_native_ranks_take_their_rank_from_slurm(tmp_path, capsys):
    assert main(launch(tmp_path, "sft", "--config", str(DEMO / "sft.yaml"), "--tasks-per-node", "4",
                       "--rendezvous", "srun", "--no-requeue", "--dry-run")) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --ntasks-per-node=4" in script and "#SBATCH --requeue" not in script
    assert "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS" in script


@pytest.mark.parametrize(("args", "message"), [
    (["--time", "two days"], "--time 'two days': expected minutes or [D-]HH:MM:SS"),
    (["--nodes", "0"], "--nodes must be >= 1"),
    (["--sbatch", "exclusive"], "give the option as sbatch takes it"),
    (["--env", "NOVALUE"], "--env 'NOVALUE': expected KEY=VALUE"),
    (["--set", "trainer.betta=0.1"], "unknown key"),
])
def test_bad_launch_options_are_refused_before_anything_is_written(tmp_path, capsys, args, message):
    assert main(launch(tmp_path, "dpo", "--config", str(DEMO / "dpo.yaml"), "--dry-run", *args)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_recipe_for_another_stage_is_named(tmp_path, capsys):
    assert main(launch(tmp_path, "sft", "--config", str(DEMO / "dpo.yaml"), "--dry-run")) == 2
    assert "recipe is for stage 'dpo', not 'sft'" in capsys.readouterr().err


def test_a_queued_run_is_started_in_place_by_its_job(tmp_path):
    """What `launch` leaves (status queued, slurm/ files, the job id) is reopened, not refused, by the stage."""
    from smolforge.runs import Runs, write_json_atomic

    runs = Runs(tmp_path)
    with runs.start("sft", "queued-run", recipe={}) as run:
        (run.path / "slurm").mkdir()
        (run.path / "slurm" / "job.sh").write_text("#!/bin/bash\n")
        run.info.update(status="queued", launch={"slurm_job_id": "42"})
        write_json_atomic(run.json_path, run.info)
    with runs.start("sft", "queued-run", recipe={"lr": 1}) as run:
        assert run.status == "running" and run.info["launch"] == {"slurm_job_id": "42"}
        assert (run.path / "slurm" / "job.sh").is_file()
    assert runs.get("queued-run").status == "done"
    with pytest.raises(Exception, match="already exists"):  # a done run is not reopened
        with runs.start("sft", "queued-run", recipe={}):
            pass


def test_a_trl_stage_asked_to_stop_checkpoints_and_the_next_start_resumes(runs, data_run, pretrain_run, tmp_path,
                                                                         monkeypatch):
    """What a job does near its time limit (the stop file its USR1 trap writes), on an SFT run."""
    from smolforge.alignment import sft
    from smolforge.errors import Preempted
    from smolforge.slurm import STOP_FILE_ENV

    from conftest import tiny_recipe

    def recipe():
        return tiny_recipe("sft", name="sft-stopped", parent=pretrain_run.name, data=data_run.name, eval_fraction=0,
                           early_stopping_patience=0, trainer={"max_steps": 4, "logging_steps": 1})

    stop = tmp_path / "stop"
    stop.write_text("")
    monkeypatch.setenv(STOP_FILE_ENV, str(stop))
    with pytest.raises(Preempted, match="stopped at step 1 .* checkpoint-1 saved"):
        sft.run(recipe(), runs, overwrite=True)
    stopped = runs.get("sft-stopped", require_done=False)
    assert stopped.status == "failed" and stopped.info["error"].startswith("Preempted: stopped at step 1")
    assert (stopped.checkpoints_dir / "checkpoint-1" / "trainer_state.json").is_file()
    stop.unlink()
    done = sft.run(recipe(), runs)  # the requeued job: the same command, no --overwrite
    assert done.status == "done" and done.metrics["train/steps"] == 4
    logged = [json.loads(line) for line in done.metrics_path.read_text().splitlines()]
    steps = [entry["step"] for entry in logged if "loss" in entry]
    assert steps == [1, 2, 3, 4]


def test_a_pipeline_is_one_job_whose_steps_start_their_own_ranks(tmp_path, capsys):
    assert main(launch(tmp_path, "pipeline", "--config", str(DEMO / "pipeline.yaml"), "--time", "60", "--dry-run")) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --ntasks-per-node=1" in script and "torch.distributed.run" not in script
    assert f"-m smolforge --runs-dir {tmp_path / 'runs'} pipeline {DEMO / 'pipeline.yaml'} &" in script
    assert main(launch(tmp_path, "pipeline", "--config", str(DEMO / "sft.yaml"), "--dry-run")) == 2
    assert "this is a stage recipe" in capsys.readouterr().err
