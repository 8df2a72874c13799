"""Judge-assisted review on hand-built verdicts and answers: who decides each pair, the accepted verdicts'
pairs beside the people's, the judge measured against the people (kappa, confusion, audit), the balanced
verdict rule, and the settings refused before anything runs. With a real judge and a real Argilla server:
tests/test_real_model_served.py."""
from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from smolforge.annotate.agreement import cohen_kappa
from smolforge.annotate.pull import resolve
from smolforge.annotate.review import (Review, accepted_rows, calibration, check, load, merge, metadata, route, save,
                                       store_path)
from smolforge.errors import RecipeError
from smolforge.generation.judge.prompts import first_probability
from smolforge.generation.judge.verdicts import balanced, summarise


def vote(user: str, value: str) -> dict:
    return {"user_id": user, "status": "submitted", "values": {"preference": value}}


def record(rid: str, *votes: tuple[str, str]) -> dict:
    return {"id": rid, "prompt": f"question {rid}", "responses": [f"good {rid}", f"bad {rid}"],
            "answers": [vote(user, value) for user, value in votes]}


def entry(rid: str, verdict: str | None, route_: str, margin: float | None = 0.5) -> dict:
    return {"verdict": verdict, "margin": margin, "consistent": verdict is not None, "route": route_,
            "prompt": f"question {rid}", "responses": [f"good {rid}", f"bad {rid}"]}


def test_uncertain_pairs_and_a_seeded_audit_sample_go_to_people_the_rest_is_accepted():
    judged = {f"s{i}": {"verdict": "response_1", "margin": 0.6} for i in range(8)}
    judged |= {"none": {"verdict": None, "margin": None}, "low": {"verdict": "response_2", "margin": 0.05},
               "nolp": {"verdict": "response_2", "margin": None}}
    review = Review(judge={"endpoint": "http://127.0.0.1:9/v1"}, send="uncertain", min_margin=0.1, audit=0.25, seed=3)
    routes = route(judged, review)
    assert routes["none"] == routes["low"] == "uncertain"           # no verdict; a verdict below min_margin
    assert Counter(routes.values()) == {"accepted": 7, "audit": 2, "uncertain": 2}   # 25 % of the 9 sure ones
    assert route(judged, review) == routes and route(judged, Review(**{**vars(review), "seed": 4})) != routes
    one = route(judged, Review(**{**vars(review), "audit": 0.01}))
    assert Counter(one.values())["audit"] == 1                      # an audit asked for audits at least one pair
    assert set(route(judged, Review(judge=review.judge, send="all")).values()) == {"all"}
    assert metadata(judged["none"], "uncertain") == {"judge_verdict": "unsure", "review": "uncertain"}
    assert metadata(judged["low"], "uncertain")["judge_margin"] == 0.05


def test_accepted_verdicts_join_the_peoples_pairs_and_the_judge_is_measured_against_the_people():
    people = [record("a", ("ann", "response_1"), ("bob", "response_1")),        # judge right (audit)
              record("b", ("ann", "response_2"), ("bob", "response_2")),        # judge wrong (uncertain)
              record("c", ("ann", "tie"), ("bob", "tie")),                      # judge unsure; people tie
              record("d", ("ann", "response_1"), ("bob", "response_2")),        # people disagree: no label
              record("e", ("ann", "response_1"), ("bob", "response_1"))]        # judge right (uncertain: low margin)
    entries = {"a": entry("a", "response_1", "audit"), "b": entry("b", "response_1", "uncertain"),
               "c": entry("c", None, "uncertain", None), "d": entry("d", "response_2", "uncertain"),
               "e": entry("e", "response_1", "uncertain", 0.01),
               "f": entry("f", "response_2", "accepted"), "g": entry("g", "tie", "accepted"),
               "h": entry("h", "response_1", "accepted")}
    rows, report = resolve(people, min_votes=2)
    merged, full = merge(rows, report, people, entries, min_votes=2)
    assert full["ids"] == ["a", "b", "e", "f", "h"]                  # people's pairs and accepted ones, by id
    assert merged[full["ids"].index("f")] == {"prompt": "question f", "chosen": "bad f", "rejected": "good f"}
    assert merged[full["ids"].index("b")]["chosen"] == "bad b"        # the people's verdict, not the judge's
    review = full["review"]
    assert (review["pairs"], review["sent_to_people"], review["uncertain"], review["audit"]) == (8, 5, 4, 1)
    assert (review["accepted"], review["accepted_rows"], review["accepted_ties"], review["people_rows"]) == (3, 2, 1, 3)
    # the judge against the people's majority, where both have a label: a (right), b (wrong), e (right)
    judged = review["judge_vs_people"]
    # right 2 times of 3, but it said response_1 every time: no better than chance, kappa 0
    assert judged == {"items": 3, "accuracy": 0.667, "kappa": 0.0}
    assert review["confusion"] == {"response_1": {"response_1": 2, "response_2": 1}, "unsure": {"tie": 1}}
    assert review["accuracy_by_verdict"] == {"response_1": 0.667}
    assert review["audit_agreement"] == {"items": 1, "accuracy": 1.0, "kappa": None}   # one label: kappa undefined
    # against each annotator on every pair the judge gave a verdict to, d included (ann agrees, bob does not)
    ann, bob = review["judge_vs_annotators"]["ann"], review["judge_vs_annotators"]["bob"]
    assert (ann["items"], ann["accuracy"], bob["accuracy"]) == (4, 0.5, 0.75)
    assert ann["kappa"] == round(cohen_kappa(["response_1", "response_1", "response_2", "response_1"],
                                             ["response_1", "response_2", "response_1", "response_1"]), 3)
    assert report["agreement"]["metric"] == "cohen_kappa"            # the annotators against each other, beside it


