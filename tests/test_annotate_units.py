"""Push/pull without a server: agreement maths, stable record ids, the schema check, the pull rule,
and a pulled run that a DPO recipe accepts as its data."""
from __future__ import annotations

import json
import random

import pytest

from smolforge.annotate.agreement import cohen_kappa, krippendorff_alpha
from smolforge.annotate.pull import decide, from_argilla, resolve, write_preference_run
from smolforge.annotate.records import (build_record, build_settings, check_schema, record_id, response_order, review_schema,
                              schema_of)
from smolforge.errors import DataError, RecipeError

N = None
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability": 4 coders, 12 units, missing values.
RELIABILITY_DATA = [[1, 2, 3, 3, 2, 1, 4, 1, 2, N, N, N],
                    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, N, 3],
                    [N, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, N],
                    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, N]]


def vote(user: str, value, status: str = "submitted", **more) -> dict:
    return {"user_id": user, "status": status, "values": {"preference": value, **more}}


def record(rid: str, *answers, prompt="Name a colour.", responses=("red", "blue"), runs=("sft-a", "dpo-b")) -> dict:
    return {"id": rid, "prompt": prompt, "responses": list(responses), "runs": list(runs), "answers": list(answers)}


# -- agreement ---------------------------------------------------------------------------------

def test_krippendorff_alpha_matches_the_textbook_reliability_data():
    assert round(krippendorff_alpha(RELIABILITY_DATA, "nominal"), 3) == 0.743
    assert round(krippendorff_alpha(RELIABILITY_DATA, "ordinal"), 3) == 0.815
    assert round(krippendorff_alpha(RELIABILITY_DATA, "interval"), 3) == 0.849


def test_krippendorff_alpha_takes_unit_dicts_like_coder_rows():
    as_dict = {u: {c: row[u] for c, row in enumerate(RELIABILITY_DATA)} for u in range(12)}
    assert krippendorff_alpha(as_dict) == pytest.approx(krippendorff_alpha(RELIABILITY_DATA))


def test_krippendorff_alpha_two_coder_binary_example():
    a = [0, 1, 0, 0, 0, 0, 0, 0, 1, 0]
    b = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
    assert round(krippendorff_alpha([a, b]), 3) == 0.095


def test_cohen_kappa_from_a_2x2_table():
    # 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no: p_o = 0.7, p_e = 0.5*0.6 + 0.5*0.4 = 0.5
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa(b, a) == pytest.approx(0.4)


def test_perfect_agreement_is_one_and_a_single_category_is_undefined():
    assert cohen_kappa(["A", "B", "tie"], ["A", "B", "tie"]) == 1.0
    assert krippendorff_alpha([["A", "B", "tie"], ["A", "B", "tie"], ["A", "B", N]]) == 1.0
    assert cohen_kappa(["A", "A"], ["A", "A"]) is None          # chance agreement is already 1: 0/0
    assert krippendorff_alpha([["A", "A"], ["A", "A"]]) is None
    assert cohen_kappa([N, "A"], ["B", N]) is None               # nothing both answered
    assert krippendorff_alpha([["A", N], [N, "B"]]) is None      # no unit with two answers


def test_cohen_kappa_ignores_items_either_annotator_skipped():
    assert cohen_kappa(["A", "B", N, "A"], ["A", "B", "B", N]) == 1.0
    with pytest.raises(ValueError):
        cohen_kappa(["A"], ["A", "B"])


# -- push: ids and schema ------------------------------------------------------------------------

def test_record_ids_are_stable_and_change_with_runs_or_sampling():
    sampling = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 64}
    rid = record_id("Name a colour.", ["sft-a", "dpo-b"], sampling)
    assert rid == record_id("Name a colour.", ["sft-a", "dpo-b"], dict(reversed(sampling.items())))
    assert rid != record_id("Name a colour.", ["sft-a", "dpo-b"], sampling | {"temperature": 1.0})
    assert rid != record_id("Name a colour.", ["sft-a", "dpo-c"], sampling)
    assert rid != record_id("Name a colour!", ["sft-a", "dpo-b"], sampling)
    chat = [{"role": "user", "content": "Name a colour."}]
    assert record_id(chat, ["sft-a", "dpo-b"], sampling) != rid
    first = build_record("Name a colour.", ["red", "blue"], ["sft-a", "dpo-b"], sampling)
    again = build_record("Name a colour.", ["red", "blue"], ["sft-a", "dpo-b"], sampling)
    assert first == again and first["id"] == rid
    assert first["metadata"]["temperature"] == 0.7


