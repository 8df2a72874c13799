"""The judge's own parts on hand-built inputs: both orders → one verdict, the cache a killed judge resumes
from, the rate limiter, the rows it accepts, and the errors it gives before a run exists (an endpoint that
is down, a bad recipe). Judging with a real served model: tests/test_real_model_served.py."""
from __future__ import annotations

import json
import threading

import pytest

from smolforge.cli import main
from smolforge.errors import DataError, RecipeError
from smolforge.generation.judge.cache import JudgeCache, request_key
from smolforge.generation.judge.items import read_rows
from smolforge.generation.judge.limiter import RateLimiter
from smolforge.generation.judge.prompts import Rubric, choice_margin, pairwise_messages, parse_choice, parse_score
from smolforge.generation.judge.verdicts import combine, combined_margin, summarise


def test_a_pair_gets_a_verdict_only_where_both_orders_agree_and_disagreement_is_position_bias():
    readings = [("A", "B"), ("B", "A"), ("T", "T"), ("A", "A"), ("B", "B"), (None, "A")]
    combined = [combine(first, second) for first, second in readings]
    assert [c["verdict"] for c in combined] == ["A", "B", "T", None, None, None]
    rows = [{**c, "label": "A"} for c in combined]
    figures = summarise(rows)
    assert figures["position_bias"] == 0.5 and figures["verdicts"] == 3
    assert figures["label_agreement"] == round(1 / 6, 3)            # unsure pairs count as misses
    assert (figures["first_wins"], figures["second_wins"], figures["ties"]) == (0.167, 0.167, 0.167)
    assert combined_margin(0.8, 0.6, True) == 0.7 and combined_margin(0.8, None, True) is None
    assert combined_margin(0.8, 0.6, False) is None


def test_the_reply_is_read_as_a_letter_and_the_first_tokens_probabilities_as_a_margin():
    assert [parse_choice(r) for r in ("A", " b.", "Response B is better", "tie", "Neither")] == ["A", "B", "B", "T", None]
    assert choice_margin({" A": -0.0, "B": -100.0}) == 1.0
    assert choice_margin({"A": -0.693, "B": -0.693}) == 0.0
    assert choice_margin({"The": -0.1}) is None and choice_margin({}) is None
    rubric = Rubric("helpful", (1, 5), "5 best")
    assert parse_score("Score: 3\nReason: partly", rubric) == (3, "partly")
    assert parse_score("I would give it a 5.", rubric) == (5, "I would give it a 5.")
    assert parse_score("Score: 0", rubric)[0] is None
    first, second = pairwise_messages("q", "x", "y"), pairwise_messages("q", "y", "x", reference="r")
    assert "[Response A]\nx" in first[1]["content"] and "[Response A]\ny" in second[1]["content"]
    assert "[Reference answer]\nr" in second[1]["content"] and "Reference" not in first[1]["content"]


def test_the_cache_survives_a_kill_mid_line_and_keys_each_order_apart(tmp_path):
    path = tmp_path / "judge.jsonl"
    cache = JudgeCache(path)
    first = request_key("judge-1", pairwise_messages("q", "x", "y"), 8)
    swapped = request_key("judge-1", pairwise_messages("q", "y", "x"), 8)
    other_judge = request_key("judge-2", pairwise_messages("q", "x", "y"), 8)
    assert len({first, swapped, other_judge}) == 3
    cache.put(first, {"reply": "A", "top": {"A": -0.1}})
    with open(path, "a") as handle:
        handle.write('{"key": "' + swapped + '", "reply": "B", "to')        # killed while writing
    reread = JudgeCache(path)
    assert len(reread) == 1 and reread.get(first)["reply"] == "A" and reread.get(swapped) is None
    reread.put(swapped, {"reply": "B", "top": {}})
    assert JudgeCache(path).get(swapped)["reply"] == "B"


