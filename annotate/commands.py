"""The annotate stage's commands: ``smolforge annotate serve | push | status | pull``, and the
pipeline step (no verb: push, wait for the answers, pull); the synth stage (``smolforge synth``:
judged synthetic SFT rows and preference pairs).

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> cli.is_summary_metric("annotate/agreement"), cli.is_summary_metric("annotate/tied")
    (True, False)
"""
from __future__ import annotations

import argparse
import json
import os

from smolforge.commands import Commands, Context, StageSpec
from smolforge.stage_runner import run_stage
from smolforge.errors import RecipeError


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verb", nargs="?", choices=["serve", "push", "status", "pull", "users", "backup", "restore"],
                        help="serve: run the embedded Argilla; push: generate and push records; status: progress "
                        "per annotator; pull: submitted answers → a preference run; users: add NAME | list | "
                        "remove NAME (annotator accounts); backup FILE / restore FILE: the annotation database; "
                        "none: push, wait, pull")
    parser.add_argument("words", nargs="*", metavar="ARG",
                        help="users: add NAME | list | remove NAME; backup, restore: FILE")
    parser.add_argument("--database", metavar="URL",
                        help="serve, backup, restore: PostgreSQL instead of the home's SQLite "
                        "(default $ARGILLA_DATABASE_URL; put a password there, not on the command line)")
    parser.add_argument("--home", metavar="DIR",
                        help="serve, users: the embedded server's folder (default <runs>/.argilla)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="serve: address to bind (default 127.0.0.1; any other needs real credentials, generated "
                        "on the first start unless ARGILLA_API_KEY/ARGILLA_PASSWORD are set)")
    parser.add_argument("--port", type=int, help="serve: port (default: a free one)")
    parser.add_argument("--role", default="annotator", help="users add: annotator (default) or admin")
    parser.add_argument("--workspace", help="users add: workspace to join (default argilla); other verbs: the "
                        "recipe's workspace")


def _annotate(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from pathlib import Path

    home = Path(args.home).expanduser() if args.home else ctx.root / ".argilla"
    if args.words and args.verb not in ("users", "backup", "restore"):
        raise RecipeError(f"annotate {args.verb or ''}: unexpected argument(s) {' '.join(args.words)}")
    database = args.database or os.environ.get("ARGILLA_DATABASE_URL") or None
    if args.verb == "serve":
        from .server import serve

        return serve(home, port=args.port, host=args.host, database_url=database)
    if args.verb in ("backup", "restore"):
        from . import backup as backups
        from .server import database_url_for

        if len(args.words) != 1:
            raise RecipeError(f"usage: smolforge annotate {args.verb} FILE [--home DIR] [--database URL]")
        url = database_url_for(database)       # checks the URL's form
        if args.verb == "backup":
            print(json.dumps(backups.backup(home, Path(args.words[0]), database_url=url)))
        else:
            print(json.dumps(backups.restore(Path(args.words[0]), home, database_url=url)))
        return 0
    if args.verb == "users":
        from .users import users_command

        return users_command(home, args.words, role=args.role, workspace=args.workspace or "argilla")
    if args.workspace is not None:   # for push/pull/status, a recipe override like any other --key value
        extras = [*extras, "--workspace", args.workspace]
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
    cli.stage(StageSpec("annotate", "smolforge.annotate.stage",
                        example="smolforge annotate push --config recipes/demo/annotate.yaml"),
              examples=("smolforge annotate serve                                   # 127.0.0.1, demo credentials",
                        "smolforge annotate serve --host 0.0.0.0 --database postgresql://argilla@db:5432/argilla",
                        "smolforge annotate users add alice                         # prints a generated password once",
                        "smolforge annotate users add bob --role admin --workspace red-team",
                        "smolforge annotate users list",
                        "smolforge annotate users remove alice",
                        "smolforge annotate backup backups/argilla-$(date +%F).db  # consistent while annotators submit",
                        "smolforge annotate restore backups/argilla-2026-12-02.db --home runs/.argilla-restored",
                        "smolforge annotate push --config recipes/demo/annotate.yaml",
                        "smolforge annotate status --config recipes/demo/annotate.yaml",
                        "smolforge annotate pull --config recipes/demo/annotate.yaml"),
              arguments=_arguments, handler=_annotate, config_required=False)
    cli.stage(StageSpec("synth", "smolforge.annotate.synth", example="smolforge synth --config synth.yaml"),
              examples=["smolforge synth --config synth.yaml",
                        "smolforge synth --config synth.yaml --set k=4 --set min_margin=0.25"])
    cli.summary(show=["annotate/rows", "annotate/agreement", "synth/sft_rows", "synth/pairs"],
                hide=["annotate/*", "synth/*"])
