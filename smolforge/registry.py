"""Where the CLI and the pipeline runner find stages and commands: the command modules' declarations.

A stage module exposes ``Recipe`` (a dataclass with a ``name`` field = run name),
``validate(recipe, runs)`` and ``run(recipe, runs, *, overwrite=False) -> Run``; optionally
``defaults() -> dict``, values the CLI lays beneath the YAML before building ``Recipe``
(see ``smolforge.recipe.build_stage_recipe``); optionally ``summary(run) -> str`` and
``as_json(run) -> dict`` for what its command prints. Nothing here imports a stage until it is
asked for, so ``smolforge --help`` stays fast.

Commands: each package's ``commands`` module (:data:`COMMAND_MODULES`, stdlib + spine imports
only) declares its stages (a :class:`smolforge.commands.StageSpec` each: name, module, traits),
registers its subcommands and says which of its metrics the pipeline summary shows
(:mod:`smolforge.commands`); the functions here read those declarations, so the CLI and the
pipeline runner name no stage.

Plugin hook: ``SMOLFORGE_EXTRA_STAGES="name=dotted.module,other=pkg.mod"`` adds stages (or
replaces built-in ones) without editing this file; subprocesses started by ``smolforge pipeline``
inherit it.

    >>> from smolforge.registry import model_stages, stages
    >>> stages()["dpo"]
    'smolforge.alignment.dpo'
    >>> "sft" in model_stages(), "reward" in model_stages()
    (True, False)
"""
from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

from smolforge.commands import Commands, StageSpec
from smolforge.errors import RecipeError

__all__ = ["EVAL_STAGE", "COMMAND_MODULES", "EXTRA_STAGES_ENV", "SUITES_ENV", "stages", "stage_specs",
           "model_stages", "training_stages", "load_stage", "commands", "suite_folders"]

# the stage a pipeline's ``eval:`` recipes run as, after every model stage
EVAL_STAGE = "eval"
# each package's commands (smolforge.commands), in the flow's order (data → … → eval), which is
# the order of the stages in --help; imported to build the CLI and to find stages, so stdlib + spine only
COMMAND_MODULES: tuple[str, ...] = (
    "smolforge.spine_commands",
    # the ops layer (above every stage) declares no stage: listed here, its tools (lr-find, plan, burnin,
    # doctor, ablate) follow the spine's in --help, before serve, compare and report
    "smolforge.ops.commands",
    "smolforge.data.commands",
    "smolforge.pretrain.commands",
    "smolforge.alignment.commands",
    "smolforge.generation.commands",
    "smolforge.evals.commands",
    "smolforge.annotate.commands",
)
EXTRA_STAGES_ENV = "SMOLFORGE_EXTRA_STAGES"


def stages() -> dict[str, str]:
    """Built-in stages merged with those named in ``$SMOLFORGE_EXTRA_STAGES`` (extras win).

    >>> import os
    >>> os.environ["SMOLFORGE_EXTRA_STAGES"] = "toy=mypkg.toy_stage"
    >>> stages()["toy"]
    'mypkg.toy_stage'
    >>> del os.environ["SMOLFORGE_EXTRA_STAGES"]
    """
    table = {name: spec.module for name, spec in stage_specs().items()}
    raw = os.environ.get(EXTRA_STAGES_ENV, "").strip()
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, module = item.partition("=")
        if not sep or not name.strip() or not module.strip():
            raise RecipeError(
                f"${EXTRA_STAGES_ENV}: item '{item}' must look like name=dotted.module"
            )
        table[name.strip()] = module.strip()
    return table


def stage_specs() -> dict[str, StageSpec]:
    """``{name: StageSpec}`` of every built-in stage, as the command modules declare them.

    >>> stage_specs()["sft"].lr_find
    'smolforge.ops.lr_find.sft'
    """
    return {name: command.spec for name, command in commands().stages.items()}


def model_stages() -> tuple[str, ...]:
    """The stages whose runs hold a causal LM in model/ and get evaluated (a reward run holds a scorer
    instead); an imported released model is scored too: the baseline of the steps that follow it.

    >>> model_stages()
    ('import', 'pretrain', 'sft', 'dpo', 'orpo', 'cpo', 'kto', 'grpo', 'rloo', 'ppo', 'distill', 'merge')
    """
    return tuple(name for name, spec in stage_specs().items() if spec.makes_model)


