"""The built-in suites' sizes and what they can tell (issue 38 item 2): the generated red-team
categories and the grown chat tasks, held out from training, and the table docs/evals.md states."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from smolforge.data.safety import HARMFUL_FRAMES, safety_conversations
from smolforge.errors import RecipeError
from smolforge.evals.power import DOCS, render_power, suite_power, with_power
from smolforge.evals.redteam.suite import load_redteam_suite
from smolforge.evals.redteam.world_items import world_attacks, world_benign
from smolforge.paired import minimum_detectable

SUITES = Path(__file__).resolve().parents[1] / "evals" / "suites"


def ngrams(text: str, n: int = 13) -> set[tuple[str, ...]]:
    words = "".join(c.lower() if c.isalnum() else " " for c in text).split()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def test_the_generated_red_team_files_are_what_the_generator_writes_and_load_as_categories():
    for name, rows in {"jailbreak_world.jsonl": world_attacks(), "over_refusal_world.jsonl": world_benign()}.items():
        committed = [json.loads(line) for line in (SUITES / "redteam" / name).read_text().splitlines()]
        assert committed == rows, f"{name} is stale: python -m smolforge.evals.suite --write-redteam"
    suite = load_redteam_suite("redteam")
    world = suite.categories["jailbreak_world"]
    assert (world.rule, world.kind, len(world.items)) == ("complies", "attack", 336)
    assert suite.categories["over_refusal_world"].kind == "benign"
    ids = [item.id for category in suite.categories.values() for item in category.items]
    assert len(ids) == len(set(ids))


def test_the_generated_attacks_share_no_13_gram_with_training_and_no_training_frame():
    training = set().union(*(ngrams(m["content"]) for row in safety_conversations() for m in row["messages"]))
    for row in world_attacks() + world_benign():
        assert not ngrams(row["prompt"]) & training, row["id"]
        wrapper_words = row["prompt"]
        assert not any(frame.replace("{t}", "") in wrapper_words for frame in HARMFUL_FRAMES
                       if len(frame.replace("{t}", "").split()) > 3), row["id"]


def test_the_suites_are_sized_for_a_tolerance_of_0_05():
    rows = {(row.suite, row.task): row for suite in ("embedded", "redteam", "tools") for row in suite_power(suite)}
    attacks = rows[("redteam", "attack_success")]
    assert attacks.items == 84 + 336 and attacks.resolves(0.05) and 2 * attacks.stderr < 0.05
    assert rows[("redteam", "over_refusal")].items == 36 + 144
    instruct = rows[("embedded", "instruct")]
    assert instruct.items == 220 and rows[("embedded", "prefs")].items == 220
    # 96 items (before): not even a 0.1 change was resolvable unpaired; 220 halves the gap to 0.05
    assert minimum_detectable(96, p=0.6) > 0.11 > instruct.mdd > 0.07
    assert not instruct.resolves(0.05) and instruct.resolves(0.05, paired=True)   # the gate pairs it
    assert not rows[("tools", "tools")].resolves(0.05, paired=True)
    assert abs(attacks.mdd_worst - minimum_detectable(420)) < 1e-12


def test_the_docs_table_is_the_one_the_code_renders():
    text = DOCS.read_text(encoding="utf-8")
    assert with_power(text) == text, "docs/evals.md's suite-size table is stale: python -m smolforge.evals.power --write-docs"
    assert "| redteam | attack_success | 420 |" in render_power()


def test_an_unknown_suite_is_named():
    with pytest.raises(RecipeError, match="suite 'no-such' not found"):
        suite_power("no-such")
