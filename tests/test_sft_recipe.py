"""SFT as the playbook runs it: a held-out split with early stopping, LR from pretraining, LoRA merged on export."""
from __future__ import annotations

import logging

import pytest
import torch

from conftest import run_stage, tiny_recipe
from smolforge.errors import RecipeError
from smolforge.registry import load_stage


def test_sft_evaluates_a_heldout_split_and_exports_the_best_checkpoint(sft_run):
    metrics = sft_run.metrics
    assert metrics["sft/evaluations"] == 2                  # eval_steps 3 of 6 steps
    assert metrics["sft/heldout_loss"] > 0
    assert metrics["sft/best_step"] in (3, 6)
    recipe = sft_run.info["recipe"]
    assert recipe["eval_fraction"] == 0.2 and recipe["trainer"]["load_best_model_at_end"] is True


def test_learning_rate_left_unset_is_a_fifth_of_pretraining_and_a_stray_one_is_flagged(runs, pretrain_run, caplog):
    from smolforge.alignment.sft import TRL_DEFAULT_LR, resolve_learning_rate

    peak = pretrain_run.info["recipe"]["train"]["learning_rate"]
    recipe = tiny_recipe("sft", trainer={"learning_rate": TRL_DEFAULT_LR})
    resolve_learning_rate(recipe, runs)
    assert recipe.trainer.learning_rate == pytest.approx(0.2 * peak)
    stray = tiny_recipe("sft", trainer={"learning_rate": peak})
    with caplog.at_level(logging.WARNING, logger="smolforge.alignment.sft"):
        resolve_learning_rate(stray, runs)
    assert stray.trainer.learning_rate == peak
    assert "outside 1/10-1/5 of the pretraining peak" in caplog.text


def test_lora_sft_exports_a_merged_model_that_scores_like_the_adapter(runs, sft_run, pretrain_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lora = run_stage("sft", runs, name="sft-lora", lora={"r": 4, "alpha": 8, "dropout": 0.0},
                     trainer={"learning_rate": 5e-3})
    files = {p.name for p in lora.model_dir.iterdir()}
    assert "model.safetensors" in files and "adapter_config.json" not in files
    assert (lora.path / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(lora.model_dir).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(pretrain_run.model_dir),
                                        lora.path / "adapter").eval()
    base = AutoModelForCausalLM.from_pretrained(pretrain_run.model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(lora.model_dir)
    chat = [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "2 plus 3 is 5."}]
    ids = tokenizer.apply_chat_template(chat, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        merged_out = merged(ids, labels=ids)
        adapted_out = adapted(ids, labels=ids)
        base_logits = base(ids).logits
    assert torch.allclose(merged_out.logits, adapted_out.logits, atol=1e-4)
    assert abs(merged_out.loss.item() - adapted_out.loss.item()) < 1e-5
    assert (merged_out.logits - base_logits).abs().max() > 1e-3      # the adapter did train


@pytest.mark.parametrize("change, message", [
    ({"eval_fraction": 1.0}, "eval_fraction must be in [0, 1)"),
    ({"eval_fraction": 0.0}, "early_stopping_patience needs a held-out split"),
    ({"lr_vs_pretrain": 0}, "lr_vs_pretrain must be in (0, 1]"),
    ({"lora": {"r": 0}}, "lora: r must be >= 1"),
    ({"trainer": {"padding_free": True, "packing": False}}, "trainer.padding_free without trainer.packing does not cut"),
    ({"attn_implementation": "flash"}, "attn_implementation is 'flash'; expected one of auto"),
])
def test_sft_recipe_mistakes_are_refused_before_training(runs, change, message):
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_stage("sft").validate(tiny_recipe("sft", **change), runs)
