"""The ``smolforge`` command: parse arguments, hand them to the command's handler, print errors once.

    smolforge --help
    smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20
    smolforge pipeline recipes/demo/pipeline.yaml
    smolforge runs --runs-dir runs --json
    smolforge lineage dpo-demo
    smolforge import ./SmolLM3-3B-Base --name smollm3-base

Every command is declared in a ``commands`` module (:mod:`smolforge.commands`,
:data:`smolforge.registry.COMMAND_MODULES`): the spine's own ``pipeline``, ``import``, ``runs``,
``lineage``, ``launch`` and ``lr-find`` in :mod:`smolforge.spine_commands`, the others in their
package's; a stage's command runs its ``validate`` and ``run``. Only stdlib and pyyaml are imported
to build the parser; a handler imports torch, TRL or lm-eval when its command runs, so
``--help`` answers at once. The global options ``--runs-dir DIR``, ``--debug`` and ``--json``
work before or after the command; options after ``--`` go to the program a command wraps
(``smolforge serve RUN -- --max-num-seqs 8`` passes them to vLLM).

    >>> import tempfile
    >>> main(["runs", "--runs-dir", tempfile.mkdtemp()])  # doctest: +ELLIPSIS
    no runs under /.../
    0
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from smolforge.commands import Context, StageCommand, ToolCommand, close_option, epilog
from smolforge.errors import RecipeError, SmolforgeError, Terminated
from smolforge.processes import release_process_group, use_environment_extension_cache

__all__ = ["main", "build_parser", "split_global_options", "unwind_on_sigterm"]

GLOBAL_FLAGS = ("--debug", "--json")
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (a RecipeError), like every other error."""

    def error(self, message: str):
        raise RecipeError(f"{self.prog}: {message}")


def split_global_options(argv: Sequence[str]) -> tuple[list[str], dict, list[str]]:
    """``(the rest, {runs_dir, debug, json}, what follows '--')``: global options may sit anywhere.

    ``--local_rank N`` (which the ``deepspeed`` launcher appends to every rank's command) is one
    of them: it is taken out here and becomes ``$LOCAL_RANK`` when the launcher did not set that.

    >>> split_global_options(["runs", "--runs-dir", "r", "--json"])
    (['runs'], {'runs_dir': 'r', 'debug': False, 'json': True, 'local_rank': None}, [])
    >>> split_global_options(["--debug", "serve", "x", "--runs-dir=r", "--", "--json"])
    (['serve', 'x'], {'runs_dir': 'r', 'debug': True, 'json': False, 'local_rank': None}, ['--json'])
    >>> split_global_options(["sft", "--config", "s.yaml", "--local_rank=1"])[:2]
    (['sft', '--config', 's.yaml'], {'runs_dir': None, 'debug': False, 'json': False, 'local_rank': 1})
    """
    argv = list(argv)
    tail: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1:]
    found: dict = {"runs_dir": None, "debug": False, "json": False, "local_rank": None}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in GLOBAL_FLAGS:
            found[token[2:]] = True
        elif token == "--runs-dir":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise RecipeError("--runs-dir needs a folder (--runs-dir DIR)")
            found["runs_dir"] = argv[i + 1]
            i += 1
        elif token.startswith("--runs-dir="):
            found["runs_dir"] = token.split("=", 1)[1]
        elif token.split("=", 1)[0] in LOCAL_RANK_FLAGS:
            value = token.split("=", 1)[1] if "=" in token else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 0 if "=" in token else 1
            if not value.isdigit():
                raise RecipeError(f"{token.split('=', 1)[0]} needs a process index (--local_rank N), got {value!r}")
            found["local_rank"] = int(value)
        else:
            rest.append(token)
        i += 1
    return rest, found, tail


