"""``smolforge ablate``: its arguments and what it does with them (stdlib, yaml and spine at the top:
the CLI builds its parser from :func:`add_arguments`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from .ablation import load_ablation
from .run import _check_runs, analyze, branch_point, pipeline_file, run_ablation

__all__ = ["add_arguments", "command"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE", help="the ablation file (see the description)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a key of the ablation file (e.g. seeds=[0,1])")
    p.add_argument("--overwrite", action="store_true", help="train again runs that are done with another recipe")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--analyze", action="store_true", help="only score and compare runs that already exist")
    what.add_argument("--write-pipeline", metavar="FILE",
                      help="write the pipeline of the runs still to train (for smolforge launch pipeline) and stop")
    p.add_argument("--device", default="auto", help="where the evals run (auto, cpu, cuda)")


def command(args: argparse.Namespace, extras: list[str], ctx) -> int:
    """``smolforge ablate``."""
    ablation = load_ablation(args.config, args.set)
    runs = ctx.runs
    out = sys.stderr if ctx.json else sys.stdout
    if args.write_pipeline:
        branch_point(ablation, runs)
        todo, reused = _check_runs(ablation, runs, args.overwrite)
        target = Path(args.write_pipeline)
        target.write_text(yaml.safe_dump(pipeline_file(ablation, todo), sort_keys=False), encoding="utf-8")
        print(f"wrote {target}: {len(todo)} runs to train ({len(reused)} already done). Next:\n"
              f"  smolforge launch pipeline --config {target}\n"
              f"  smolforge ablate --config {args.config} --analyze   # once the job is done", file=out)
        return 0
    result = (analyze(ablation, runs, device=args.device, out=out) if args.analyze
              else run_ablation(ablation, runs, overwrite=args.overwrite, debug=ctx.debug, out=out))
    if ctx.json:
        print(json.dumps(result, indent=2, default=str))
    return 0
