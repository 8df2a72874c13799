"""Tool use end to end: the demo template's tool format (rendered and parsed back), the world's tool
task in the data stage's schema, the tool loop on a real model that learned to call the calculator,
the `tools` eval suite, and GRPO with `tools:` through TRL's own tool loop."""
from __future__ import annotations

import json

import pytest

from smolforge.data.schemas import validate_row
from smolforge.data.synthetic import World
from smolforge.data.tokenizer import train_tokenizer
from smolforge.errors import DataError, RecipeError

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "482 + 390"}}}
CONVERSATION = [{"role": "user", "content": "What is 482 plus 390?"},
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
                {"role": "tool", "name": "calculator", "content": "872"},
                {"role": "assistant", "content": "The answer is 872."}]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [World.generate(n_entities=4).pretrain_corpus(n_docs=60)[i]["text"] for i in range(60)]
    return train_tokenizer(texts + [json.dumps(CONVERSATION)] * 20, vocab_size=400)


def test_the_demo_template_renders_tools_and_parses_its_own_calls_back(tokenizer):
    from trl.chat_template_utils import supports_tool_calling

    from smolforge.generation.tool_loop import tool_schemas

    text = tokenizer.apply_chat_template(CONVERSATION, tools=tool_schemas(["calculator"]), tokenize=False)
    assert "<tools>\ncalculator(expression)\n</tools>" in text
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "482 + 390"}}\n</tool_call><|im_end|>' in text
    assert "<tool_response>\n872\n</tool_response>" in text
    plain = tokenizer.apply_chat_template(CONVERSATION[:1] + CONVERSATION[-1:], tokenize=False)
    assert plain == ("<|im_start|>user\nWhat is 482 plus 390?<|im_end|>\n<|im_start|>assistant\n"
                     "The answer is 872.<|im_end|>\n")                       # without tools: ChatML as before
    assert supports_tool_calling(tokenizer)
    prefix = tokenizer.apply_chat_template(CONVERSATION[:1], tools=tool_schemas(["calculator"]), tokenize=False,
                                           add_generation_prompt=True)
    turn = text[len(prefix):text.index("<|im_end|>", len(prefix)) + len("<|im_end|>")]
    assert tokenizer.parse_response(turn, prefix=prefix)["tool_calls"] == [CALL]


def test_the_world_tool_task_passes_the_chat_schema_and_bad_calls_are_named():
    rows = World.tool_conversations()
    for i, row in enumerate(rows[:50]):
        validate_row(row, "chat", f"world sft row {i}")
    bad = {"messages": [CONVERSATION[0], {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}]}
    with pytest.raises(DataError, match=r"row 7: field 'messages\[1\].tool_calls\[0\].function.name'"):
        validate_row(bad, "chat", "row 7")
    held_out = {(r["a"], r["b"]) for r in World.tool_problems("heldout")}
    assert not held_out & {(r["a"], r["b"]) for r in World.tool_problems("train")}


