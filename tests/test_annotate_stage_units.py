"""The annotate stage without a server: prompts, response slots, the scripted judge, recipe checks, CLI."""
from __future__ import annotations

import json
import random

import pytest

from smolforge.annotate.generate import generate_responses, response_runs, slots_per_run
from smolforge.annotate.prompts import load_prompts
from smolforge.annotate.scripted import noisy, verdict, verifier
from smolforge.annotate.stage import Recipe, Sampling, Scripted, check_recipe, schema_for, validate
from smolforge.cli import main
from smolforge.errors import DataError, RecipeError


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_prompts_from_a_file_drop_duplicates_keep_answers_and_honour_limit(tmp_path):
    source = write(tmp_path / "p.jsonl", [{"prompt": "a?", "answer": "A"}, {"prompt": "b?"}, {"prompt": "a?"},
                                          {"prompt": [{"role": "user", "content": "c?"}]}])
    rows, run = load_prompts(source, runs=None)
    assert rows == [{"prompt": "a?", "answer": "A"}, {"prompt": "b?"},
                    {"prompt": [{"role": "user", "content": "c?"}]}] and run is None
    assert load_prompts(source, runs=None, limit=1)[0] == [{"prompt": "a?", "answer": "A"}]


def test_prompts_from_a_suite_and_from_a_data_run(runs, data_run):
    rows, _ = load_prompts("suite:redteam/jailbreak", runs=None)
    assert len(rows) > 30 and all(r["prompt"][-1]["role"] == "user" for r in rows)
    assert any(len(r["prompt"]) == 3 for r in rows)                     # multi-turn attacks keep their turns
    instruct, _ = load_prompts("suite:embedded/instruct", runs=None)
    assert all(r["prompt"][0]["role"] == "user" and r["answer"] for r in instruct)
    rows, run = load_prompts(data_run.name, runs)
    assert run.name == data_run.name and rows and all("answer" in r for r in rows)


