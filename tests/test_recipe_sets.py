"""The SmolLM3-3B recipe set as a whole: every recipe that can plan plans (post-training from its
parent chain), the folder plan's table, JSON and total, and the hub data recipes fail offline cleanly.

GPU-free and fast: shapes come from the recipes, parameters are counted on the meta device.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from smolforge.cli import main
from smolforge.errors import RecipeError
from smolforge.ops.plan import plan_file

FOLDER = REPO / "recipes" / "smollm3-3b"
N_3B = 3_075_098_624                   # SmolLM3-3B's parameters (tied embeddings, vocab 128256)
PLANNED = ["pretrain.yaml", "midtrain-32k.yaml", "midtrain-64k.yaml", "midtrain-reasoning.yaml", "sft.yaml",
           "apo.yaml", "dpo.yaml", "merge.yaml"]          # lineage order (apo and dpo both follow sft)
NOT_PLANNED = {"data-web.yaml": "data", "data-mid.yaml": "data", "data-post.yaml": "data", "grpo.yaml": "grpo",
               "orpo.yaml": "orpo", "ppo.yaml": "ppo", "reward.yaml": "reward", "rloo.yaml": "rloo"}


@pytest.fixture(scope="module")
def no_runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")   # no data run: token counts come from the recipes


@pytest.fixture(scope="module")
def folder_plan(no_runs):
    return plan_file(FOLDER, gpus=384, gpu="h100", runs_dir=no_runs)


@pytest.fixture(scope="module")
def plans(no_runs):
    return {name: plan_file(FOLDER / name, gpus=384, runs_dir=no_runs) for name in PLANNED}


def test_every_recipe_that_can_plan_plans_in_lineage_order(folder_plan):
    assert [r["recipe"] for r in folder_plan["rows"]] == PLANNED
    assert {s["recipe"]: s["stage"] for s in folder_plan["not_planned"]} == NOT_PLANNED
    assert all(s["why"].startswith(f"not planned: {s['stage']}") for s in folder_plan["not_planned"])


def test_post_training_plans_have_the_pretrain_models_shape(plans):
    assert plans["pretrain.yaml"]["params"] == N_3B
    for name in ("midtrain-reasoning.yaml", "sft.yaml", "apo.yaml", "dpo.yaml"):
        assert plans[name]["params"] == plans["pretrain.yaml"]["params"], name
        assert plans[name]["lineage"][:3] == ["pretrain.yaml", "midtrain-32k.yaml", "midtrain-64k.yaml"]
    assert plans["apo.yaml"]["lineage"][-2:] == ["midtrain-reasoning.yaml", "sft.yaml"]
    assert [plans[n]["seq_len"] for n in ("midtrain-reasoning.yaml", "sft.yaml", "apo.yaml")] == [32768, 8192, 24576]
    assert plans["merge.yaml"]["memory_bytes"] == 2 * 2 * N_3B     # two 3B models in bf16
    assert plans["merge.yaml"]["gpu_hours"] == 0


def test_token_counts_are_smollm3s_published_figures_times_the_recipes_epochs(plans):
    assert plans["midtrain-reasoning.yaml"]["tokens"] == 35e9 * 4        # 140B: SmolLM3's model card
    assert plans["sft.yaml"]["tokens"] == 1.8e9 * 2
    assert plans["apo.yaml"]["tokens"] == pytest.approx(0.18e9 * 2)     # assumed, and says so
    assert "assumed" in plans["apo.yaml"]["tokens_source"]
    assert plans["midtrain-32k.yaml"]["tokens"] == 3974 * 32768 * 384 == pytest.approx(50e9, rel=0.001)


def test_dpo_adds_the_reference_forward_and_memory(plans, no_runs):
    apo, dpo = plans["apo.yaml"], plans["dpo.yaml"]
    per_token, tokens = apo["flops_per_token"], apo["tokens"]
    assert apo["train_flops"] == pytest.approx(per_token * tokens * 4 / 3)   # policy 6N + reference 2N
    assert apo["reference"] == "model" and dpo["reference"] == "precomputed"
    once = plan_file(FOLDER / "apo.yaml", ["trainer.precompute_ref_log_probs=true"], gpus=384, runs_dir=no_runs)
    assert once["train_flops"] == pytest.approx(per_token * tokens + per_token / 3 * tokens / 2)  # 2 epochs, 1 pass
    zero3 = apo["memory_per_gpu_bytes"]["3"]
    assert zero3["reference"] == round(2 * N_3B / 384)                  # bf16, sharded under ZeRO-3
    assert apo["memory_per_gpu_bytes"]["0"]["reference"] == 2 * N_3B
    assert "reference" not in dpo["memory_per_gpu_bytes"]["3"]          # precomputed: no reference in memory
    assert apo["activations_bytes"]["micro_batch_size"] == 2 * 2        # 2 pairs: chosen + rejected rows


def test_64k_midtraining_needs_more_memory_and_hours_than_32k(folder_plan):
    rows = {r["recipe"]: r for r in folder_plan["rows"]}
    short, long = rows["midtrain-32k.yaml"], rows["midtrain-64k.yaml"]
    assert long["memory_per_gpu_bytes"] > short["memory_per_gpu_bytes"]
    assert long["gpu_hours"] > short["gpu_hours"]                       # the same 50B tokens, twice the attention
    assert short["activation_checkpointing"] and short["zero_stage"] == 1


def test_folder_total_is_the_sum_of_its_rows(folder_plan):
    rows = folder_plan["rows"]
    assert folder_plan["total_gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in rows))
    assert all(r["gpu_hours"] > 0 for r in rows if r["stage"] != "merge")
    for r in rows:
        if r["stage"] != "merge":
            assert r["days"] == pytest.approx(r["gpu_hours"] / 384 / 24)
    assert folder_plan["total_days"] == pytest.approx(sum(r["days"] or 0 for r in rows))


def test_folder_plan_through_the_cli(no_runs, capsys):
    assert main(["--runs-dir", str(no_runs), "plan", str(FOLDER), "--gpus", "384", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [r["recipe"] for r in plan["rows"]] == PLANNED and plan["gpus"] == 384 and plan["gpu"] == "h100"
    assert plan["total_gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in plan["rows"]))
    assert {r["stage"] for r in plan["rows"]} == {"pretrain", "sft", "dpo", "merge"}
    assert main(["--runs-dir", str(no_runs), "plan", str(FOLDER), "--gpus", "384"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert f"{plan['total_gpu_hours']:,.0f}" in lines["total"]
    assert "ppo.yaml: not planned: ppo" in out and "merge.yaml" in out and "CPU" in lines["merge.yaml"]


@pytest.mark.parametrize("args, says", [
    ([], "a folder plan needs --gpus G"),
    (["--gpus", "384", "--tokens", "1T"], "--tokens is per recipe"),
    (["--gpus", "384", "--set", "name=x"], "--set changes one recipe"),
])
def test_folder_plan_refuses_what_it_cannot_apply(args, says, capsys):
    assert main(["plan", str(FOLDER), *args]) == 2
    assert says in capsys.readouterr().err


def test_sft_tokens_come_from_the_data_runs_card_or_an_error(tmp_path):
    card = tmp_path / "data-smollm3-post" / "data_card.json"
    card.parent.mkdir()
    card.write_text(json.dumps({"tokens": {"sft": 1_000_000, "prefs": 300_000}}))
    sft = plan_file(FOLDER / "sft.yaml", gpus=8, runs_dir=tmp_path)
    assert sft["tokens"] == 2 * 1_000_000 and str(card) in sft["tokens_source"]
    with pytest.raises(RecipeError, match="data run 'data-mine' has no data_card.json.*pass --tokens"):
        plan_file(FOLDER / "sft.yaml", ["data=data-mine"], gpus=8, runs_dir=tmp_path)
    assert plan_file(FOLDER / "sft.yaml", ["data=data-mine"], tokens="5B", gpus=8, runs_dir=tmp_path)["tokens"] == 5e9


# --------------------------------------------------------------------------- hub data offline

HUB_FIRST = {"data-web.yaml": "HuggingFaceFW/fineweb-edu", "data-mid.yaml": "HuggingFaceTB/smoltalk2",
             "data-post.yaml": "HuggingFaceTB/smoltalk2"}


def _prepare(name: str, runs: Path, sets: list[str]) -> int:
    args = [item for s in sets for item in ("--set", s)]
    return main(["--runs-dir", str(runs), "data", "prepare", str(FOLDER / name), *args])


@pytest.mark.parametrize("name", sorted(HUB_FIRST))
def test_hub_data_recipe_as_shipped_fails_offline_naming_the_hub_tokenizer(name, tmp_path, capsys):
    """As shipped (data-web's Slurm executor aside: it needs a controller), the first thing a recipe
    reads from the hub is SmolLM3's tokenizer; offline that is a clear error and no run folder."""
    assert _prepare(name, tmp_path, ["executor=local"] if name == "data-web.yaml" else []) == 2
    err = capsys.readouterr().err
    assert ("tokenizer.path HuggingFaceTB/SmolLM3-3B: could not load this hub tokenizer "
            "(HF_HUB_OFFLINE is set: a hub tokenizer must already be in the HF cache)") in err
    assert "Traceback" not in err and not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", sorted(HUB_FIRST))
def test_hub_data_recipe_fails_offline_naming_its_first_dataset(name, tmp_path, capsys):
    """The sources' own offline error, with the two checks that come first set aside."""
    sets = ["tokenizer.path=null"] + (["executor=local"] if name == "data-web.yaml" else [])
    assert _prepare(name, tmp_path, sets) == 2
    err = capsys.readouterr().err
    assert f"dataset {HUB_FIRST[name]}: could not load it" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())                                  # no run folder left behind
