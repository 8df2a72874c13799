"""Reward functions for online RL: verifiers, naming rewards in recipes, guards, held-out scoring."""
from __future__ import annotations

import math
import pickle

import pytest

from smolforge.alignment.rewards import (BUILTINS, answer_match, arith_verifier, checked, completion_text, mean_reward,
                               resolve)
from smolforge.errors import DataError, RecipeError


def chat(text):
    return [{"role": "assistant", "content": text}]


def ask(text):
    return [{"role": "user", "content": text}]


# --------------------------------------------------------------------------- answer_match


@pytest.mark.parametrize("completion, expected", [
    ("3 plus 4 is 7.", 1.0),                  # exact
    ("  3 PLUS 4   is 7 !", 1.0),             # case, whitespace, trailing punctuation
    ("Sure. 3 plus 4 is 7", 1.0),             # states the answer at the end
    ("The answer is 7.", 0.5),                # the key value, not the whole answer
    ("3 plus 4 is 8.", 0.0),                  # wrong
    ("3 plus 7 is 10.", 0.0),                 # an operand equal to the value is no credit
    ("3 plus 4 is 17.", 0.0),                 # the value must be a whole word
    ("", 0.0),
    (None, 0.0),
])
def test_answer_match_scores_exact_partial_wrong_and_empty_plain_completions(completion, expected):
    assert answer_match(["Add 3 and 4."], [completion], answer=["3 plus 4 is 7."]) == [expected]


def test_answer_match_reads_conversational_completions_and_fact_values():
    answer = ["The favourite color of Kalo is red."] * 4
    completions = [chat("The favourite color of Kalo is red."), chat("Red."), chat("The favourite color of Kalo is blue."),
                   chat("")]
    assert answer_match([ask("Name the favourite color of Kalo.")] * 4, completions, answer=answer) == [1.0, 0.5, 0.0, 0.0]


def test_answer_match_without_an_answer_column_says_what_it_needs():
    with pytest.raises(DataError, match="needs an 'answer' column"):
        answer_match(["Add 3 and 4."], ["7"])


def test_listing_every_candidate_earns_no_partial_credit():
    listing = "red blue green yellow purple orange white black"
    assert answer_match(["Q"], [listing], answer=["Kalo likes red."]) == [0.0]


# --------------------------------------------------------------------------- arith_verifier


@pytest.mark.parametrize("prompt, completion, expected", [
    ("Add 3 and 4.", "3 plus 4 is 7.", 1.0),
    ("What is 9 plus 8?", chat("It is 17"), 1.0),
    ("Compute 2 + 5.", "2 + 5 = 7", 1.0),
    ("Add 3 and 4.", "3 plus 4 is 8.", 0.0),
    ("Add 3 and 4.", "7 or maybe 8", 0.0),     # the last number counts
    ("Add 3 and 4.", "seven", 0.0),
    ("Add 3 and 4.", None, 0.0),
    ("Where does Kalo live?", "Kesh", None),   # no sum asked: not applicable
])
def test_arith_verifier_recomputes_the_sum_from_the_prompt(prompt, completion, expected):
    assert arith_verifier([ask(prompt)], [completion]) == [expected]
    assert arith_verifier([prompt], [completion]) == [expected]


# --------------------------------------------------------------------------- resolve


def test_resolve_short_names_keep_the_function_name_for_trl_logs():
    for name in BUILTINS:
        reward = resolve(name)
        assert reward.__name__ == name
    assert resolve("arith_verifier")(["Add 1 and 1."], ["2"]) == [1.0]


@pytest.mark.parametrize("spec", ["smolforge.alignment.rewards:answer_match", "smolforge.alignment.rewards.answer_match"])
def test_resolve_dotted_paths(spec):
    reward = resolve(spec)
    assert reward.__name__ == "answer_match"
    assert reward(["Q"], ["Kalo likes red."], answer=["Kalo likes red."]) == [1.0]


def test_unknown_reward_names_the_builtins_and_the_close_match():
    with pytest.raises(RecipeError, match=r"unknown reward 'arith_verfier' \(did you mean 'arith_verifier'\?\)"
                                          r".*answer_match, arith_verifier"):
        resolve("arith_verfier")


