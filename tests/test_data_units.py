"""The embedded data path alone: synthetic world, held-out eval phrasings, tokenizer, packing, JSONL."""
from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from smolforge.data.jsonl import read_jsonl, write_jsonl
from smolforge.data.packing import IGNORE_INDEX, pack_documents, packing_efficiency
from smolforge.data.schemas import load_rows, validate_row
from smolforge.data.synthetic import (ANSWERS, ARITH_ANSWER, ARITH_QUESTIONS, ARITH_RANGE, ATTRIBUTES,
                            EVAL_ARITH_CONTEXT, EVAL_ARITH_QUESTION, EVAL_CONTEXTS, EVAL_QUESTIONS,
                            PREFIXES, QUESTIONS, World, chat_text)
from smolforge.data.tokenizer import DOC_SEPARATOR, SPECIAL_TOKENS, train_tokenizer
from smolforge.evals.suite import SUITES_DIR, load_suite, write_embedded
from smolforge.errors import DataError

EVAL_LEADS = ("Everyone knows that", "Do you know")


@pytest.fixture(scope="module")
def world() -> World:
    return World.generate(seed=0, n_entities=40)


@pytest.fixture(scope="module")
def tokenizer():
    small = World.generate(seed=0, n_entities=8)
    texts = [d["text"] for d in small.pretrain_corpus(n_docs=300)]
    texts += [chat_text(c["messages"]) for c in small.sft_conversations()]
    return train_tokenizer(texts, vocab_size=400)


def correct_answers(world: World) -> dict[str, str]:
    """Every training-phrased question → its correct answer, built from the templates directly."""
    table = {}
    for entity in world.entities:
        for attribute in ATTRIBUTES:
            value = world.value(entity, attribute)
            for template in QUESTIONS[attribute]:
                table[template.format(e=entity)] = ANSWERS[attribute].format(e=entity, v=value)
    for a in ARITH_RANGE:
        for b in ARITH_RANGE:
            for template in ARITH_QUESTIONS:
                table[template.format(a=a, b=b)] = ARITH_ANSWER.format(a=a, b=b, c=a + b)
    return table


# ---- synthetic world ------------------------------------------------------------------------

def test_world_is_deterministic_per_seed_and_differs_across_seeds():
    assert World.generate(seed=0, n_entities=40) == World.generate(seed=0, n_entities=40)
    first, other = World.generate(seed=0, n_entities=40), World.generate(seed=1, n_entities=40)
    assert first.entities != other.entities
    assert first.facts != other.facts
    assert first.pretrain_corpus(n_docs=50) == World.generate(0, 40).pretrain_corpus(n_docs=50)
    assert first.sft_conversations() == World.generate(0, 40).sft_conversations()
    assert first.preference_pairs(n_pairs=50) == World.generate(0, 40).preference_pairs(n_pairs=50)


def test_every_entity_has_one_value_per_attribute(world):
    assert len(world.entities) == 40 and len(set(world.entities)) == 40
    per_key = Counter((e, a) for e, a, _ in world.facts)
    assert set(per_key) == {(e, a) for e in world.entities for a in ATTRIBUTES}
    assert set(per_key.values()) == {1}
    for entity, attribute, value in world.facts:
        assert value in ATTRIBUTES[attribute]
        assert world.value(entity, attribute) == value


def test_eval_phrasings_never_occur_in_training_text(world):
    suite = world.eval_suite()
    eval_strings = {row["context"] for row in suite["facts"] + suite["arith"]}
    eval_strings |= {row["question"] for row in suite["instruct"] + suite["prefs"]}
    # The held-out frames really are what the suite asks with (else the check below proves nothing).
    assert all(s.startswith(EVAL_LEADS) for s in eval_strings)
    assert any(s.startswith(EVAL_LEADS[0]) for s in eval_strings)
    assert any(s.startswith(EVAL_LEADS[1]) for s in eval_strings)

    pretrain = [d["text"] for d in world.pretrain_corpus()]
    sft_user = [m["content"] for c in world.sft_conversations() for m in c["messages"] if m["role"] == "user"]
    sft_all = [m["content"] for c in world.sft_conversations() for m in c["messages"]]
    prompts = [m["content"] for p in world.preference_pairs() for m in p["prompt"]]
    responses = [m["content"] for p in world.preference_pairs() for m in p["chosen"] + p["rejected"]]
    assert pretrain and sft_user and prompts
    training = "\n".join(pretrain + sft_all + prompts + responses)
    lowered = training.lower()
    for lead in EVAL_LEADS:
        assert lead.lower() not in lowered, f"held-out frame {lead!r} leaks into training text"
    for template in [*EVAL_CONTEXTS.values(), EVAL_ARITH_CONTEXT, *EVAL_QUESTIONS.values(), EVAL_ARITH_QUESTION]:
        lead = template.split("{")[0].strip()
        assert lead and lead.lower() not in lowered, f"held-out frame {template!r} leaks into training"
    leaked = [s for s in eval_strings if s in training]
    assert not leaked, f"eval strings found in training text: {leaked[:3]}"


