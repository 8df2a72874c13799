"""`smolforge merge` (MergeKit) on the session's SFT and DPO runs: the math of each method on real tensors."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import DEMO
from smolforge.errors import RecipeError
from smolforge.recipe import build_stage_recipe, deep_merge, load_recipe
from smolforge.registry import load_stage


def merge(runs, **changes):
    _, data = load_recipe(DEMO / "merge.yaml")
    stage = load_stage("merge")
    recipe = build_stage_recipe(stage, deep_merge(data, changes), source="merge.yaml (test)")
    stage.validate(recipe, runs)
    return stage.run(recipe, runs, overwrite=True)


def tensors(run) -> dict:
    found = {}
    for path in sorted(run.model_dir.glob("*.safetensors")):
        found.update(load_file(path))
    return found


def test_linear_merge_is_the_weighted_average_and_lists_its_parents(runs, sft_run, dpo_run):
    run = merge(runs, name="merge-half", models=[{"run": sft_run.name, "weight": 0.5},
                                                 {"run": dpo_run.name, "weight": 0.5}])
    merged, a, b = tensors(run), tensors(sft_run), tensors(dpo_run)
    assert merged.keys() == a.keys()
    differs = 0
    for key in a:
        torch.testing.assert_close(merged[key], (a[key] + b[key]) / 2, rtol=0, atol=1e-7)
        differs += not torch.equal(a[key], b[key])
    assert differs > 0                                   # DPO moved the weights: the average is not either
    assert run.parents == [sft_run.name, dpo_run.name]
    assert (run.metrics["merge/weight/" + sft_run.name], run.metrics["merge/weight/" + dpo_run.name]) == (0.5, 0.5)
    assert [m["weight"] for m in run.info["recipe"]["models"]] == [0.5, 0.5]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(run.model_dir)  # a plain HF model with its tokenizer
    assert len(AutoTokenizer.from_pretrained(run.model_dir)) == len(AutoTokenizer.from_pretrained(sft_run.model_dir))


def test_slerp_of_a_model_with_itself_returns_it_and_ties_at_full_density_adds_the_task_vector(runs, sft_run, dpo_run):
    import shutil

    twin = runs.root / "sft-twin"                        # the same weights under another run
    if not twin.exists():
        shutil.copytree(sft_run.path, twin)
    same = merge(runs, name="merge-slerp-self", method="slerp", base=sft_run.name, t=0.3, models=[{"run": "sft-twin"}])
    for key, value in tensors(sft_run).items():
        torch.testing.assert_close(tensors(same)[key], value, rtol=1e-6, atol=1e-6)
    # one model, weight 1, density 1: base + (dpo - base) = dpo
    ties = merge(runs, name="merge-ties", method="ties", base=sft_run.name,
                 models=[{"run": dpo_run.name, "weight": 1.0, "density": 1.0}])
    for key, value in tensors(dpo_run).items():
        torch.testing.assert_close(tensors(ties)[key], value, rtol=1e-5, atol=1e-6)
    assert ties.parents == [dpo_run.name, sft_run.name]


@pytest.mark.parametrize(("changes", "message"), [
    ({"method": "linearr"}, r"unknown merge method 'linearr' \(did you mean 'linear'\?\)"),
    ({"models": []}, "name at least one run"),
    ({"method": "slerp"}, "needs a base run"),
    ({"method": "ties", "base": "sft-demo", "models": [{"run": "dpo-demo", "density": 1.5}]}, r"density must be within \(0, 1\]"),
    ({"models": [{"run": "data-demo"}]}, "has no model/config.json; only model runs merge"),
    ({"models": [{"run": "dpo-demo", "weight": -1}]}, "weight must be >= 0"),
    ({"method": "slerp", "base": "sft-demo", "models": [{"run": "sft-demo"}]}, "the base run 'sft-demo' is listed again"),
])
def test_bad_merge_recipes_fail_before_any_run(runs, sft_run, dpo_run, data_run, changes, message):
    _, data = load_recipe(DEMO / "merge.yaml")
    stage = load_stage("merge")
    recipe = build_stage_recipe(stage, {**data, "name": "merge-refused", **changes}, source="merge.yaml (test)")
    with pytest.raises(RecipeError, match=message):
        stage.validate(recipe, runs)
    assert not (runs.root / "merge-refused").exists()
