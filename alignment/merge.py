"""Merge model runs with MergeKit: linear, SLERP, TIES, DARE and task arithmetic.

    smolforge merge --config recipes/demo/merge.yaml
    smolforge merge --config recipes/demo/merge.yaml --set method=slerp --set t=0.3

SmolLM3's last step: a soup of its APO checkpoints, then a linear merge with a mid-training
checkpoint to win back long-context ability. A recipe names the runs and their weights::

    method: linear                  # linear | slerp | ties | dare_ties | dare_linear | task_arithmetic
    models:
      - {run: apo-demo, weight: 0.9}
      - {run: pretrain-long, weight: 0.1}
    base: null                      # ties / dare_* / task_arithmetic: the run task vectors are taken from;
                                    #   slerp: the t = 0 end (models: then names the other end)

Every run must hold a causal LM of one architecture (same config shape); the first run's
tokenizer is kept (the base's, when there is one). The merge is written by MergeKit's
``run_merge`` (fp32 by default, safetensors) into a temp folder inside the run, then renamed to
``model/``. The run's parents are the merged runs (the base last); ``run.json`` records each
one's weight under ``recipe.models`` and ``metrics``: ``merge/models``, ``merge/weight/<run>``.
"""
from __future__ import annotations

import difflib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field

from smolforge.errors import RecipeError
from smolforge.model_folder import check_model_folder
from smolforge.recipe import FRACTION, build, to_dict
from smolforge.runs import Run, Runs

log = logging.getLogger(__name__)

METHODS = ("linear", "slerp", "ties", "dare_ties", "dare_linear", "task_arithmetic")
NEEDS_BASE = ("slerp", "ties", "dare_ties", "dare_linear", "task_arithmetic")
SPARSIFIED = ("ties", "dare_ties", "dare_linear")
# config keys that must agree for tensors to be merged one to one
SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings")


@dataclass
class Source:
    run: str = ""                     # a run holding a causal LM in model/
    weight: float = 1.0               # its weight (linear, TIES, DARE, task arithmetic)
    density: float | None = None      # TIES/DARE: share of its task vector kept (1.0 = all)


@dataclass
class Recipe:
    name: str = "merge-demo"          # run name
    method: str = "linear"            # linear | slerp | ties | dare_ties | dare_linear | task_arithmetic
    models: list = field(default_factory=list)  # [{run: NAME, weight: W, density: D}, ...]
    base: str | None = None           # ties/dare/task_arithmetic: task vectors' origin; slerp: the t = 0 end
    t: float = field(default=0.5, metadata=FRACTION)                   # slerp: 0 = base, 1 = the other model
    normalize: bool = True            # linear/TIES/DARE: divide by the sum of the weights
    dtype: str = "float32"            # float32 | bfloat16 | float16: the merge's arithmetic and output
    seed: int = 0                     # DARE's random drops


def sources(recipe: Recipe) -> list[Source]:
    return [build(Source, item, source="merge recipe", prefix=f"models[{i}].") if isinstance(item, dict)
            else Source(run=str(item)) for i, item in enumerate(recipe.models)]


