"""The real-model lane: SmolLM2-135M-Instruct, a released checkpoint with its own tokenizer and chat
template (ChatML with a default system turn, no {% generation %} markers), through smolforge's stages.
One import per session (conftest's ``real_model_run``); a few steps each."""
from __future__ import annotations

import json

import pytest
from conftest import needs_vllm, real_model_file, run_stage

from smolforge.errors import RecipeError

pytestmark = pytest.mark.slow

CHATS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Name a primary colour.", "Red is a primary colour."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What is 2 + 2?", "2 + 2 = 4."),
]


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """A user's own chats, smoltalk-style: a system turn on some rows, extra columns beside ``messages``."""
    path = tmp_path_factory.mktemp("real-chats") / "chats.jsonl"
    rows = []
    for i, (question, answer) in enumerate(CHATS):
        messages = ([{"role": "system", "content": "Answer in one sentence."}] if i % 2 else []) + [
            {"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        rows.append({"messages": messages, "source": "hand-written", "id": f"chat-{i}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_changes(parent: str, chats, **more):
    return {"name": "sft-real", "parent": parent, "data": str(chats), "eval_fraction": 0.0,
            "early_stopping_patience": 0, "lora": {"r": 8, "alpha": 16},
            "trainer": {"max_steps": 2, "per_device_train_batch_size": 2, "max_length": 128, "logging_steps": 1,
                        "learning_rate": 1e-4, "save_steps": 1000}, **more}


def test_import_records_the_gguf_source_and_its_quantization(real_model_run):
    recipe = real_model_run.info["recipe"]
    assert real_model_run.status == "done" and recipe["format"] == "gguf"
    assert recipe["quantization"] == "MOSTLY_Q4_1" and recipe["tensor_types"]["Q4_1"] > 100
    assert recipe["model_type"] == "llama" and recipe["dequantized_to"] == "float32"
    assert 130e6 < real_model_run.metrics["import/params"] < 140e6
    source_print = real_model_run.info["data_fingerprints"][f"gguf/{real_model_file().name}"]
    assert source_print == f"sha256:{recipe['gguf_sha256']}"
    assert (real_model_run.model_dir / "model.safetensors").is_file()
    assert "<|im_start|>" in (real_model_run.model_dir / "chat_template.jinja").read_text()


def test_default_sft_recipe_trains_only_on_assistant_tokens(real_model_run, runs, chats):
    """What TRL's SFTTrainer holds as labels: each answer and its <|im_end|>, never the system/user turns."""
    from datasets import Dataset

    from smolforge.alignment import sft
    from smolforge.data.schemas import load_rows
    from smolforge.generation.prompts import load_tokenizer
    from conftest import tiny_recipe

    recipe = tiny_recipe("sft", **sft_changes(real_model_run.name, chats))
    assert recipe.trainer.assistant_only_loss   # the default, unchanged
    tokenizer = load_tokenizer(real_model_run.model_dir)
    rows = sft.prepare_rows(recipe)(load_rows(chats, "chat"), tokenizer)
    trainer = sft.trainer_factory(recipe)(real_model_run.model_dir, Dataset.from_list(rows), tokenizer, [])
    trained = []
    for example in trainer.train_dataset:
        trained.append(tokenizer.decode([t for t in example["labels"] if t != -100]))
        assert tokenizer.decode(example["input_ids"]).startswith("<|im_start|>system\n")
    assert sorted(trained) == sorted(f"{answer}<|im_end|>" for _, answer in CHATS)


def test_lora_sft_runs_on_the_real_model_and_says_how_it_masked(real_model_run, runs, chats):
    run = run_stage("sft", runs, **sft_changes(real_model_run.name, chats))
    assert run.status == "done" and run.metrics["train/steps"] == 2
    assert run.metrics["sft/derived_assistant_masks"] is True
    assert 0.1 < run.metrics["sft/assistant_token_fraction"] < 0.5   # the default system turn is long
    assert (run.path / "adapter").is_dir() and (run.model_dir / "model.safetensors").is_file()


def test_a_template_that_cannot_be_masked_fails_before_any_run(real_model_run, runs, chats):
    """A recipe template that rewrites history (as Qwen3's drops old reasoning) gets the choices, and no run."""
    from smolforge.alignment import sft
    from conftest import tiny_recipe

    rewriting = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content if loop.last else '...' }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    multi_turn = chats.parent / "multi.jsonl"
    multi_turn.write_text(json.dumps({"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye."}]}) + "\n")
    recipe = tiny_recipe("sft", **sft_changes(real_model_run.name, multi_turn, name="sft-unmaskable",
                                              chat_template=rewriting))
    with pytest.raises(RecipeError, match=r"cannot derive the assistant tokens of conversation 1 .*"
                                          r"chat_template:.*trainer.assistant_only_loss: false"):
        sft.validate(recipe, runs)
    assert not (runs.root / "sft-unmaskable").exists()


def tensor(model_dir, name: str):
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        return weights.get_tensor(name)


