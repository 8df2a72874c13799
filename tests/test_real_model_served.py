"""The real-model lane, served: one ``smolforge serve`` of SmolLM2-135M-Instruct (vLLM, fp32) for the module,
on all interfaces with an API key (every client below sends it, from ``$OPENAI_API_KEY`` or through
``api_key_env``). It answers only with its key; the ``openai`` SDK chats with it (whole and streamed) and
gets HF's greedy answer; the embedded suite and each standard lm-eval task staged from hand-written rows in
its hub layout (tests/standard_task_rows.py) are scored by HF in-process and through the endpoint, document
for document; the judge, judge rewards, synthetic data and judge-assisted review run against it; SIGTERM
ends the command and its server, and the key is never in the log."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from conftest import REPO, needs_vllm

from smolforge.processes import ephemeral_range
from smolforge.recipe import build_stage_recipe
from smolforge.registry import load_stage
from standard_task_rows import STAGED_TASKS

pytestmark = [pytest.mark.slow, needs_vllm]

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
KEY_ENV = "OPENAI_API_KEY"      # what the eval stage's endpoint client reads; the judge's api_key_env names it
SERVED: dict = {}               # the command's ready line, the server's PID and the key, for the checks below


@pytest.fixture(scope="module")
def served(real_model_run, runs, tmp_path_factory):
    """``smolforge serve`` of the imported model on 0.0.0.0 with an API key (``$OPENAI_API_KEY`` for the
    module); its base URL on 127.0.0.1. SIGTERM at the end: the command exits 0, its server is gone, and
    the key appears neither in its output nor in the server's log."""
    key_file = tmp_path_factory.mktemp("serve-key") / "key"
    key_file.write_text("k3y-" + os.urandom(12).hex() + "\n")
    key = key_file.read_text().strip()
    before = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = key
    cli = subprocess.Popen([sys.executable, "-m", "smolforge", "--runs-dir", str(runs.root), "serve",
                            real_model_run.name, "--max-model-len", "1024", "--host", "0.0.0.0",
                            "--api-key-file", str(key_file)], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        line = cli.stdout.readline()                     # blocks until ready (or the CLI ends)
        assert re.match(rf"serving {real_model_run.name} as '{real_model_run.name}' at http://0\.0\.0\.0:\d+/v1 "
                        ".*requests need the API key", line), line + cli.stderr.read()
        port = int(line.split("http://0.0.0.0:")[1].split("/")[0])
        SERVED.update(line=line, key=key, port=port, pid=int(line.split("(pid ")[1].split(",")[0]))
        yield f"http://127.0.0.1:{port}/v1"              # 0.0.0.0 answers on loopback too
    finally:
        cli.send_signal(signal.SIGTERM)
        code = cli.wait(timeout=60)
        if before is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = before
    assert code == 0
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(SERVED["pid"], 0)                        # the server went with the command
    log = (real_model_run.path / "serve" / "vllm.log").read_text()
    assert log and key not in log and key not in SERVED["line"]


def get_json(url: str, key: str | None = None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as reply:
        return reply.status, json.loads(reply.read() or b"null")


def test_the_server_on_all_interfaces_answers_only_with_its_key_and_scores_as_hf_does(real_model_run, runs, served,
                                                                                    monkeypatch):
    """vLLM's own key check on /v1 (health stays open); the eval stage scores the embedded suite through
    the endpoint with the key from $OPENAI_API_KEY, document for document as HF does in-process."""
    from smolforge.errors import ServiceError

    assert SERVED["port"] < ephemeral_range()[0]        # picked below the ephemeral range
    assert get_json(served.removesuffix("/v1") + "/health")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        get_json(served + "/models")
    assert refused.value.code == 401
    assert [m["id"] for m in get_json(served + "/models", SERVED["key"])[1]["data"]] == [real_model_run.name]

    def score_through() -> None:
        stage = load_stage("eval")
        # 16 new tokens per answer (the tasks' own 32 and 64): both sides generate them, and the comparison
        # is token for token either way
        recipe = build_stage_recipe(stage, {"suite": "embedded", "run": real_model_run.name, "limit": 4,
                                            "max_gen_toks": 16, "parity": "endpoint", "endpoint": served},
                                    source="eval (test)")
        stage.validate(recipe, runs)
        stage.run(recipe, runs)

    scores = real_model_run.eval_dir / "embedded.json"
    earlier = scores.stat().st_mtime_ns if scores.exists() else None
    monkeypatch.delenv(KEY_ENV)   # refused before HF scores anything: the endpoint is checked first
    with pytest.raises(ServiceError, match=r"GET .*/v1/models: HTTP 401"):
        score_through()
    assert (scores.stat().st_mtime_ns if scores.exists() else None) == earlier
    monkeypatch.setenv(KEY_ENV, SERVED["key"])
    score_through()
    report = json.loads((real_model_run.eval_dir / "embedded-parity.json").read_text())
    assert (report["first"], report["second"], report["agree"]) == ("hf", "endpoint", True)
    assert set(report["tasks"]) == {"arith", "facts", "instruct", "prefs", "reason"}
    for task in report["tasks"].values():
        assert task["documents"] == 4 and task["documents_differing"] == 0
    margin = report["tasks"]["prefs"]["metrics"]["margin"]
    assert abs(margin["diff"]) < 1e-4 and margin["first"] != 0       # log-likelihoods really compared
    result = json.loads((real_model_run.eval_dir / "embedded.json").read_text())
    assert result["backend"] == "hf" and result["tasks"]["instruct"]["apply_chat_template"] is True
    assert real_model_run.reload().metrics["parity/endpoint/agree"] == 1.0


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


def test_the_openai_sdk_chats_with_the_served_model_as_hf_answers(real_model_run, served):
    from openai import OpenAI

    client = OpenAI(base_url=served, api_key=SERVED["key"], max_retries=0, timeout=60)
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


JUDGED_PAIRS = [("What is 3 + 4?", "3 + 4 = 7.", "3 + 4 = 12."),
                ("Name the largest planet in the solar system.", "Jupiter is the largest planet.", "The Moon."),
                ("Spell the word cat.", "C-A-T.", "D-O-G.")]


def judge(runs, served, real_model_run, tmp_path, name: str, **changes):
    """The judge stage on the served real model, in process: its run."""
    items = tmp_path / "pairs.jsonl"
    items.write_text("".join(json.dumps({"prompt": p, "chosen": good, "rejected": bad}) + "\n"
                             for p, good, bad in JUDGED_PAIRS))
    stage = load_stage("judge")
    recipe = build_stage_recipe(stage, {"name": name, "items": str(items), "sanity": "none", **changes,
                                        "judge": {"endpoint": served, "model": real_model_run.name,
                                                  "api_key_env": KEY_ENV}},
                                source="judge (test)")
    stage.validate(recipe, runs)
    return stage.run(recipe, runs)


def test_the_real_model_judges_pairs_in_both_orders_caches_and_resumes(real_model_run, runs, served, tmp_path):
    from smolforge.generation.judge.items import BUILTIN_SANITY

    sanity_file = tmp_path / "sanity.jsonl"          # two of the built-in suite's twelve pairs
    sanity_file.write_text("".join(BUILTIN_SANITY.read_text().splitlines(keepends=True)[:2]))
    first = judge(runs, served, real_model_run, tmp_path, "judge-real", sanity=str(sanity_file), limit=2)
    metrics = first.metrics
    assert first.status == "done" and metrics["judge/identity"] == f"{served}#{real_model_run.name}"
    assert (metrics["judge/requests"], metrics["judge/cached"]) == (2 * (2 + 2), 0)    # sanity suite, then 2 pairs
    sanity = [json.loads(line) for line in first.sanity_path.read_text().splitlines()]
    assert len(sanity) == 2 and all(len(r["orders"]) == 2 for r in sanity)
    assert 0 <= metrics["judge/sanity_accuracy"] <= 1 and 0 <= metrics["judge/sanity_position_bias"] <= 1
    verdicts = [json.loads(line) for line in first.verdicts_path.read_text().splitlines()]
    assert [v["response_a"] for v in verdicts] == ["3 + 4 = 7.", "Jupiter is the largest planet."]
    for v in verdicts:       # each order's reading kept; a verdict only where both orders agree
        assert v["consistent"] == (v["orders"][0]["choice"] is not None
                                   and v["orders"][0]["choice"] == {"A": "B", "B": "A"}.get(v["orders"][1]["choice"],
                                                                                          v["orders"][1]["choice"]))
        assert all(o["margin"] is None or 0 <= o["margin"] <= 1 for o in v["orders"])
    print(f"\nreal 135M judge: sanity accuracy {metrics['judge/sanity_accuracy']}, "
          f"position bias {metrics['judge/sanity_position_bias']} (sanity suite)")
    # all three pairs (rate-limited: tests/test_judge.py checks the spacing): the two judged above come from
    # the cache, as a killed judge's finished requests do when it is started again
    full = judge(runs, served, real_model_run, tmp_path, "judge-real-all", rate=20.0)
    assert (full.metrics["judge/requests"], full.metrics["judge/cached"]) == (2, 4)
    again = [json.loads(line) for line in full.verdicts_path.read_text().splitlines()]
    assert [v["orders"] for v in again[:2]] == [v["orders"] for v in verdicts]


def test_the_real_model_grades_responses_on_a_rubric_and_keeps_its_reasons(real_model_run, runs, served, tmp_path):
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text("name: correct\nscale: [1, 5]\ncriteria: 5 means the answer is correct and complete; "
                      "1 means it is wrong.\n")
    items = tmp_path / "answers.jsonl"
    items.write_text("".join(json.dumps({"prompt": p, "response": good}) + "\n" for p, good, _ in JUDGED_PAIRS[:1]))
    stage = load_stage("judge")
    recipe = build_stage_recipe(stage, {"name": "judge-points", "items": str(items), "mode": "pointwise",
                                        "rubric": str(rubric), "sanity": "none", "max_tokens": 24,
                                        "judge": {"endpoint": served, "model": real_model_run.name,
                                                  "api_key_env": KEY_ENV}},
                                source="judge (test)")
    stage.validate(recipe, runs)
    run = stage.run(recipe, runs)
    graded = [json.loads(line) for line in run.verdicts_path.read_text().splitlines()]
    assert len(graded) == 1 and all(g["reply"] and g["reason"] for g in graded)
    assert all(g["score"] is None or 1 <= g["score"] <= 5 for g in graded)
    assert run.metrics["judge/scored"] + run.metrics["judge/unreadable"] == 1
    assert len(run.metrics["judge/rubric_sha256"]) == 64


def test_a_judge_reward_grades_completions_through_the_endpoint_and_caches_them(real_model_run, runs, served,
                                                                                tmp_path):
    from smolforge.alignment.rewards import resolve

    rubric = tmp_path / "rubric.yaml"
    rubric.write_text("name: correct\nscale: [1, 5]\ncriteria: 5 means the answer is correct; 1 means it is wrong.\n")
    spec = {"judge": {"endpoint": served, "model": real_model_run.name, "rubric": str(rubric), "max_tokens": 16,
                      "api_key_env": KEY_ENV}}
    reward = resolve(spec, runs)
    prompts = [[{"role": "user", "content": p}] for p, _, _ in JUDGED_PAIRS[:1]] * 2
    completions = [[{"role": "assistant", "content": good}] for _, good, bad in JUDGED_PAIRS[:1]] * 2
    values = reward(prompts, completions)
    assert reward.__name__ == "judge_correct" and len(values) == 2 and values[0] == values[1]
    assert all(v is None or 0.0 <= v <= 1.0 for v in values)
    judge = reward.fn
    assert judge.judge.asked == 1 and judge.unreadable == sum(v is None for v in values)   # one request per distinct chat
    assert resolve(spec, runs)(prompts, completions) == values       # a new reward: every reply from the cache


def test_synthetic_answers_are_graded_and_kept_as_sft_rows_and_pairs_with_their_lineage(real_model_run, runs, served,
                                                                                       tmp_path):
    from smolforge.alignment.common import validated_rows
    from smolforge.data.schemas import resolve_data

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": p}]}) + "\n"
                               for p, _, _ in JUDGED_PAIRS[:2]))
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text("name: correct\nscale: [1, 5]\ncriteria: 5 means the answer is correct; 1 means it is wrong.\n")
    endpoint = {"endpoint": served, "model": real_model_run.name, "api_key_env": KEY_ENV}
    stage = load_stage("synth")
    recipe = build_stage_recipe(stage, {"name": "synth-real", "prompts": str(prompts), "rubric": str(rubric),
                                        "generators": [endpoint], "judge": endpoint, "k": 3, "max_tokens": 12,
                                        "judge_max_tokens": 12, "temperature": 1.0}, source="synth (test)")
    stage.validate(recipe, runs)
    run = stage.run(recipe, runs)
    metrics = run.metrics
    assert (metrics["synth/prompts"], metrics["synth/candidates"]) == (2, 6)
    assert metrics["synth/generators"] == metrics["synth/judge"] == f"{served}#{real_model_run.name}"
    assert set(run.info["data_fingerprints"]) == {str(prompts), str(rubric)}          # the lineage of every row
    kept = [json.loads(line) for line in run.candidates_path.read_text().splitlines()]
    sft = [json.loads(line) for p in sorted(run.data_shard_dir("sft").glob("*.jsonl")) for line in p.open()]
    pairs = validated_rows(sorted(run.data_shard_dir("prefs").glob("*.jsonl")), "preference", keep=False)
    assert len(sft) == metrics["synth/sft_rows"] and len(pairs) == metrics["synth/pairs"] <= len(sft) <= 2
    if sft:                                          # what `smolforge sft --set data=synth-real` reads
        assert resolve_data(run.name, runs, "sft")[0] == sorted(run.data_shard_dir("sft").glob("*.jsonl"))
    for entry in kept:
        graded = [c for c in entry["candidates"] if c["score"] is not None]
        assert len(entry["candidates"]) == 3 and all(c["generator"] == metrics["synth/judge"] for c in entry["candidates"])
        assert all(c["score"] == (c["grade"] - 1) / 4 for c in graded)
        rows = [r for r in sft if r["messages"][0] == entry["prompt"][0]]
        if graded:                                   # the SFT row is the best-graded answer (first of equals)
            assert rows[0]["messages"][-1]["content"] == max(graded, key=lambda c: c["score"])["text"]
        else:
            assert rows == []


