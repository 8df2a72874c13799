"""Each real stage on a tiny model: DeepSpeed pretraining, TRL SFT and DPO, lm-eval scoring."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import run_stage
from smolforge.errors import RecipeError

RUN_KEYS = {"name", "stage", "status", "parents", "recipe", "data_fingerprints", "versions", "git_commit",
            "started_at", "ended_at", "metrics", "error"}


def read_metrics(run):
    return [json.loads(line) for line in run.metrics_path.read_text().splitlines()]


def assert_model_folder(run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = {p.name for p in run.model_dir.iterdir()}
    assert "model.safetensors" in files and not any(f.endswith(".bin") for f in files)
    model = AutoModelForCausalLM.from_pretrained(run.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    assert model.config.model_type == "smollm3"
    assert "{% generation %}" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
    return model, tokenizer


def test_data_run_holds_datasets_tokenizer_and_fingerprints(data_run):
    info = json.loads((data_run.path / "run.json").read_text())
    assert set(info) == RUN_KEYS and info["status"] == "done"
    for kind in ("pretrain", "sft", "prefs", "prompts"):
        assert info["data_fingerprints"][f"data/{kind}"].startswith("sha256:")
        shards = sorted((data_run.path / "data" / kind).glob("part-*.jsonl"))
        rows = sum(len(p.read_text().splitlines()) for p in shards)
        assert shards and info["metrics"][f"data/{kind}_rows"] == rows > 0
    assert (data_run.path / "tokenizer" / "tokenizer.json").is_file()


def test_pretrain_on_deepspeed_lowers_loss_and_writes_the_run_contract(pretrain_run, data_run):
    info = pretrain_run.info
    assert set(info) == RUN_KEYS and info["status"] == "done" and info["error"] is None
    assert info["parents"] == [data_run.name]
    assert info["recipe"]["train"]["zero_stage"] == 2
    assert info["data_fingerprints"] == data_run.info["data_fingerprints"]
    assert "deepspeed" in info["versions"] and "torch" in info["versions"]
    logged = read_metrics(pretrain_run)
    assert [m["step"] for m in logged] == [2, 4, 6, 8, 10, 12]
    assert logged[-1]["loss"] < logged[0]["loss"] - 0.5
    assert all(m["tokens_per_s"] > 0 and m["grad_norm"] is not None for m in logged)
    assert info["metrics"]["train/tokens"] == 12 * 4 * 64
    model, _ = assert_model_folder(pretrain_run)
    assert model.config.no_rope_layers == [1, 0]  # NoPE is exercised even with 2 layers
    assert model.config.num_key_value_heads == 1
    checkpoints = sorted(p.name for p in pretrain_run.checkpoints_dir.iterdir())
    assert checkpoints == ["step-12", "step-6"]  # atomic: no .tmp folders left behind


def test_pretrained_model_generates_until_eos(pretrain_run):
    model, tokenizer = assert_model_folder(pretrain_run)
    ids = tokenizer("The favourite color of", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]


def test_sft_trains_on_assistant_tokens_and_saves_a_plain_model(sft_run, pretrain_run, data_run):
    assert sft_run.info["status"] == "done"
    assert sft_run.info["parents"] == [pretrain_run.name, data_run.name]
    assert sft_run.info["data_fingerprints"]["sft"] == data_run.info["data_fingerprints"]["data/sft"]
    logged = [m for m in read_metrics(sft_run) if "loss" in m]
    assert len(logged) == 6 and logged[-1]["loss"] < logged[0]["loss"]
    assert sft_run.info["recipe"]["trainer"]["assistant_only_loss"] is True
    assert sft_run.metrics["train/tokens"] > 0
    model, _ = assert_model_folder(sft_run)
    before, _ = assert_model_folder(pretrain_run)
    changed = any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), before.state_dict().values()))
    assert changed


def test_dpo_raises_reward_margin_of_chosen_answers(dpo_run, sft_run):
    assert dpo_run.info["status"] == "done" and dpo_run.info["parents"][0] == sft_run.name
    logged = [m for m in read_metrics(dpo_run) if "rewards/margins" in m]
    assert len(logged) == 6
    assert logged[-1]["rewards/margins"] > logged[0]["rewards/margins"]
    assert "train/margins" in dpo_run.metrics
    assert_model_folder(dpo_run)


def test_eval_writes_scores_baselines_and_samples_into_the_run(runs, sft_run):
    run_stage("eval", runs, run=sft_run.name)
    run = runs.get(sft_run.name)
    result = json.loads((run.eval_dir / "embedded.json").read_text())
    assert set(result["tasks"]) == {"facts", "arith", "instruct", "prefs", "reason",        # chat tasks in both modes
                                    "instruct@no_think", "prefs@no_think", "reason@no_think"}
    metrics = run.metrics
    for key, baseline in {"facts/acc": 0.125, "arith/acc": 0.25, "instruct/exact_match": 0.0, "prefs/acc": 0.5}.items():
        assert 0.0 <= metrics[key] <= 1.0
        assert metrics[f"{key}/random"] == baseline
    assert "prefs/margin" in metrics
    samples = (run.eval_dir / "embedded-samples.jsonl").read_text().splitlines()
    assert len(samples) == 8 * 8  # limit 8 per task and mode
    chat_prompt = next(json.loads(s) for s in samples if json.loads(s)["task"] == "instruct")["arguments"][0][0]
    assert chat_prompt.startswith("<|im_start|>user\n") and chat_prompt.endswith("<|im_start|>assistant\n")


def test_eval_unknown_task_suggests_the_close_match(runs, sft_run):
    from smolforge.evals import stage

    recipe = stage.Recipe(run=sft_run.name, tasks=["fatcs"])
    with pytest.raises(RecipeError, match="did you mean 'facts'"):
        stage.validate(recipe, runs)