def test_the_judges_readings_are_kept_per_dataset_merged_on_a_second_push_and_survive_a_torn_write(tmp_path):
    path = store_path(tmp_path, "http://127.0.0.1:6900", "argilla", "review-demo")
    assert path != store_path(tmp_path, "http://127.0.0.1:6900", "argilla", "other")
    save(path, {"r1": entry("r1", "response_1", "accepted"), "r2": entry("r2", None, "uncertain")})
    save(path, {"r2": entry("r2", "response_2", "accepted")})
    kept = load(path)
    assert sorted(kept) == ["r1", "r2"] and kept["r2"]["verdict"] == "response_2" and kept["r1"]["id"] == "r1"
    assert not list(tmp_path.glob("*.tmp*")) and load(tmp_path / "missing.jsonl") == {}
    rows, ids, ties = accepted_rows(kept)
    assert ids == ["r1", "r2"] and rows[1] == {"prompt": "question r2", "chosen": "bad r2", "rejected": "good r2"}
    assert ties == 0 and json.loads(path.read_text().splitlines()[0])["id"] == "r1"


def test_the_balanced_rule_separates_pairs_a_judge_that_always_answers_a_cannot():
    # P(first shown wins) in each order: always above one half (it always answers "A"), but higher when the
    # better response is first
    readings = [(0.90, 0.85), (0.88, 0.91), (0.70, 0.70)]
    assert [balanced(first, second)["verdict"] for first, second in readings] == ["A", "B", None]   # no lean: unsure
    assert [balanced(first, second)["margin"] for first, second in readings] == [0.05, 0.03, 0.0]
    rows = [{"verdict": balanced(*r)["verdict"], "consistent": False, "label": "A"} for r in readings]
    figures = summarise(rows)
    assert (figures["position_bias"], figures["verdicts"], figures["label_agreement"]) == (1.0, 2, 0.333)
    # a letter missing from the top log-probs stands at the least likely one listed, not at zero
    assert first_probability({"A": -0.1, "x": -3.0}) == pytest.approx(math.exp(-0.1) / (math.exp(-0.1) + math.exp(-3.0)))


@pytest.mark.parametrize("changes, k, message", [
    ({"judge": {}}, 2, "review.judge: expected {endpoint: URL, model: NAME, api_key_env: VAR} or {run: RUN}"),
    ({"judge": {"endpoint": "http://x/v1", "run": "sft-demo"}}, 2, "give one of endpoint and run"),
    ({"judge": {"endpoint": "http://x/v1", "key": "s"}}, 2, "unknown field(s) key"),
    ({}, 3, "review: the judge compares two responses; k must be 2, got 3"),
    ({"send": "some"}, 2, "review.send must be one of all, uncertain, got 'some'"),
    ({"verdict": "vote"}, 2, "review.verdict must be one of agree, balanced, got 'vote'"),
])
def test_review_settings_are_refused_before_anything_runs(changes, k, message):
    review = Review(**{"judge": {"endpoint": "http://127.0.0.1:9/v1"}, **changes})
    with pytest.raises(RecipeError) as err:
        check(review, k)
    assert message in str(err.value)


def test_an_annotate_recipe_whose_judge_is_down_exits_2_before_sampling(tmp_path, runs, sft_run, data_run, capsys):
    from smolforge.cli import main

    recipe = tmp_path / "annotate.yaml"
    recipe.write_text(json.dumps({"stage": "annotate", "name": "annotate-judged", "runs": [sft_run.name],
                                  "prompts": data_run.name, "limit": 2, "dataset": "judged",
                                  "review": {"judge": {"endpoint": "http://127.0.0.1:9/v1", "model": "j"}}}))
    assert main(["--runs-dir", str(runs.root), "annotate", "push", "--config", str(recipe)]) == 2
    assert "GET http://127.0.0.1:9/v1/models: cannot connect (Connection refused)" in capsys.readouterr().err
    assert not runs.exists("annotate-judged")