SUMS = [(3, 4), (12, 5), (9, 9), (20, 7), (6, 8), (2, 11)]


def test_the_judge_reviews_first_and_people_get_only_the_pairs_it_is_unsure_of(real_model_run, runs, served, tmp_path,
                                                                                argilla_server, monkeypatch):
    """Judge-assisted review with the real 135M judge (balanced verdicts) on a team's Argilla: calibration
    first (every pair to people, the verdict hidden), then review only where it is unsure, at the median
    margin, with an audit sample of the accepted verdicts; scripted annotators answer what people see."""
    from smolforge.annotate import review as review_mod
    from smolforge.annotate import stage as annotate
    from smolforge.annotate.push import open_dataset

    monkeypatch.setenv("ARGILLA_API_KEY", argilla_server.api_key)
    judge = {"endpoint": served, "model": real_model_run.name, "api_key_env": KEY_ENV}
    prompts = tmp_path / "sums.jsonl"           # answers the 135M model gets right only some of the time
    prompts.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with "
                                                                                  "the number."}],
                                           "answer": str(a + b)}) + "\n" for a, b in SUMS))

    def review(name: str, **settings):
        recipe = build_stage_recipe(load_stage("annotate"), {
            "name": name, "runs": [real_model_run.name], "prompts": str(prompts), "dataset": name,
            "generation": "hf", "url": argilla_server.url, "annotators": 2, "scripted": {"annotators": 2},
            "sampling": {"temperature": 1.0, "max_new_tokens": 10, "seed": 0},
            "review": {"judge": judge, "verdict": "balanced", **settings}}, source="annotate (test)")
        annotate.validate(recipe, runs)
        return recipe, annotate.run(recipe, runs, overwrite=True)

    recipe, everything = review("review-all", send="all")
    store = review_mod.load(annotate.review_store(recipe, runs))
    report = json.loads(everything.annotations_path.read_text())
    dataset = open_dataset(argilla_server.url, argilla_server.api_key, "review-all", "argilla")
    hidden = {m.name: m.visible_for_annotators for m in dataset.settings.metadata}
    assert hidden["judge_verdict"] is False and hidden["judge_margin"] is False      # annotators never see it
    pushed = {r.id: r.metadata for r in dataset.records}
    assert len(store) == len(pushed) == len(SUMS) and all(e["route"] == "all" for e in store.values())
    assert all(pushed[rid]["judge_verdict"] == (e["verdict"] or "unsure") for rid, e in store.items())
    calibration = report["review"]
    assert (calibration["pairs"], calibration["sent_to_people"], calibration["accepted"]) == (len(SUMS), len(SUMS), 0)
    assert sum(sum(c.values()) for c in calibration["confusion"].values()) <= len(SUMS)
    assert everything.metrics["annotate/judge_kappa"] == calibration["judge_vs_people"]["kappa"]

    margins = sorted(e["margin"] for e in store.values() if e["margin"] is not None)
    median = margins[len(margins) // 2]
    recipe, unsure_only = review("review-unsure", send="uncertain", min_margin=median, audit=0.3, seed=1)
    routes = {rid: e["route"] for rid, e in review_mod.load(annotate.review_store(recipe, runs)).items()}
    assert set(routes) == set(store)                 # the same pairs: every judge reply came from the cache
    shown = {r.id for r in open_dataset(argilla_server.url, argilla_server.api_key, "review-unsure", "argilla").records}
    assert shown == {rid for rid, where in routes.items() if where in ("uncertain", "audit")}
    assert {rid for rid, where in routes.items() if where == "uncertain"} == {
        rid for rid, e in store.items() if e["verdict"] is None or e["margin"] is None or e["margin"] < median}
    section = json.loads(unsure_only.annotations_path.read_text())["review"]
    assert section["sent_to_people"] == len(shown) < len(SUMS) and section["accepted"] == len(SUMS) - len(shown) >= 1
    sure = section["accepted"] + section["audit"]
    assert section["audit"] == max(1, round(0.3 * sure))         # 30 % of the sure verdicts, checked blind
    assert unsure_only.metrics["annotate/rows"] == section["people_rows"] + section["accepted_rows"]
    print(f"\nreal 135M judge in review (balanced): kappa vs people {calibration['judge_vs_people']}, "
          f"vs annotators {calibration['judge_vs_annotators_mean_kappa']}, annotators "
          f"{report['agreement']['value']}; review where unsure: {section['sent_to_people']} of {len(SUMS)} to people, "
          f"audit {section['audit_agreement']}")