def _global_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", metavar="DIR", help="where runs live (default: $SMOLFORGE_RUNS, else ./runs); "
                        "before or after the command")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table "
                        "(pipeline, runs, lineage, data, plan, compare, eval audit, lr-find, doctor, burnin, ablate)")
    parser.add_argument("--local_rank", "--local-rank", type=int, metavar="N",
                        help="this process's index on its node, as the deepspeed launcher passes it "
                        "(becomes $LOCAL_RANK when unset)")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser: every declared tool and one subcommand per stage (:mod:`smolforge.registry`)."""
    from smolforge.commands import StageCommand, StageSpec
    from smolforge.registry import commands, stages

    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="smolforge",
        description="Post-training workbench for small LMs: data → pretrain → SFT → DPO → eval.\n"
        "Every stage reads a run folder and writes one (runs/<name>/run.json).",
        formatter_class=fmt,
        epilog=epilog("smolforge pipeline recipes/demo/pipeline.yaml",
                      "smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20",
                      "smolforge lineage dpo-demo"),
    )
    _global_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    declared = commands()
    tools = list(declared.tools.values())
    for tool in (t for t in tools if t.before_stages):
        add_tool_parser(sub, tool, fmt)
    for name, dotted in stages().items():  # the command modules' order follows the flow: data → … → eval
        # a plugin stage ($SMOLFORGE_EXTRA_STAGES) replacing a built-in one keeps its command's shape
        command = declared.stages.get(name) or StageCommand(StageSpec(name, dotted))
        add_stage_parser(sub, command, dotted, fmt)
    for tool in (t for t in tools if not t.before_stages):
        add_tool_parser(sub, tool, fmt)
    for choice in sub.choices.values():  # --help of every command lists the global options too
        _global_arguments(choice.add_argument_group("global options (before or after the command)"))
    return parser


_PARSERS: dict = {}   # one parser per stage table: argparse parses without changing the parser


def stage_table_parser() -> argparse.ArgumentParser:
    """:func:`build_parser` for the registered stages, built once per process and stage table (a caller
    that runs many commands in one process, such as ``smolforge.step_batch``, builds it once: ~24 ms of
    every command on 2 cores, for 18 stages' and 12 tools' subcommands)."""
    from smolforge.registry import stages

    key = tuple(stages().items())
    if key not in _PARSERS:
        _PARSERS[key] = build_parser()
    return _PARSERS[key]


# --------------------------------------------------------------------------- entry point


def _known_options(parser: argparse.ArgumentParser, command: str) -> list[str]:
    chosen = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return sorted({flag for action in chosen._actions for flag in action.option_strings if flag.startswith("--")})


def unwind_on_sigterm() -> None:
    """SIGTERM raises :class:`Terminated` in the main thread (when it is this process's main thread)."""
    import signal
    import threading

    def terminated(signum, frame):
        raise Terminated("terminated by SIGTERM")

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, terminated)


def _dispatch(argv: list[str]) -> int:
    """Parse ``argv`` and run the chosen command's handler; its exit code."""
    rest, options, tail = split_global_options(argv)
    if options["local_rank"] is not None:
        os.environ.setdefault("LOCAL_RANK", str(options["local_rank"]))
    parser = stage_table_parser()
    args, extras = parser.parse_known_args(rest)
    if args.command is None:
        parser.print_help()
        return 2
    if extras and not args.takes_extras:
        raise RecipeError(f"smolforge {args.command}: {close_option(extras[0], _known_options(parser, args.command))}")
    args.passthrough = tail
    if tail and not getattr(args, "takes_passthrough", False):
        raise RecipeError(f"smolforge {args.command} passes nothing on after '--' (got {' '.join(tail)})")
    from smolforge.runs import runs_root

    ctx = Context(root=runs_root(options["runs_dir"]), debug=options["debug"], json=options["json"])
    return args.handler(args, extras, ctx)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for smolforge errors, 130 on Ctrl-C).

    >>> main(["--help"]) == 0  # doctest: +ELLIPSIS
    usage: smolforge ...
    True
    >>> main(["runs", "--sort"])
    2
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    use_environment_extension_cache()
    own_process = argv is None
    if argv is None:  # the command itself (not a caller in its own process): SIGTERM unwinds, runs record it
        unwind_on_sigterm()
    argv = list(sys.argv[1:] if argv is None else argv)
    # what split_global_options finds, known before it runs: its own errors honour --debug too
    debug = "--debug" in argv[: argv.index("--") if "--" in argv else len(argv)]
    try:
        return _dispatch(argv)
    except SmolforgeError as exc:
        if debug:
            traceback.print_exc()
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return 143
    except SystemExit as exc:   # --help, and argparse's own exits
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BrokenPipeError:  # `smolforge runs | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    finally:
        if own_process:   # a stage under a launcher: its group ends before the interpreter does
            release_process_group()


# --------------------------------------------------------------------------- parsers


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
    parser.add_argument("--seeds", metavar="N|S,S,...",
                        help="run the stage once per seed (N: seeds 0..N-1; or the seeds listed) as runs NAME-seedS, "
                        "then NAME with mean ± sd of every metric (stages with a seed)")
    parser.add_argument("--result-json", help=argparse.SUPPRESS)  # written for the pipeline runner
    parser.set_defaults(handler=command.handler or _plain_stage, takes_extras=True)
    return parser


def _plain_stage(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from smolforge.stage_runner import run_stage

    run_stage(args, extras, ctx)
    return 0


def add_tool_parser(sub, spec: ToolCommand, formatter) -> argparse.ArgumentParser:
    parser = sub.add_parser(spec.name, help=spec.help, description=spec.description or spec.help,
                            formatter_class=formatter, epilog=epilog(*spec.examples) if spec.examples else None)
    if spec.arguments is not None:
        spec.arguments(parser)
    parser.set_defaults(handler=spec.handler, takes_extras=spec.takes_extras, takes_passthrough=spec.takes_passthrough)
    return parser
