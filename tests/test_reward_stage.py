"""The reward stage: a sequence-classification reward model trained from the SFT run on preference pairs."""
from __future__ import annotations

import math

import pytest

from smolforge.errors import DataError, RecipeError, RunError
from smolforge.recipe import build_stage_recipe, deep_merge, load_recipe
from smolforge.registry import load_stage

from conftest import DEMO

# Shrinks recipes/demo/reward.yaml to a seconds-long run on the tiny session chain.
TINY_REWARD = {"trainer": {"max_steps": 8, "per_device_train_batch_size": 8, "max_length": 64,
                           "logging_steps": 2, "learning_rate": 1e-3}}


def reward_recipe(**changes):
    _, data = load_recipe(DEMO / "reward.yaml")
    data = deep_merge(deep_merge(data, TINY_REWARD), changes)
    return build_stage_recipe(load_stage("reward"), data, source="reward (test)")


@pytest.fixture(scope="module")
def reward_run(runs, sft_run, data_run):
    stage = load_stage("reward")
    recipe = reward_recipe(name="reward-test", parent=sft_run.name, data=data_run.name, lora=None)  # all weights
    stage.validate(recipe, runs)
    return stage.run(recipe, runs, overwrite=True)


def test_reward_stage_writes_a_loadable_scorer_and_held_out_accuracy(reward_run, sft_run, data_run):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    assert reward_run.status == "done" and reward_run.stage == "reward"
    assert reward_run.parents == [sft_run.name, data_run.name]
    assert "prefs" in reward_run.info["data_fingerprints"]
    metrics = reward_run.reload().metrics
    assert 0.0 <= metrics["reward/heldout_accuracy"] <= 1.0
    assert math.isfinite(metrics["reward/heldout_margin"])
    assert metrics["reward/heldout_pairs"] >= 1 and metrics["train/pairs"] >= metrics["reward/heldout_pairs"]
    assert metrics["train/steps"] == 8

    config = AutoConfig.from_pretrained(reward_run.model_dir)
    assert config.num_labels == 1 and config.pad_token_id is not None
    assert config.architectures[0].endswith("ForSequenceClassification")
    assert AutoModelForSequenceClassification.from_pretrained(reward_run.model_dir).config.num_labels == 1
    assert (reward_run.model_dir / "model.safetensors").is_file()
    assert (reward_run.model_dir / "chat_template.jinja").is_file()


def test_scorer_on_the_reward_run_gives_one_finite_score_per_completion(reward_run, runs):
    from smolforge.alignment.rewards import RewardModelScorer, resolve

    scorer = RewardModelScorer(reward_run.path)
    prompts = [[{"role": "user", "content": "Add 3 and 4."}]] * 3
    completions = [[{"role": "assistant", "content": t}] for t in ("3 plus 4 is 7.", "3 plus 4 is 9.", "")]
    scores = scorer(prompts, completions, answer=["x"] * 3)
    assert len(scores) == 3 and all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert scorer(["Add 3 and 4. "], ["3 plus 4 is 7."])[0] == pytest.approx(scorer(["Add 3 and 4. "], ["3 plus 4 is 7."])[0])

    named = resolve(f"run:{reward_run.name}", runs)  # how an RL recipe names it
    assert named.__name__ == reward_run.name
    assert named(prompts, completions) == pytest.approx(scores, abs=1e-5)


def test_scores_agree_with_the_recorded_held_out_accuracy(reward_run, runs, data_run):
    from smolforge.alignment.reward import heldout_scores, split_pairs
    from smolforge.alignment.rewards import RewardModelScorer
    from smolforge.data.schemas import load_many, resolve_data

    recipe = reward_recipe()
    rows = load_many(resolve_data(data_run.name, runs, "prefs")[0], "preference")
    _, held = split_pairs(rows, recipe.eval_fraction, recipe.split_seed)
    scorer = RewardModelScorer(reward_run.path)
    again = heldout_scores(scorer.model, scorer.tokenizer, held)
    assert again["accuracy"] == pytest.approx(reward_run.metrics["reward/heldout_accuracy"])
    assert len(held) == reward_run.metrics["reward/heldout_pairs"]


def test_lora_reward_model_is_merged_into_a_plain_model_with_its_adapter_kept(runs, sft_run, data_run):
    from smolforge.alignment.rewards import RewardModelScorer

    stage = load_stage("reward")
    recipe = reward_recipe(name="reward-lora", parent=sft_run.name, data=data_run.name, lora={"r": 2, "alpha": 4},
                           trainer={"max_steps": 4})
    stage.validate(recipe, runs)
    run = stage.run(recipe, runs, overwrite=True)
    assert (run.path / "adapter" / "adapter_config.json").is_file()
    assert not (run.model_dir / "adapter_config.json").exists()  # model/ is merged, loadable without PEFT
    scorer = RewardModelScorer(run.path)
    assert 0.0 <= run.metrics["reward/heldout_accuracy"] <= 1.0
    assert len(scorer(["Add 1 and 2."], ["1 plus 2 is 3."])) == 1


@pytest.mark.parametrize("fraction, message", [(0, r"eval_fraction must be in \(0, 0.5\]"),
                                               (0.6, r"eval_fraction must be <= 0.5, got 0.6"),
                                               (-0.1, r"eval_fraction must be >= 0, got -0.1")])
def test_eval_fraction_outside_its_range_is_a_recipe_error(runs, sft_run, data_run, fraction, message):
    with pytest.raises(RecipeError, match=message):
        recipe = reward_recipe(name="reward-bad", parent=sft_run.name, data=data_run.name, eval_fraction=fraction)
        load_stage("reward").validate(recipe, runs)
    assert not (runs.root / "reward-bad").exists()


def test_a_parent_without_a_model_is_a_run_error(runs, data_run):
    recipe = reward_recipe(name="reward-bad", parent=data_run.name, data=data_run.name)
    with pytest.raises(RunError, match="has no model/"):
        load_stage("reward").validate(recipe, runs)


def test_too_few_pairs_for_both_splits_is_a_data_error(runs, sft_run, tmp_path):
    import json

    pairs = tmp_path / "two.jsonl"
    row = {"prompt": "Add 1 and 1.", "chosen": "2", "rejected": "3"}
    pairs.write_text("\n".join(json.dumps(row) for _ in range(2)) + "\n")
    recipe = reward_recipe(name="reward-bad", parent=sft_run.name, data=str(pairs))
    with pytest.raises(DataError, match="too few to hold out"):
        load_stage("reward").validate(recipe, runs)
