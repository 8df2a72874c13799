"""Recipes: YAML loading, overrides and dataclass building with errors that name the fix."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Literal, Optional

import pytest

from smolforge.errors import RecipeError
from smolforge.recipe import (apply_overrides, build, build_stage_recipe, deep_merge, load_recipe,
                              load_yaml, to_dict)


@dataclass
class Lora:
    r: int = 8            # rank
    alpha: float = 16.0   # scaling


@dataclass
class Train:
    learning_rate: float = 1e-3
    max_steps: int = 10
    bf16: bool = False
    optim: str = "adamw"
    warmup: Optional[float] = None


@dataclass
class Recipe:
    name: str
    train: Train = field(default_factory=Train)
    lora: Lora | None = None
    mode: Literal["a", "b"] = "a"
    tags: list = field(default_factory=list)
    out: Path = Path("runs")


def test_unknown_recipe_key_names_file_key_and_closest():
    with pytest.raises(RecipeError) as err:
        build(Recipe, {"name": "x", "nmae": "y"}, source="recipes/demo/sft.yaml")
    assert str(err.value) == "recipes/demo/sft.yaml: unknown key 'nmae' (did you mean 'name'?)"


def test_unknown_nested_key_names_the_full_path():
    with pytest.raises(RecipeError) as err:
        build(Recipe, {"name": "x", "train": {"max_stpes": 3}}, source="r.yaml")
    assert "r.yaml: unknown key 'train.max_stpes' (did you mean 'train.max_steps'?)" == str(err.value)


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(RecipeError) as err:
        build(Lora, {"zzzzzz": 1}, source="r.yaml")
    assert str(err.value) == "r.yaml: unknown key 'zzzzzz' (valid keys: r, alpha)"


def test_optional_nested_dataclass_is_built():
    recipe = build(Recipe, {"name": "x", "lora": {"r": 4}}, source="r.yaml")
    assert recipe.lora == Lora(r=4)
    assert build(Recipe, {"name": "x", "lora": None}, source="r.yaml").lora is None
    with pytest.raises(RecipeError, match="unknown key 'lora.rank'"):
        build(Recipe, {"name": "x", "lora": {"rank": 4}}, source="r.yaml")


def test_missing_required_key_is_named():
    with pytest.raises(RecipeError, match=r"r.yaml: missing required key 'name'"):
        build(Recipe, {}, source="r.yaml")


def test_yaml_string_5e_4_becomes_a_float(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: x\ntrain:\n  learning_rate: 5e-4\n  max_steps: '20'\n  warmup: 1e-2\n")
    data = load_yaml(f)
    assert data["train"]["learning_rate"] == "5e-4"  # YAML 1.1 reads it as a string
    recipe = build(Recipe, data, source=str(f))
    assert recipe.train.learning_rate == 5e-4 and isinstance(recipe.train.learning_rate, float)
    assert recipe.train.max_steps == 20 and recipe.train.warmup == 0.01


def test_ints_are_accepted_for_floats():
    assert build(Train, {"learning_rate": 1}, source="r.yaml").learning_rate == 1


@pytest.mark.parametrize(
    "data, message",
    [
        ({"learning_rate": "abc"}, "r.yaml: 'train.learning_rate' must be a float, got 'abc'"),
        ({"max_steps": 2.5}, "r.yaml: 'train.max_steps' must be an int, got 2.5 (a float)"),
        ({"max_steps": True}, "r.yaml: 'train.max_steps' must be an int, got true (a boolean)"),
        ({"bf16": "yes please"}, "r.yaml: 'train.bf16' must be a boolean (true/false), got 'yes please'"),
        ({"bf16": 1}, "r.yaml: 'train.bf16' must be a boolean (true/false), got 1"),
        ({"optim": 3}, "r.yaml: 'train.optim' must be a string, got 3"),
        ({"learning_rate": None}, "r.yaml: 'train.learning_rate' must be a float, got null"),
    ],
)
def test_wrong_scalar_type_is_an_error(data, message):
    with pytest.raises(RecipeError) as err:
        build(Recipe, {"name": "x", "train": data}, source="r.yaml")
    assert str(err.value) == message


@pytest.mark.parametrize("value, shown", [
    (1.0e+30, "1e+30 (a float)"),          # YAML 1.0e+30: int(1e30) would be 10**30 steps
    ("1e30", "1e30 (a float)"),            # YAML 1.1 reads 1e30 as text
    (float(2 ** 53 + 2), "9007199254740994.0 (a float)"),   # past 2**53 a float is no exact count
    (-1.0e+30, "-1e+30 (a float)"),
    (float("inf"), "inf (a float)"),
    (float("nan"), "nan (a float)"),
    (2.5, "2.5 (a float)"),
    ("2.5", "2.5 (a float)"),
    (False, "false (a boolean)"),
])
def test_a_float_or_boolean_for_an_int_field_is_refused_not_truncated(value, shown):
    with pytest.raises(RecipeError) as err:
        build(Recipe, {"name": "x", "train": {"max_steps": value}}, source="recipes/demo/sft.yaml")
    assert str(err.value) == f"recipes/demo/sft.yaml: 'train.max_steps' must be an int, got {shown}"


def test_a_whole_float_for_an_int_field_becomes_that_int():
    for value, expected in ((3.0, 3), ("3.0", 3), (float(2 ** 53), 2 ** 53), (10 ** 30, 10 ** 30)):
        steps = build(Train, {"max_steps": value}, source="r.yaml").max_steps
        assert steps == expected and type(steps) is int


def test_a_float_for_an_int_field_of_a_trl_config_is_refused_through_the_stage(tmp_path):
    pytest.importorskip("trl")
    from smolforge.registry import load_stage

    repo = Path(__file__).resolve().parents[1]
    sft = load_stage("sft")
    source = str(repo / "recipes/demo/sft.yaml")
    for override, shown in (("trainer.max_steps=1.0e+30", "1e+30 (a float)"),
                            ("trainer.max_steps=true", "true (a boolean)"),
                            ("trainer.per_device_train_batch_size=2.5", "2.5 (a float)")):
        stage, data = load_recipe(source, [override])
        key = override.split("=")[0]
        with pytest.raises(RecipeError) as err:
            build_stage_recipe(sft, data, source=source)
        assert str(err.value) == f"{source}: '{key}' must be an int, got {shown}"
    f = tmp_path / "sft.yaml"                      # the same in the YAML itself
    f.write_text("stage: sft\ntrainer:\n  max_steps: 1.0e+30\n")
    with pytest.raises(RecipeError, match=r"sft.yaml: 'trainer.max_steps' must be an int, got 1e\+30 \(a float\)"):
        build_stage_recipe(sft, load_recipe(f)[1], source=str(f))
    stage, data = load_recipe(source, ["trainer.max_steps=3.0"])
    assert build_stage_recipe(sft, data, source=source).trainer.max_steps == 3


def test_other_annotations_pass_through_unchecked():
    recipe = build(Recipe, {"name": "x", "mode": "zzz", "tags": ["a"], "out": "elsewhere"}, "r.yaml")
    assert recipe.mode == "zzz" and recipe.tags == ["a"] and recipe.out == "elsewhere"


def test_nested_value_must_be_a_mapping():
    with pytest.raises(RecipeError, match=r"'train' must be a mapping"):
        build(Recipe, {"name": "x", "train": 5}, source="r.yaml")


def test_post_init_errors_become_recipe_errors():
    @dataclass
    class Checked:
        n: int = 1

        def __post_init__(self):
            if self.n < 1:
                raise ValueError("n must be positive")

    with pytest.raises(RecipeError, match=r"r.yaml: n must be positive"):
        build(Checked, {"n": 0}, source="r.yaml")


def test_overrides_are_typed_and_create_intermediate_keys():
    data = {"name": "x", "train": {"max_steps": 1}}
    out = apply_overrides(data, ["train.max_steps=5", "train.bf16=true", "lora.r=4", "tags=[1, 2]",
                                 "name=a=b"], source="r.yaml")
    assert out == {"name": "a=b", "train": {"max_steps": 5, "bf16": True}, "lora": {"r": 4}, "tags": [1, 2]}
    assert data["train"]["max_steps"] == 1  # the input is not modified


def test_bad_override_is_a_recipe_error():
    with pytest.raises(RecipeError, match=r"r.yaml: override 'train.max_steps' must look like key.path=value"):
        apply_overrides({}, ["train.max_steps"], source="r.yaml")
    with pytest.raises(RecipeError, match=r"'name' is a str, not a mapping"):
        apply_overrides({"name": "x"}, ["name.first=1"], source="r.yaml")


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("stage: sft\nname: [unclosed\ntrainer: {}\n")
    with pytest.raises(RecipeError) as err:
        load_yaml(f)
    assert str(err.value).startswith(f"{f} line ")
    assert "invalid YAML" in str(err.value)


def test_missing_file_and_non_mapping_top_level(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_yaml(tmp_path / "nope.yaml")
    f = tmp_path / "list.yaml"
    f.write_text("- a\n- b\n")
    with pytest.raises(RecipeError, match=r"list.yaml: top level must be a mapping"):
        load_yaml(f)


def test_unknown_yaml_tags_are_read_as_strings(tmp_path):
    f = tmp_path / "task.yaml"
    f.write_text("task: toy\nprocess_docs: !function utils.process_docs\n")
    assert load_yaml(f) == {"task": "toy", "process_docs": "utils.process_docs"}


def test_load_recipe_returns_stage_and_applies_overrides(tmp_path):
    f = tmp_path / "sft.yaml"
    f.write_text("stage: sft\nname: sft-demo\n")
    assert load_recipe(f, ["trainer.max_steps=3"]) == ("sft", {"name": "sft-demo", "trainer": {"max_steps": 3}})


def test_load_recipe_without_stage_lists_known_stages(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("name: x\n")
    with pytest.raises(RecipeError, match=r"x.yaml: missing top-level key 'stage' \(one of: .*dpo.*sft"):
        load_recipe(f)
    f.write_text("stage: stf\n")
    with pytest.raises(RecipeError, match=r"unknown stage 'stf' \(did you mean 'sft'\?"):
        load_recipe(f)


def test_to_dict_is_json_serialisable():
    recipe = build(Recipe, {"name": "x", "lora": {}}, source="r.yaml")
    out = to_dict(recipe)
    json.dumps(out)
    assert out["lora"] == {"r": 8, "alpha": 16.0} and out["out"] == "runs"


def test_trl_sft_config_field_is_checked_and_built():
    trl = pytest.importorskip("trl")

    # real type objects (not strings), as a stage module's get_type_hints would resolve them
    SFTRecipe = make_dataclass("SFTRecipe", [
        ("name", str, field(default="sft")),
        ("trainer", Optional[trl.SFTConfig], field(default=None)),
    ])
    base = {"output_dir": "/tmp/smolforge-test", "use_cpu": True, "bf16": False, "report_to": "none"}
    with pytest.raises(RecipeError) as err:
        build(SFTRecipe, {"trainer": {**base, "learning_rat": 1e-4}}, source="sft.yaml")
    assert str(err.value) == "sft.yaml: unknown key 'trainer.learning_rat' (did you mean 'trainer.learning_rate'?)"

    recipe = build(SFTRecipe, {"trainer": {**base, "learning_rate": "5e-4", "max_steps": "7"}}, "sft.yaml")
    assert isinstance(recipe.trainer, trl.SFTConfig)
    assert recipe.trainer.learning_rate == 5e-4 and recipe.trainer.max_steps == 7
    with pytest.raises(RecipeError, match=r"sft.yaml: 'trainer.max_steps' must be an int, got 'many'"):
        build(SFTRecipe, {"trainer": {**base, "max_steps": "many"}}, "sft.yaml")
    with pytest.raises(RecipeError, match=r"sft.yaml: invalid 'trainer': "):
        build(SFTRecipe, {"trainer": {**base, "lr_scheduler_type": "no-such-schedule"}}, "sft.yaml")
    out = to_dict(recipe)
    json.dumps(out)
    assert out["trainer"]["learning_rate"] == 5e-4


def test_stage_defaults_lie_beneath_the_yaml():
    import types

    stage = types.SimpleNamespace(
        Recipe=Recipe,
        defaults=lambda: {"name": "default", "train": {"bf16": True, "max_steps": 99}},
    )
    recipe = build_stage_recipe(stage, {"train": {"max_steps": 3}}, source="r.yaml")
    assert recipe.name == "default" and recipe.train == Train(max_steps=3, bf16=True)
    assert deep_merge({"a": {"b": 1}}, {"a": None}) == {"a": None}
