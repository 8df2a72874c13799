"""Submit a stage to Slurm: the job script, sbatch, and what Slurm says of the job since.

    smolforge launch pretrain --config recipes/smollm3-1b/pretrain.yaml --nodes 2 --gpus-per-node 8 \\
        --partition hopper --time 2-00:00:00 --dry-run
    smolforge launch sft --config recipes/demo/sft.yaml --tasks-per-node 2 --time 30

:func:`job_script` writes one batch script: ``srun`` starts one ``torchrun`` per node, whose c10d
rendezvous sits on the allocation's first node (``--rendezvous srun`` starts every rank with
``srun`` itself instead, RANK/WORLD_SIZE from Slurm's variables). The job asks for ``USR1``
``signal_lead`` seconds before its time limit; the batch shell turns it into a stop file the
stage polls, the stage checkpoints and stops, and the job requeues itself, so the same command
resumes from that checkpoint. :func:`submit` creates the run (status ``queued``, the script under
``slurm/``, the job id in run.json's ``launch``) before Slurm can start it.

    >>> spec = SlurmSpec(nodes=2, gpus_per_node=8, partition="hopper", time="2-00:00:00")
    >>> script = job_script(spec, ["--runs-dir", "/r", "pretrain", "--config", "/r/p/slurm/recipe.yaml"],
    ...                     Path("/r/p"), name="p", python="/venv/bin/python")
    >>> [line for line in script.splitlines() if "--rdzv" in line or line.startswith("#SBATCH --n")]
    ['#SBATCH --nodes=2', '#SBATCH --ntasks-per-node=1', '  --rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \\\\']
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from smolforge.errors import RecipeError, ServiceError
from smolforge.runs import RunLayout

__all__ = ["SlurmSpec", "job_script", "submit", "submit_pipeline", "job_state", "STOP_FILE_ENV", "stop_requested"]

STOP_FILE_ENV = "SMOLFORGE_STOP_FILE"     # the stage checkpoints and stops once this file exists
RENDEZVOUS = ("torchrun", "srun")
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^\d+$")


@dataclasses.dataclass
class SlurmSpec:
    nodes: int = 1                     # nodes
    gpus_per_node: int = 0             # GPUs (= ranks) per node; 0: CPU ranks, tasks_per_node of them
    tasks_per_node: int = 1            # ranks per node without GPUs
    cpus_per_task: int | None = None   # CPUs per Slurm task (torchrun: per node)
    partition: str | None = None
    time: str | None = None            # time limit (minutes, or [D-]HH:MM:SS)
    account: str | None = None
    qos: str | None = None
    sbatch: list[str] = dataclasses.field(default_factory=list)   # extra #SBATCH options, e.g. --exclusive
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # exported in the job
    signal_lead: int = 300             # seconds before the time limit: checkpoint, stop, requeue
    rendezvous: str = "torchrun"       # torchrun (one per node, c10d) | srun (srun-native ranks)
    requeue: bool = True               # requeue after a pre-timeout stop (the run resumes)

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node or self.tasks_per_node

    def check(self) -> None:
        """Numbers and names Slurm would refuse later, refused now with the option's name."""
        for key in ("nodes", "tasks_per_node"):
            if getattr(self, key) < 1:
                raise RecipeError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(self, key)}")
        if self.gpus_per_node < 0 or self.signal_lead < 0:
            raise RecipeError("--gpus-per-node and --signal-lead must be >= 0")
        if self.time is not None and not _TIME.match(self.time):
            raise RecipeError(f"--time {self.time!r}: expected minutes or [D-]HH:MM:SS, e.g. 2-00:00:00")
        if self.rendezvous not in RENDEZVOUS:
            raise RecipeError(f"--rendezvous must be one of {', '.join(RENDEZVOUS)}, got {self.rendezvous!r}")
        for line in self.sbatch:
            if not line.startswith("--"):
                raise RecipeError(f"--sbatch {line!r}: give the option as sbatch takes it, e.g. --sbatch=--exclusive")