def training_stages() -> tuple[str, ...]:
    """The stages that run a training loop: what a pipeline-level ``launch:`` starts under its launcher.

    >>> training_stages()
    ('pretrain', 'sft', 'dpo', 'orpo', 'cpo', 'kto', 'reward', 'grpo', 'rloo', 'ppo', 'distill')
    """
    return tuple(name for name, spec in stage_specs().items() if spec.trains)


def unknown_stage_message(name: str, known: list[str] | None = None) -> str:
    """The text of an unknown-stage error, with the closest known stage and the full list.

    >>> unknown_stage_message("stf", ["data", "sft"])
    "unknown stage 'stf' (did you mean 'sft'?; known stages: data, sft)"
    """
    known = sorted(stages()) if known is None else known
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f"did you mean '{close[0]}'?; " if close else ""
    return f"unknown stage '{name}' ({hint}known stages: {', '.join(known)})"


def load_stage(name: str) -> ModuleType:
    """Import and return the stage module registered under ``name``.

    >>> load_stage("nope")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: unknown stage 'nope' (known stages: annotate, cpo, data, distill, dpo, eval, grpo, import, judge, kto, merge, orpo, ppo, pretrain, reward, rloo, sft, synth)
    """
    table = stages()
    if name not in table:
        raise RecipeError(unknown_stage_message(name, sorted(table)))
    dotted = table[name]
    try:
        module = importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (dotted == exc.name or dotted.startswith(exc.name + ".")):
            raise  # a dependency of the stage is missing: the traceback says which
        raise RecipeError(
            f"stage '{name}' is registered as '{dotted}' but no such module can be imported"
        ) from exc
    missing = [attr for attr in ("Recipe", "validate", "run") if not hasattr(module, attr)]
    if missing:
        raise RecipeError(
            f"stage '{name}' ({dotted}) does not define {', '.join(missing)}; "
            "a stage module needs Recipe, validate(recipe, runs) and run(recipe, runs, *, overwrite)"
        )
    return module


@functools.lru_cache(maxsize=1)
def commands() -> Commands:
    """Every command module's declarations (:class:`smolforge.commands.Commands`), loaded once.

    >>> sorted({"compare", "doctor", "lineage", "plan", "report", "serve"} & set(commands().tools))
    ['compare', 'doctor', 'lineage', 'plan', 'report', 'serve']
    """
    declared = Commands()
    for dotted in COMMAND_MODULES:
        importlib.import_module(dotted).register(declared)
    return declared


# Eval suites are folders (lm-eval YAML + JSONL). Those under evals/suites/ are registered by
# being there; $SMOLFORGE_SUITES adds folders (os.pathsep-separated). Decontamination reads them
# all, so a suite added for evaluation is automatically kept out of training data.
SUITES_ENV = "SMOLFORGE_SUITES"


def builtin_suites_dir() -> Path:
    """``suites/`` inside the installed ``smolforge.evals`` package, found without importing it."""
    spec = importlib.util.find_spec("smolforge.evals")
    if spec is None or not spec.submodule_search_locations:
        return Path("/nonexistent")
    return Path(list(spec.submodule_search_locations)[0]) / "suites"


def suite_folders() -> dict[str, Path]:
    """``{suite name: folder}`` of every registered suite (built-in first, then $SMOLFORGE_SUITES).

    >>> "embedded" in suite_folders()
    True
    """
    found: dict[str, Path] = {}
    builtin = builtin_suites_dir()
    if builtin.is_dir():
        for path in sorted(builtin.iterdir()):
            if path.is_dir() and not path.name.startswith(("_", ".")) and any(path.glob("*.jsonl")):
                found[path.name] = path
    staged = staged_suites_dir()
    if staged.is_dir():
        for path in sorted(staged.iterdir()):
            if path.is_dir() and any(path.glob("*.yaml")):
                found[path.name] = path
    for item in filter(None, os.environ.get(SUITES_ENV, "").split(os.pathsep)):
        path = Path(item)
        if not path.is_dir():
            raise RecipeError(f"${SUITES_ENV}: {item} is not a folder")
        found[path.name] = path
    return found


def staged_suites_dir() -> Path:
    """Where ``smolforge eval stage`` keeps standard lm-eval tasks with local data.

    ``$SMOLFORGE_STAGED``, else ``~/.cache/smolforge/staged``; one suite folder per task.
    """
    return Path(os.environ.get("SMOLFORGE_STAGED") or Path.home() / ".cache" / "smolforge" / "staged")