@pytest.mark.parametrize("source,message", [
    ("missing.jsonl", "missing.jsonl: file not found"),
    ("suite:nope", "prompts: unknown suite 'nope'"),
    ("suite:embedded/nope", "prompts: suite 'embedded' has no task 'nope' (tasks: arith, facts, instruct, prefs, reason)"),
])
def test_bad_prompt_sources_say_what_is_wrong(source, message):
    with pytest.raises((DataError, RecipeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        load_prompts(source, runs=None)


def test_a_bad_prompt_row_names_file_line_and_field(tmp_path):
    source = write(tmp_path / "p.jsonl", [{"prompt": "ok"}, {"question": "no prompt"}])
    with pytest.raises(DataError, match=r"p.jsonl line 2: field 'prompt' is missing"):
        load_prompts(source, runs=None)


def test_two_runs_alternate_over_the_response_slots():
    assert slots_per_run(["a", "b"], 4) == [("a", 2), ("b", 2)]
    assert response_runs(["a", "b"], 4) == ["a", "b", "a", "b"]
    assert response_runs(["a"], 3) == ["a", "a", "a"]


def test_seeded_sampling_gives_the_same_responses_twice(runs, sft_run):
    model = {sft_run.name: sft_run.model_dir}
    prompts = ["The", [{"role": "user", "content": "Name a colour."}]]
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8, "seed": 5}
    first = generate_responses(model, prompts, 3, sampling)
    assert [len(r) for r in first] == [3, 3]
    assert generate_responses(model, prompts, 3, sampling) == first
    assert generate_responses(model, prompts, 3, sampling | {"seed": 6}) != first


def test_the_scripted_judge_prefers_the_reference_and_its_noise_is_seeded():
    assert verdict(["Omberton.", "Drummo."], "Nelzu lives in Drummo.") == "response_2"
    assert verdict(["Drummo.", "Drummo!"], "Drummo") == "tie"
    rng = random.Random(0)
    assert all(noisy("tie", 2, rng) in ("response_1", "response_2") for _ in range(20))
    shuffled = noisy([{"value": "response_1", "rank": 1}], 3, rng)
    assert sorted(item["rank"] for item in shuffled) == [1, 2, 3]
    record = {"id": "r", "responses": ["7", "8"]}
    decide = verifier({"r": "7"}, noise=0.5, seed=1)
    votes = [decide(f"user-{i}", record)[0] for i in range(200)]
    assert votes == [verifier({"r": "7"}, noise=0.5, seed=1)(f"user-{i}", record)[0] for i in range(200)]
    assert 0.3 < votes.count("response_1") / 200 < 0.7               # about half flipped away
    assert verifier({"r": "7"})("u", {"id": "r", "responses": [" ", ""]}) == ("tie", "discarded")


@pytest.mark.parametrize("change,message", [
    ({"runs": ["a", "b", "c"]}, "runs: one run, or two different runs"),
    ({"runs": ["a", "a"]}, "runs: one run, or two different runs"),
    ({"k": 1}, "k must be at least 2"),
    ({"sampling": Sampling(temperature=0.0)}, "temperature 0 (greedy) with one run gives k identical responses"),
    ({"generation": "tgi"}, "generation must be one of auto, hf, vllm"),
    ({"annotators": 0}, "annotators and min_votes must be at least 1"),
    ({"wait": -1}, "wait must be >= 0"),
    ({"scripted": Scripted(noise=1.5)}, "scripted: annotators >= 1 and 0 <= noise <= 1"),
    ({"url": "localhost:6900"}, "url must start with http://"),
])
def test_recipe_errors_come_before_any_work(change, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_recipe(Recipe(**change))


def test_a_team_server_needs_the_api_key_in_the_environment(monkeypatch):
    monkeypatch.delenv("ARGILLA_API_KEY", raising=False)
    with pytest.raises(RecipeError, match=r"url: https://argilla.example needs \$ARGILLA_API_KEY"):
        check_recipe(Recipe(url="https://argilla.example"))


def test_schema_follows_the_recipe(tmp_path):
    guide = tmp_path / "guide.md"
    guide.write_text("Prefer the correct answer.\n")
    schema = schema_for(Recipe(k=3, rating=True, annotators=3, guidelines=str(guide)), conversational=True)
    assert schema["questions"]["preference"]["type"] == "ranking"
    assert schema["fields"]["prompt"] == {"type": "chat"} and "rating" in schema["questions"]
    assert schema["distribution"]["min_submitted"] == 3 and schema["guidelines"] == "Prefer the correct answer."
    assert set(schema["metadata"]) == {"run_1", "run_2", "run_3", "temperature", "top_p", "max_new_tokens", "seed"}


def test_validate_names_a_run_without_a_model_and_mixed_prompts(runs, data_run, sft_run, tmp_path):
    with pytest.raises(RecipeError, match=f"runs: '{data_run.name}' has no model/"):
        validate(Recipe(runs=[data_run.name], prompts=data_run.name), runs)
    mixed = write(tmp_path / "mixed.jsonl", [{"prompt": "a"}, {"prompt": [{"role": "user", "content": "b"}]}])
    with pytest.raises(RecipeError, match="mixes plain-text and chat prompts"):
        validate(Recipe(runs=[sft_run.name], prompts=mixed), runs)


def test_cli_lists_the_annotate_verbs_and_reports_a_missing_server_install(capsys, monkeypatch, tmp_path, runs,
                                                                          sft_run, data_run):
    assert main(["annotate", "--help"]) == 0
    assert "{serve,push,status,pull,users,backup,restore}" in capsys.readouterr().out
    monkeypatch.setenv("SMOLFORGE_ARGILLA_VENV", str(tmp_path / "no-venv"))
    rc = main(["--runs-dir", str(runs.root), "annotate", "push", "--set", f"runs=[{sft_run.name}]",
               "--set", f"prompts={data_run.name}"])
    err = capsys.readouterr().err
    assert rc == 2 and "argilla-server is not installed" in err and "make setup" in err
