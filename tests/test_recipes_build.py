"""Every shipped recipe builds into its stage's typed recipe (unknown keys, types, TRL configs)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from smolforge.pipeline import load_pipeline
from smolforge.recipe import build_stage_recipe, load_yaml, load_recipe
from smolforge.registry import load_stage

RECIPES = sorted(p for p in (REPO / "recipes").rglob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(REPO / "recipes")))
def test_recipe_builds(path: Path):
    if "pipeline" in load_yaml(path):
        assert load_pipeline(path).steps
        return
    stage, data = load_recipe(path)
    recipe = build_stage_recipe(load_stage(stage), data, source=str(path))
    assert getattr(recipe, "name", None) or getattr(recipe, "run", None)