def test_response_slots_follow_the_record_id_not_the_run_order():
    firsts = {response_order(record_id(f"prompt {i}", ["a", "b"], {}), 2)[0] for i in range(20)}
    assert firsts == {0, 1}  # both runs appear in slot 1 somewhere: no fixed position bias
    item = build_record("p", ["from a", "from b"], ["a", "b"], {})
    slot_of_a = next(j for j in (1, 2) if item["metadata"][f"run_{j}"] == "a")
    assert item["fields"][f"response_{slot_of_a}"] == "from a"


def test_schema_for_two_responses_is_ab_tie_and_for_more_a_ranking():
    two = review_schema(2, rating=True, min_submitted=2, sampling={"temperature": 0.7, "seed": 0, "do_sample": True})
    assert two["questions"]["preference"]["options"] == ["response_1", "response_2", "tie"]
    assert two["questions"]["rating"] == {"type": "rating", "options": [1, 2, 3, 4, 5], "required": False}
    assert two["metadata"] == {"run_1": {"type": "terms"}, "run_2": {"type": "terms"}, "do_sample": {"type": "terms"},
                               "seed": {"type": "integer"}, "temperature": {"type": "float"}}
    assert two["distribution"] == {"strategy": "overlap", "min_submitted": 2}
    four = review_schema(4, conversational=True)
    assert four["questions"]["preference"] == {"type": "ranking", "options": [f"response_{i}" for i in range(1, 5)],
                                               "required": True}
    assert four["fields"]["prompt"] == {"type": "chat"}
    with pytest.raises(RecipeError, match="at least 2 responses"):
        review_schema(1)


def test_schema_mismatch_on_re_push_names_the_question_and_both_label_lists():
    existing = review_schema(2)
    existing["questions"]["preference"]["options"] = ["A", "B", "tie"]
    with pytest.raises(RecipeError) as err:
        check_schema(existing, review_schema(2))
    assert str(err.value).startswith("schema mismatch on re-push: question 'preference' has labels "
                                     "['A', 'B', 'tie'] but the push needs ['response_1', 'response_2', 'tie']")


def test_schema_mismatch_names_a_changed_field_type_or_metadata_type():
    with pytest.raises(RecipeError, match="field 'prompt' has type 'text' but the push needs 'chat'"):
        check_schema(review_schema(2), review_schema(2, conversational=True))
    with pytest.raises(RecipeError, match="property 'temperature' has type 'integer' but the push needs 'float'"):
        check_schema(review_schema(2, sampling={"temperature": 1}), review_schema(2, sampling={"temperature": 0.7}))
    with pytest.raises(RecipeError, match="field 'response_3' exists in the dataset"):
        check_schema(review_schema(3), review_schema(2))


def test_compatible_re_push_returns_only_updatable_differences():
    base = review_schema(2, rating=True)
    assert check_schema(base, review_schema(2, rating=True)) == []
    assert check_schema(base, review_schema(2, rating=True, guidelines="new", min_submitted=2)) == \
        ["guidelines", "distribution"]
    # an optional question the new push no longer asks is fine; answers to it stay in the dataset
    assert check_schema(base, review_schema(2, rating=False)) == []


@pytest.fixture
def offline_client(monkeypatch):
    """An SDK client that never connects: enough to build Settings and Records."""
    import argilla as rg
    from argilla._api._client import APIClient

    monkeypatch.setattr(APIClient, "_validate_connection", lambda self: None)
    client = rg.Argilla(api_url="http://127.0.0.1:9", api_key="not-a-key")
    yield client
    rg.Argilla._default_client = None


@pytest.mark.parametrize("k,conversational", [(2, False), (3, True)])
def test_sdk_settings_round_trip_to_the_same_schema(offline_client, k, conversational):
    schema = review_schema(k, conversational=conversational, rating=True, min_submitted=2,
                           sampling={"temperature": 0.7, "max_new_tokens": 64, "model": "x"})
    settings = build_settings(schema)
    settings.validate()
    assert schema_of(settings) == schema
    assert check_schema(schema_of(settings), schema) == []
    assert all(not m.visible_for_annotators for m in settings.metadata)  # run ids stay hidden from annotators


