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

``--seeds N`` (or ``--seeds 0,7,9``) runs the stage once per seed and then writes the seeds run
(:mod:`smolforge.seeds`).
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
    seeded = None
    if getattr(args, "seeds", None) is not None:   # checked before the stage is imported: the errors come at once
        from smolforge.seeds import parse_seeds, seed_key

        if action is not None:
            raise RecipeError(f"smolforge {stage}: --seeds runs the stage once per seed; this command does "
                              "something else with the recipe")
        seeded = (parse_seeds(args.seeds, "--seeds"), seed_key(stage))
    module = load_stage(stage)
    if extras:
        top = [f.name for f in dataclasses.fields(module.Recipe)]
        sets = extra_overrides(extras, top, has_trainer="trainer" in top)
        data = recipes.apply_overrides(data, sets, source="command line")
    data = {**data, **(given or {})}
    if seeded is not None:
        chosen, key = seeded
        return _run_seeds(module, stage, data, args, ctx, source, chosen, key, print_result=print_result)
    recipe = recipes.build_stage_recipe(module, data, source=source)  # over module.defaults()
    main = launcher_rank() == 0  # under a launcher every rank runs this; one reports
    if args.result_json and main:
        write_json_atomic(args.result_json, {"name": getattr(recipe, "name", None), "status": "validating"})
    runs = ctx.runs
    if action is not None:
        run = action(module, recipe, runs)
    else:
        _validate(module, recipe, runs, args, source)
        run = module.run(recipe, runs, overwrite=args.overwrite)
    if run is not None and args.result_json and main:
        write_json_atomic(args.result_json, {"name": run.name, "path": str(run.path), "status": run.status})
    if run is not None and print_result and main:
        report_run(module, run, ctx)
    return run


def _validate(module: Any, recipe: Any, runs: Any, args: argparse.Namespace, source: str) -> None:
    try:
        module.validate(recipe, runs)
    except RecipeError as err:   # a stage's own check: say which recipe file it is about
        if args.config and not str(err).startswith(source):
            raise RecipeError(f"{source}: {err}") from None
        raise


def _run_seeds(module: Any, stage: str, data: dict, args: argparse.Namespace, ctx: Context, source: str,
               chosen: list[int], key: str, *, print_result: bool = True):
    """``--seeds``: the stage once per seed as runs ``NAME-seedS`` (each built and validated before any
    folder exists), then the seeds run ``NAME`` with the spread of every metric (:mod:`smolforge.seeds`)."""
    import json

    from smolforge import seeds as seeding

    base = recipes.build_stage_recipe(module, data, source=source)
    seeding.check_key(base, key, stage)
    name = str(getattr(base, "name", "") or "")
    if not name:
        raise RecipeError(f"{source}: --seeds needs the recipe's name (its runs are NAME-seedS)")
    planned = [recipes.build_stage_recipe(module, seeding.seeded_recipe(data, key, seed, name, "--seeds"),
                                          source=source) for seed in chosen]
    runs = ctx.runs
    seeding.check_names(runs, name, [recipe.name for recipe in planned], overwrite=args.overwrite)
    for recipe in planned:
        _validate(module, recipe, runs, args, source)
    main = launcher_rank() == 0
    if args.result_json and main:
        write_json_atomic(args.result_json, {"name": name, "status": "validating"})
    done = []
    for seed, recipe in zip(chosen, planned):
        run = module.run(recipe, runs, overwrite=args.overwrite)
        if main and print_result and not ctx.json:
            print(f"seed {seed}: run {run.name} {run.status or 'done'} → {run.path}")
        done.append(run)
    if not main:   # under a launcher: rank 0 writes the seeds run
        return done[0]
    run = seeding.aggregate(runs, name, done, chosen, key, overwrite=args.overwrite)
    if args.result_json:
        write_json_atomic(args.result_json, {"name": run.name, "path": str(run.path), "status": run.status})
    if print_result:
        record = seeding.read_seeds(run) or {}
        if ctx.json:
            print(json.dumps({**record, "path": str(run.path)}, indent=2, default=str))
        else:
            print(seeding.seeds_table(record))
            print(f"run {run.name} {run.status} → {run.path} (means over the seeds; its other files "
                  f"link to {record.get('linked')}'s)")
    return run
