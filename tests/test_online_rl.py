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


def even_token_share(prompts, completions, completion_ids, **kwargs):
    """A second reward that differs between sampled answers (the tiny model's all run to the length limit,
    so a length penalty would give every one the same)."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["grpo", "rloo"])
def test_online_rl_trains_from_the_sft_model_and_reports_heldout_reward(runs, sft_run, data_run, stage, monkeypatch):
    """HF rollouts here (the vLLM server's are tests/test_vllm_rollouts.py's and test_real_model.py's). GRPO
    trains on two weighted rewards, each normalised within its group first (GDPO's normalize_then_sum):
    the advantages TRL computed for the last batch are the formula's (alignment/grpo_math.py) on the
    rewards it logged."""
    import torch
    from trl import GRPOTrainer

    from smolforge.alignment.grpo_math import advantages

    trainers = []
    build = GRPOTrainer.__init__
    monkeypatch.setattr(GRPOTrainer, "__init__", lambda self, *a, **k: (trainers.append(self), build(self, *a, **k))[1])
    rewards = ["answer_match"] if stage == "rloo" else \
        [{"reward": "answer_match", "weight": 1.0}, {"reward": "test_online_rl:even_token_share", "weight": 0.5}]
    trainer = {**TINY_RL, **({"multi_objective_aggregation": "normalize_then_sum"} if stage == "grpo" else {})}
    run = run_stage(stage, runs, name=f"{stage}-tiny", parent=sft_run.name, data=data_run.name, rewards=rewards,
                    eval_max_new_tokens=8, trainer=trainer, generation="hf")
    metrics = run.metrics
    if stage == "grpo":
        [grpo] = trainers
        logged = torch.tensor([list(grpo._logs["rewards"][name]) for name in ("answer_match", "even_token_share")]).T
        assert not logged.isnan().any() and logged[:, 1].std() > 0        # the second reward really varied
        expected = advantages(logged, torch.tensor([1.0, 0.5]), TINY_RL["num_generations"],
                              aggregation="normalize_then_sum")
        assert torch.allclose(torch.tensor(list(grpo._logs["advantages"])), expected, atol=1e-4)
        assert metrics["rl/reward_weights"] == [1.0, 0.5]
        assert metrics["rl/multi_objective_aggregation"] == "normalize_then_sum"
        for name in ("answer_match", "even_token_share"):                 # each reward's mean and spread
            assert {f"rl/reward/{name}/mean_last", f"rl/reward/{name}/std_last", f"rl/heldout/{name}_before",
                    f"rl/heldout/{name}_after"} <= set(metrics)
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
    ({"tools": ["calculater"]}, "unknown tool 'calculater' (did you mean 'calculator'?)"),
    ({"rewards": [{"reward": "answer_match", "weight": 2}], "trainer": {**TINY_RL, "reward_weights": [1.0]}},
     "rewards: weights [2.0] beside the rewards and trainer.reward_weights [1.0] disagree"),
    ({"rewards": [{"length_penalty": {"max_tokens": 8, "buffer": 9}}]}, "0 < buffer <= max_tokens"),
    ({"rewards": [{"reward": "answer_match", "weight": "high"}]}, "weight must be a number"),
    ({"parity": {"on_breach": "ignore"}}, "parity.on_breach must be one of stop, warn"),
])
def test_online_rl_recipe_mistakes_are_refused_before_training(runs, sft_run, change, message):
    recipe = tiny_recipe("grpo", parent=sft_run.name, **{"trainer": TINY_RL, **change})
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_stage("grpo").validate(recipe, runs)


def test_trls_own_gap_figures_meet_the_same_parity_limit():
    """Where TRL drives vLLM itself (a GPU), it logs the engine-vs-trainer gap as sampling/…: the stage's
    callback holds those logs to the recipe's parity.max_gap as it does its own measurements."""
    from types import SimpleNamespace

    from smolforge.alignment.logprob_parity import ParitySpec, ParityWatch, parity_callback
    from smolforge.errors import RunError

    watch = ParityWatch(ParitySpec(max_gap=0.05), "grpo")
    callback = parity_callback(watch)
    callback.on_log(None, SimpleNamespace(global_step=3), None,
                    logs={"loss": 0.1, "sampling/sampling_logp_difference/mean": 0.012,
                          "sampling/sampling_logp_difference/max": 0.31, "sampling/importance_sampling_ratio/max": 1.4})
    callback.on_log(None, SimpleNamespace(global_step=4), None, logs={"loss": 0.1})      # a step without vLLM figures
    assert watch.summary() == {"parity/logprob_gap_mean_last": 0.012, "parity/logprob_gap_mean_worst": 0.012,
                               "parity/logprob_gap_p99_worst": 0.31, "parity/steps_measured": 1,
                               "parity/steps_over_max_gap": 0}
    with pytest.raises(RunError, match=r"grpo step 5: the inference engine and the trainer disagree .* by 0\.0900"):
        callback.on_log(None, SimpleNamespace(global_step=5), None,
                        logs={"sampling/sampling_logp_difference/mean": 0.09})
