"""How packages add their commands to ``smolforge`` without the spine naming them.

A command module (listed in :data:`smolforge.registry.COMMAND_MODULES`) imports only the stdlib
and the spine, and has ``register(cli: Commands) -> None``. In it a package

- declares each of its stages, once (``cli.stage(StageSpec(...))``): its name, its module, whether
  its runs hold a model and whether it trains, an example for ``--help``, and, where the stage can
  run a learning-rate range test, the module that does it (used by ``smolforge lr-find``,
  :mod:`smolforge.ops.lr_find`); the registry, the pipeline runner and the CLI read these; beside the
  spec, the stage's subcommand may get extra arguments and a handler that prepares the arguments
  and then calls :func:`smolforge.stage_runner.run_stage`;
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

__all__ = ["Commands", "Context", "StageSpec", "StageCommand", "ToolCommand", "report_run",
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
    seed_key: str | None = None    # where its recipe keeps its seed ("trainer.seed"): `--seeds` and a pipeline
                                   # step's `seeds:` set it per run (smolforge.seeds); None: it has no seed


@dataclasses.dataclass
class StageCommand:
    """A stage's subcommand: its spec and how its command line differs from the plain one."""

    spec: StageSpec
    examples: Sequence[str] = ()               # replace the two default examples under --help
    arguments: Arguments | None = None         # adds the stage's own arguments
    handler: Handler | None = None             # default: smolforge.stage_runner.run_stage
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
