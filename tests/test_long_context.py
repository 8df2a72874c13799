"""Long-context scoring: perplexity by position bucket (checked against the model's own loss), YaRN
at load for HF and vLLM, the long-context suite through the eval stage, and dual-mode chat scoring."""
from __future__ import annotations

import json
import math

import pytest
import torch

from smolforge.errors import RecipeError
from smolforge.evals.long_context import load_model, position_perplexity, rope_overrides
from smolforge.evals.suite import SUITES_DIR
from smolforge.recipe import build_stage_recipe
from smolforge.registry import load_stage


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny SmolLM3 (trained 128-token context) and a tokenizer, saved as a model folder."""
    from smolforge.data.synthetic import World, ledger_text
    from smolforge.data.tokenizer import train_tokenizer
    from smolforge.pretrain.model import ModelShape, build_model

    import random

    texts = [ledger_text(200, random.Random(i)) for i in range(20)]
    texts += [d["text"] for d in World.generate(n_entities=4).pretrain_corpus(n_docs=50)]
    tokenizer = train_tokenizer(texts, vocab_size=300)
    model = build_model(ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                                   max_position_embeddings=128), vocab_size=len(tokenizer))
    folder = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer, texts


def test_position_perplexity_is_the_models_own_loss_per_bucket(saved_model):
    folder, tokenizer, texts = saved_model
    model = load_model(folder)
    ids = tokenizer(texts[0], add_special_tokens=False)["input_ids"][:96]
    with torch.no_grad():
        whole = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()   # HF's mean next-token loss
    assert position_perplexity(model, tokenizer, [texts[0]], [0, 96]) == {"ppl@0-96": pytest.approx(math.exp(whole), rel=1e-4)}
    split = position_perplexity(model, tokenizer, [texts[0]], [0, 40, 96])
    # positions 1..39 and 40..95 predicted: the token-weighted mean of the two buckets' log-ppl is the whole's
    combined = (39 * math.log(split["ppl@0-40"]) + 56 * math.log(split["ppl@40-96"])) / 95
    assert combined == pytest.approx(whole, rel=1e-4) and split["ppl@0-40"] != split["ppl@40-96"]


def test_yarn_stretches_the_context_for_hf_and_vllm(saved_model):
    from smolforge.evals.backends import hf_overrides_args

    folder, tokenizer, texts = saved_model
    overrides = rope_overrides(folder, {"rope_type": "yarn", "factor": 4})
    assert overrides["max_position_embeddings"] == 512
    assert overrides["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 128}
    plain, stretched = load_model(folder), load_model(folder, {"rope_type": "yarn", "factor": 4})
    assert stretched.config.rope_parameters["rope_type"] == "yarn"
    ids = torch.tensor([tokenizer(texts[1], add_special_tokens=False)["input_ids"][:300]])
    with torch.no_grad():
        assert not torch.allclose(plain(ids).logits, stretched(ids).logits, atol=1e-3)   # YaRN really applied
    assert hf_overrides_args(folder, {"rope_type": "yarn", "factor": 4}) == ["--hf-overrides", json.dumps(overrides)]
    assert hf_overrides_args(folder, {}) == []
    for bad, message in [({"factor": 1}, "factor must be a number > 1"), ({"factor": 2, "rope_type": "ntk"}, "rope_type")]:
        with pytest.raises(RecipeError, match=message):
            rope_overrides(folder, bad)


def eval_recipe(**changes):
    return build_stage_recipe(load_stage("eval"), changes, source="eval (test)")


def test_the_long_context_suite_scores_a_run_past_its_length_with_yarn(runs, pretrain_run):
    stage = load_stage("eval")
    recipe = eval_recipe(run=pretrain_run.name, suite="longctx", limit=3, batch_size=4,
                         rope_scaling={"rope_type": "yarn", "factor": 4})
    stage.validate(recipe, runs)
    stage.run(recipe, runs)
    result = json.loads((pretrain_run.eval_dir / "longctx.json").read_text())
    assert result["settings"]["rope_scaling"] == {"rope_type": "yarn", "factor": 4}
    assert result["tasks"]["position_ppl"]["kind"] == "position_perplexity"
    metrics = pretrain_run.reload().metrics
    buckets = [k for k in metrics if k.startswith("position_ppl/ppl@")]
    assert sorted(buckets) == ["position_ppl/ppl@0-128", "position_ppl/ppl@128-256", "position_ppl/ppl@256-512",
                               "position_ppl/ppl@512-1024"]
    assert all(metrics[k] > 1 for k in buckets) and "position_ppl/ppl@512-1024/random" not in metrics
    assert metrics["passkey_1024/acc/random"] == 0.25 and 0 <= metrics["passkey_1024/acc"] <= 1
    with pytest.raises(RecipeError, match="factor must be a number > 1"):
        stage.validate(eval_recipe(run=pretrain_run.name, suite="longctx", rope_scaling={"factor": 0.5}), runs)


def test_chat_tasks_are_scored_in_both_modes(runs, sft_run):
    stage = load_stage("eval")
    recipe = eval_recipe(run=sft_run.name, suite="embedded", tasks=["instruct", "reason"], limit=3, batch_size=8,
                         modes=["think", "no_think"])
    stage.validate(recipe, runs)
    stage.run(recipe, runs)
    metrics = sft_run.reload().metrics
    for key in ("instruct/exact_match", "instruct@no_think/exact_match", "reason/exact_match",
                "reason@no_think/exact_match"):
        assert 0 <= metrics[key] <= 1, key
    samples = [json.loads(line) for line in (sft_run.eval_dir / "embedded-samples.jsonl").open()]
    prompts = {s["task"]: s["arguments"][0][0] for s in samples if s["doc_id"] == 0}
    assert set(prompts) == {"instruct", "instruct@no_think", "reason", "reason@no_think"}
    assert prompts["reason@no_think"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n")   # the flag's empty think block
    first = json.loads((SUITES_DIR / "embedded" / "reason.jsonl").read_text().splitlines()[0])["question"]
    assert prompts["reason"] == f"<|im_start|>user\n{first}<|im_end|>\n<|im_start|>assistant\n"   # think: plain ChatML
    assert prompts["reason@no_think"].startswith("<|im_start|>system\nReasoning Mode: /no_think<|im_end|>\n")
    result = json.loads((sft_run.eval_dir / "embedded.json").read_text())
    assert result["tasks"]["reason@no_think"]["mode"] == "no_think" and result["tasks"]["reason"]["mode"] == "think"
    with pytest.raises(RecipeError, match="modes"):
        stage.validate(eval_recipe(run=sft_run.name, suite="embedded", modes=["think", "fast"]), runs)
