"""The eval stage's command (``smolforge eval RUN``, ``eval audit``, ``eval stage``), the judge stage
(``smolforge judge``), ``compare`` and ``report``.

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> sorted(cli.tools)
    ['compare', 'report']
    >>> [cli.is_summary_metric(k) for k in ("arith/acc", "arith/acc/stderr", "redteam/jailbreak/attack_success")]
    [True, False, False]
"""
from __future__ import annotations

import argparse
import json

from smolforge.commands import Commands, Context, StageSpec, extra_overrides
from smolforge.stage_runner import run_stage
from smolforge.errors import RecipeError


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="*", metavar="RUN",
                        help="run to score (same as --set run=RUN); or: audit RUN RUN… | stage TASK --from FILE")
    parser.add_argument("--check-parity", nargs="?", const="endpoint", metavar="BACKEND",
                        help="also score on BACKEND (default: endpoint) and compare per task and document")
    parser.add_argument("--from", dest="from_file", metavar="FILE", help="eval stage: the task's local data")


def _eval(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    verb = args.target[0] if args.target else None
    if verb == "stage":
        return _stage_task(args)
    if verb == "audit":
        return _audit(args, extras, ctx)
    if len(args.target) > 1:
        raise RecipeError(f"smolforge eval takes one run, got {' '.join(args.target)}")
    if args.target:
        args.set = [f"run={args.target[0]}", *args.set]
    if args.check_parity:
        args.set = [*args.set, f"parity={args.check_parity}"]
    run_stage(args, extras, ctx)
    return 0


def _stage_task(args: argparse.Namespace) -> int:
    from .standard_tasks import stage_task

    names = args.target[1:]
    if len(names) != 1 or not args.from_file:
        raise RecipeError("usage: smolforge eval stage TASK --from FILE (a local copy of the task's data)")
    print(stage_task(names[0], args.from_file))
    return 0


def _audit(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .audit import audit, audit_json, format_audit

    names = args.target[1:]
    if not names:
        raise RecipeError("usage: smolforge eval audit RUN RUN… [--suite NAME] [--tasks a,b] [--limit N]")
    options = dict(item.split("=", 1) for item in extra_overrides(extras, ["suite", "tasks", "limit"], False))
    tasks = [t for t in options.get("tasks", "").strip("[]").split(",") if t] or None
    result = audit(ctx.runs, names, suite=options.get("suite", "embedded"), tasks=tasks,
                   limit=int(options["limit"]) if options.get("limit") else None)
    print(audit_json(result) if ctx.json else format_audit(result))
    return 0


def _compare(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .compare import compare_data, compare_table

    runs = ctx.runs
    print(json.dumps(compare_data(runs, args.names), indent=2, default=str) if ctx.json
          else compare_table(runs, args.names))
    return 0


def _report(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .report import write_report

    runs = ctx.runs
    print(write_report(runs.get(args.run), runs))
    return 0


def register(cli: Commands) -> None:
    cli.stage(StageSpec("eval", "smolforge.evals.stage",
                        example="smolforge eval sft-demo --suite embedded --check-parity"),
              arguments=_eval_arguments, handler=_eval, config_required=False)
    cli.stage(StageSpec("judge", "smolforge.evals.judge",
                        example="smolforge judge --config judge.yaml --set judge.endpoint=http://127.0.0.1:8000/v1"),
              examples=["smolforge judge --config judge.yaml",
                        "smolforge judge --config judge.yaml --set mode=pointwise --set rubric=rubric.yaml"])
    cli.tool("compare", help="compare runs side by side: eval scores and training figures", handler=_compare,
             arguments=lambda p: p.add_argument("names", nargs="+", metavar="RUN", help="runs to compare"),
             description="One column per run: primary eval scores (± stderr, random baseline in the row label),\n"
             "final loss, steps, wall time and RL's held-out reward.",
             examples=["smolforge compare sft-demo dpo-demo grpo-demo"])
    cli.tool("report", help="write a run's report.html (curves, scores, lineage plots)", handler=_report,
             arguments=lambda p: p.add_argument("run", metavar="RUN", help="run name (under the runs folder) or "
                                                "run folder"),
             description="Write <run>/report.html: training curves, eval scores with stderr, and the scores along "
             "the run's lineage, as one self-contained page.",
             examples=["smolforge report dpo-demo"])
    # per-category red-team figures live in eval/redteam.json and the report; timings and parity in run.json
    cli.summary(hide=["judge/identity", "judge/mode", "judge/rubric_sha256", "eval/*", "parity/*", "redteam/seconds", "redteam/judge_agreement", "redteam/*/*",
                     "position_ppl/ppl@0-*", "position_ppl/ppl@128-*", "position_ppl/ppl@256-*",
                     "passkey_256/*", "passkey_512/*"])