def test_preference_pairs_prefer_the_correct_answer(world):
    pairs = world.preference_pairs()
    table = correct_answers(world)
    assert len(pairs) == 400
    led_in = 0
    for pair in pairs:
        assert pair["chosen"] != pair["rejected"]
        [question] = pair["prompt"]
        assert question["role"] == "user"
        content = question["content"]
        prefix = next((p for p in PREFIXES if content.startswith(p)), "")
        led_in += bool(prefix)
        content = content[len(prefix):]  # SFT's lead-ins ("Quick question: ") may precede it
        assert content in table, f"prompt is not a training phrasing: {question['content']!r}"
        correct = table[content]
        assert pair["chosen"] == [{"role": "assistant", "content": correct}]
        [rejected] = pair["rejected"]
        assert rejected["role"] == "assistant" and rejected["content"] != correct
    assert 0.15 < led_in / len(pairs) < 0.35  # about a quarter, like SFT's fourth phrasing
    # Both facts and sums are asked about.
    sums = {t.format(a=a, b=b) for t in ARITH_QUESTIONS for a in ARITH_RANGE for b in ARITH_RANGE}
    kinds = {"arith" if any(pair["prompt"][0]["content"].endswith(q) for q in sums) else "fact"
             for pair in pairs}
    assert kinds == {"arith", "fact"}


def test_preference_pairs_pass_the_preference_schema(world, tmp_path):
    path = tmp_path / "prefs.jsonl"
    write_jsonl(path, world.preference_pairs(n_pairs=60))
    assert len(load_rows(path, "preference")) == 60


