"""GRPO and RLOO through TRL on the tiny chain: prompts from the data run, verifier rewards, held-out reward."""
from __future__ import annotations

import json
import re

import pytest

from conftest import run_stage, tiny_recipe
from smolforge.errors import DataError, RecipeError
from smolforge.registry import load_stage

TINY_RL = {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8,
           "logging_steps": 1}


def one_reward_too_few(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["grpo", "rloo"])
def test_online_rl_trains_from_the_sft_model_and_reports_heldout_reward(runs, sft_run, data_run, stage):
    # HF rollouts here; GRPO through the vLLM server is checked by the demo pipeline (test_pipeline_e2e)
    run = run_stage(stage, runs, name=f"{stage}-tiny", parent=sft_run.name, data=data_run.name,
                    eval_max_new_tokens=8, trainer=TINY_RL, generation="hf")
    metrics = run.metrics
    assert run.info["parents"] == [sft_run.name, data_run.name]
    assert run.info["data_fingerprints"]["prompts"] == data_run.info["data_fingerprints"]["data/prompts"]
    assert metrics["train/steps"] == 2
    assert metrics["rl/generation"] == "hf" and metrics["rl/weight_syncs"] == 0
    assert metrics["rl/is_correction"] == "none"            # HF samples from the policy itself: nothing to correct
    if stage == "grpo":                                     # TRL 1.16's default loss, recorded
        assert (metrics["rl/loss_type"], metrics["rl/importance_sampling_level"]) == ("dapo", "token")
    assert 0.0 <= metrics["rl/heldout_reward_before"] <= 1.0 and 0.0 <= metrics["rl/heldout_reward_after"] <= 1.0
    assert metrics["rl/heldout_prompts"] + metrics["rl/train_prompts"] == 118     # 6 entities x 3 + 100 sums
    rows = [json.loads(line) for line in (run.path / "rl" / "heldout.jsonl").read_text().splitlines()]
    assert len(rows) == metrics["rl/heldout_prompts"]
    assert {"prompt", "completion", "rewards", "total"} <= set(rows[0]["after"])
    logged = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert any("rewards/answer_match/mean" in m for m in logged)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run.model_dir)


def test_a_reward_function_with_the_wrong_length_is_named(runs, sft_run, data_run):
    with pytest.raises(DataError, match="one_reward_too_few"):
        run_stage("grpo", runs, name="grpo-bad-reward", parent=sft_run.name, data=data_run.name,
                  rewards=["test_online_rl:one_reward_too_few"], eval_max_new_tokens=4, trainer=TINY_RL,
                  generation="hf")


@pytest.mark.parametrize("change, message", [
    ({"heldout_fraction": 0.0}, "heldout_fraction must be between 0 and 1"),
    ({"rewards": ["answer_mach"]}, "did you mean 'answer_match'?"),
    ({"rewards": []}, "name at least one reward function"),
    ({"trainer": {**TINY_RL, "loss_type": "dr_gpro"}}, "unknown GRPO loss 'dr_gpro' (did you mean 'dr_grpo'?)"),
    ({"trainer": {**TINY_RL, "loss_type": "cispo"}}, "epsilon_high is CISPO's cap on the importance weight"),
    ({"trainer": {**TINY_RL, "importance_sampling_level": "seq"}}, "must be token or sequence"),
    ({"parity": {"max_gap": 0}}, "parity.max_gap must be a positive number"),
    ({"parity": {"on_breach": "ignore"}}, "parity.on_breach must be one of stop, warn"),
])
def test_online_rl_recipe_mistakes_are_refused_before_training(runs, sft_run, change, message):
    recipe = tiny_recipe("grpo", parent=sft_run.name, **{"trainer": TINY_RL, **change})
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_stage("grpo").validate(recipe, runs)