def validate(recipe: Recipe, runs: Runs) -> None:
    if recipe.method not in METHODS:
        close = difflib.get_close_matches(recipe.method, METHODS, n=1)
        raise RecipeError(f"method: unknown merge method {recipe.method!r} "
                          + (f"(did you mean {close[0]!r}?)" if close else f"(expected one of {', '.join(METHODS)})"))
    models = sources(recipe)
    if not models:
        raise RecipeError("models: name at least one run to merge ({run: NAME, weight: W})")
    if recipe.method in NEEDS_BASE and not recipe.base:
        raise RecipeError(f"base: method {recipe.method} needs a base run "
                          + ("(the t = 0 end)" if recipe.method == "slerp" else "(the task vectors' origin)"))
    if recipe.base and recipe.base in [s.run for s in models]:
        raise RecipeError(f"models: the base run '{recipe.base}' is listed again; list only the other runs")
    if recipe.method == "slerp" and len(models) != 1:
        raise RecipeError(f"models: slerp interpolates base and one other run; got {len(models)} runs")
    if recipe.method == "linear" and recipe.base:
        raise RecipeError("base: a linear merge has no base; list every run under models:")
    if recipe.method == "slerp" and not 0.0 <= recipe.t <= 1.0:
        raise RecipeError(f"t must be within [0, 1], got {recipe.t}")
    if recipe.dtype not in ("float32", "bfloat16", "float16"):
        raise RecipeError(f"dtype is {recipe.dtype!r}; expected float32, bfloat16 or float16")
    for i, source in enumerate(models):
        if not source.run:
            raise RecipeError(f"models[{i}].run: name the run to merge")
        if source.weight < 0:
            raise RecipeError(f"models[{i}].weight must be >= 0, got {source.weight}")
        if source.density is not None and not 0.0 < source.density <= 1.0:
            raise RecipeError(f"models[{i}].density must be within (0, 1], got {source.density}")
    if recipe.method == "linear" and sum(s.weight for s in models) <= 0:
        raise RecipeError("models: the weights sum to 0; nothing to merge")
    shapes = {}
    for ref in [s.run for s in models] + ([recipe.base] if recipe.base else []):
        shapes[ref] = _shape(runs.get(ref))
    first, shape = next(iter(shapes.items()))
    for ref, other in shapes.items():
        if other != shape:
            diff = ", ".join(f"{k} {shape.get(k)} vs {other.get(k)}" for k in SHAPE_KEYS if shape.get(k) != other.get(k))
            raise RecipeError(f"models: run '{ref}' has another architecture than '{first}' ({diff}); "
                              "only models of one shape merge tensor by tensor")


def _shape(run: Run) -> dict:
    config = run.model_dir / "config.json"
    if not config.is_file():
        raise RecipeError(f"run '{run.name}' (stage {run.stage}) has no model/config.json; only model runs merge")
    check_model_folder(run.model_dir, f"models: run '{run.name}'")
    try:
        values = json.loads(config.read_text())
    except ValueError as exc:
        raise RecipeError(f"{config}: not valid JSON ({exc})") from None
    return {k: values.get(k) for k in SHAPE_KEYS}


def mergekit_config(recipe: Recipe, parents: list[Run]) -> dict:
    """The MergeKit configuration of the recipe; ``parents`` are its runs, in ``models:`` order, then the base."""
    def parameters(source: Source) -> dict:
        found = {} if recipe.method == "slerp" else {"weight": source.weight}
        if recipe.method in SPARSIFIED:
            found["density"] = 1.0 if source.density is None else source.density
        return found

    config: dict = {"merge_method": recipe.method, "dtype": recipe.dtype,
                    "models": [{"model": str(run.model_dir), "parameters": parameters(s)}
                               for s, run in zip(sources(recipe), parents)]}
    if recipe.base:
        config["base_model"] = str(parents[-1].model_dir)
    if recipe.method == "slerp":
        config["parameters"] = {"t": recipe.t}
    elif recipe.method != "task_arithmetic":
        config["parameters"] = {"normalize": recipe.normalize}
    return config


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    models = sources(recipe)
    parents = [runs.get(s.run) for s in models] + ([runs.get(recipe.base)] if recipe.base else [])
    config = mergekit_config(recipe, parents)
    with runs.start("merge", recipe.name, to_dict(recipe), parents=parents, overwrite=overwrite) as run:
        tmp = run.model_staging_dir
        shutil.rmtree(tmp, ignore_errors=True)
        run.mergekit_path.write_text(_yaml(config))
        run_merge(MergeConfiguration.model_validate(config), str(tmp),
                  MergeOptions(copy_tokenizer=True, quiet=True, write_model_card=False, random_seed=recipe.seed,
                               safe_serialization=True))
        os.replace(tmp, run.model_dir)
        weights = {f"merge/weight/{s.run}": s.weight for s in models} if recipe.method != "slerp" else {
            f"merge/weight/{recipe.base}": 1.0 - recipe.t, f"merge/weight/{models[0].run}": recipe.t}
        run.finish({"merge/models": len(parents), **weights})
    log.info("merged %s (%s) → %s", ", ".join(p.name for p in parents), recipe.method, run.model_dir)
    return run


def _yaml(config: dict) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False)