def test_sft_asks_every_answer_in_at_least_three_phrasings(world):
    conversations = world.sft_conversations()
    table = correct_answers(world)
    phrasings: dict[str, set[str]] = defaultdict(set)
    for conv in conversations:
        [user, assistant] = conv["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        phrasings[assistant["content"]].add(user["content"])
    expected_answers = set(table.values())
    assert set(phrasings) == expected_answers  # every fact and every sum is taught
    assert min(len(qs) for qs in phrasings.values()) >= 3
    # The three training templates themselves are all present for every answer.
    by_answer: dict[str, set[str]] = defaultdict(set)
    for question, answer in table.items():
        by_answer[answer].add(question)
    for answer, questions in by_answer.items():
        assert len(questions) == 3
        assert questions <= phrasings[answer]
    # Each user turn answers to the right answer (no mix-ups between entities).
    for conv in conversations:
        user, assistant = conv["messages"]
        if user["content"] in table:
            assert table[user["content"]] == assistant["content"]


# ---- embedded evaluation suite ----------------------------------------------------------------

def test_committed_embedded_suite_equals_a_fresh_write(tmp_path):
    write_embedded(tmp_path, seed=0, entities=40)
    committed = SUITES_DIR / "embedded"
    stems = sorted(p.stem for p in tmp_path.glob("*.jsonl"))
    assert stems == ["arith", "facts", "instruct", "prefs", "reason"]
    assert sorted(p.stem for p in committed.glob("*.jsonl")) == stems
    for stem in stems:
        fresh = (tmp_path / f"{stem}.jsonl").read_bytes()
        assert fresh, stem
        assert (committed / f"{stem}.jsonl").read_bytes() == fresh, f"{stem}.jsonl is stale; run python -m smolforge.evals.suite --write-embedded"


def test_committed_embedded_suite_matches_the_default_world(world):
    rows = world.eval_suite()
    for stem, expected in rows.items():
        got = [row for _, row in read_jsonl(SUITES_DIR / "embedded" / f"{stem}.jsonl")]
        assert got == expected, stem


def test_embedded_suite_reports_random_baselines():
    suite = load_suite("embedded")
    assert sorted(suite.tasks) == ["arith", "facts", "instruct", "prefs", "reason"]
    baselines = {name: task.random_baseline for name, task in suite.tasks.items()}
    assert baselines == {"facts": 0.125, "arith": 0.25, "instruct": 0.0, "prefs": 0.5, "reason": 0.0}
    assert suite.tasks["instruct"].chat and suite.tasks["prefs"].chat
    assert not suite.tasks["facts"].chat and not suite.tasks["arith"].chat
    assert suite.tasks["facts"].size == 120 and suite.tasks["arith"].size == 100
    for task in suite.tasks.values():
        for data_file in task.config["dataset_kwargs"]["data_files"].values():
            assert Path(data_file).is_absolute() and Path(data_file).is_file()


def test_eval_suite_golds_point_at_the_true_value(world):
    suite = world.eval_suite()
    for row in suite["facts"]:
        entity = next(e for e in world.entities if EVAL_CONTEXTS[row["kind"]].format(e=e) == row["context"])
        assert row["choices"][row["gold"]] == " " + world.value(entity, row["kind"])
    for row in suite["arith"]:
        [(a, b)] = [(a, b) for a in ARITH_RANGE for b in ARITH_RANGE
                    if EVAL_ARITH_CONTEXT.format(a=a, b=b) == row["context"]]
        assert row["choices"][row["gold"]] == f" {a + b}" and len(set(row["choices"])) == 4
    for row in suite["prefs"]:
        assert row["gold"] == 0 and row["choices"][0] != row["choices"][1]


# ---- tokenizer -----------------------------------------------------------------------------------

def test_tokenizer_round_trips_text(tokenizer):
    for text in ["Kalo likes the color red.", "3 plus 4 is 7.", "  Unseen wörds, ünïcode ✓ and tabs\t!",
                 "line one\nline two", ""]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_special_tokens_are_single_ids(tokenizer):
    ids = [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS)
    for token, token_id in zip(SPECIAL_TOKENS, ids):
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [token_id]
        encoded = tokenizer(f"red{token}blue", add_special_tokens=False)["input_ids"]
        assert encoded.count(token_id) == 1
        assert tokenizer.decode(encoded) == f"red{token}blue"
    assert tokenizer.convert_tokens_to_ids(DOC_SEPARATOR) in ids


def test_eos_is_im_end_and_pad_is_pad(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What does Kalo eat?"},
    {"role": "assistant", "content": "Kalo eats plums."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "2 plus 3 is 5."},
]


def assistant_text(tokenizer, conversation) -> tuple[str, list[int], list[int]]:
    out = tokenizer.apply_chat_template(conversation, return_assistant_tokens_mask=True,
                                        return_dict=True, tokenize=True)
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    assert len(ids) == len(mask)
    return tokenizer.decode([i for i, m in zip(ids, mask) if m]), ids, mask


def test_chat_template_masks_exactly_the_assistant_turns(tokenizer):
    masked, ids, mask = assistant_text(tokenizer, CONVERSATION)
    assert masked == "Kalo eats plums.<|im_end|>2 plus 3 is 5.<|im_end|>"
    unmasked = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    assert "Kalo eats plums." not in unmasked and "<|im_start|>assistant\n" in unmasked
    assert "What does Kalo eat?" in unmasked and "Answer briefly." in unmasked
    # Two contiguous masked spans, each ending on <|im_end|>.
    starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
    ends = [i for i in range(len(mask)) if mask[i] and (i + 1 == len(mask) or not mask[i + 1])]
    assert len(starts) == 2
    assert all(ids[e] == tokenizer.eos_token_id for e in ends)


def test_chat_template_renders_chatml_with_generation_prompt(tokenizer):
    text = tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nAnswer briefly.<|im_end|>\n"
                    "<|im_start|>user\nWhat does Kalo eat?<|im_end|>\n<|im_start|>assistant\n")


def test_saved_tokenizer_keeps_the_chat_template(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.chat_template == tokenizer.chat_template
    assert "{% generation %}" in reloaded.chat_template
    assert reloaded.eos_token == "<|im_end|>" and reloaded.pad_token == "<|pad|>"
    masked, ids, mask = assistant_text(reloaded, CONVERSATION)
    assert masked == "Kalo eats plums.<|im_end|>2 plus 3 is 5.<|im_end|>"
    assert (ids, mask) == assistant_text(tokenizer, CONVERSATION)[1:]
    text = "Kalo lives in Quonda.<|endoftext|>3 plus 4 is 7."
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]


