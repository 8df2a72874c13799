"""Public dataset shapes as published (data/shapes.py): each built from rows in the dataset's own field
layout, read through a stage's ``data: file.jsonl`` path (schemas.load_rows) and a data source."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_stage
from smolforge.data import shapes
from smolforge.data.schemas import load_rows
from smolforge.data.sources import Source, iter_rows
from smolforge.errors import DataError, RecipeError
from smolforge.generation.verifiers import answer_match, math_match
from smolforge.runs import Runs

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Relative paths, so the `where` strings read as they would in a recipe."""
    monkeypatch.chdir(tmp_path)


def write_jsonl(path: str, rows: list[dict]) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def user(text: str) -> dict:
    return {"content": text, "role": "user"}            # the published key order: content, then role


def assistant(text: str) -> dict:
    return {"content": text, "role": "assistant"}


# ---- chat: smoltalk, Tulu 3 -------------------------------------------------------------------

SMOLTALK = {   # HuggingFaceTB/smoltalk (all): messages with a system turn, and source
    "messages": [{"content": "You are an AI assistant. Provide a detailed answer so user don't need to search outside "
                             "to understand the answer.", "role": "system"},
                 user("What is the boiling point of water at the top of Mount Everest?"),
                 assistant("At the summit of Mount Everest (8,849 m) the air pressure is about a third of sea level, "
                           "so water boils at roughly 70 °C (158 °F) instead of 100 °C.")],
    "source": "smol-magpie-ultra"}
TULU = {       # allenai/tulu-3-sft-mixture: id, messages, source
    "id": "oasst1_6674",
    "messages": [user("Can you explain what a hash table is?"),
                 assistant("A hash table maps keys to values: a hash function turns each key into an index of an "
                           "array of buckets, so lookups take constant time on average.")],
    "source": "ai2-adapt-dev/oasst1_converted"}
PERSONA = {    # allenai/tulu-3-sft-personas-math: id, prompt (the user turn again), messages
    "id": "personahub_8r3fxwh4ezk9w5bvh0mc0xq9",
    "prompt": "A retired teacher plants 12 rows of 15 tulips. How many tulips does she plant?",
    "messages": [user("A retired teacher plants 12 rows of 15 tulips. How many tulips does she plant?"),
                 assistant("12 rows of 15 tulips make 12 × 15 = 180 tulips.")]}


def test_smoltalk_and_tulu_rows_are_chat_rows_and_build_one_dataset():
    write_jsonl("sft.jsonl", [SMOLTALK, TULU, PERSONA, {"messages": TULU["messages"]}])
    rows = load_rows("sft.jsonl", "chat")
    assert rows == [SMOLTALK, TULU, {k: v for k, v in PERSONA.items() if k != "prompt"}, {"messages": TULU["messages"]}]
    # the extra columns differ from row to row; datasets (what every TRL stage is given) takes them,
    # and no `prompt` column is left to make TRL's SFTTrainer read the rows as prompt-completion
    from datasets import Dataset

    for order in (rows, rows[::-1]):
        dataset = Dataset.from_list(order)
        assert "prompt" not in dataset.column_names and len(dataset) == 4
        assert dataset[0]["messages"] == order[0]["messages"]
    assert [r for _, r in iter_rows(Source(path="sft.jsonl", shape="smoltalk"), "chat")] == rows


# ---- chat: reasoning traces (OpenR1-Math) ------------------------------------------------------

TRACE_WRONG = "<think>\nHalf of 10 is 4... no wait.\n</think>\n\nThe answer is $\\boxed{4}$."
TRACE_RIGHT = ("<think>\nJan has 10 apples and gives away half: 10 / 2 = 5. So 5 remain.\n</think>\n\n"
               "Jan gives away $10/2 = 5$ apples, so $\\boxed{5}$ remain.")
