"""The data stage's command: ``smolforge data prepare RECIPE`` (``--config RECIPE`` works too).

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> cli.stages["data"].spec.example
    'smolforge data prepare recipes/demo/data.yaml --set name=data-mine'
"""
from __future__ import annotations

import argparse

from smolforge.commands import Commands, Context, StageSpec
from smolforge.stage_runner import run_stage
from smolforge.errors import RecipeError


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verb", nargs="?", choices=["prepare"], help="prepare a dataset run")
    parser.add_argument("recipe", nargs="?", metavar="RECIPE", help="data recipe YAML (same as --config)")


def _prepare(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    args.config = args.config or args.recipe
    if not args.config:
        raise RecipeError("no recipe: use smolforge data prepare RECIPE (or --config RECIPE)")
    run_stage(args, extras, ctx)
    return 0


def register(cli: Commands) -> None:
    cli.stage(StageSpec("data", "smolforge.data.stage", seed_key="world.seed",
                        example="smolforge data prepare recipes/demo/data.yaml --set name=data-mine"),
              arguments=_arguments, handler=_prepare, config_required=False)
    cli.summary(hide=["data/*"])