# ---- packing ---------------------------------------------------------------------------------------

def random_documents(lengths, seed=0, separator=0):
    rng = random.Random(seed)
    return [[rng.randrange(4, 300) for _ in range(n - 1)] + [separator] for n in lengths]


def document_starts(documents):
    """Offsets in the flat token stream where each document begins."""
    starts, offset = set(), 0
    for doc in documents:
        starts.add(offset)
        offset += len(doc)
    return starts


@pytest.mark.parametrize("seq_len", [8, 16, 37])
def test_packing_restarts_positions_and_masks_first_tokens(seq_len):
    docs = random_documents([5, 12, 3, 40, 9, 1, 17, 22], seed=seq_len)
    rows = pack_documents(docs, seq_len)
    flat = [t for d in docs for t in d]
    assert len(rows) == len(flat) // seq_len
    assert all(len(r[k]) == seq_len for r in rows for k in ("input_ids", "position_ids", "labels"))
    # Concatenated rows are the concatenated documents minus the dropped tail.
    assert [t for r in rows for t in r["input_ids"]] == flat[:len(rows) * seq_len]
    doc_starts = document_starts(docs)
    for r_index, row in enumerate(rows):
        for i in range(seq_len):
            at = r_index * seq_len + i
            restart = at in doc_starts or i == 0
            expected_pos = 0 if restart else row["position_ids"][i - 1] + 1
            assert row["position_ids"][i] == expected_pos, (r_index, i)
            if at in doc_starts:
                assert row["position_ids"][i] == 0 and row["labels"][i] == IGNORE_INDEX
            if row["position_ids"][i] == 0:
                assert row["labels"][i] == IGNORE_INDEX
            else:
                assert row["labels"][i] == row["input_ids"][i]
    assert packing_efficiency(rows, seq_len) == 1.0


def test_packing_matches_the_documented_example():
    rows = pack_documents([[5, 6, 0], [7, 8, 9, 0]], seq_len=4)
    assert rows == [{"input_ids": [5, 6, 0, 7], "position_ids": [0, 1, 2, 0], "labels": [-100, 6, 0, -100]}]


def test_document_longer_than_seq_len_is_split():
    doc = list(range(1, 41))
    rows = pack_documents([doc], seq_len=16)
    assert [r["input_ids"] for r in rows] == [doc[:16], doc[16:32]]
    assert all(r["position_ids"] == list(range(16)) for r in rows)
    assert all(r["labels"][0] == IGNORE_INDEX and r["labels"][1:] == r["input_ids"][1:] for r in rows)
    kept = pack_documents([doc], seq_len=16, drop_last=False)
    assert [t for r in kept for t in r["input_ids"]] == doc
    assert len(kept[-1]["input_ids"]) == 8
    assert packing_efficiency(kept, 16) == pytest.approx(40 / 48)
    assert packing_efficiency([], 16) == 0.0


def test_whole_document_packing_never_cuts_a_document_that_fits():
    docs = random_documents([30, 50, 20, 70, 64, 10, 90], seed=3)
    rows = pack_documents(docs, seq_len=64, pad_id=1, drop_last=False)
    pieces = []
    for row in rows:
        starts = [i for i, p in enumerate(row["position_ids"]) if p == 0]
        for start, end in zip(starts, starts[1:] + [64]):
            piece = row["input_ids"][start:end]
            if piece != [1]:                                  # padding: one token per "document", never learnt
                pieces.append(piece)
            else:
                assert row["labels"][start] == IGNORE_INDEX
    fitting = [d for d in docs if len(d) <= 64]
    assert all(d in pieces for d in fitting)                # each fitting document whole, in one row
    assert [t for piece in pieces for t in piece] == [t for d in docs for t in d]   # nothing lost, order kept
    assert pack_documents(docs, seq_len=64)[0]["input_ids"][30:64] == docs[1][:34]   # default: cut, no padding


def test_packing_rejects_seq_len_below_two():
    with pytest.raises(ValueError, match="seq_len"):
        pack_documents([[1, 2, 3]], seq_len=1)


# ---- JSONL and schemas -----------------------------------------------------------------------------

def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD_PREF = {"prompt": "Q?", "chosen": "yes", "rejected": "no"}