OPENR1 = {     # open-r1/OpenR1-Math-220k (default): every published column
    "problem": "Jan has 10 apples and gives away half of them. How many apples remain?",
    "solution": "Half of 10 is 5, so $10 - 5 = \\boxed{5}$ apples remain.",
    "answer": "5", "problem_type": "Algebra", "question_type": "math-word-problem", "source": "olympiads",
    "uuid": "0a3f6c1e-5b3c-5b7d-9a8e-2f7e4c1d9b10",
    "is_reasoning_complete": [True, True, False],
    "generations": [TRACE_WRONG, TRACE_RIGHT, "<think>\nLet me think about this for a long"],
    "correctness_math_verify": [False, True, False], "correctness_llama": None,
    "finish_reasons": None, "correctness_count": 1,
    "messages": [user("Jan has 10 apples and gives away half of them. How many apples remain?"),
                 assistant(TRACE_RIGHT)]}
KEPT = {"answer": "5", "problem_type": "Algebra", "question_type": "math-word-problem", "source": "olympiads",
        "uuid": "0a3f6c1e-5b3c-5b7d-9a8e-2f7e4c1d9b10", "correctness_count": 1}


def test_openr1_reasoning_rows_keep_the_think_trace_of_a_correct_generation():
    without_messages = {k: v for k, v in OPENR1.items() if k != "messages"}
    r1_style = {**without_messages, "generations": [TRACE_RIGHT.removeprefix("<think>\n")],
                "is_reasoning_complete": [True], "correctness_math_verify": [True]}   # the template opened <think>
    write_jsonl("r1.jsonl", [OPENR1, without_messages, r1_style])
    rows = load_rows("r1.jsonl", "chat")
    expected = {"messages": [user(OPENR1["problem"]), assistant(TRACE_RIGHT)], **KEPT}
    assert rows == [expected, expected, expected]
    # the dual-mode template trains on the trace as it is (think mode: no flag, no empty think block)
    from smolforge.data.tokenizer import train_tokenizer

    tok = train_tokenizer(["Jan has 10 apples. Think step by step."] * 20, vocab_size=300)
    out = tok.apply_chat_template(rows[0]["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    trained = tok.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m])
    assert trained == TRACE_RIGHT + "<|im_end|>"
    wrong_only = {**without_messages, "correctness_math_verify": [False, False, False]}
    write_jsonl("bad.jsonl", [without_messages, wrong_only])
    with pytest.raises(DataError, match=r"^bad.jsonl line 2: none of the 3 generations with a complete trace is marked "
                                        r"correct \(correctness_math_verify\)$"):
        load_rows("bad.jsonl", "chat")


# ---- preference: UltraFeedback, TRL implicit and explicit, HH-RLHF ------------------------------

UF_PROMPT = "Write a haiku about autumn leaves."
UF_CHOSEN = "Crimson leaves drifting\nwhispering down to the earth\nautumn's soft goodbye"
UF_REJECTED = "Leaves are falling down. They are red and yellow. It is autumn now and it is cold."
ULTRAFEEDBACK = {   # HuggingFaceH4/ultrafeedback_binarized (train_prefs): every published column
    "prompt": UF_PROMPT,
    "prompt_id": "3c5d4b8f1e2a9d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29180f1e2d3c4b5a6978",
    "chosen": [user(UF_PROMPT), assistant(UF_CHOSEN)],
    "rejected": [user(UF_PROMPT), assistant(UF_REJECTED)],
    "messages": [user(UF_PROMPT), assistant(UF_CHOSEN)],
    "score_chosen": 8.5, "score_rejected": 4.0}


def test_ultrafeedback_rows_become_explicit_conversational_pairs_with_their_scores():
    write_jsonl("uf.jsonl", [ULTRAFEEDBACK])
    assert load_rows("uf.jsonl", "preference") == [{
        "prompt": [user(UF_PROMPT)], "chosen": [assistant(UF_CHOSEN)], "rejected": [assistant(UF_REJECTED)],
        "prompt_id": ULTRAFEEDBACK["prompt_id"], "score_chosen": 8.5, "score_rejected": 4.0}]
    assert shapes.detect(ULTRAFEEDBACK, "preference", "uf.jsonl line 1").name == "ultrafeedback"


def test_trl_implicit_pairs_split_at_the_longest_common_prefix():
    system = {"content": "You are a terse assistant.", "role": "system"}
    turns = [system, user("What is the capital of France?"), assistant("Paris."), user("And of Italy?")]
    implicit = {"chosen": turns + [assistant("Rome.")], "rejected": turns + [assistant("Milan.")],
                "score_chosen": 9.0, "score_rejected": 2.0}        # trl-lib/ultrafeedback_binarized's columns
    write_jsonl("implicit.jsonl", [implicit])
    assert load_rows("implicit.jsonl", "preference") == [{
        "prompt": turns, "chosen": [assistant("Rome.")], "rejected": [assistant("Milan.")],
        "score_chosen": 9.0, "score_rejected": 2.0}]
    no_prefix = {"chosen": [user("Hi"), assistant("Hello")], "rejected": [user("Hey"), assistant("Hello")]}
    early = {"chosen": [user("Hi"), assistant("Hello"), user("Bye"), assistant("Bye!")],
             "rejected": [user("Hi"), assistant("Go away"), user("Bye"), assistant("Bye!")]}
    write_jsonl("bad.jsonl", [no_prefix, early])
    with pytest.raises(DataError, match=r"^bad.jsonl line 1: fields 'chosen' and 'rejected' share no leading turn"):
        load_rows("bad.jsonl", "preference")
    write_jsonl("bad.jsonl", [early])
    with pytest.raises(DataError) as info:
        load_rows("bad.jsonl", "preference")
    assert str(info.value) == ("bad.jsonl line 1: fields 'chosen' and 'rejected' differ before their last assistant "
                               "turn: after 1 shared turn(s) chosen has assistant, user, assistant and rejected "
                               "assistant, user, assistant (expected one assistant turn each)")


def test_trl_explicit_rows_still_read_as_they_are():
    plain = {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}    # trl-lib explicit, standard
    conversational = {"prompt": [user("What color is the sky?")], "chosen": [assistant("It is blue.")],
                      "rejected": [assistant("It is green.")]}
    write_jsonl("explicit.jsonl", [plain, conversational])
    assert load_rows("explicit.jsonl", "preference") == [plain, conversational]
    assert shapes.detect(conversational, "preference", "x").name == "explicit"


HH_TURNS = ("\n\nHuman: What kind of noises did dinosaurs make?\n\nAssistant: Humans and dinosaurs didn’t live at the "
            "same time, so it’s really hard to say. The best place to find out what noises dinosaurs made would be"
            "\n\nHuman: yes they did\n\nAssistant: to guess, and that would probably require lots of reading and a "
            "certain amount of imagination, so we’re not really prepared to do that.\n\nHuman: you cant read")
HH = [  # Anthropic/hh-rlhf (helpful-base): chosen and rejected, nothing else
    {"chosen": HH_TURNS + "\n\nAssistant: You can read?",
     "rejected": HH_TURNS + "\n\nAssistant: there’s a lot of stuff humans don’t know"},
    {"chosen": "\n\nHuman: Can you give me a simple pancake recipe?\n\nAssistant: Sure. You will need:\n\n1 cup of "
               "flour\n1 egg\n1 cup of milk\n\nWhisk them together and fry a ladleful at a time.",
     "rejected": "\n\nHuman: Can you give me a simple pancake recipe?\n\nAssistant: Pancakes are made in a pan."}]


def test_hh_rlhf_strings_parse_into_a_prompt_and_final_assistant_turns():
    write_jsonl("hh.jsonl", HH)
    rows = load_rows("hh.jsonl", "preference")
    assert rows[0] == {
        "prompt": [{"role": "user", "content": "What kind of noises did dinosaurs make?"},
                   {"role": "assistant", "content": "Humans and dinosaurs didn’t live at the same time, so it’s really "
                    "hard to say. The best place to find out what noises dinosaurs made would be"},
                   {"role": "user", "content": "yes they did"},
                   {"role": "assistant", "content": "to guess, and that would probably require lots of reading and a "
                    "certain amount of imagination, so we’re not really prepared to do that."},
                   {"role": "user", "content": "you cant read"}],
        "chosen": [{"role": "assistant", "content": "You can read?"}],
        "rejected": [{"role": "assistant", "content": "there’s a lot of stuff humans don’t know"}]}
    assert rows[1] == {   # blank lines inside an answer stay in it
        "prompt": [{"role": "user", "content": "Can you give me a simple pancake recipe?"}],
        "chosen": [{"role": "assistant", "content": "Sure. You will need:\n\n1 cup of flour\n1 egg\n1 cup of milk\n\n"
                                                    "Whisk them together and fry a ladleful at a time."}],
        "rejected": [{"role": "assistant", "content": "Pancakes are made in a pan."}]}
    write_jsonl("one-sided.jsonl", [{"chosen": "No human turn here.", "rejected": HH[0]["rejected"]}])
    with pytest.raises(DataError, match=r"^one-sided.jsonl line 1: field 'chosen' does not start with a "
                                        r"\"\\n\\nHuman:\" turn"):
        load_rows("one-sided.jsonl", "preference")


# ---- prompts: GSM8K and MATH, checked by the verifiers ------------------------------------------

GSM8K = [  # openai/gsm8k (main): question, answer with <<calculator>> annotations and '#### N'
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
               "in April and May.\n#### 72"},
    {"question": "A bakery sells 1,250 loaves a day at $2 each. How many dollars does it take in over 30 days?",
     "answer": "Each day it takes in 1,250*2 = $<<1250*2=2500>>2,500.\nOver 30 days it takes in 2,500*30 = "
               "$<<2500*30=75000>>75,000.\n#### 75,000"}]


def test_gsm8k_rows_become_prompts_with_the_final_number_as_answer():
    write_jsonl("gsm8k.jsonl", GSM8K)
    rows = load_rows("gsm8k.jsonl", "prompt")
    assert rows == [{"prompt": GSM8K[0]["question"], "answer": "72"}, {"prompt": GSM8K[1]["question"], "answer": "75000"}]
    answers = [r["answer"] for r in rows]
    completions = ["She sold 24 in May, so 48 + 24 = 72.\n#### 72", "It takes in $75,000."]
    assert math_match([r["prompt"] for r in rows], completions, answer=answers) == [1.0, 1.0]
    assert answer_match([r["prompt"] for r in rows], ["So the answer is 72.", "75,000"], answer=answers) == [1.0, 0.0]
    assert math_match([rows[0]["prompt"]], ["48 + 24 = 73"], answer=["72"]) == [0.0]
    write_jsonl("plain.jsonl", [{"question": "Capital of France?", "answer": "Paris"}])
    with pytest.raises(DataError, match=r"^plain.jsonl line 1: field 'answer' has no final '#### <answer>' line"):
        load_rows("plain.jsonl", "prompt")


MATH = [  # hendrycks competition_math: problem, level, type, solution with \boxed{...}
    {"problem": "What is the value of $\\sqrt{36 \\times \\sqrt{16}}$?", "level": "Level 1", "type": "Prealgebra",
     "solution": "Calculating from the inside out, $$\\sqrt{36 \\times \\sqrt{16}} = \\sqrt{36 \\times 4} = "
                 "\\sqrt{144} = \\boxed{12}.$$"},
    {"problem": "Find $\\cos 45^\\circ$ divided by $\\sin 90^\\circ$.", "level": "Level 2", "type": "Precalculus",
     "solution": "We have $\\sin 90^\\circ = \\boxed{1}$ (not the answer) and $\\cos 45^\\circ = "
                 "\\frac{1}{\\sqrt{2}}$, so the quotient is $\\boxed{\\frac{1}{\\sqrt{2}}}$."}]
MATH_500 = {   # HuggingFaceH4/MATH-500: its own answer column, an integer level
    "problem": "Compute $\\dbinom{8}{4}$.", "solution": "$\\dbinom{8}{4} = \\frac{8!}{4!4!} = \\boxed{70}.$",
    "answer": "70", "subject": "Counting & Probability", "level": 2, "unique_id": "test/counting_and_probability/1.json"}


def test_math_rows_take_the_last_boxed_answer_with_nested_braces():
    write_jsonl("math.jsonl", MATH + [MATH_500])
    rows = load_rows("math.jsonl", "prompt")
    assert rows == [
        {"prompt": MATH[0]["problem"], "answer": "12", "level": "Level 1", "type": "Prealgebra"},
        {"prompt": MATH[1]["problem"], "answer": "\\frac{1}{\\sqrt{2}}", "level": "Level 2", "type": "Precalculus"},
        {"prompt": MATH_500["problem"], "answer": "70", "subject": "Counting & Probability", "level": 2,
         "unique_id": "test/counting_and_probability/1.json"}]
    completions = ["The root is $\\boxed{12}$.", "So it is $\\boxed{\\dfrac{1}{\\sqrt{2}}}$.", "It is \\boxed{35}."]
    assert math_match([r["prompt"] for r in rows], completions, answer=[r["answer"] for r in rows]) == [1.0, 1.0, 0.0]
    # OpenR1-Math rows give GRPO prompts too
    assert load_rows(write_jsonl("r1.jsonl", [OPENR1]), "prompt") == [
        {"prompt": OPENR1["problem"], "answer": "5", **{k: v for k, v in KEPT.items() if k != "answer"}}]


# ---- feedback: trl-lib/kto-mix-14k (TRL unpaired preference) -------------------------------------

KTO_MIX = [    # trl-lib/kto-mix-14k: prompt and completion message lists, label a boolean
    {"prompt": [user("Which planet is known as the red planet?")], "completion": [assistant("Mars.")], "label": True},
    {"prompt": [user("Which planet is known as the red planet?")], "completion": [assistant("Venus.")], "label": False}]


def test_kto_mix_rows_are_feedback_rows_in_jsonl_csv_and_parquet():
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = {"prompt": "Name a prime.", "completion": "7", "label": True, "source": "thumbs"}   # extras ride along
    write_jsonl("kto.jsonl", KTO_MIX + [plain])
    assert load_rows("kto.jsonl", "feedback") == KTO_MIX + [plain]
    for shape in ("auto", "kto-mix", "unpaired"):
        assert [row for _, row in iter_rows(Source(path="kto.jsonl", shape=shape), "feedback")] == KTO_MIX + [plain]
    pq.write_table(pa.Table.from_pylist(KTO_MIX), "kto.parquet")
    assert [row for _, row in iter_rows(Source(path="kto.parquet"), "feedback")] == KTO_MIX
    with open("kto.csv", "w", newline="") as handle:       # cells are text: JSON message lists, true/false
        writer = csv.writer(handle)
        writer.writerow(["prompt", "completion", "label"])
        writer.writerows([json.dumps(r["prompt"]), json.dumps(r["completion"]), str(r["label"]).lower()] for r in KTO_MIX)
    assert [row for _, row in iter_rows(Source(path="kto.csv"), "feedback")] == KTO_MIX
    write_jsonl("bad.jsonl", [KTO_MIX[0], {**KTO_MIX[1], "label": "yes"}])
    with pytest.raises(DataError, match=r"^bad.jsonl line 2: field 'label' must be true \(a desirable answer\) or "
                                        r"false, found 'yes'$"):
        list(iter_rows(Source(path="bad.jsonl"), "feedback"))
    write_jsonl("pairs.jsonl", [ULTRAFEEDBACK])            # pairs belong under prefs
    with pytest.raises(DataError, match=r"^pairs.jsonl line 1: a feedback row needs prompt\+completion\+label .*; "
                                        r"preference pairs go under sources.prefs"):
        list(iter_rows(Source(path="pairs.jsonl"), "feedback"))
    with pytest.raises(RecipeError, match=r"'kto-mix' makes feedback rows, not preference rows"):
        iter_rows(Source(path="kto.jsonl", shape="kto-mix"), "preference")


# ---- rows that fit no shape, or several -----------------------------------------------------------

def test_unrecognised_and_ambiguous_rows_name_the_row_its_keys_and_the_shapes():
    write_jsonl("raw/p.jsonl", [ULTRAFEEDBACK, HH[0], {"chosen": "It is fine.", "score": 3}])
    with pytest.raises(DataError) as info:
        load_rows("raw/p.jsonl", "preference")
    assert str(info.value) == ('raw/p.jsonl line 3: a preference row needs prompt+chosen+rejected (TRL explicit), '
                               'chosen+rejected conversations (TRL implicit), or HH-style strings with "\\n\\nHuman:" '
                               'turns; found keys chosen, score')
    both = {**GSM8K[0], **MATH[0]}
    write_jsonl("raw/q.jsonl", [GSM8K[1], both])
    with pytest.raises(DataError) as info:
        load_rows("raw/q.jsonl", "prompt")
    assert str(info.value) == ("raw/q.jsonl line 2: the row fits several shapes, gsm8k (question+answer) and math "
                               "(problem+solution); name one with shape: on its source, or keep one layout's columns; "
                               "found keys question, answer, problem, level, type, solution")
    # a named shape settles it, in shape: or in format: (the file format is then told by the extension)
    for source in (Source(path="raw/q.jsonl", shape="math"), Source(path="raw/q.jsonl", format="math")):
        with pytest.raises(DataError, match=r"^raw/q.jsonl line 1: field 'problem' is missing \(a math row has "
                                            r"problem, solution; found keys question, answer\)$"):
            list(iter_rows(source, "prompt"))
    assert list(iter_rows(Source(path="raw/q.jsonl", format="gsm8k"), "prompt"))[1] == (   # the rest rides along
        "raw/q.jsonl line 2", {"prompt": GSM8K[0]["question"], "answer": "72", **MATH[0]})
    with pytest.raises(RecipeError, match=r"^raw/q.jsonl: shape: 'gsm8k' makes prompt rows, not preference rows"):
        iter_rows(Source(path="raw/q.jsonl", shape="gsm8k"), "preference")
    with pytest.raises(RecipeError, match=r"unknown shape 'ultrafeedbak' \(did you mean 'ultrafeedback'\?\)"):
        iter_rows(Source(path="raw/p.jsonl", shape="ultrafeedbak"), "preference")


def test_parquet_columns_of_a_published_shape_pass_the_file_check():
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(HH), "hh.parquet")
    assert [r["chosen"] for _, r in iter_rows(Source(path="hh.parquet"), "preference")] == [
        [{"role": "assistant", "content": "You can read?"}],
        [{"role": "assistant", "content": HH[1]["chosen"].split("Assistant: ", 1)[1]}]]
    pq.write_table(pa.Table.from_pylist([{"q": "2+2?", "a": "4"}]), "qa.parquet")
    with pytest.raises(DataError) as info:
        list(iter_rows(Source(path="qa.parquet"), "prompt"))
    assert str(info.value) == ("qa.parquet: no column 'prompt' (expected prompt; columns present: q, a); map one with "
                               "columns: {prompt: <column>}, or give a published shape's columns (question+answer "
                               "(gsm8k), problem+solution (math))")


# ---- data prepare ---------------------------------------------------------------------------------

def test_data_prepare_reads_published_shapes_into_its_shards(tmp_path):
    from smolforge.data.shards import kind_files, read_files

    sources = {"sft": [{"path": write_jsonl("smoltalk.jsonl", [SMOLTALK, PERSONA]), "shape": "smoltalk"}],
               "prefs": [write_jsonl("uf.jsonl", [ULTRAFEEDBACK]), {"path": write_jsonl("hh.jsonl", HH), "format": "hh"}],
               "prompts": [write_jsonl("gsm8k.jsonl", GSM8K)]}
    run = run_stage("data", Runs(tmp_path / "runs"), name="data-shapes", sources=sources,
                    pack={"enabled": False}, tokenizer={"vocab_size": 300})
    prefs = [row for _, row in read_files(kind_files(run.path, "prefs"))]
    assert prefs == load_rows("uf.jsonl", "preference") + load_rows("hh.jsonl", "preference")
    assert [row["answer"] for _, row in read_files(kind_files(run.path, "prompts"))] == ["72", "75000"]
    sft = [row for _, row in read_files(kind_files(run.path, "sft"))]
    assert [set(row) for row in sft] == [{"messages", "source"}, {"messages", "id"}]