def test_full_sft_updates_every_weight_of_the_real_model(real_model_run, runs, chats):
    changes = sft_changes(real_model_run.name, chats, name="sft-real-full")
    del changes["lora"]                                  # every weight trained
    # no Trainer checkpoint (weights and AdamW state, 1.6 GB) at the last step: the test reads model/
    changes["trainer"] = {**changes["trainer"], "max_steps": 1, "learning_rate": 1e-5, "warmup_steps": 0,
                          "save_strategy": "no"}
    run = run_stage("sft", runs, **changes)
    assert run.status == "done" and run.metrics["train/steps"] == 1 and not (run.path / "adapter").exists()
    name = "model.layers.0.self_attn.q_proj.weight"
    before, after = tensor(real_model_run.model_dir, name), tensor(run.model_dir, name)
    assert before.shape == after.shape == (576, 576) and 0 < (after - before).abs().max().item() < 1e-3


@pytest.fixture(scope="module")
def ultrafeedback_pairs(chats):
    """Preference pairs as HuggingFaceH4/ultrafeedback_binarized publishes them: a prompt string, chosen and
    rejected as whole conversations repeating the user turn, with messages/scores/prompt_id beside them."""
    path = chats.parent / "ultrafeedback.jsonl"
    rows = []
    for i, (question, answer) in enumerate(CHATS):
        def conversation(reply):
            return [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        rows.append({"prompt": question, "prompt_id": f"{i:064x}", "chosen": conversation(answer),
                     "rejected": conversation("I am not sure, sorry."), "messages": conversation(answer),
                     "score_chosen": 8.0, "score_rejected": 3.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_lora_dpo_on_ultrafeedback_pairs_prefers_the_chosen_answers(real_model_run, runs, ultrafeedback_pairs):
    run = run_stage("dpo", runs, name="dpo-real", parent=real_model_run.name, data=str(ultrafeedback_pairs),
                    lora={"r": 8, "alpha": 16},
                    trainer={"max_steps": 3, "per_device_train_batch_size": 2, "max_length": 128,
                             "learning_rate": 5e-5, "warmup_steps": 0, "logging_steps": 1, "save_steps": 1000})
    assert run.status == "done" and run.metrics["train/steps"] == 3
    logged = [json.loads(line) for line in open(run.path / "metrics.jsonl")]
    margins = [row["rewards/margins"] for row in logged if "rewards/margins" in row]
    assert len(margins) == 3 and margins[0] == 0.0      # step 1 scores the policy before any update
    assert margins[-1] > 0                               # pairs seen again after two updates: chosen ahead
    assert (run.path / "adapter").is_dir() and (run.model_dir / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def gsm8k_prompts(chats):
    """RL prompts in openai/gsm8k's layout: question, and the worked answer ending ``#### N``."""
    path = chats.parent / "gsm8k.jsonl"
    pairs = [(2, 3), (4, 5), (1, 6), (3, 3), (7, 2), (5, 4), (6, 1), (8, 1), (2, 2), (9, 0)]
    path.write_text("".join(json.dumps({
        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"}) + "\n" for a, b in pairs))
    return path


@needs_vllm
def test_grpo_rolls_out_through_vllm_on_gsm8k_prompts(real_model_run, runs, gsm8k_prompts):
    run = run_stage("grpo", runs, name="grpo-real", parent=real_model_run.name, data=str(gsm8k_prompts),
                    rewards=["math_match"], heldout_fraction=0.2, generation="vllm", eval_max_new_tokens=16,
                    chat_prompts=True,
                    # groups of two (one prompt a step): the rollout path, not the statistics, is under test
                    trainer={"max_steps": 2, "per_device_train_batch_size": 2, "num_generations": 2,
                             "max_completion_length": 16, "logging_steps": 1, "save_strategy": "no"})
    metrics = run.metrics
    assert run.status == "done" and metrics["train/steps"] == 2
    assert metrics["rl/generation"] == "vllm-server" and metrics["rl/weight_syncs"] >= 1
    assert metrics["rl/is_correction"] == "sequence_mask"       # TRL's IS correction, on by default
    assert (metrics["rl/train_prompts"], metrics["rl/heldout_prompts"]) == (8, 2)
    assert 0.0 <= metrics["rl/heldout_reward_before"] <= 1.0 and 0.0 <= metrics["rl/heldout_reward_after"] <= 1.0
    logged = [json.loads(line) for line in open(run.path / "metrics.jsonl")]
    lengths = [row["completions/mean_length"] for row in logged if "completions/mean_length" in row]
    assert len(lengths) == 2 and all(0 < n <= 16 for n in lengths)
    # the questions went through the chat template, so the instruct model answers them (as raw text,
    # recipes/smollm2-135m's DPO model gave an empty greedy answer to every held-out question)
    heldout = [json.loads(line) for line in open(run.path / "rl" / "heldout.jsonl")]
    assert len(heldout) == 2 and all(row[side]["completion"].strip() for row in heldout for side in ("before", "after"))
    assert (run.model_dir / "model.safetensors").is_file()