def test_from_argilla_reads_sdk_records_with_responses(offline_client):
    import argilla as rg

    users = ["00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"]
    item = build_record([{"role": "user", "content": "Name a colour."}], ["red", "blue", "green"],
                        ["r1", "r2", "r3"], {"temperature": 0.7})
    ranking = [{"value": f"response_{i}", "rank": rank} for i, rank in ((2, 1), (1, 2), (3, 3))]
    responses = [rg.Response("preference", ranking, user_id=u, status="submitted") for u in users]
    responses.append(rg.Response("rating", 4, user_id=users[0], status="submitted"))
    rec = rg.Record(id=item["id"], fields=item["fields"], metadata=item["metadata"], responses=responses)
    plain = from_argilla(rec)
    assert plain["id"] == item["id"] and plain["prompt"] == item["fields"]["prompt"]
    assert plain["runs"] == [item["metadata"][f"run_{i}"] for i in (1, 2, 3)]
    assert [a["user_id"] for a in plain["answers"]] == users
    assert plain["answers"][0] == {"user_id": users[0], "status": "submitted",
                                   "values": {"preference": ranking, "rating": 4}}
    rows, report = resolve([plain])
    assert rows == [{"prompt": item["fields"]["prompt"],
                     "chosen": [{"role": "assistant", "content": item["fields"]["response_2"]}],
                     "rejected": [{"role": "assistant", "content": item["fields"]["response_3"]}]}]
    assert report["agreement"]["metric"] == "krippendorff_alpha_ordinal" and report["agreement"]["value"] == 1.0


# -- pull: the resolution rule -------------------------------------------------------------------

def test_two_annotators_who_agree_give_one_pair():
    rows, report = resolve([record("r1", vote("ann", "response_2"), vote("bob", "response_2"))])
    assert rows == [{"prompt": "Name a colour.", "chosen": "blue", "rejected": "red"}]
    assert report["counts"]["used"] == 1 and report["ids"] == ["r1"]
    assert report["wins"] == {"dpo-b": {"won": 1}, "sft-a": {"lost": 1}}


def test_disagreement_tie_discard_and_pending_are_excluded_and_counted():
    records = [
        record("a-agree", vote("ann", "response_1"), vote("bob", "response_1")),
        record("b-disagree", vote("ann", "response_1"), vote("bob", "response_2")),
        record("c-tie", vote("ann", "tie"), vote("bob", "tie")),
        record("d-tie-vs-pick", vote("ann", "tie"), vote("bob", "response_1")),
        record("e-discarded", vote("ann", None, status="discarded")),
        record("f-draft-only", vote("ann", "response_1", status="draft")),
        record("g-untouched"),
        record("h-identical", vote("ann", "response_1"), responses=("same", "same")),
        record("i-majority", vote("ann", "response_2"), vote("bob", "response_2"), vote("cy", "tie")),
    ]
    rows, report = resolve(records)
    assert report["counts"] == {"used": 2, "tied": 1, "disagreed": 2, "discarded": 1, "pending": 2, "unusable": 1}
    assert report["ids"] == ["a-agree", "i-majority"]
    assert [r["chosen"] for r in rows] == ["red", "blue"]
    assert sum(report["counts"].values()) == report["records"] == len(records)


def test_min_votes_keeps_records_pending_until_enough_annotators_submitted():
    one = record("r1", vote("ann", "response_1"), vote("bob", "response_1", status="draft"))
    assert decide(one, min_votes=2) == ("pending", None, None)
    assert decide(one, min_votes=1) == ("used", 0, 1)


def test_rankings_use_mean_rank_best_against_worst():
    three = dict(responses=("ok", "best", "worst"), runs=("a", "b", "c"))
    agree = record("r1", vote("ann", ["response_2", "response_1", "response_3"]),
                   vote("bob", [{"value": "response_2", "rank": 1}, {"value": "response_1", "rank": 2},
                                {"value": "response_3", "rank": 3}]), **three)
    opposite = record("r2", vote("ann", ["response_1", "response_2", "response_3"]),
                      vote("bob", ["response_3", "response_2", "response_1"]), **three)
    all_equal = record("r3", vote("ann", [{"value": f"response_{i}", "rank": 1} for i in (1, 2, 3)]), **three)
    rows, report = resolve([agree, opposite, all_equal])
    assert rows == [{"prompt": "Name a colour.", "chosen": "best", "rejected": "worst"}]
    assert report["counts"]["used"] == 1 and report["counts"]["disagreed"] == 1 and report["counts"]["tied"] == 1


def test_conversational_prompts_give_conversational_pairs():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    rows, _ = resolve([record("r1", vote("ann", "response_1"), prompt=chat)])
    assert rows == [{"prompt": chat, "chosen": [{"role": "assistant", "content": "red"}],
                     "rejected": [{"role": "assistant", "content": "blue"}]}]


