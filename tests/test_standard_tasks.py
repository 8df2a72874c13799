"""Standard lm-eval tasks (gsm8k, ARC, hellaswag, MMLU) staged from files in their hub layout and scored.

Every task is staged once for the module (each found by indexing its own lm-eval folder), from the
hand-written rows of standard_task_rows.py. The tiny model's scores are arbitrary: its tests check the
shape of what the eval stage writes. What the scores mean is checked with an oracle model that answers
from the rows' own fields (ARC's answerKey, hellaswag's label, MMLU's answer, gsm8k's ``#### N``), wrong on
purpose for the last document: a field read wrongly by a staged task shows up as a wrong score.
"""
from __future__ import annotations

import json

import pytest

from smolforge.errors import DataError, RecipeError
from smolforge.recipe import build_stage_recipe
from smolforge.registry import load_stage
from standard_task_rows import GSM8K_ROWS, MMLU_TASK, ROWS, STAGED_TASKS, write_rows

MULTIPLE_CHOICE = {"arc_easy": {"acc", "acc_norm"}, "arc_challenge": {"acc", "acc_norm"},
                   "hellaswag": {"acc", "acc_norm"}, MMLU_TASK: {"acc"}}
GSM8K_SCORES = {"exact_match,strict-match", "exact_match,flexible-extract"}   # lm-eval's two filters


def choices(row: dict) -> int:
    found = row.get("choices", row.get("endings"))
    return len(found["text"] if isinstance(found, dict) else found)


def eval_recipe(**changes):
    return build_stage_recipe(load_stage("eval"), changes, source="eval (test)")


@pytest.mark.parametrize("task", STAGED_TASKS)
def test_a_staged_standard_task_scores_the_tiny_model(task, staged, runs, sft_run):
    stage = load_stage("eval")
    recipe = eval_recipe(run=sft_run.name, suite=task, batch_size=8, max_gen_toks=16)   # the tiny model: 128 tokens
    stage.validate(recipe, runs)
    stage.run(recipe, runs)
    rows = ROWS[task]
    result = json.loads((sft_run.eval_dir / f"{task}.json").read_text())["tasks"][task]
    samples = [json.loads(line) for line in open(sft_run.eval_dir / f"{task}-samples.jsonl")]
    names = GSM8K_SCORES if task == "gsm8k" else MULTIPLE_CHOICE[task]
    assert set(result["scores"]) == names | {f"{n}_stderr" for n in names}
    assert all(0.0 <= result["scores"][n] <= 1.0 for n in names)
    assert result["documents"] == len(rows) and result["num_fewshot"] == 0
    assert f"{task}/{result['primary']}" in sft_run.reload().metrics
    if task == "gsm8k":
        assert result["primary"] == "exact_match,strict-match" and result["random_baseline"] == 0.0
        assert sorted((s["filter"], s["doc_id"]) for s in samples) == \
            [(f, i) for f in ("flexible-extract", "strict-match") for i in range(len(rows))]
        assert all(s["target"] == rows[s["doc_id"]]["answer"] for s in samples)
        assert all(len(s["resps"]) == 1 and isinstance(s["resps"][0], str) for s in samples)
    else:
        assert result["primary"] == "acc"
        assert result["random_baseline"] == pytest.approx(sum(1 / choices(r) for r in rows) / len(rows), abs=1e-4)
        assert sorted(s["doc_id"] for s in samples) == list(range(len(rows)))
        assert all(len(s["resps"]) == len(s["arguments"]) == choices(rows[s["doc_id"]]) for s in samples)


def gold(task: str, doc: dict) -> int:
    """The right choice, read from the hub fields (not from lm-eval's templates)."""
    if task.startswith("arc_"):
        return doc["choices"]["label"].index(doc["answerKey"])
    if task == "hellaswag":
        return int(doc["label"])
    return doc["answer"]


def oracle(task: str):
    """An lm-eval model that answers every document right but the last one (per the native rows)."""
    from lm_eval.api.model import LM

    last = ROWS[task][-1]["question" if "question" in ROWS[task][-1] else "ctx_a"]

    def wrong(doc: dict) -> bool:
        return doc.get("question", doc.get("ctx_a")) == last

    class Oracle(LM):
        def loglikelihood(self, requests, disable_tqdm=False):
            out = []
            for request in requests:
                best = gold(task, request.doc)
                if wrong(request.doc):
                    best = (best + 1) % choices(request.doc)
                out.append((0.0 if request.idx == best else -7.0, request.idx == best))
            return out

        def generate_until(self, requests, disable_tqdm=False):
            # gsm8k: the worked answer with '#### N'; the number in a sentence; a wrong '#### N'
            number = [r["answer"].rsplit("#### ", 1)[1] for r in GSM8K_ROWS]
            replies = {GSM8K_ROWS[0]["question"]: GSM8K_ROWS[0]["answer"],
                       GSM8K_ROWS[1]["question"]: "They sold 1,545 apples in all. The answer is 1,545.",
                       GSM8K_ROWS[2]["question"]: f"#### {int(number[2]) + 1}"}
            return [replies[r.doc["question"]] for r in requests]

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

    return Oracle()


