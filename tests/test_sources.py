"""Source readers: every format, column mapping, domains, limits, streaming, and errors that name file and row."""
from __future__ import annotations

import csv
import gzip
import json
import os
from pathlib import Path

import pytest

from smolforge.data import sources
from smolforge.data.sources import BadRows, Source, iter_rows, source_label, validate_source
from smolforge.errors import DataError, RecipeError

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Relative paths, so the `where` strings read as they would in a recipe."""
    monkeypatch.chdir(tmp_path)


def write_lines(path: str, lines: list[str]) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_jsonl(path: str, rows: list) -> str:
    return write_lines(path, [json.dumps(r) for r in rows])


def write_parquet(path: str, rows: list[dict], row_group_size: int | None = None) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def write_csv(path: str, header: list[str], rows: list[list]) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def read(source: Source, shape: str = "text", **kw) -> list[tuple[str, dict]]:
    return list(iter_rows(source, shape, **kw))


def error_of(source: Source, shape: str = "text") -> str:
    with pytest.raises(DataError) as info:
        read(source, shape)
    return str(info.value)


# ---- each format ------------------------------------------------------------------------------

def test_jsonl_rows_keep_extra_fields_and_name_lines():
    write_lines("raw/a.jsonl", [json.dumps({"text": "one", "id": 1}), "", json.dumps({"text": "two"})])
    assert read(Source(path="raw/a.jsonl")) == [("raw/a.jsonl line 1", {"text": "one", "id": 1}),
                                               ("raw/a.jsonl line 3", {"text": "two"})]


def test_json_array_and_gzipped_jsonl():
    Path("a.json").write_text(json.dumps([{"messages": CHAT}, {"messages": CHAT, "id": "b"}], indent=2))
    assert read(Source(path="a.json"), "chat") == [("a.json row 1", {"messages": CHAT}),
                                                   ("a.json row 2", {"messages": CHAT, "id": "b"})]
    with gzip.open("b.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"text": "zipped"}) + "\n")
    assert read(Source(path="b.jsonl.gz")) == [("b.jsonl.gz line 1", {"text": "zipped"})]


def test_json_array_larger_than_the_read_buffer(monkeypatch):
    monkeypatch.setattr(sources, "BATCH_ROWS", 1)          # 1 KiB reads
    rows = [{"text": f"document {i} " + "x" * (i * 37), "n": i} for i in range(200)]
    Path("big.json").write_text(json.dumps(rows))
    assert [row for _, row in read(Source(path="big.json"))] == rows


def test_parquet_rows_counted_across_batches(monkeypatch):
    monkeypatch.setattr(sources, "BATCH_ROWS", 3)
    prefs = [{"prompt": f"q{i}", "chosen": "good", "rejected": "bad", "score": i} for i in range(10)]
    write_parquet("raw/p.parquet", prefs, row_group_size=4)
    got = read(Source(path="raw/p.parquet"), "preference")
    assert [w for w, _ in got] == [f"raw/p.parquet row {i}" for i in range(1, 11)]
    assert [r for _, r in got] == prefs


def test_parquet_messages_as_list_of_structs():
    write_parquet("c.parquet", [{"messages": CHAT}])
    assert read(Source(path="c.parquet"), "chat") == [("c.parquet row 1", {"messages": CHAT})]


def test_csv_rows_decode_json_messages_and_name_physical_lines():
    write_csv("c.csv", ["messages", "note"], [[json.dumps(CHAT), "multi\nline"], [json.dumps(CHAT), "x"]])
    got = read(Source(path="c.csv"), "chat")
    assert got == [("c.csv lines 2-3", {"messages": CHAT, "note": "multi\nline"}),
                   ("c.csv line 4", {"messages": CHAT, "note": "x"})]
    write_csv("p.csv", ["prompt", "chosen", "rejected"],
              [["[citation needed] why?", "because", "no"],
               [json.dumps(CHAT[:1]), json.dumps(CHAT[1:]), json.dumps([{"role": "assistant", "content": "no"}])]])
    rows = [r for _, r in read(Source(path="p.csv"), "preference")]
    assert rows[0]["prompt"] == "[citation needed] why?" and rows[1]["prompt"] == CHAT[:1]


def test_text_folder_one_document_per_file_and_paragraphs():
    write_lines("corpus/b.txt", ["second file"])
    write_lines("corpus/a.txt", ["first para", "still first", "", "  ", "second para"])
    write_lines("corpus/.hidden.txt", ["never read"])
    write_lines("corpus/sub/c.txt", ["nested"])
    assert read(Source(path="corpus", domain="books")) == [
        ("corpus/a.txt", {"text": "first para\nstill first\n\n  \nsecond para\n", "domain": "books"}),
        ("corpus/b.txt", {"text": "second file\n", "domain": "books"}),
        ("corpus/sub/c.txt", {"text": "nested\n", "domain": "books"})]
    got = read(Source(path="corpus/a.txt", text_unit="paragraph"))
    assert got == [("corpus/a.txt paragraph 1", {"text": "first para\nstill first"}),
                   ("corpus/a.txt paragraph 2", {"text": "second para"})]


def test_saved_datasets_dataset_and_dataset_dict():
    import datasets

    datasets.Dataset.from_dict({"content": ["a", "b", "c"], "lang": ["en", "fr", "en"]}).save_to_disk("ds")
    got = read(Source(dataset="ds", columns={"text": "content"}))
    assert got[2] == ("dataset ds[train] row 3", {"text": "c", "lang": "en"})
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"messages": [CHAT]}),
                          "test": datasets.Dataset.from_dict({"messages": [CHAT, CHAT]})}).save_to_disk("dd")
    assert [w for w, _ in read(Source(dataset="dd", split="test"), "chat")] == ["dataset dd[test] row 1",
                                                                                "dataset dd[test] row 2"]
    # a save_to_disk folder given as path: is read as a dataset too
    assert read(Source(path="ds", columns={"text": "content"}))[0][0] == "dataset ds[train] row 1"
    assert "no split 'validation' (splits: " in error_of(Source(dataset="dd", split="validation"), "chat")


def test_glob_reads_files_in_sorted_order():
    for name in ("b", "a", "c"):
        write_parquet(f"raw/{name}.parquet", [{"text": name}])
    assert [w for w, _ in read(Source(path="raw/*.parquet"))] == [
        "raw/a.parquet row 1", "raw/b.parquet row 1", "raw/c.parquet row 1"]


# ---- mapping, domain, limit ---------------------------------------------------------------------

def test_column_mapping_for_a_foreign_layout():
    write_parquet("f.parquet", [{"question": "q", "good": "yes", "bad": "no", "id": 7}])
    got = read(Source(path="f.parquet", columns={"prompt": "question", "chosen": "good", "rejected": "bad"}),
               "preference")
    assert got == [("f.parquet row 1", {"prompt": "q", "chosen": "yes", "rejected": "no", "id": 7})]
    write_jsonl("swap.jsonl", [{"prompt": "q", "chosen": "worse", "rejected": "better"}])
    swapped = read(Source(path="swap.jsonl", columns={"chosen": "rejected", "rejected": "chosen"}), "preference")
    assert swapped[0][1] == {"chosen": "better", "rejected": "worse", "prompt": "q"}


def test_domain_stamped_on_text_rows_unless_the_row_has_one():
    write_jsonl("d.jsonl", [{"text": "a", "domain": "code"}, {"text": "b"}])
    assert [r.get("domain") for _, r in read(Source(path="d.jsonl"))] == ["code", None]
    assert [r["domain"] for _, r in read(Source(path="d.jsonl", domain="web"))] == ["web", "web"]
    write_jsonl("c.jsonl", [{"messages": CHAT}])
    assert read(Source(path="c.jsonl", domain="web"), "chat")[0][1] == {"messages": CHAT}


def test_limit_counts_valid_rows_and_stops_reading():
    write_lines("l.jsonl", [json.dumps({"text": "a"}), json.dumps({"text": ""}), json.dumps({"text": "b"}),
                            "not json at all"])
    bad = BadRows()
    got = read(Source(path="l.jsonl", limit=2), on_error="skip", bad=bad)
    assert [r["text"] for _, r in got] == ["a", "b"] and bad.count == 1
    assert read(Source(path="l.jsonl", limit=0)) == []


# ---- streaming ----------------------------------------------------------------------------------

def test_jsonl_is_read_lazily():
    with open("huge.jsonl", "w") as handle:
        handle.write(json.dumps({"text": "first"}) + "\n")
        handle.write(json.dumps({"text": "second"}) + "\n")
        handle.write("{broken\n" * 50_000)
    rows = iter_rows(Source(path="huge.jsonl"), "text")
    assert next(rows) == ("huge.jsonl line 1", {"text": "first"})
    assert next(rows) == ("huge.jsonl line 2", {"text": "second"})
    with pytest.raises(DataError, match=r"huge.jsonl line 3: not valid JSON"):
        next(rows)


def test_parquet_is_read_a_batch_at_a_time(monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(sources, "BATCH_ROWS", 5)
    write_parquet("s.parquet", [{"text": f"doc {i}"} for i in range(100)], row_group_size=20)
    pulled = []
    original = pq.ParquetFile.iter_batches

    def counting(self, *args, **kwargs):
        for batch in original(self, *args, **kwargs):
            pulled.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
    rows = iter_rows(Source(path="s.parquet"), "text")
    assert next(rows) == ("s.parquet row 1", {"text": "doc 0"})
    assert pulled == [5]
    rows.close()


def test_iter_rows_reads_nothing_until_iterated():
    write_lines("bad.jsonl", ["{nope"])
    rows = iter_rows(Source(path="bad.jsonl"), "text")   # no error yet: nothing read
    with pytest.raises(DataError):
        next(rows)


# ---- errors name file, row and field ------------------------------------------------------------

def test_bad_json_line():
    write_lines("j.jsonl", [json.dumps({"text": "ok"}), '{"text": "unterminated'])
    assert error_of(Source(path="j.jsonl")) == ("j.jsonl line 2: not valid JSON "
                                                "(Unterminated string starting at column 10)")
    write_lines("arr.jsonl", ['["a list"]'])
    assert error_of(Source(path="arr.jsonl")) == "arr.jsonl row 1: expected a JSON object, found a string"
    write_lines("n.jsonl", ["5"])
    assert error_of(Source(path="n.jsonl")) == "n.jsonl line 1: expected a JSON object, found the number 5"


def test_broken_json_array_is_a_file_error():
    Path("b.json").write_text('[{"text": "a"}, {"text": ')
    bad = BadRows()
    with pytest.raises(DataError, match=r"^b.json row 2: not valid JSON \(Expecting value at character 26\); "
                                        r"the rest of the array cannot be read$"):
        read(Source(path="b.json"), on_error="skip", bad=bad)


def test_wrong_types():
    write_jsonl("t.jsonl", [{"text": 5}])
    assert error_of(Source(path="t.jsonl")) == ("t.jsonl line 1: field 'text' must be a non-empty string, "
                                                "found the number 5")
    write_jsonl("m.jsonl", [{"messages": "hi"}])
    assert error_of(Source(path="m.jsonl"), "chat") == ("m.jsonl line 1: field 'messages' must be a non-empty "
                                                        "list of messages, found a string")
    write_jsonl("r.jsonl", [{"messages": [{"role": "bot", "content": "x"}]}])
    assert error_of(Source(path="r.jsonl"), "chat") == ("r.jsonl line 1: field 'messages[0].role' is 'bot' "
                                                        "(expected one of system, user, assistant, tool)")
    write_jsonl("p.jsonl", [{"prompt": "q", "chosen": {"a": 1}, "rejected": "b"}])
    assert error_of(Source(path="p.jsonl"), "preference") == (
        "p.jsonl line 1: field 'chosen' must be a non-empty string or a list of messages, found an object")


def test_parquet_null_reads_as_null():
    write_parquet("n.parquet", [{"text": "fine"}, {"text": None}])
    assert error_of(Source(path="n.parquet")) == "n.parquet row 2: field 'text' must be a non-empty string, found null"


def test_missing_fields():
    write_jsonl("m.jsonl", [{"body": "x", "id": 1}])
    assert error_of(Source(path="m.jsonl")) == ("m.jsonl line 1: field 'text' is missing (expected text; "
                                                "the row has body, id)")
    write_parquet("m.parquet", [{"body": "x"}])
    assert error_of(Source(path="m.parquet")) == ("m.parquet: no column 'text' (expected text; columns present: "
                                                  "body); map one with columns: {text: <column>}")


def test_mapped_column_that_does_not_exist():
    write_jsonl("m.jsonl", [{"body": "x", "id": 1}])
    assert error_of(Source(path="m.jsonl", columns={"text": "content"})) == (
        "m.jsonl line 1: column 'content' (mapped to 'text') not found; columns present: body, id")
    write_csv("m.csv", ["body", "id"], [["x", "1"]])
    assert error_of(Source(path="m.csv", columns={"text": "content"})) == (
        "m.csv: column 'content' (mapped to 'text') not found; columns present: body, id")


def test_empty_files():
    Path("e.jsonl").write_text("\n\n")
    assert error_of(Source(path="e.jsonl")) == ("e.jsonl: no rows (expected JSON Lines or a JSON array of objects "
                                                "with text rows: text)")
    Path("e.csv").write_text("text\n")
    assert error_of(Source(path="e.csv")) == "e.csv: no rows (expected CSV with a header line with text rows: text)"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([], pa.string())}), "e.parquet")
    assert error_of(Source(path="e.parquet")) == "e.parquet: no rows (expected Parquet with text rows: text)"
    Path("e.txt").write_text("  \n")
    assert error_of(Source(path="e.txt")) == "e.txt: empty file (expected a non-empty text document)"


def test_unreadable_parquet():
    Path("x.parquet").write_bytes(b"this is not parquet at all" * 10)
    bad = BadRows()
    with pytest.raises(DataError, match=r"^x.parquet: not a readable Parquet file \(.*magic bytes"):
        read(Source(path="x.parquet"), on_error="skip", bad=bad)


def test_file_missing_at_read_time():
    with pytest.raises(DataError, match=r"^path 'gone.jsonl': file not found$"):
        iter_rows(Source(path="gone.jsonl"), "text")


def test_csv_row_with_wrong_field_count():
    Path("w.csv").write_text("text,id\nok,1\ntoo,many,fields\n")
    assert error_of(Source(path="w.csv")) == "w.csv line 3: 3 fields, but the header has 2"


def test_unloadable_hub_dataset_offline():
    with pytest.raises(DataError, match=r"^dataset no-such-org/no-such-dataset: could not load it"):
        read(Source(dataset="no-such-org/no-such-dataset"))


# ---- on_error: skip -----------------------------------------------------------------------------

def test_skip_counts_and_lists_bad_rows_and_yields_the_good_ones():
    write_lines("raw/a.jsonl", [json.dumps({"text": "good 1"}), "{oops", json.dumps({"text": ""}),
                                json.dumps({"body": "x"}), json.dumps({"text": "good 2"})])
    write_csv("raw/b.csv", ["text"], [["good 3"], [""]])
    bad = BadRows()
    good = read(Source(path="raw/a.jsonl"), on_error="skip", bad=bad)
    good += read(Source(path="raw/b.csv"), on_error="skip", bad=bad)
    assert [r["text"] for _, r in good] == ["good 1", "good 2", "good 3"]
    assert bad.count == 4
    assert [item["where"] for item in bad.items] == ["raw/a.jsonl line 2", "raw/a.jsonl line 3",
                                                     "raw/a.jsonl line 4", "raw/b.csv line 3"]
    assert bad.items[1]["error"] == "field 'text' must be a non-empty string, found an empty string"
    assert bad.items[2]["error"] == "field 'text' is missing (expected text; the row has body)"
    assert bad.as_dict(limit=2) == {"count": 4, "items": bad.items[:2], "more": 2}


def test_skip_with_no_valid_row_left_is_an_error():
    write_jsonl("all-bad.jsonl", [{"text": ""}, {"text": 3}])
    bad = BadRows()
    with pytest.raises(DataError, match=r"^all-bad.jsonl: no valid rows \(2 bad rows skipped; the first: "
                                        r"all-bad.jsonl line 1: field 'text'"):
        read(Source(path="all-bad.jsonl"), on_error="skip", bad=bad)
    assert bad.count == 2


def test_skip_text_paragraph_with_bad_bytes():
    Path("t.txt").write_bytes(b"good para\n\nbad \xff bytes\n\nlast para\n")
    bad = BadRows()
    got = read(Source(path="t.txt", text_unit="paragraph"), on_error="skip", bad=bad)
    assert [w for w, _ in got] == ["t.txt paragraph 1", "t.txt paragraph 3"]
    assert bad.items == [{"where": "t.txt paragraph 2",
                          "error": "line 3 is not valid UTF-8 (invalid start byte at column 5)"}]


def test_skip_needs_a_bad_rows_and_on_error_is_checked():
    write_jsonl("a.jsonl", [{"text": "a"}])
    with pytest.raises(ValueError):
        iter_rows(Source(path="a.jsonl"), "text", on_error="skip")
    with pytest.raises(RecipeError, match="on_error: unknown value 'ignore'"):
        iter_rows(Source(path="a.jsonl"), "text", on_error="ignore")


# ---- validate_source ----------------------------------------------------------------------------

@pytest.mark.parametrize("source, message", [
    (Source(), r"sources.pretrain\[0\]: give path: \(a file, glob or folder\) or dataset:"),
    (Source(path="a.jsonl", dataset="imdb"), r"sources.pretrain\[0\]: give path: or dataset:, not both"),
    (Source(path="a.jsonl", format="xlsx"),
     r"sources.pretrain\[0\].format: unknown format 'xlsx' \(expected one of auto, jsonl"),
    (Source(dataset="imdb", format="csv"), r"format: must be auto or datasets, not 'csv'"),
    (Source(path="a.jsonl", text_unit="sentence"),
     r"text_unit: unknown text unit 'sentence' \(expected one of file, paragraph\)"),
    (Source(path="a.jsonl", limit=-1),
     r"sources.pretrain\[0\].limit: must be a whole number >= 0 \(or unset\), got -1"),
    (Source(path="raw/*.parquet"), r"sources.pretrain\[0\].path: path 'raw/\*.parquet' matches no file$"),
    (Source(path="nope.jsonl"), r"sources.pretrain\[0\].path: path 'nope.jsonl': file not found$"),
    (Source(path="a.dat"), r"path: cannot tell the format of 'a.dat' from its extension; set format:"),
    (Source(path="mixed"), r"path: folder mixed holds files of several formats \(jsonl, text\)"),
    (Source(path="a.jsonl", columns={"text": 3}), r"columns: 'text': 3 must map a field name to a column name"),
    (Source(path="corpus", columns={"text": "body"}), r"columns: does not apply to text files"),
])
def test_validate_source_errors(source, message):
    write_jsonl("a.jsonl", [{"text": "a"}])
    Path("a.dat").write_text("?")
    write_jsonl("mixed/a.jsonl", [{"text": "a"}])
    write_lines("mixed/b.txt", ["b"])
    write_lines("corpus/a.txt", ["a"])
    with pytest.raises(RecipeError, match=message):
        validate_source(source, "sources.pretrain[0]")


def test_validate_source_accepts_good_sources_and_labels():
    write_jsonl("a.jsonl", [{"text": "a"}])
    write_lines("corpus/a.txt", ["a"])
    Path("a.dat").write_text("text\nx\n")
    for source in (Source(path="a.jsonl"), Source(path="corpus", text_unit="paragraph"),
                   Source(path="a.dat", format="csv"), Source(dataset="imdb")):
        validate_source(source, "sources.pretrain[0]")
    assert read(Source(path="a.dat", format="csv")) == [("a.dat line 2", {"text": "x"})]
    assert source_label(Source(path="a.jsonl")) == "a.jsonl"
    assert source_label(Source(dataset="imdb")) == "imdb"
    assert source_label(Source(dataset="imdb", name="reviews")) == "reviews"