def test_bad_answers_and_duplicate_ids_name_the_record():
    with pytest.raises(DataError, match="record 'r1': answer 'response_3' is not one of"):
        resolve([record("r1", vote("ann", "response_3"))])
    with pytest.raises(DataError, match="record id 'r1' appears 2 times"):
        resolve([record("r1"), record("r1")])


def test_two_annotators_report_cohen_kappa_and_more_report_alpha():
    labels_ann = ["response_1", "response_1", "response_2", "tie", "response_2", "response_1"]
    labels_bob = ["response_1", "response_2", "response_2", "tie", "response_1", "response_1"]
    recs = [record(f"r{i}", vote("ann", a, rating=4), vote("bob", b, rating=4 if a == b else 2))
            for i, (a, b) in enumerate(zip(labels_ann, labels_bob))]
    _, report = resolve(recs)
    assert report["agreement"]["metric"] == "cohen_kappa" and report["agreement"]["annotators"] == 2
    assert report["agreement"]["value"] == pytest.approx(cohen_kappa(labels_ann, labels_bob))
    assert report["agreement"]["items"] == 6
    assert "rating_alpha" in report["agreement"]
    recs[0]["answers"].append(vote("cy", "response_1"))
    _, report = resolve(recs)
    assert report["agreement"]["metric"] == "krippendorff_alpha_nominal" and report["agreement"]["annotators"] == 3


def test_pulling_twice_gives_identical_rows_whatever_the_export_order():
    rng = random.Random(0)
    labels = ["response_1", "response_2", "tie"]
    recs = [record(f"r{i:03d}", *(vote(u, rng.choice(labels)) for u in ("ann", "bob", "cy")),
                   responses=(f"answer {i} a", f"answer {i} b")) for i in range(60)]
    first = resolve(recs)
    shuffled = recs[:]
    rng.shuffle(shuffled)
    second = resolve(shuffled)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first[1]["ids"] == sorted(first[1]["ids"]) and first[0]


# -- the run a dpo stage reads -------------------------------------------------------------------

def test_no_pairs_writes_no_run(runs):
    rows, report = resolve([record("r1", vote("ann", "tie"))])
    with pytest.raises(DataError, match="no preference pairs to write .*tied 1"):
        write_preference_run(runs, "annotate-empty", rows, report)
    assert not (runs.root / "annotate-empty").exists()


def test_dpo_recipe_validates_against_a_pulled_run(runs, sft_run):
    from conftest import tiny_recipe
    from smolforge.data.schemas import load_many, resolve_data
    from smolforge.registry import load_stage

    recs = [record(f"r{i}", vote("ann", "response_1"), vote("bob", "response_1"),
                   responses=(f"good answer {i}", f"bad answer {i}")) for i in range(4)]
    recs.append(record("chat", vote("ann", "response_2"), prompt=[{"role": "user", "content": "hi"}]))
    plain_rows, report = resolve(recs[:4])
    run = write_preference_run(runs, "annotate-unit", plain_rows, report, parents=[sft_run.name], overwrite=True)
    assert run.stage == "annotate" and run.status == "done" and run.parents == [sft_run.name]
    assert run.metrics["annotate/used"] == 4 and run.metrics["annotate/agreement"] is None  # one label only
    assert set(run.info["data_fingerprints"]) == {"data/prefs"}
    assert json.loads((run.path / "annotations.json").read_text())["ids"] == ["r0", "r1", "r2", "r3"]
    load_stage("dpo").validate(tiny_recipe("dpo", parent=sft_run.name, data=run.name), runs)
    paths, data_run = resolve_data(run.name, runs, "prefs")  # what dpo reads: exactly the pulled rows
    assert data_run.name == run.name and load_many(paths, "preference") == plain_rows

    chat_rows, chat_report = resolve(recs[4:])
    chat_run = write_preference_run(runs, "annotate-chat", chat_rows, chat_report, overwrite=True)
    load_stage("dpo").validate(tiny_recipe("dpo", parent=sft_run.name, data=chat_run.name), runs)
    again = write_preference_run(runs, "annotate-unit-2", *resolve(list(reversed(recs[:4]))))
    files = lambda r: [p.read_bytes() for p in sorted((r.path / "data" / "prefs").glob("*.jsonl"))]
    assert files(again) == files(run) and again.info["data_fingerprints"] == run.info["data_fingerprints"]