def _sbatch_lines(spec: SlurmSpec, name: str, slurm_dir: Path, single: bool = False) -> list[str]:
    per_node_tasks = 1 if spec.rendezvous == "torchrun" or single else spec.ranks_per_node
    lines = [f"--job-name=smolforge-{name}", f"--nodes={spec.nodes}", f"--ntasks-per-node={per_node_tasks}",
             f"--output={slurm_dir}/job-%j.out", "--open-mode=append"]
    if spec.gpus_per_node:
        lines.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.cpus_per_task:
        lines.append(f"--cpus-per-task={spec.cpus_per_task}")
    for key in ("partition", "time", "account", "qos"):
        if getattr(spec, key):
            lines.append(f"--{key}={getattr(spec, key)}")
    if spec.signal_lead:
        lines.append(f"--signal=B:USR1@{spec.signal_lead}")
    if spec.requeue:
        lines.append("--requeue")
    return ["#SBATCH " + line for line in lines + list(spec.sbatch)]


# Said before `scontrol requeue`: slurmctld kills this script as it requeues the job, and a line echoed after
# the requeue was lost from the log now and then (seen in make test).
REQUEUE = ('echo "smolforge: requeueing job $SLURM_JOB_ID (the stage checkpointed and stopped)"\n'
           '  scontrol requeue "$SLURM_JOB_ID" || { echo "smolforge: scontrol requeue failed" >&2; exit 1; }\n'
           '  exit 0')


def job_script(spec: SlurmSpec, smolforge_args: list[str], run_dir: Path, *, name: str,
               python: str | None = None, single: bool = False) -> str:
    """The batch script that runs ``smolforge <smolforge_args>`` on the allocation, ranks started as
    ``spec`` says (``single``: one process, e.g. a pipeline whose steps start their own ranks)."""
    python = python or sys.executable
    layout = RunLayout(run_dir)
    slurm_dir = layout.slurm_dir
    args = " ".join(shlex.quote(a) for a in smolforge_args)
    env = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(spec.env.items()))
    if single:
        start = f"srun --ntasks=1 --nodes=1 --kill-on-bad-exit=1 {shlex.quote(python)} -m smolforge {args} &"
    elif spec.rendezvous == "torchrun":
        start = (f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 {shlex.quote(python)} -m torch.distributed.run \\\n"
                 f"  --nnodes \"$SLURM_JOB_NUM_NODES\" --nproc_per_node {spec.ranks_per_node} \\\n"
                 f"  --rdzv_id \"$SLURM_JOB_ID\" --rdzv_backend c10d --rdzv_endpoint \"$MASTER_ADDR:$MASTER_PORT\" \\\n"
                 f"  -m smolforge {args} &")
    else:  # every rank a Slurm task: its rank and world from Slurm's own variables
        start = (f"srun --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID "
                 f"WORLD_SIZE=$SLURM_NTASKS exec {shlex.quote(python)} -m smolforge {args}' &")
    return f"""#!/bin/bash
# written by smolforge launch; resubmit with: sbatch {layout.slurm_job_path}
{chr(10).join(_sbatch_lines(spec, name, slurm_dir, single))}
set -uo pipefail
export HF_HUB_OFFLINE=${{HF_HUB_OFFLINE:-1}} HF_DATASETS_OFFLINE=${{HF_DATASETS_OFFLINE:-1}} TOKENIZERS_PARALLELISM=false
{env}export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 10000 ))  # below smolforge's own server ports (20000+) and the kernel's ephemeral ones
export SMOLFORGE_LAUNCHER=slurm-{spec.rendezvous}
export {STOP_FILE_ENV}={shlex.quote(str(slurm_dir))}/stop-$SLURM_JOB_ID
rm -f "${STOP_FILE_ENV}"
trap 'echo "smolforge: stop asked (USR1): checkpoint, then requeue"; touch "${STOP_FILE_ENV}"' USR1
{start}
STEP=$!
while kill -0 "$STEP" 2>/dev/null; do wait "$STEP"; CODE=$?; done
wait "$STEP" 2>/dev/null; CODE=${{CODE:-$?}}
if [ -e "${STOP_FILE_ENV}" ]; then
  rm -f "${STOP_FILE_ENV}"
  {REQUEUE if spec.requeue else 'exit 0'}
fi
exit "$CODE"
"""


