"""Run one stage from the command line: the recipe (``--config`` and ``--set``), built, validated, run.

Every stage subcommand ends here (``smolforge sft --config sft.yaml``), through its package's
handler or the plain one in :mod:`smolforge.cli`. It sits above the registry (it loads the stage
by name), so :mod:`smolforge.commands`, which the registry reads, never imports it.

    >>> import argparse
    >>> args = argparse.Namespace(config=None, set=["name=x"], command="no-such-stage", result_json=None,
    ...                           overwrite=False)
    >>> run_stage(args, [], Context(root=__import__("pathlib").Path("runs")))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: unknown stage 'no-such-stage'...
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from smolforge import recipe as recipes
from smolforge.commands import Context, extra_overrides, launcher_rank, report_run
from smolforge.errors import RecipeError
from smolforge.registry import load_stage
from smolforge.runs import write_json_atomic

__all__ = ["run_stage"]


def run_stage(args: argparse.Namespace, extras: list[str], ctx: Context, *,
              action: Callable[[Any, Any, Any], Any] | None = None, print_result: bool = True,
              given: dict | None = None):
    """Load the recipe (``--config`` and ``--set``, or only ``--set``), build it, validate, run.

    ``action(module, recipe, runs)`` replaces validate + run (a verb such as ``annotate push``);
    it returns a Run, or None when there is no run to report. ``given`` holds top-level fields the
    command's own arguments set (taken as they are, over the recipe and ``--set``). Returns the run (or None).
    """
    if args.config:
        source = str(args.config)
        stage, data = recipes.load_recipe(args.config, args.set)
    else:
        source = "command line"
        stage, data = args.command, recipes.apply_overrides({}, args.set, source=source)
    if stage != args.command:
        raise RecipeError(f"{source}: recipe is for stage '{stage}', not '{args.command}'; "
                          f"run it with: smolforge {stage} --config {source}")
    module = load_stage(stage)
    if extras:
        top = [f.name for f in dataclasses.fields(module.Recipe)]
        sets = extra_overrides(extras, top, has_trainer="trainer" in top)
        data = recipes.apply_overrides(data, sets, source="command line")
    data = {**data, **(given or {})}
    recipe = recipes.build_stage_recipe(module, data, source=source)  # over module.defaults()
    main = launcher_rank() == 0  # under a launcher every rank runs this; one reports
    if args.result_json and main:
        write_json_atomic(args.result_json, {"name": getattr(recipe, "name", None), "status": "validating"})
    runs = ctx.runs
    if action is not None:
        run = action(module, recipe, runs)
    else:
        try:
            module.validate(recipe, runs)
        except RecipeError as err:   # a stage's own check: say which recipe file it is about
            if args.config and not str(err).startswith(source):
                raise RecipeError(f"{source}: {err}") from None
            raise
        run = module.run(recipe, runs, overwrite=args.overwrite)
    if run is not None and args.result_json and main:
        write_json_atomic(args.result_json, {"name": run.name, "path": str(run.path), "status": run.status})
    if run is not None and print_result and main:
        report_run(module, run, ctx)
    return run
