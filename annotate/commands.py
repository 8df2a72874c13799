"""The annotate stage's commands: ``smolforge annotate serve | push | status | pull``, and the
pipeline step (no verb: push, wait for the answers, pull).

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> cli.is_summary_metric("annotate/agreement"), cli.is_summary_metric("annotate/tied")
    (True, False)
"""
from __future__ import annotations

import argparse

from smolforge.commands import Commands, Context, run_stage


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verb", nargs="?", choices=["serve", "push", "status", "pull"],
                        help="serve: run the embedded Argilla; push: generate and push records; status: progress "
                        "per annotator; pull: submitted answers → a preference run; none: push, wait, pull")
    parser.add_argument("--home", metavar="DIR", help="serve: the embedded server's folder (default <runs>/.argilla)")
    parser.add_argument("--port", type=int, help="serve: port (default: a free one)")


def _annotate(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    if args.verb == "serve":
        from pathlib import Path

        from .server import serve

        return serve(Path(args.home) if args.home else ctx.root / ".argilla", port=args.port)
    if args.verb == "push":
        run_stage(args, extras, ctx, action=lambda module, recipe, runs: module.push_only(recipe, runs) and None)
    elif args.verb == "status":
        run_stage(args, extras, ctx, action=lambda module, recipe, runs: print(module.status_only(recipe, runs)))
    elif args.verb == "pull":
        run_stage(args, extras, ctx,
                  action=lambda module, recipe, runs: module.pull_only(recipe, runs, overwrite=args.overwrite))
    else:
        run_stage(args, extras, ctx)
    return 0


def register(cli: Commands) -> None:
    cli.stage("annotate", example="smolforge annotate push --config recipes/demo/annotate.yaml",
              arguments=_arguments, handler=_annotate, config_required=False)
    cli.summary(show=["annotate/rows", "annotate/agreement"], hide=["annotate/*"])
