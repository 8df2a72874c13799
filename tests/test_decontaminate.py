"""Decontamination against the registered eval suites: planted copies are caught and named."""
from __future__ import annotations

import json

import pytest

from smolforge.data.decontaminate import EvalIndex, decontaminate, item_text
from smolforge.data.synthetic import World

SUITE = "evals/suites/embedded"


@pytest.fixture(scope="module")
def index():
    return EvalIndex.from_suites([SUITE])


def test_the_demo_training_data_holds_no_eval_item(index):
    world = World.generate()
    docs = [d["text"] for d in world.pretrain_corpus()]
    docs += [" ".join(m["content"] for m in c["messages"]) for c in world.sft_conversations()]
    assert decontaminate(docs, index).hits == []


def test_a_planted_eval_item_is_caught_and_its_suite_named(index):
    world = World.generate()
    docs = [d["text"] for d in world.pretrain_corpus(n_docs=200)]
    rows = [json.loads(line) for line in open(f"{SUITE}/instruct.jsonl")]
    planted = {17: rows[3], 120: rows[40]}
    for position, row in planted.items():  # an eval item pasted inside a normal document
        docs[position] = f"{docs[position]} {row['question']} {row['answer']} {docs[position + 1]}"
    report = decontaminate(docs, index)
    assert [h["document"] for h in report.hits] == [17, 120]
    assert {(h["suite"], h["file"]) for h in report.hits} == {("embedded", "instruct.jsonl")}
    assert [h["row"] for h in report.hits] == [4, 41]  # 1-based JSONL rows
    assert report.by_suite() == {"embedded": 2}
    assert len(report.keep) == 198


def test_a_multiple_choice_item_counts_with_its_gold_answer_only(index):
    row = json.loads(open(f"{SUITE}/facts.jsonl").readline())
    gold = row["choices"][row["gold"]]
    wrong = row["choices"][(row["gold"] + 1) % len(row["choices"])]
    assert item_text(row).endswith(gold)
    assert index.match(f"Note: {row['context']}{gold}. More text.") is not None
    assert index.match(f"Note: {row['context']}{wrong}. More text.") is None


def test_long_items_are_caught_by_any_shared_13_gram(tmp_path):
    suite = tmp_path / "essays"
    suite.mkdir()
    essay = " ".join(f"word{i}" for i in range(40))
    (suite / "essays.jsonl").write_text(json.dumps({"text": essay}) + "\n")
    index = EvalIndex.from_suites([suite])
    excerpt = " ".join(essay.split()[10:23])  # exactly 13 words from the middle
    assert decontaminate([f"intro {excerpt} outro", " ".join(essay.split()[10:22])], index).keep == [1]


def test_items_shorter_than_min_words_are_not_indexed(tmp_path):
    suite = tmp_path / "tiny"
    suite.mkdir()
    (suite / "tiny.jsonl").write_text(json.dumps({"q": "what is red"}) + "\n")
    assert decontaminate(["the car is red and what is red anyway"], EvalIndex.from_suites([suite])).hits == []