def stop_requested() -> bool:
    """Whether the job asked this stage to checkpoint and stop (only under ``smolforge launch``)."""
    path = os.environ.get(STOP_FILE_ENV)
    return bool(path) and os.path.exists(path)


def _slurm_env() -> dict[str, str]:
    return dict(os.environ)


def submit(runs, stage: str, recipe: dict, spec: SlurmSpec, *, overwrite: bool = False, dry_run: bool = False,
           python: str | None = None) -> tuple[str, str | None]:
    """Create run ``recipe['name']`` (queued), write its recipe and job script, ``sbatch`` it.

    Returns ``(script text, job id or None for a dry run)``. A dry run writes nothing.
    """
    import yaml

    from smolforge.runs import write_json_atomic

    spec.check()
    name = str(recipe.get("name") or "")
    if not name:
        raise RecipeError("the recipe has no name: the run it launches needs one (--set name=...)")
    run_dir = (runs.root / name).resolve()
    args = ["--runs-dir", str(runs.root.resolve()), stage, "--config", str(RunLayout(run_dir).slurm_recipe_path)]
    script = job_script(spec, args, run_dir, name=name, python=python)
    if dry_run:
        return script, None
    with runs.start(stage, name, recipe, overwrite=overwrite) as run:
        run.slurm_dir.mkdir(parents=True, exist_ok=True)
        run.slurm_recipe_path.write_text(yaml.safe_dump({"stage": stage, **recipe}, sort_keys=False))
        run.slurm_job_path.write_text(script)
        job_id = _sbatch(run.slurm_job_path)
        run.info.update(status="queued", launch={"slurm_job_id": job_id, "script": str(run.slurm_job_path),
                                                 "nodes": spec.nodes, "ranks_per_node": spec.ranks_per_node})
        write_json_atomic(run.json_path, run.info)
    return script, job_id


def submit_pipeline(runs, pipeline_file: Path, spec: SlurmSpec, *, overwrite: bool = False, dry_run: bool = False,
                    python: str | None = None) -> tuple[str, str | None, Path]:
    """Submit ``smolforge pipeline FILE`` as one job: its steps run in order inside the allocation, each
    started as its own ``launch:`` says. The script and ``launch.json`` (the job id) go to
    ``<runs>/.launch/<pipeline name>/slurm/``. Returns ``(script, job id or None, that folder)``."""
    from smolforge.runs import utc_now, write_json_atomic

    spec.check()
    folder = runs.launch_dir(Path(pipeline_file).stem).resolve()
    args = ["--runs-dir", str(runs.root.resolve()), "pipeline", str(Path(pipeline_file).resolve())]
    args += ["--overwrite"] if overwrite else []
    script = job_script(spec, args, folder, name=f"pipeline-{Path(pipeline_file).stem}", python=python, single=True)
    if dry_run:
        return script, None, folder
    layout = RunLayout(folder)
    layout.slurm_dir.mkdir(parents=True, exist_ok=True)
    layout.slurm_job_path.write_text(script)
    job_id = _sbatch(layout.slurm_job_path)
    write_json_atomic(layout.slurm_launch_path, {"slurm_job_id": job_id, "pipeline": str(pipeline_file),
                                                 "submitted_at": utc_now()})
    return script, job_id, folder


def _sbatch(script: Path) -> str:
    try:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                              env=_slurm_env(), timeout=60)
    except FileNotFoundError:
        raise ServiceError("sbatch not found: smolforge launch needs a Slurm client (slurm-wlm) on PATH") from None
    if done.returncode != 0:
        raise ServiceError(f"sbatch refused {script}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def job_state(job_id: str) -> str | None:
    """Slurm's state of a job (``PENDING``, ``RUNNING``, ``COMPLETED``…) from ``scontrol``, or None when
    Slurm no longer knows it (there may be no accounting database to ask)."""
    try:
        done = subprocess.run(["scontrol", "show", "job", str(job_id)], capture_output=True, text=True,
                              env=_slurm_env(), timeout=10)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"JobState=(\S+)", done.stdout)
    return found.group(1) if done.returncode == 0 and found else None
