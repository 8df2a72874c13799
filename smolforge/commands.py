"""How packages add their commands to ``smolforge`` without the spine naming them.

A command module (listed in :data:`smolforge.registry.COMMAND_MODULES`) imports only the stdlib
and the spine, and has ``register(cli: Commands) -> None``. In it a package

- declares each of its stages, once (``cli.stage(StageSpec(...))``): its name, its module, whether
  its runs hold a model and whether it trains, an example for ``--help``, and, where the stage can
  run a learning-rate range test, the module that does it (used by ``smolforge lr-find``,
  :mod:`smolforge.ops.lr_find`); the registry, the pipeline runner and the CLI read these; beside the
  spec, the stage's subcommand may get extra arguments and a handler that prepares the arguments
  and then calls :func:`run_stage`;
- adds a tool command (``cli.tool``): ``plan``, ``compare``, ``serve``…, with its arguments and
  its handler;
- says which of the metrics its stages write are pipeline-summary scores (``cli.summary``).

Handlers take ``(args, extras, ctx)`` and return the exit code; they import what they need
(torch, TRL, lm-eval) inside, so building the parser stays cheap and ``smolforge --help`` fast.
A stage nobody shapes (a plugin from ``$SMOLFORGE_EXTRA_STAGES``) gets the plain stage command.

    >>> cli = Commands()
    >>> cli.stage(StageSpec("toy", "mypkg.toy_stage", makes_model=True))
    >>> cli.tool("hello", help="say hello", examples=["smolforge hello"], handler=lambda a, e, c: 0)
    >>> cli.summary(show=["toy/score"], hide=["toy/*"])
    >>> sorted(cli.tools), cli.is_summary_metric("toy/score"), cli.is_summary_metric("toy/seconds")
    (['hello'], True, False)
    >>> cli.stages["toy"].spec.module
    'mypkg.toy_stage'
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import fnmatch
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError

__all__ = ["Commands", "Context", "StageSpec", "StageCommand", "ToolCommand", "run_stage", "report_run",
           "close_option", "extra_overrides", "epilog"]


@dataclasses.dataclass
class Context:
    """What every handler gets besides its arguments: the global options."""

    root: Path                     # the runs folder (--runs-dir, $SMOLFORGE_RUNS, ./runs)
    debug: bool = False            # --debug: tracebacks
    json: bool = False             # --json: one JSON object instead of a table

    @property
    def runs(self):
        from smolforge.runs import Runs

        return Runs(self.root)


Handler = Callable[[argparse.Namespace, list[str], Context], int]
Arguments = Callable[[argparse.ArgumentParser], None]


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """A stage, as its package declares it: the one place its name, module and traits are written.

    >>> spec = StageSpec("sft", "smolforge.alignment.sft", makes_model=True, trains=True)
    >>> spec.module, spec.example
    ('smolforge.alignment.sft', None)
    """

    name: str
    module: str                    # dotted name of the module with Recipe, validate and run
    makes_model: bool = False      # its runs hold a causal LM in model/: a pipeline evaluates it
    trains: bool = False           # a training loop: a pipeline's launch: starts it; an ablation may vary it
    example: str | None = None     # shown under --help
    lr_find: str | None = None     # dotted module whose lr_find(recipe, runs, sweep) runs
                                   # `smolforge lr-find` on this stage's recipes (smolforge.ops.lr_find)


@dataclasses.dataclass
class StageCommand:
    """A stage's subcommand: its spec and how its command line differs from the plain one."""

    spec: StageSpec
    examples: Sequence[str] = ()               # replace the two default examples under --help
    arguments: Arguments | None = None         # adds the stage's own arguments
    handler: Handler | None = None             # default: run_stage
    config_required: bool = True               # --config must be given
    usage: str | None = None                   # replaces the default description's first line


@dataclasses.dataclass
class ToolCommand:
    name: str
    help: str
    handler: Handler
    examples: Sequence[str] = ()
    description: str | None = None
    arguments: Arguments | None = None
    takes_extras: bool = False                 # unknown options reach the handler instead of an error
    takes_passthrough: bool = False            # what follows '--' reaches the handler (args.passthrough)
    before_stages: bool = False                # listed above the stages in --help (as pipeline is)


def epilog(*lines: str) -> str:
    """The ``example:`` block of a command's help."""
    return "example:\n" + "\n".join(f"  {line}" for line in lines)


