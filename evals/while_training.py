"""The process that scores checkpoints for ``eval_while_training:`` (:mod:`smolforge.eval_watch`).

    python -m smolforge.evals.while_training check --suite redteam           # suites load; the metrics they give
    python -m smolforge.evals.while_training score FOLDER --suite redteam --limit 8
    python -m smolforge.evals.while_training serve --suite redteam --limit 8  # the folders named on stdin

``FOLDER`` is a run-shaped snapshot of a checkpoint (``<run>/eval/while_training/step-N/``: run.json,
``model/``) that the training process wrote; each suite is scored by the eval stage itself
(:func:`smolforge.evals.stage.run`: red-team, lm-eval and tool suites alike), so its ``eval/`` holds
the same files ``smolforge eval`` writes and its run.json the same metrics. ``check`` loads the suites
(the training process calls it while validating a recipe, before any run exists) and prints
``{"metrics": [...], "tasks": [...]}``: the metric names the suites give and the lm-eval tasks whose
metrics depend on their filters. A bad suite exits 2 with the error on stderr. ``serve`` is what training
starts: one process that scores each snapshot named on stdin (``{"folder", "log"}``, a JSON line) with
its output in that log, answers ``{"folder", "code"}`` on stdout, and so imports torch and the
evaluation code once for every checkpoint.

    >>> sorted(m for m in check(["redteam"])["metrics"] if "/" not in m.split("/", 1)[1])[:3]
    ['redteam/attack_success', 'redteam/over_refusal', 'redteam/seconds']
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from smolforge.errors import SmolforgeError
from smolforge.runs import Runs

__all__ = ["check", "score", "serve", "main"]


def _redteam_metrics(ref: str) -> list[str]:
    from .redteam import load_redteam_suite

    suite = load_redteam_suite(ref)
    names = [f"{suite.name}/seconds"]
    kinds = set()
    for category in suite.categories.values():
        kinds.add(category.kind)
        names.append(f"{suite.name}/{category.name}/{'rate' if category.kind == 'benign' else 'attack_success'}")
    if "attack" in kinds:
        names.append(f"{suite.name}/attack_success")
    if "benign" in kinds:
        names.append(f"{suite.name}/over_refusal")
    return names + [f"{n}/stderr" for n in names if not n.endswith("/seconds")]


def check(suites: list[str]) -> dict:
    """Load every suite as the eval stage will; the metric names they give and their lm-eval tasks."""
    from .suite import load_suite
    from .tool_use import is_tool_suite, load_tool_suite
    from .redteam import is_redteam_suite

    metrics: list[str] = []
    tasks: list[str] = []
    for ref in suites:
        if is_redteam_suite(ref):
            metrics += _redteam_metrics(ref)
        elif is_tool_suite(ref):
            name = load_tool_suite(ref)["name"]
            metrics += [f"{name}/{key}{tail}" for key in ("accuracy", "call_validity", "called")
                        for tail in ("", "/stderr")]
        else:
            suite = load_suite(ref)
            for task in suite.tasks.values():
                tasks.append(task.name)
                listed = [m["metric"] for m in task.config.get("metric_list", []) if isinstance(m, dict)]
                for metric in dict.fromkeys([task.primary, *listed]):
                    metrics += [f"{task.name}/{metric}", f"{task.name}/{metric}/stderr"]
                if task.random_baseline is not None:
                    metrics.append(f"{task.name}/{task.primary}/random")
            metrics.append("eval/seconds")
    return {"metrics": sorted(set(metrics)), "tasks": sorted(set(tasks))}


def score(folder: str | Path, suites: list[str], *, limit: int | None = None, max_new_tokens: int = 32,
          batch_size: int = 8, device: str = "auto") -> dict:
    """Score the snapshot at ``folder`` on each suite with the eval stage; its run.json metrics after."""
    from .stage import Recipe, run, validate

    folder = Path(folder).resolve()
    runs = Runs(folder.parent)
    for ref in suites:
        recipe = Recipe(run=str(folder), suite=ref, limit=limit, batch_size=batch_size, device=device,
                        max_new_tokens=max_new_tokens)
        validate(recipe, runs)
        run(recipe, runs)
    return runs.get(str(folder)).metrics


@contextlib.contextmanager
def _output_to(path: str):
    """This process's stdout and stderr (file descriptors 1 and 2: what libraries print too) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", encoding="utf-8") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def serve(suites: list[str], **options) -> int:
    """Score the snapshots named on stdin, one JSON line ``{"folder", "log"}`` each, until end of input;
    answer ``{"folder", "code"}`` on stdout for each (0: scored; 2: a SmolforgeError; 1: another error),
    with everything the scoring prints in its ``log``."""
    import gc
    import traceback

    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)                               # what the scoring prints never mixes with the replies
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        with _output_to(job["log"]):
            try:
                score(job["folder"], suites, **options)
                code = 0
            except SmolforgeError as exc:
                print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
                code = 2
            except Exception:  # noqa: BLE001 - this job failed; the next checkpoint is scored all the same
                traceback.print_exc()
                code = 1
        gc.collect()
        replies.write(json.dumps({"folder": job["folder"], "code": code}) + "\n")
        replies.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smolforge.evals.while_training")
    sub = parser.add_subparsers(dest="command", required=True)
    checking = sub.add_parser("check", help="load the suites; print the metric names they give")
    checking.add_argument("--suite", action="append", required=True)
    scoring = argparse.ArgumentParser(add_help=False)
    scoring.add_argument("--suite", action="append", required=True)
    scoring.add_argument("--limit", type=int, default=None)
    scoring.add_argument("--max-new-tokens", type=int, default=32)
    scoring.add_argument("--batch-size", type=int, default=8)
    scoring.add_argument("--device", default="auto")
    one = sub.add_parser("score", parents=[scoring], help="score one snapshot folder")
    one.add_argument("folder")
    sub.add_parser("serve", parents=[scoring], help="score the snapshot folders named on stdin, one JSON line each")
    args = parser.parse_args(argv)
    if args.command == "check":
        try:
            print(json.dumps(check(args.suite)))
        except SmolforgeError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        return 0
    options = dict(limit=args.limit, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                   device=args.device)
    if args.command == "serve":
        return serve(args.suite, **options)
    try:
        score(args.folder, args.suite, **options)
    except SmolforgeError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
