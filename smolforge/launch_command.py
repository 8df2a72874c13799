"""``smolforge launch STAGE --config FILE``: submit a stage (or a whole pipeline) to Slurm.

The command line and its output; the job script and the submission are :mod:`smolforge.slurm`'s.
Only the stdlib and the spine's errors are imported here, so building the parser stays cheap.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="launch"); add_arguments(parser)
    >>> args = parser.parse_args(["sft", "--config", "sft.yaml", "--env", "A=1", "--time", "30"])
    >>> spec = slurm_spec(args)
    >>> spec.env, spec.time, spec.requeue
    ({'A': '1'}, '30', True)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from smolforge.errors import RecipeError

__all__ = ["add_arguments", "slurm_spec", "command"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The stage, its recipe, and the Slurm job's shape."""
    p.add_argument("stage", metavar="STAGE", help="the stage to run (its recipe's 'stage'), or 'pipeline'")
    p.add_argument("--config", required=True, metavar="FILE", help="stage recipe YAML, or a pipeline file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key (repeatable)")
    p.add_argument("--nodes", type=int, default=1, metavar="N", help="nodes (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=0, metavar="G", help="GPUs, one rank each (default 0: CPU ranks)")
    p.add_argument("--tasks-per-node", type=int, default=1, metavar="T", help="CPU ranks per node without GPUs (default 1)")
    p.add_argument("--cpus-per-task", type=int, metavar="C", help="CPUs per Slurm task")
    p.add_argument("--partition", metavar="P")
    p.add_argument("--time", metavar="LIMIT", help="time limit: minutes or [D-]HH:MM:SS")
    p.add_argument("--account", metavar="A")
    p.add_argument("--qos", metavar="Q")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="an extra #SBATCH option, e.g. --sbatch=--exclusive (repeatable)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="exported in the job (repeatable)")
    p.add_argument("--signal-lead", type=int, default=300, metavar="S",
                   help="seconds before the time limit at which the stage checkpoints and the job requeues (default 300)")
    p.add_argument("--rendezvous", default="torchrun", choices=["torchrun", "srun"],
                   help="torchrun per node with a c10d rendezvous (default), or srun-native ranks")
    p.add_argument("--no-requeue", action="store_true", help="after a pre-timeout stop, end instead of requeueing")
    p.add_argument("--overwrite", action="store_true", help="replace the run if it already exists")
    p.add_argument("--dry-run", action="store_true", help="print the job script; create and submit nothing")


def slurm_spec(args: argparse.Namespace):
    """The :class:`smolforge.slurm.SlurmSpec` the parsed options describe."""
    from smolforge.slurm import SlurmSpec

    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RecipeError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    return SlurmSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, tasks_per_node=args.tasks_per_node,
                     cpus_per_task=args.cpus_per_task, partition=args.partition, time=args.time, account=args.account,
                     qos=args.qos, sbatch=list(args.sbatch), env=env, signal_lead=args.signal_lead,
                     rendezvous=args.rendezvous, requeue=not args.no_requeue)


def _launch_pipeline(args: argparse.Namespace, spec, ctx) -> int:
    """``smolforge launch pipeline --config FILE``: the whole pipeline as one job."""
    from smolforge.pipeline import load_pipeline
    from smolforge.runs import RunLayout
    from smolforge.slurm import submit_pipeline

    if args.set:
        raise RecipeError("smolforge launch pipeline takes no --set: put overrides in the pipeline file")
    load_pipeline(args.config)  # every step checked before anything is submitted
    script, job_id, folder = submit_pipeline(ctx.runs, Path(args.config), spec, overwrite=args.overwrite,
                                             dry_run=args.dry_run)
    if args.dry_run:
        print(script, end="")
    elif ctx.json:
        print(json.dumps({"pipeline": str(args.config), "slurm_job_id": job_id, "script": str(RunLayout(folder).slurm_job_path)}))
    else:
        print(f"submitted job {job_id}: pipeline {args.config} (script: {RunLayout(folder).slurm_job_path})")
    return 0


def command(args: argparse.Namespace, extras: list[str], ctx) -> int:
    """Check the recipe (unknown keys fail here, not in the job), then write the job script and submit it."""
    from smolforge import recipe as recipes
    from smolforge.registry import load_stage
    from smolforge.runs import RunLayout
    from smolforge.slurm import submit

    spec = slurm_spec(args)
    if args.stage == "pipeline":
        return _launch_pipeline(args, spec, ctx)
    stage, data = recipes.load_recipe(args.config, args.set)
    if stage != args.stage:
        raise RecipeError(f"{args.config}: recipe is for stage '{stage}', not '{args.stage}'")
    module = load_stage(stage)
    recipe = recipes.build_stage_recipe(module, data, source=str(args.config))  # unknown keys fail here, not in the job
    if not args.dry_run:
        module.validate(recipe, ctx.runs)
    data = {key: value for key, value in data.items() if key != "stage"}
    data.setdefault("name", getattr(recipe, "name", None))
    script, job_id = submit(ctx.runs, stage, data, spec, overwrite=args.overwrite, dry_run=args.dry_run)
    if args.dry_run:
        print(script, end="")
        return 0
    run_dir = ctx.root / data["name"]
    if ctx.json:
        print(json.dumps({"run": data["name"], "path": str(run_dir), "slurm_job_id": job_id,
                          "script": str(RunLayout(run_dir).slurm_job_path)}))
    else:
        print(f"submitted job {job_id}: run {data['name']} queued → {run_dir} (script: {RunLayout(run_dir).slurm_job_path})")
    return 0