@pytest.fixture(scope="module")
def caller(tokenizer):
    """A real tiny model that learned one tool conversation by heart, behind four questions: whatever it is
    asked, it calls the calculator on 482 + 390, reads the tool's answer and states it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from smolforge.generation.tool_loop import tool_schemas

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id))
    questions = ["What is 482 plus 390?", "What is 12 plus 7?", "Add 5 and 6.", "What is 100 plus 1?"]
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": q}] + CONVERSATION[1:],
                                          tools=tool_schemas(["calculator"]), return_dict=True)["input_ids"]
            for q in questions]
    width = max(map(len, rows))
    ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    labels = ids.masked_fill(ids == tokenizer.pad_token_id, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(100):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 0.1
    return model.eval()


def test_the_tool_loop_runs_the_call_and_reads_the_answer_back(tokenizer, caller):
    from smolforge.generation.tool_loop import answer_with_tools

    prompt = [{"role": "user", "content": "What is 100 plus 1?"}]
    [transcript] = answer_with_tools(caller, tokenizer, [prompt], ["calculator"], max_new_tokens=64)
    assert [m["role"] for m in transcript.messages] == ["assistant", "tool", "assistant"]
    assert transcript.messages[0]["tool_calls"] == [CALL] and transcript.messages[1]["content"] == "872"
    assert (transcript.answer, transcript.calls, transcript.valid_calls) == ("The answer is 872.", 1, 1)
    # no tool on offer with that name: the same call is invalid and the model reads why
    [refused] = answer_with_tools(caller, tokenizer, [prompt], [{"name": "lookup", "parameters": {}}],
                                  max_new_tokens=64, max_iterations=1)
    assert refused.valid_calls == 0 and refused.messages[1]["content"].startswith("error: no tool named 'calculator'")


def test_the_tools_suite_scores_validity_and_accuracy(tokenizer, caller, runs, tmp_path):
    from smolforge.evals.tool_use import evaluate_tool_suite, load_tool_suite

    suite = tmp_path / "sums"
    suite.mkdir()
    (suite / "tools.yaml").write_text("tools: [calculator]\nmax_new_tokens: 64\n")
    items = [{"prompt": [{"role": "user", "content": "What is 482 plus 390?"}], "answer": "The answer is 872."},
             {"prompt": [{"role": "user", "content": "What is 100 plus 1?"}], "answer": "The answer is 101."}]
    (suite / "items.jsonl").write_text("".join(json.dumps(row) + "\n" for row in items))
    with runs.start("sft", "tool-caller", recipe={}) as run:
        caller.save_pretrained(run.model_dir)
        tokenizer.save_pretrained(run.model_dir)
        run.finish(metrics={})
    result = evaluate_tool_suite(runs.get("tool-caller"), suite)
    assert (result["items"], result["accuracy"], result["call_validity"], result["called"]) == (2, 0.5, 1.0, 1.0)
    metrics = runs.get("tool-caller").info["metrics"]
    assert metrics["sums/accuracy"] == 0.5 and metrics["sums/accuracy/stderr"] == 0.35355
    samples = [json.loads(line) for line in (run.eval_dir / "sums-samples.jsonl").read_text().splitlines()]
    assert [s["correct"] for s in samples] == [True, False] and samples[1]["final"] == "The answer is 872."
    (suite / "items.jsonl").write_text('{"prompt": "What is 1 plus 1?", "answer": "2"}\n')
    with pytest.raises(RecipeError, match=r"items.jsonl line 1: field 'prompt' must be a list of messages"):
        load_tool_suite(suite)


def test_grpo_with_tools_trains_through_trl_tool_loop_and_reports_tool_use(runs, sft_run, data_run):
    from conftest import run_stage

    run = run_stage("grpo", runs, name="grpo-tools", parent=sft_run.name, data=data_run.name, tools=["calculator"],
                    chat_prompts=True, generation="hf",
                    trainer={"max_steps": 1, "max_tool_calling_iterations": 1})
    metrics = run.info["metrics"]
    assert run.status == "done" and metrics["rl/generation"] == "hf"
    assert 0.0 <= metrics["rl/tools/called_before"] <= 1.0 and 0.0 <= metrics["rl/tools/called_after"] <= 1.0
    logged = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert any("tools/call_frequency" in row for row in logged)          # TRL's tool loop ran and logged
    with pytest.raises(RecipeError, match="unknown tool 'calculater'"):
        run_stage("grpo", runs, name="grpo-tools-bad", parent=sft_run.name, data=data_run.name, tools=["calculater"])


def test_grpo_in_an_environment_pays_for_the_answer_the_tool_gave(tokenizer, caller, runs, tmp_path):
    """environment: sums (TRL's environment_factory): the environment's calculator is the tool, its
    get_reward scores each rollout on whether the row's answer came out of it, logged beside rewards:."""
    from conftest import run_stage

    with runs.start("sft", "env-caller", recipe={}) as parent:
        caller.save_pretrained(parent.model_dir)
        tokenizer.save_pretrained(parent.model_dir)
        parent.finish(metrics={})
    prompts = tmp_path / "sums.jsonl"
    rows = [{"prompt": [{"role": "user", "content": "What is 482 plus 390?"}], "answer": "The answer is 872."}] * 8
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = run_stage("grpo", runs, name="grpo-env", parent="env-caller", data=str(prompts), environment="sums",
                    chat_prompts=True, generation="hf", heldout_fraction=0.25, eval_max_new_tokens=64,
                    trainer={"max_steps": 1, "max_tool_calling_iterations": 1, "max_completion_length": 64,
                             "num_generations": 4, "per_device_train_batch_size": 4, "logging_steps": 1})
    logged = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    env_rewards = [row["rewards/SumsEnvironment/mean"] for row in logged if "rewards/SumsEnvironment/mean" in row]
    assert env_rewards and 0.0 < env_rewards[0] <= 1.0     # rollouts that got 872 out of the calculator
    metrics = run.info["metrics"]
    assert metrics["rl/tools/called_before"] == 1.0          # held out: answered with the calculator on offer
    with pytest.raises(RecipeError, match="unknown environment 'sum' \\(did you mean 'sums'\\?\\)"):
        run_stage("grpo", runs, name="grpo-env-bad", parent="env-caller", data=str(prompts), environment="sum")
