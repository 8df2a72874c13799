"""The real-model lane, served: one ``smolforge serve`` of SmolLM2-135M-Instruct (vLLM, fp32) for the module.
The ``openai`` SDK chats with it (whole and streamed) and gets HF's greedy answer; each standard lm-eval
task staged from hand-written rows in its hub layout (tests/standard_task_rows.py) is scored by HF
in-process and through the endpoint, document for document."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from conftest import REPO, needs_vllm

from smolforge.recipe import build_stage_recipe
from smolforge.registry import load_stage
from standard_task_rows import STAGED_TASKS

pytestmark = [pytest.mark.slow, needs_vllm]

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def served(real_model_run, runs):
    """``smolforge serve`` of the imported model on 127.0.0.1; its base URL, stopped by SIGTERM at the end."""
    cli = subprocess.Popen([sys.executable, "-m", "smolforge", "--runs-dir", str(runs.root), "serve",
                            real_model_run.name, "--max-model-len", "1024"], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        line = cli.stdout.readline()                     # blocks until ready (or the CLI ends)
        assert line.startswith(f"serving {real_model_run.name} "), line + cli.stderr.read()
        yield line.split(" at ")[1].split(" ")[0]
    finally:
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 0


def hf_greedy_reply(model_dir, messages, max_new_tokens: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    from smolforge.generation.prompts import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, top_k=None, top_p=None,
                             temperature=None, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_the_openai_sdk_chats_with_the_served_model_as_hf_answers(real_model_run, served, monkeypatch):
    from openai import OpenAI

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = OpenAI(base_url=served, api_key="unused-on-loopback", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list()] == [real_model_run.name]
    reply = client.chat.completions.create(model=real_model_run.name, messages=QUESTION, max_tokens=12,
                                           temperature=0)
    answer = reply.choices[0].message.content
    assert "Paris" in answer and reply.usage.completion_tokens <= 12
    stream = client.chat.completions.create(model=real_model_run.name, messages=QUESTION, max_tokens=12,
                                            temperature=0, stream=True)
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len(pieces) > 2 and "".join(pieces) == answer
    assert answer == hf_greedy_reply(real_model_run.model_dir, QUESTION, 12)   # the chat template applied alike


@pytest.mark.parametrize("task", STAGED_TASKS)
def test_each_staged_standard_task_scores_alike_in_process_and_served(task, staged, real_model_run, runs, served):
    stage = load_stage("eval")
    recipe = build_stage_recipe(stage, {"run": real_model_run.name, "suite": task, "parity": "endpoint",
                                        "endpoint": served, "batch_size": 8, "max_gen_toks": 32},
                                source="eval (test)")
    stage.validate(recipe, runs)
    stage.run(recipe, runs)
    report = json.loads((real_model_run.eval_dir / f"{task}-parity.json").read_text())
    assert (report["first"], report["second"]) == ("hf", "endpoint")
    found = report["tasks"][task]
    assert found["documents"] >= 3 and found["documents_differing"] == 0, found
    assert report["agree"] is True and found["max_loglik_diff"] < 1e-3
    scores = json.loads((real_model_run.eval_dir / f"{task}.json").read_text())["tasks"][task]["scores"]
    assert all(0.0 <= v <= 1.0 for k, v in scores.items() if not k.endswith("_stderr"))
    if task != "gsm8k":                                  # log-likelihoods really compared, not only counts
        samples = [json.loads(line) for line in open(real_model_run.eval_dir / f"{task}-samples.jsonl")]
        assert all(loglik < 0 for s in samples for loglik, _ in s["resps"])
