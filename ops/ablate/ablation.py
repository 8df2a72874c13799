"""An ablation file, read and checked: :class:`Ablation` (its baseline, variants and seeds) and the runs it plans.

The keys are those :mod:`smolforge.ops.ablate` lists; :func:`load_ablation` reads a file (``--set``
changes applied), :meth:`Ablation.plan` names every run and builds its stage recipe.
"""
from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError
from smolforge.recipe import apply_overrides, check_keys, load_yaml, set_path
from smolforge.registry import model_stages, stages, training_stages

__all__ = ["Variant", "PlannedRun", "Ablation", "load_ablation", "ABLATION_KEYS", "MODES", "RESULT_STAGE"]

ABLATION_KEYS = ("ablation", "recipe", "set", "seeds", "seed_key", "variants", "mode", "from", "from_step", "suite",
                 "tasks", "limit", "launch")
MODES = ("scratch", "anneal")
RESULT_STAGE = "ablate"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One arm of the ablation: the baseline (``key`` None) or one key set to one value."""

    label: str          # "baseline", "learning_rate=0.001", "mixture=math-heavy"
    slug: str           # its part of the run names
    key: str | None = None
    value: Any = None


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of the ablation: which variant, which seed, its run name and full stage recipe."""

    variant: Variant
    seed: int
    name: str
    recipe: dict        # the stage recipe's keys (without ``stage``)


@dataclasses.dataclass
class Ablation:
    """A loaded ablation file (see the module docstring)."""

    name: str
    source: Path
    stage: str
    baseline: dict                  # the baseline stage recipe with ``set:`` applied (no ``stage`` key)
    seeds: list[int]
    seed_key: str
    variants: list[Variant]         # the baseline first
    mode: str = "scratch"
    start_from: str | None = None   # anneal: the main run
    suite: str = "embedded"
    tasks: list[str] | None = None
    limit: int | None = None
    launch: dict | None = None
    from_step: int | None = None    # anneal: start from this checkpoint of the main run

    @property
    def init_run(self) -> str | None:
        """The run every anneal continues: the main run, or its exported checkpoint's run."""
        if self.start_from and self.from_step:
            return f"{self.start_from}-step{self.from_step}"
        return self.start_from

    @property
    def result_name(self) -> str:
        return f"{RESULT_STAGE}-{self.name}"

    def plan(self) -> list[PlannedRun]:
        """Every run, variant by variant (the baseline first), seed by seed."""
        planned = []
        for variant in self.variants:
            for seed in self.seeds:
                recipe = copy.deepcopy(self.baseline)
                name = f"{self.name}-{variant.slug}-s{seed}"
                recipe["name"] = name
                if self.mode == "anneal":
                    recipe["init"] = self.init_run
                if variant.key is not None:
                    set_path(recipe, variant.key, copy.deepcopy(variant.value), f"{self.source}: variants")
                set_path(recipe, self.seed_key, seed, f"{self.source}: seed_key")
                planned.append(PlannedRun(variant, seed, name, recipe))
        return planned

    def names(self, variant: Variant) -> list[str]:
        return [p.name for p in self.plan() if p.variant == variant]


def load_ablation(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> Ablation:
    """Read and check an ablation file (``sets``: ``key=value`` overrides of the file's own keys).
    Raises RecipeError naming the file and key for anything it cannot run."""
    path = Path(path)
    source = str(path)
    data = apply_overrides(load_yaml(path), sets, source)
    check_keys(data, ABLATION_KEYS, source)
    name = data.get("ablation")
    if not isinstance(name, str) or not _NAME.match(name):
        raise RecipeError(f"{source}: 'ablation' must name the ablation (letters, digits, '-', '_', '.'), got {name!r}")
    if not data.get("recipe"):
        raise RecipeError(f"{source}: 'recipe' must name the baseline stage recipe (a path relative to this file)")
    recipe_path = path.parent / str(data["recipe"])
    baseline = load_yaml(recipe_path)
    stage = baseline.pop("stage", None)
    trained = [s for s in training_stages() if s in model_stages()]
    if stage not in stages() or stage not in trained:
        raise RecipeError(f"{recipe_path}: an ablation trains a model; its recipe's stage must be one of "
                          f"{', '.join(trained)}, got {stage!r}")
    changes = data.get("set") or {}
    if not isinstance(changes, dict):
        raise RecipeError(f"{source}: 'set' must be a mapping of key.path: value")
    for key, value in changes.items():
        set_path(baseline, str(key), value, f"{source}: set")
    seeds = data.get("seeds", [0, 1, 2])
    if (not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise RecipeError(f"{source}: 'seeds' must be a list of distinct integers, got {seeds!r}")
    seed_key = str(data.get("seed_key") or ("train.seed" if stage == "pretrain" else "trainer.seed"))
    mode = data.get("mode", "scratch")
    if mode not in MODES:
        raise RecipeError(f"{source}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    start_from = data.get("from")
    if mode == "anneal":
        if stage != "pretrain":
            raise RecipeError(f"{source}: mode anneal continues a pretraining run; the recipe's stage is {stage}")
        if not start_from:
            raise RecipeError(f"{source}: mode anneal needs 'from: <main run>' (the model every run continues)")
    elif start_from is not None or data.get("from_step") is not None:
        raise RecipeError(f"{source}: 'from' and 'from_step' are for mode anneal (this ablation's mode is {mode})")
    from_step = data.get("from_step")
    if from_step is not None and (not isinstance(from_step, int) or isinstance(from_step, bool) or from_step < 1):
        raise RecipeError(f"{source}: 'from_step' must be a checkpoint's step (a positive integer), got {from_step!r}")
    tasks = data.get("tasks")
    if tasks is not None and (not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks)):
        raise RecipeError(f"{source}: 'tasks' must be a list of task names, got {tasks!r}")
    limit = data.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise RecipeError(f"{source}: 'limit' must be a positive integer or null, got {limit!r}")
    variants = [Variant("baseline", "baseline")] + _variants(data.get("variants"), source)
    return Ablation(name, path, stage, baseline, seeds, seed_key, variants, mode, start_from,
                    str(data.get("suite") or "embedded"), tasks, limit, data.get("launch"), from_step)


def _variants(items: Any, source: str) -> list[Variant]:
    if not isinstance(items, list) or not items:
        raise RecipeError(f"{source}: 'variants' must be a non-empty list of {{key: a.b.c, values: [...]}}")
    variants: list[Variant] = []
    for n, item in enumerate(items, start=1):
        where = f"{source}: variants[{n}]"
        if not isinstance(item, dict) or set(item) != {"key", "values"}:
            raise RecipeError(f"{where} must be {{key: a.b.c, values: [...]}} (one key per variant), got {item!r}")
        key, values = str(item["key"]), item["values"]
        if isinstance(values, dict):
            named = [(str(label), value) for label, value in values.items()]
        elif isinstance(values, list) and values:
            odd = [v for v in values if not isinstance(v, (int, float, str, bool))]
            if odd:
                raise RecipeError(f"{where}: value {odd[0]!r} of {key} needs a name: values: {{name: value}}")
            named = [(str(v), v) for v in values]
        else:
            raise RecipeError(f"{where}: 'values' must be a non-empty list or a mapping of name: value")
        leaf = key.split(".")[-1]
        for label, value in named:
            slug = re.sub(r"[^A-Za-z0-9_.]+", "-", f"{leaf}-{label}").strip("-.")
            variant = Variant(f"{leaf}={label}", slug, key, value)
            if any(v.slug == slug for v in variants):
                raise RecipeError(f"{where}: variant {variant.label} is listed twice")
            variants.append(variant)
    return variants