def test_dotted_path_to_a_missing_function_suggests_the_close_one():
    with pytest.raises(RecipeError, match=r"has no 'answer_mtch' \(did you mean 'answer_match'\?\)"):
        resolve("smolforge.alignment.rewards:answer_mtch")
    with pytest.raises(RecipeError, match="cannot import module 'no_such_pkg.mod'"):
        resolve("no_such_pkg.mod:fn")


def test_resolve_run_spec_needs_an_existing_run(runs):
    from smolforge.errors import RunError

    with pytest.raises(RunError, match="run 'no-such-reward' not found"):
        resolve("run:no-such-reward", runs)


# --------------------------------------------------------------------------- checked


def test_checked_turns_an_exception_into_a_data_error_naming_the_function_and_prompt():
    def broken(prompts, completions, **kw):
        raise KeyError("oops")

    with pytest.raises(DataError, match=r"reward function 'broken' raised KeyError.*first prompt: 'Add 1 and 2\.'"):
        checked(broken, "broken")([ask("Add 1 and 2.")], ["3"])


def test_checked_rejects_a_result_of_the_wrong_length():
    three = checked(lambda prompts, completions, **kw: [1.0, 0.0, 1.0], "three")
    with pytest.raises(DataError, match=r"reward function 'three' returned 3 values for 4 completions"):
        three(["a"] * 4, ["b"] * 4)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", [1.0]])
def test_checked_rejects_non_finite_and_non_numeric_values(bad):
    fn = checked(lambda prompts, completions, **kw: [0.5, bad], "shaky")
    with pytest.raises(DataError, match=r"reward function 'shaky' returned .* for completion 1"):
        fn(["a", "b"], ["x", "y"])


def test_checked_passes_numbers_and_none_through_and_pickles():
    import numpy as np

    fn = checked(arith_verifier, "arith_verifier")
    assert fn(["Add 1 and 2.", "Hi"], ["3", "x"]) == [1.0, None]
    assert checked(lambda prompts, completions, **kw: [np.float32(0.25), 1])(["a", "b"], ["x", "y"]) == [0.25, 1.0]
    assert pickle.loads(pickle.dumps(fn))(["Add 1 and 2."], ["3"]) == [1.0]


def test_completion_text_of_each_shape():
    assert completion_text("x") == "x"
    assert completion_text(chat("y")) == "y"
    assert completion_text({"role": "assistant", "content": "z"}) == "z"


# --------------------------------------------------------------------------- mean_reward


def test_mean_reward_generates_and_scores_held_out_prompts(sft_run, data_run, runs):
    from smolforge.generation.prompts import load_tokenizer
    from smolforge.data.schemas import load_many, resolve_data
    from transformers import AutoModelForCausalLM

    paths, _ = resolve_data(data_run.name, runs, "prompts")
    rows = load_many(paths, "prompt")
    rows = [r for r in rows if r["kind"] == "arith"][:3] + [r for r in rows if r["kind"] != "arith"][:3]
    model = AutoModelForCausalLM.from_pretrained(sft_run.model_dir)
    tokenizer = load_tokenizer(sft_run.model_dir)

    mean, details = mean_reward(model, tokenizer, rows, [answer_match, "arith_verifier"], max_new_tokens=12)

    assert 0.0 <= mean <= 2.0 and len(details) == 6
    assert {"prompt", "completion", "rewards", "total", "answer", "kind"} <= set(details[0])
    assert details[0]["prompt"] == rows[0]["prompt"][0]["content"]
    assert set(details[0]["rewards"]) == {"answer_match", "arith_verifier"}
    assert all(d["rewards"]["arith_verifier"] is None for d in details[3:])  # fact prompts: not applicable
    assert mean == pytest.approx(sum(d["total"] for d in details) / 6)

    only_answers, _ = mean_reward(model, tokenizer, rows, answer_match, max_new_tokens=12)
    assert 0.0 <= only_answers <= 1.0
    assert not model.training