@pytest.mark.parametrize("task", STAGED_TASKS)
def test_a_staged_task_scores_what_the_native_fields_say(task, staged, sft_run, monkeypatch):
    from smolforge.evals import backends
    from smolforge.evals.stage import evaluate
    from smolforge.evals.suite import load_suite

    monkeypatch.setattr(backends, "make_lm", lambda *args, **kwargs: oracle(task))
    scores, samples = evaluate(sft_run.model_dir, load_suite(task), [task])
    n = len(ROWS[task])
    if task == "gsm8k":
        # strict-match needs '#### N'; flexible-extract takes the last number, commas and a final '.' ignored
        assert scores[task]["exact_match,strict-match"] == pytest.approx(1 / 3)
        assert scores[task]["exact_match,flexible-extract"] == pytest.approx(2 / 3)
        strict = {s["doc_id"]: s for s in samples if s["filter"] == "strict-match"}
        assert strict[0]["resps"] == [GSM8K_ROWS[0]["answer"].rsplit("#### ", 1)[1]] == ["18"]
        assert strict[0]["target"].endswith("#### 18") and strict[1]["resps"] == ["[invalid]"]
    else:
        for metric in MULTIPLE_CHOICE[task]:
            assert scores[task][metric] == pytest.approx((n - 1) / n), metric


def test_what_a_staged_task_cannot_do_is_refused_before_scoring(staged, runs, sft_run):
    text = (staged["gsm8k"] / "gsm8k.yaml").read_text()
    assert "lm_eval_num_fewshot: 5" in text and "fewshot_split: null" in text and "num_fewshot: 0" in text
    stage = load_stage("eval")
    with pytest.raises(RecipeError, match="num_fewshot=5: task 'gsm8k' was staged with its evaluation documents only"):
        stage.validate(eval_recipe(run=sft_run.name, suite="gsm8k", num_fewshot=5, max_gen_toks=16), runs)
    with pytest.raises(RecipeError, match=r"task 'gsm8k' generates up to 256 new tokens \(lm-eval's default\) but the "
                                          r"model's context is 128 tokens: set max_gen_toks below 128"):
        stage.validate(eval_recipe(run=sft_run.name, suite="gsm8k"), runs)


@pytest.mark.parametrize("task, row, problem", [
    ("gsm8k", {"question": "2+2?", "answer": "4"}, r"line 2: field 'answer' has no '#### N' final answer"),
    ("arc_easy", {**ROWS["arc_easy"][0], "answerKey": "E"}, r"line 2: field 'answerKey' is 'E', not one of the labels"),
    ("hellaswag", {k: v for k, v in ROWS["hellaswag"][0].items() if k != "ctx_b"},
     r"line 2: field 'ctx_b' is missing \(Rowan/hellaswag rows have"),
    (MMLU_TASK, {**ROWS[MMLU_TASK][0], "answer": "C"}, r"line 2: field 'answer' is 'C': expected an index"),
])
def test_a_row_not_in_the_hub_layout_is_named_before_staging(task, row, problem, staged, tmp_path):
    from smolforge.evals.standard_tasks import stage_task

    bad = tmp_path / f"{task}.jsonl"
    bad.write_text(json.dumps(ROWS[task][0]) + "\n" + json.dumps(row) + "\n")
    before = (staged[task] / f"{task}.yaml").read_text()
    with pytest.raises(DataError, match=f"{bad} {problem}"):
        stage_task(task, bad)
    assert (staged[task] / f"{task}.yaml").read_text() == before   # the staged task is untouched


def test_ifeval_is_refused_when_it_cannot_score_offline(staged, tmp_path, monkeypatch):
    from smolforge.evals.standard_tasks import stage_task

    nltk = pytest.importorskip("nltk")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "no-nltk-data")])
    source = write_rows(tmp_path / "rows", ["ifeval"])["ifeval"]
    with pytest.raises(RecipeError, match=r"lm-eval's task 'ifeval' cannot be scored on this machine: it needs .*"
                                          r"NLTK's 'punkt_tab' tokenizer data \(lm-eval downloads it"):
        stage_task("ifeval", source)
    assert not (staged["gsm8k"].parent / "ifeval").exists()