def test_the_rate_limiter_spaces_requests_from_many_threads():
    now, slots, lock = [0.0], [], threading.Lock()

    def sleep(seconds):
        with lock:
            slots.append(round(now[0] + seconds, 3))

    limiter = RateLimiter(5.0, clock=lambda: now[0], sleep=sleep)
    threads = [threading.Thread(target=limiter.wait) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(slots) == [0.2, 0.4, 0.6, 0.8, 1.0]        # one went at once, the others 1/rate apart


def test_rows_in_the_public_shapes_are_read_and_bad_rows_named(tmp_path):
    path = tmp_path / "pairs.jsonl"
    ultrafeedback = {"prompt": "Say hi", "prompt_id": "p1",
                     "chosen": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}],
                     "rejected": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "No."}],
                     "score_chosen": 8.0, "score_rejected": 2.0}
    plain = {"id": "q2", "prompt": [{"role": "user", "content": "2+2?"}], "response_a": "5", "response_b": "4",
             "label": "B", "reference": "4"}
    path.write_text(json.dumps(ultrafeedback) + "\n" + json.dumps(plain) + "\n")
    rows = read_rows(path, "pairwise")
    assert [(r["id"], r["response_a"], r["response_b"], r["label"]) for r in rows] == [
        ("1", "Hi!", "No.", "A"), ("q2", "5", "4", "B")]      # chosen/rejected as conversations: the last answer
    with pytest.raises(DataError, match=r"pairs.jsonl line 1: mode reference needs a field 'reference'"):
        read_rows(path, "reference")
    path.write_text(json.dumps(plain) + "\n")
    assert read_rows(path, "reference")[0]["reference"] == "4"
    path.write_text(json.dumps({"prompt": "q", "chosen": "a"}) + "\n")
    with pytest.raises(DataError, match=r"line 1: field 'rejected' must be a non-empty string"):
        read_rows(path, "pairwise")


def _recipe(tmp_path, **changes) -> str:
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"prompt": "2+3?", "chosen": "5", "rejected": "7"}) + "\n")
    recipe = {"stage": "judge", "name": "judged", "items": str(items), "judge": {"endpoint": "http://127.0.0.1:9/v1",
                                                                               "model": "m"}, **changes}
    path = tmp_path / "judge.yaml"
    path.write_text(json.dumps(recipe))
    return str(path)


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, "GET http://127.0.0.1:9/v1/models: cannot connect (Connection refused)"),
    ({"judge": {"endpoint": "http://127.0.0.1:9/v1", "run": "x"}}, "judge: give either endpoint"),
    ({"mode": "pointwise"}, "rubric: pointwise judging needs a rubric"),
    ({"mode": "ranking"}, "mode must be one of pairwise, pointwise, reference"),
    ({"rate": -1}, "rate must be >= 0"),
])
def test_a_judge_that_cannot_run_is_refused_before_a_run_exists(tmp_path, runs, capsys, changes, expected):
    code = main(["--runs-dir", str(runs.root), "judge", "--config", _recipe(tmp_path, **changes)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and expected in lines[0], lines
    assert not (runs.root / "judged").exists()


def test_a_rubric_is_checked_field_by_field(tmp_path):
    from smolforge.generation.judge.prompts import load_rubric

    path = tmp_path / "rubric.yaml"
    path.write_text("name: helpful\nscale: [5, 1]\ncriteria: be helpful\n")
    with pytest.raises(RecipeError, match=r"field 'scale' must be \[low, high\]"):
        load_rubric(path)
    path.write_text("name: helpful\nscale: [1, 5]\ncriteria: be helpful\n")
    assert len(load_rubric(path).sha256) == 64


def test_a_judge_reward_whose_endpoint_is_down_fails_when_resolved_naming_the_url(tmp_path, runs):
    from smolforge.alignment.rewards import resolve
    from smolforge.errors import ServiceError

    rubric = tmp_path / "rubric.yaml"
    rubric.write_text("name: correct\nscale: [1, 5]\ncriteria: 5 is right, 1 is wrong.\n")
    with pytest.raises(ServiceError, match=r"GET http://127.0.0.1:9/v1/models: cannot connect"):
        resolve({"judge": {"endpoint": "http://127.0.0.1:9/v1", "model": "m", "rubric": str(rubric)}}, runs)
    with pytest.raises(RecipeError, match=r"unknown judge field\(s\) rubrik"):
        resolve({"judge": {"endpoint": "http://127.0.0.1:9/v1", "rubrik": str(rubric)}}, runs)


def test_the_built_in_sanity_suite_is_twelve_pairs_whose_better_answer_is_known():
    from smolforge.generation.judge.items import BUILTIN_SANITY

    rows = read_rows(BUILTIN_SANITY, "pairwise")
    assert len(rows) == 12 and {r["label"] for r in rows} == {"A"} and len({r["prompt"] for r in rows}) == 12


def test_a_sanity_suite_without_known_answers_is_refused(tmp_path, runs, capsys):
    sanity = tmp_path / "sanity.jsonl"
    sanity.write_text(json.dumps({"id": "s1", "prompt": "2+3?", "response_a": "5", "response_b": "7"}) + "\n")
    code = main(["--runs-dir", str(runs.root), "judge", "--config", _recipe(tmp_path, sanity=str(sanity))])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "every pair needs its known better answer" in lines[0] and "s1" in lines[0]