class Commands:
    """What the command modules declared: stage shapes, tools, summary metrics."""

    def __init__(self) -> None:
        self.stages: dict[str, StageCommand] = {}
        self.tools: dict[str, ToolCommand] = {}
        self._show: list[str] = []
        self._hide: list[str] = []

    def stage(self, spec: StageSpec, **shape: Any) -> None:
        """Declare a stage; ``shape`` holds :class:`StageCommand`'s fields for its subcommand."""
        if spec.name in self.stages:
            raise RecipeError(f"stage '{spec.name}' is registered twice")
        self.stages[spec.name] = StageCommand(spec, **shape)

    def tool(self, name: str, **fields: Any) -> None:
        if name in self.tools:
            raise RecipeError(f"command '{name}' is registered twice")
        self.tools[name] = ToolCommand(name, **fields)

    def summary(self, *, show: Iterable[str] = (), hide: Iterable[str] = ()) -> None:
        """Glob patterns of metric keys the pipeline summary shows (wins) or hides."""
        self._show += list(show)
        self._hide += list(hide)

    def is_summary_metric(self, key: str) -> bool:
        """A ``task/metric`` eval score, unless a package hides it; a package's ``show`` always wins."""
        if any(fnmatch.fnmatchcase(key, p) for p in self._show):
            return True
        if "/" not in key or any(fnmatch.fnmatchcase(key, p) for p in self._hide):
            return False
        return not key.endswith(("/random", "/stderr", "_stderr"))


# --------------------------------------------------------------------------- the stage command


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


def close_option(given: str, known: Sequence[str]) -> str:
    """The one-line error for an option nobody knows.

    >>> close_option("--prot", ["--port", "--host"])
    "unknown option '--prot' (did you mean '--port'?)"
    """
    flag = given.split("=", 1)[0]
    close = difflib.get_close_matches(flag, list(known), n=1, cutoff=0.7)
    hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(known)}"
    return f"unknown option '{flag}' ({hint})"


def run_stage(args: argparse.Namespace, extras: list[str], ctx: Context, *,
              action: Callable[[Any, Any, Any], Any] | None = None, print_result: bool = True,
              given: dict | None = None):
    """Load the recipe (``--config`` and ``--set``, or only ``--set``), build it, validate, run.

    ``action(module, recipe, runs)`` replaces validate + run (a verb such as ``annotate push``);
    it returns a Run, or None when there is no run to report. ``given`` holds top-level fields the
    command's own arguments set (taken as they are, over the recipe and ``--set``). Returns the run (or None).
    """
    from smolforge import recipe as recipes
    from smolforge.registry import load_stage
    from smolforge.runs import write_json_atomic

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


def launcher_rank() -> int:
    """This process's global rank as a launcher set it (torchrun, deepspeed, accelerate, srun+torchrun); 0 alone.

    >>> launcher_rank() if "RANK" not in __import__("os").environ else 0
    0
    """
    import os

    return int(os.environ.get("RANK", "0") or 0)


def report_run(module: Any, run: Any, ctx: Context) -> None:
    """The stage's summary (``module.summary(run)``) and a last line; with --json its JSON instead."""
    if ctx.json:
        as_json = getattr(module, "as_json", None)
        print(json.dumps(as_json(run) if as_json else run.info, indent=2, default=str))
        return
    if hasattr(module, "summary"):
        print(module.summary(run))
    print(f"run {run.name} {run.status or 'done'} → {run.path}")


def add_stage_parser(sub, command: StageCommand, dotted: str, formatter) -> argparse.ArgumentParser:
    """The subcommand of one stage: --config, --set, --overwrite and the stage's own arguments."""
    name = command.spec.name
    example = command.spec.example or f"smolforge {name} --config my-{name}.yaml"
    parser = sub.add_parser(
        name, help=f"run the {name} stage ({dotted})",
        description=(command.usage or f"Run the {name} stage from a recipe whose top level has 'stage: {name}'.")
        + "\nExtra --key value pairs become overrides: trainer.key=value when the stage recipe has a trainer "
        "field\n(a TRL config) and key is not a top-level field, else key=value.",
        formatter_class=formatter,
        epilog=epilog(*(command.examples or (example, f"smolforge {name} --config my-{name}.yaml --name my-run"))),
        allow_abbrev=False,  # so TRL-style extras are never mistaken for our options
    )
    if command.arguments is not None:
        command.arguments(parser)
    parser.add_argument("--config", required=command.config_required, metavar="FILE", help="stage recipe YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key, e.g. trainer.max_steps=20 (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="replace the run if it already exists")
    parser.add_argument("--result-json", help=argparse.SUPPRESS)  # written for the pipeline runner
    parser.set_defaults(handler=command.handler or _plain_stage, takes_extras=True)
    return parser


def _plain_stage(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    run_stage(args, extras, ctx)
    return 0


def add_tool_parser(sub, spec: ToolCommand, formatter) -> argparse.ArgumentParser:
    parser = sub.add_parser(spec.name, help=spec.help, description=spec.description or spec.help,
                            formatter_class=formatter, epilog=epilog(*spec.examples) if spec.examples else None)
    if spec.arguments is not None:
        spec.arguments(parser)
    parser.set_defaults(handler=spec.handler, takes_extras=spec.takes_extras, takes_passthrough=spec.takes_passthrough)
    return parser
