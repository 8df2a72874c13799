"""`smolforge data prepare`: sources → filters → dedup → decontamination → shards, packed rows, data card."""
from __future__ import annotations

import csv
import json
import re

from dataclasses import asdict

import numpy as np
import pytest

from conftest import DEMO, REPO, run_stage, tiny_recipe
from smolforge.data.filters import FilterSpec
from smolforge.cli import main
from smolforge.errors import RecipeError
from smolforge.registry import load_stage
from smolforge.runs import Runs

SUITE = REPO / "evals" / "suites" / "embedded"
CLEAN = ["The river town sold its grain at the autumn market, and traders came from the hills with wool.",
         "A small library opened near the harbour; it lends maps, novels and old shipping records to anyone.",
         "Farmers in the valley rotate barley and beans so the soil keeps its strength through dry summers.",
         "The orchestra rehearsed the new symphony twice before the premiere, which sold out within a week."]


def card_of(run) -> dict:
    return json.loads((run.path / "data_card.json").read_text())


def test_demo_data_card_reports_sources_counts_dedup_decontamination_and_mixture(data_run):
    card = card_of(data_run)
    pre = card["kinds"]["pretrain"]
    assert pre["sources"][0]["format"] == "synthetic" and pre["rows_in"] == 300 + 12   # short documents + long ones
    assert pre["rows_out"] == pre["rows_in"] - sum(pre["filters"]["removed"].values()) \
        - pre["dedup"]["exact_removed"] - pre["dedup"]["near_removed"] - pre["decontamination"]["hits"]
    # the tiny world repeats itself: dedup finds duplicates; a second look with another MinHash
    # seed finds only the few pairs near the LSH threshold that one seed catches and another misses
    assert pre["dedup"]["duplicate_rate_before"] > 0.05
    assert pre["dedup"]["duplicate_rate_after"] < pre["dedup"]["duplicate_rate_before"] / 2
    assert (round(pre["dedup"]["detection_50"], 2), round(pre["dedup"]["detection_95"], 2)) == (0.49, 0.65)
    assert "embedded" in card["decontamination_suites"]
    assert all(k["decontamination"]["hits"] == 0 for k in card["kinds"].values())
    assert set(card["domains"]) == {"facts", "long", "math"}
    weights = card["mixture"][0]["weights"]
    assert card["mixture_source"] == "natural (domains weighted by packed rows)"
    rows = {d: v["rows"] for d, v in card["packed"]["domains"].items()}
    assert weights == pytest.approx({d: n / sum(rows.values()) for d, n in rows.items()}, abs=1e-6)
    from transformers import AutoTokenizer

    from smolforge.data.shards import read_kind
    tokenizer = AutoTokenizer.from_pretrained(data_run.path / "tokenizer")
    texts = [row["text"] for _, row in read_kind(data_run.path, "pretrain")]
    assert card["tokens"]["pretrain"] == sum(len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    assert card["tokens"]["sft"] > 0 and card["tokens"]["prefs"] > 0
    assert data_run.info["data_fingerprints"] == card["fingerprints"]
    assert set(card["fingerprints"]) == {"data/pretrain", "data/sft", "data/prefs", "data/prompts", "data/feedback",
                                         "packed/facts", "packed/long", "packed/math"}
    assert card["world_kinds"] == ["pretrain", "sft", "prefs", "prompts"] and card["kinds"]["feedback"]["rows_out"] == 0
    text = (data_run.path / "data_card.md").read_text()
    for heading in ("## Rows", "## Quality filters", "## Deduplication", "## Decontamination",
                    "## Pretraining domains and mixture", "## Fingerprints"):
        assert heading in text


def test_packed_rows_on_disk_equal_packing_at_load(data_run):
    from transformers import AutoTokenizer

    from smolforge.data.packed_store import load_packed
    from smolforge.pretrain.batches import pack_shards

    tokenizer = AutoTokenizer.from_pretrained(data_run.path / "tokenizer")
    on_disk = load_packed(data_run.path / "packed")
    at_load = pack_shards(data_run.path, tokenizer, seq_len=card_of(data_run)["packed"]["seq_len"])
    assert set(on_disk) == set(at_load)
    for domain, rows in at_load.items():
        for key in ("input_ids", "position_ids", "labels"):
            assert np.array_equal(on_disk[domain][key], np.array([r[key] for r in rows]))


def test_pretraining_reads_the_packed_rows_when_seq_len_matches(data_run):
    from transformers import AutoTokenizer

    from smolforge.pretrain.batches import load_domains

    tokenizer = AutoTokenizer.from_pretrained(data_run.path / "tokenizer")
    seq_len = card_of(data_run)["packed"]["seq_len"]
    _, how = load_domains(data_run.path, tokenizer, seq_len)
    assert how.startswith("packed/ of the data run")
    domains, how = load_domains(data_run.path, tokenizer, seq_len // 2)
    assert how.startswith("packed at load") and domains["facts"]["input_ids"].shape[1] == seq_len // 2


def write_sources(tmp_path):
    """Foreign layouts with known problems: a Parquet corpus, a CSV of chats, preference JSONL, feedback
    JSONL in trl-lib/kto-mix-14k's layout."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    planted = json.loads((SUITE / "instruct.jsonl").read_text().splitlines()[0])
    near = CLEAN[1].replace("novels", "poems")
    docs = CLEAN + [CLEAN[0],                                            # exact duplicate
                    near,                                                # near duplicate (1 word edited)
                    "\n".join(["The offer is good and the price is low."] * 8),   # repeated lines
                    CLEAN[2] + " " + "\ufffd" * 20,                      # mojibake
                    (f"Notes from the class this morning, where the teacher asked the children about numbers and sums. "
                     f"{planted['question']} {planted['answer']} After that we moved on to geography and rivers.")]
    pq.write_table(pa.table({"body": docs, "lang": ["en"] * len(docs)}), tmp_path / "web.parquet", row_group_size=3)
    with (tmp_path / "chats.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["conversation"])
        for q, a in [("What is a harbour?", "A sheltered place where ships moor."),
                     ("Name a grain.", "Barley is a grain.")]:
            writer.writerow([json.dumps([{"role": "user", "content": q}, {"role": "assistant", "content": a}])])
    good = {"prompt": "Name a grain.", "chosen": "Barley.", "rejected": "A river."}
    (tmp_path / "prefs.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({"prompt": "x", "chosen": 3,
                                                                               "rejected": "y"}) + "\n")
    def turn(role: str, text: str) -> dict:
        return {"content": text, "role": role}           # kto-mix-14k's key order
    grain = [turn("user", "Name a grain.")]
    feedback = [{"prompt": grain, "completion": [turn("assistant", "Barley is a grain.")], "label": True},
                {"prompt": grain, "completion": [turn("assistant", "A river is a grain.")], "label": False},
                {"prompt": grain, "completion": [turn("assistant", "Barley is a grain.")], "label": True},   # a copy
                {"prompt": grain, "completion": [turn("assistant", "Barley is a grain.")], "label": False},  # another
                # user's thumbs down on the same answer: not a copy, kept
                {"prompt": [turn("user", planted["question"])], "completion": [turn("assistant", planted["answer"])],
                 "label": True},                                                                              # an eval item
                {"prompt": grain, "completion": [turn("assistant", "Oats.")], "label": "yes"}]                   # bad label
    with (tmp_path / "feedback.jsonl").open("w") as handle:
        for row in feedback:
            handle.write(json.dumps(row) + "\n")
    return {"pretrain": [{"path": str(tmp_path / "web.parquet"), "columns": {"text": "body"}, "domain": "web"}],
            "sft": [{"path": str(tmp_path / "chats.csv"), "columns": {"messages": "conversation"}}],
            "prefs": str(tmp_path / "prefs.jsonl"), "feedback": [{"path": str(tmp_path / "feedback.jsonl")}]}


def assert_feedback_card(run, card) -> None:
    """write_sources' feedback rows: one copy and one eval item removed, the bad label skipped and listed,
    the same answer with both labels kept."""
    from smolforge.data.shards import read_kind

    feedback = card["kinds"]["feedback"]
    assert (feedback["rows_in"], feedback["rows_out"], feedback["bad_rows"]["count"]) == (5, 3, 1)
    assert feedback["dedup"]["exact_removed"] == 1 and feedback["decontamination"]["by_suite"] == {"embedded": 1}
    assert feedback["shards"] == ["data/feedback/part-00000.jsonl"] and card["tokens"]["feedback"] > 0
    rows = [row for _, row in read_kind(run.path, "feedback")]
    assert [(row["completion"][0]["content"], row["label"]) for row in rows] == [
        ("Barley is a grain.", True), ("A river is a grain.", False), ("Barley is a grain.", False)]
    assert run.info["data_fingerprints"]["data/feedback"] == card["fingerprints"]["data/feedback"]
    assert "| feedback | " in (run.path / "data_card.md").read_text()


def test_prepare_from_foreign_files_reports_every_removal_by_reason(tmp_path):
    runs = Runs(tmp_path / "runs")
    sources = write_sources(tmp_path)
    run = run_stage("data", runs, name="data-files", sources=sources, on_error="skip",
                    filters=asdict(FilterSpec()), pack={"seq_len": 16}, tokenizer={"vocab_size": 300})
    card = card_of(run)
    pre = card["kinds"]["pretrain"]
    assert pre["sources"] == [{"source": sources["pretrain"][0]["path"], "format": "parquet", "rows": 9}]
    assert pre["filters"]["removed"] == {"dup_line_frac": 1, "garbage_chars": 1}  # the Gopher defaults
    assert (pre["dedup"]["exact_removed"], pre["dedup"]["near_removed"]) == (1, 1)
    hit = pre["decontamination"]["examples"][0]
    assert pre["decontamination"]["by_suite"] == {"embedded": 1}
    assert hit["suite"] == "embedded" and hit["file"] == "instruct.jsonl" and hit["row"] == 1
    assert hit["where"].endswith("web.parquet row 9")
    assert pre["rows_out"] == 4 and set(card["domains"]) == {"web"}
    # the bad preference row is counted and listed, not dropped silently
    prefs = card["kinds"]["prefs"]
    assert prefs["rows_out"] == 1 and prefs["bad_rows"]["count"] == 1
    listed = [json.loads(line) for line in (run.path / "reports" / "bad_rows.jsonl").read_text().splitlines()]
    assert len(listed) == 2 and listed[0]["kind"] == "prefs" and listed[0]["where"].endswith("prefs.jsonl line 2")
    assert "chosen" in listed[0]["error"]
    assert card["kinds"]["sft"]["rows_out"] == 2
    assert_feedback_card(run, card)
    assert [item["where"] for item in listed if item["kind"] == "feedback"] == [f"{tmp_path}/feedback.jsonl line 6"]
    decontam = (run.path / "reports" / "decontamination-pretrain.jsonl").read_text()
    assert '"suite": "embedded"' in decontam
    assert "bad rows skipped" in (run.path / "data_card.md").read_text().lower()


@pytest.mark.parametrize("kind, message", [
    ("prefs", "line 2: field 'chosen' must be a non-empty string or a list of messages"),
    ("feedback", "line 6: field 'label' must be true (a desirable answer) or false, found 'yes'")])
def test_a_bad_row_with_on_error_fail_stops_before_any_run_folder(tmp_path, capsys, kind, message):
    path = tmp_path / f"{kind}.jsonl"
    write_sources(tmp_path)
    recipe = tmp_path / "data.yaml"
    recipe.write_text((DEMO / "data.yaml").read_text().replace("sources: {}", f"sources:\n  {kind}: {path}"))
    others = [k for k in ("pretrain", "sft", "prefs", "prompts") if k != kind]
    code = main(["--runs-dir", str(tmp_path / "runs"), "data", "prepare", str(recipe), "--set", "name=data-bad",
                 "--set", f"world.kinds=[{', '.join(others)}]"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"DataError: {path} {message}" in err
    assert not (tmp_path / "runs" / "data-bad").exists()


def test_data_prepare_prints_the_card_and_json(tmp_path, capsys):
    recipe = tmp_path / "data.yaml"
    recipe.write_text((DEMO / "data.yaml").read_text())
    args = ["--runs-dir", str(tmp_path / "runs"), "data", "prepare", str(recipe), "--set", "world.entities=4",
            "--set", "world.pretrain_docs=120", "--set", "world.preference_pairs=20", "--set", "world.long_docs=0", "--set", "tokenizer.vocab_size=320",
            "--set", "progress=false"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "# Data card: data-demo" in out and "## Deduplication" in out
    assert main(args + ["--overwrite", "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["name"] == "data-demo" and card["kinds"]["pretrain"]["rows_in"] == 120


def test_a_mixture_declared_with_the_data_is_recorded_and_adopted_by_pretraining(tmp_path):
    runs = Runs(tmp_path / "runs")
    phases = [{"until": 0.5, "weights": {"facts": 3, "math": 1}}, {"until": 1.0, "weights": {"facts": 1, "math": 1}}]
    data = run_stage("data", runs, name="data-mixed", mixture=phases)
    card = card_of(data)
    assert card["mixture_source"] == "recipe"
    assert card["mixture"][0]["weights"] == {"facts": 0.75, "math": 0.25}
    assert "| 0 | 0.5 | facts 0.750, math 0.250 |" in (data.path / "data_card.md").read_text()
    pretrain = load_stage("pretrain")
    recipe = tiny_recipe("pretrain", data="data-mixed", name="pretrain-mixed", mixture=[])
    assert recipe.mixture == []
    pretrain.validate(recipe, runs)
    assert recipe.mixture == card["mixture"]


def test_two_worker_processes_write_the_same_data_as_one(tmp_path, data_run):
    runs = Runs(tmp_path / "runs")
    two = run_stage("data", runs, name="data-two-workers", dedup={"workers": 2})
    assert card_of(two)["kinds"]["pretrain"]["dedup"]["workers"] == 2
    assert two.info["data_fingerprints"] == data_run.info["data_fingerprints"]


def test_recipe_mistakes_are_caught_before_reading_data(tmp_path):
    runs = Runs(tmp_path / "runs")
    data = load_stage("data")
    cases = [({"sources": {"pretrian": "x.jsonl"}}, "unknown kind 'pretrian' (did you mean 'pretrain'?)"),
             ({"mixture": [{"until": 1.0, "weights": {"code": 1}}]}, "unknown domain(s) code"),
             ({"dedup": {"bands": 30, "rows": 5}}, "exceeds dedup.num_perm 128"),
             ({"decontaminate": {"suites": [str(tmp_path / "nope")]}}, "is not a folder"),
             ({"on_error": "ignore"}, "expected fail or skip")]
    for change, message in cases:
        with pytest.raises(RecipeError, match=re.escape(message)):
            data.validate(tiny_recipe("data", **change), runs)


def test_the_synthetic_world_fills_only_the_kinds_asked_for_once_sources_are_given(tmp_path, capsys):
    """A recipe with real documents for one kind gets no toy-world rows in the others unless
    ``world.kinds`` asks, and the command says which kinds came from where."""
    runs = Runs(tmp_path / "runs")
    sources = write_sources(tmp_path)
    only_sft = {"sft": sources["sft"]}
    run = run_stage("data", runs, name="data-sft-only", sources=only_sft, on_error="skip")
    err = capsys.readouterr().err
    assert "data data-sft-only: from sources: sft; left empty: pretrain, prefs, prompts" in err
    card = card_of(run)
    assert card["world_kinds"] == [] and card["kinds"]["sft"]["rows_out"] == 2
    assert {kind: card["kinds"][kind]["rows_out"] for kind in ("pretrain", "prefs", "prompts")} == \
        {"pretrain": 0, "prefs": 0, "prompts": 0}

    run = run_stage("data", runs, name="data-sft-and-world", sources=only_sft, on_error="skip",
                    world={"kinds": ["prompts", "feedback", "prefs"]})
    assert "from the embedded synthetic world: prefs, prompts, feedback; left empty: pretrain" in capsys.readouterr().err
    card = card_of(run)
    assert card["world_kinds"] == ["prefs", "prompts", "feedback"] and card["kinds"]["prompts"]["rows_out"] > 0
    assert card["kinds"]["prefs"]["sources"][0]["format"] == "synthetic" and card["kinds"]["pretrain"]["rows_out"] == 0
    # feedback asked of the world: its pairs' answers, every chosen one good and one rejected in two bad
    from smolforge.data.shards import read_kind
    assert card["kinds"]["feedback"]["rows_in"] == 3 * card["kinds"]["prefs"]["rows_in"] // 2
    labels = [row["label"] for _, row in read_kind(run.path, "feedback")]
    assert labels.count(True) > labels.count(False) > 0

    module = load_stage("data")
    for changes, message in [
            ({"sources": only_sft, "world": {"kinds": ["sft"]}}, "world.kinds: 'sft' has sources too (sources.sft)"),
            ({"world": {"kinds": ["prompt"]}}, "world.kinds: unknown kind 'prompt' (did you mean 'prompts'?)"),
            ({"sources": {"prefs": sources["prefs"]}}, "tokenizer: nothing to train it on (no pretrain or sft rows")]:
        with pytest.raises(RecipeError, match=re.escape(message)):
            module.validate(tiny_recipe("data", name="data-bad-kinds", **changes), runs)
    assert not (runs.root / "data-bad-kinds").exists()