def test_malformed_json_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", ['{"text": "a"}', '{"text": "b"}', '{"text": "c"', '{"text": "d"}'])
    with pytest.raises(DataError) as err:
        load_rows(path, "text")
    assert str(path) in str(err.value) and "line 3" in str(err.value)
    assert "not valid JSON" in str(err.value)


def test_missing_rejected_names_line_and_field(tmp_path):
    rows = [json.dumps(GOOD_PREF)] * 4 + [json.dumps({"prompt": "Q?", "chosen": "yes"})]
    path = write_lines(tmp_path / "prefs.jsonl", rows)
    with pytest.raises(DataError) as err:
        load_rows(path, "preference")
    message = str(err.value)
    assert str(path) in message and "line 5" in message
    assert "field 'rejected' is missing" in message


def test_blank_lines_keep_line_numbers_true(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", ['{"text": "a"}', "", '{"text": 3}'])
    with pytest.raises(DataError, match="line 3: field 'text'"):
        load_rows(path, "text")


def test_identical_chosen_and_rejected_is_an_error(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "Q?", "chosen": "same", "rejected": "same"})])
    with pytest.raises(DataError, match="line 1: fields 'chosen' and 'rejected' are identical"):
        load_rows(path, "preference")
    conversational = {"prompt": [{"role": "user", "content": "Q?"}],
                      "chosen": [{"role": "assistant", "content": "A."}],
                      "rejected": [{"role": "assistant", "content": "A."}]}
    with pytest.raises(DataError, match="identical"):
        validate_row(conversational, "preference", "x.jsonl line 7")


def test_wrong_role_names_the_field(tmp_path):
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]}
    path = write_lines(tmp_path / "c.jsonl", [json.dumps(row)])
    with pytest.raises(DataError) as err:
        load_rows(path, "chat")
    message = str(err.value)
    assert "line 1" in message and "messages[1].role" in message and "'bot'" in message


def test_chat_without_assistant_turn_is_an_error():
    with pytest.raises(DataError, match="no assistant turn"):
        validate_row({"messages": [{"role": "user", "content": "hi"}]}, "chat", "f line 1")


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DataError) as err:
        load_rows(path, "chat")
    assert str(path) in str(err.value) and "no rows" in str(err.value)


def test_non_object_line_is_an_error(tmp_path):
    path = write_lines(tmp_path / "list.jsonl", ['{"text": "a"}', '["text", "b"]'])
    with pytest.raises(DataError) as err:
        load_rows(path, "text")
    assert "line 2" in str(err.value) and "expected a JSON object" in str(err.value)


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_rows(tmp_path / "nope.jsonl", "text")


def test_valid_rows_of_every_schema_load(tmp_path):
    chat = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                         {"role": "assistant", "content": "a"}]}
    for schema, row in [("text", {"text": "hello"}), ("chat", chat), ("preference", GOOD_PREF)]:
        path = write_lines(tmp_path / f"{schema}.jsonl", [json.dumps(row)] * 3)
        assert load_rows(path, schema) == [row] * 3
    with pytest.raises(ValueError, match="unknown schema"):
        load_rows(tmp_path / "text.jsonl", "pairs")


def test_write_jsonl_replaces_atomically_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "rows.jsonl"
    write_jsonl(path, [{"text": "first"}, {"text": "ünï"}])
    assert [r for _, r in read_jsonl(path)] == [{"text": "first"}, {"text": "ünï"}]
    write_jsonl(path, [{"text": "second"}])
    assert [r for _, r in read_jsonl(path)] == [{"text": "second"}]
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.jsonl"]

    def failing():
        yield {"text": "partial"}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_jsonl(path, failing())
    assert [r for _, r in read_jsonl(path)] == [{"text": "second"}]  # old content intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.jsonl"]


# ---- long documents and multi-step sums ---------------------------------------------------------

