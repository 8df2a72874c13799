"""Every shipped recipe builds into its stage's typed recipe (unknown keys, types, TRL configs)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from smolforge.ops.ablate import load_ablation
from smolforge.pipeline import load_pipeline
from smolforge.recipe import build_stage_recipe, load_yaml, load_recipe
from smolforge.registry import load_stage

RECIPES = sorted(p for p in (REPO / "recipes").rglob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(REPO / "recipes")))
def test_recipe_builds(path: Path):
    if "pipeline" in load_yaml(path):
        assert load_pipeline(path).steps
        return
    if "ablation" in load_yaml(path):   # an ablation file: every run it plans builds
        ablation = load_ablation(path)
        module = load_stage(ablation.stage)
        assert all(build_stage_recipe(module, p.recipe, source=f"{path} {p.name}") for p in ablation.plan())
        return
    stage, data = load_recipe(path)
    recipe = build_stage_recipe(load_stage(stage), data, source=str(path))
    assert getattr(recipe, "name", None) or getattr(recipe, "run", None)


def test_smollm3_3b_recipes_start_from_runs_their_siblings_make():
    """Each init:, parent:, merged run and run: reward names a run another recipe in the folder produces
    (what `smolforge plan recipes/smollm3-3b` follows to find each model's shape)."""
    folder = REPO / "recipes" / "smollm3-3b"
    recipes = {path.name: load_recipe(path) for path in sorted(folder.glob("*.yaml"))}
    made = {data["name"]: stage for stage, data in recipes.values()}
    for name, (stage, data) in recipes.items():
        wanted = [data.get("init"), data.get("parent"), data.get("base")]
        wanted += [m["run"] for m in data.get("models", [])]
        wanted += [r[len("run:"):] for r in data.get("rewards", []) if str(r).startswith("run:")]
        for run in filter(None, wanted):
            assert made.get(run) not in (None, "data"), f"{name}: no recipe beside it makes a model run '{run}'"