def test_multi_step_sums_hold_out_their_eval_problems_and_traces_add_up(world):
    from smolforge.data.synthetic import REASON_QUESTION

    train, heldout = World.reasoning_problems("train"), World.reasoning_problems("heldout")
    problems = lambda rows: {(r["a"], r["b"], r["c"], r["d"]) for r in rows}  # noqa: E731
    assert not problems(train) & problems(heldout) and (len(train), len(heldout)) == (700, 66)
    for row in train + heldout:
        a, b, c, d = row["a"], row["b"], row["c"], row["d"]
        assert row["trace"] == (f"<think>\n{a} plus {b} is {a + b}. {a + b} plus {c} is {a + b + c}. "
                                f"{a + b + c} plus {d} is {a + b + c + d}.\n</think>\n")
        assert a + b + c <= 9 and row["answer"] == f"The answer is {a + b + c + d}."   # each step: two digits
    conversations = world.sft_conversations(reasoning=True)
    reasoning = [c for c in conversations if c["messages"][0]["role"] == "system"
                 and c["messages"][1]["content"].count("plus") == 3]
    assert len(reasoning) == 2 * len(train)
    for conv in reasoning:
        system, user, assistant = conv["messages"]
        assert user["content"] in {REASON_QUESTION.format(**r) for r in train}
        assert assistant["content"].startswith("<think>") == (system["content"] == "/think")
    eval_rows = world.eval_suite()["reason"]
    assert [r["question"] for r in eval_rows] == [REASON_QUESTION.format(**r) for r in heldout]
    assert len(world.sft_conversations()) == len(conversations) - len(reasoning)   # without reasoning: as before


def test_long_documents_need_their_far_context():
    import re

    docs = World.generate(seed=0, n_entities=8).long_documents(n_docs=4, n_words=300, seed=1)
    assert {d["domain"] for d in docs} == {"long"} and all(len(d["text"].split()) >= 280 for d in docs)
    ledger, hidden = docs[0]["text"], docs[1]["text"]
    listed, again = ledger.split(" Again: ")
    records = lambda text: re.findall(r"Box (\d+) holds (\d+)\.", text)  # noqa: E731
    assert sorted(records(listed)) == sorted(records(again)) and records(listed) != records(again)
    key = re.search(r"The pass key is (\d+)\. Remember it\.", hidden).group(1)
    assert hidden.endswith(f"What is the pass key? The pass key is {key}.")


def test_committed_longctx_suite_equals_a_fresh_write(tmp_path):
    from smolforge.evals.suite import write_longctx

    write_longctx(tmp_path)
    for fresh in tmp_path.glob("*.jsonl"):
        assert (SUITES_DIR / "longctx" / fresh.name).read_bytes() == fresh.read_bytes(), fresh.name
    suite = load_suite("longctx")
    assert sorted(suite.tasks) == ["passkey_1024", "passkey_256", "passkey_512", "position_ppl"]
    assert suite.tasks["position_ppl"].kind == "position_perplexity" and suite.tasks["position_ppl"].primary == "ppl@512-1024"
    for name in ("passkey_256", "passkey_512", "passkey_1024"):
        assert suite.tasks[name].random_baseline == 0.25
        for _, row in read_jsonl(SUITES_DIR / "longctx" / f"{name}.jsonl"):
            assert f"The pass key is{row['choices'][row['gold']]}." in row["context"]
            assert "Box" not in row["context"] and "favourite" not in row["context"]   # filler no training text holds


def _rss_file_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssFile in /proc/self/status")


def test_reading_packed_rows_leaves_no_file_pages_mapped_in_the_process(tmp_path):
    """400 random rows of a 64 MiB packed corpus (in the page cache, as right after packing): the
    process's file-backed resident set stays where it was, instead of growing by the pages that each
    page fault maps around the row it reads (tens of MiB)."""
    import numpy as np

    from smolforge.data.packed_store import PackedRows


    rows, seq_len = 32768, 256
    ids_path, pos_path = tmp_path / "web.ids.bin", tmp_path / "web.pos.bin"
    np.arange(rows * seq_len, dtype=np.uint32).tofile(ids_path)
    np.tile(np.arange(seq_len, dtype=np.uint16), rows).tofile(pos_path)
    packed = PackedRows(np.memmap(ids_path, dtype=np.uint32, mode="r", shape=(rows, seq_len)),
                        np.memmap(pos_path, dtype=np.uint16, mode="r", shape=(rows, seq_len)))
    packed.read([0])        # the first read imports torch, whose own libraries are file-backed pages too
    before, rng, peak = _rss_file_mib(), random.Random(0), 0.0
    for _ in range(25):
        picks = [rng.randrange(rows) for _ in range(16)]
        batch = packed.read(picks)
        assert batch["input_ids"][0, 0].item() == picks[0] * seq_len     # the rows asked for, in order
        peak = max(peak, _rss_file_mib())
    assert peak - before < 4.0, f"file-backed RSS grew by {peak - before:.1f} MiB"
