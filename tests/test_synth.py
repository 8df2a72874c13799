"""The synth stage's choices on hand-built grades (best answer → SFT row, best over worst → a pair) and its
refusals before a run exists. Generating and grading with the real served model: tests/test_real_model_served.py."""
from __future__ import annotations

import json

import pytest

from smolforge.annotate.synth import best_and_worst, rows_for_prompt
from smolforge.cli import main


def test_the_best_graded_answer_is_the_sft_row_and_best_over_worst_the_pair():
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3 + 4?"}]
    candidates = [{"text": "7", "score": 0.75}, {"text": "12", "score": 0.0}, {"text": "seven", "score": 1.0},
                  {"text": "??", "score": None}]
    sft, pair = rows_for_prompt(conversation, candidates, min_margin=0.5)
    assert sft["messages"] == [*conversation, {"role": "assistant", "content": "seven"}]
    assert pair == {"prompt": conversation, "chosen": [{"role": "assistant", "content": "seven"}],
                    "rejected": [{"role": "assistant", "content": "12"}]}
    assert rows_for_prompt(conversation, candidates, min_margin=1.0)[1] is None        # 1.0 − 0.0 is not above 1.0
    assert rows_for_prompt("3 + 4?", [{"text": "7", "score": 0.5}, {"text": "8", "score": 0.5}], 0.0)[1] is None
    assert rows_for_prompt("3 + 4?", [{"text": "7", "score": None}], 0.0) == (None, None)
    assert best_and_worst([{"text": "a", "score": 0.5}, {"text": "b", "score": 0.5}])[0]["text"] == "a"   # first of equals


@pytest.mark.parametrize(("changes", "expected"), [
    ({"generators": []}, "generators: name at least one endpoint"),
    ({"k": 0}, "k must be >= 1"),
    ({}, "GET http://127.0.0.1:9/v1/models: cannot connect (Connection refused)"),
])
def test_a_synth_recipe_that_cannot_run_is_refused_before_a_run_exists(tmp_path, runs, capsys, changes, expected):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "3 + 4?"}) + "\n")
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text("name: correct\nscale: [1, 5]\ncriteria: 5 is right.\n")
    down = {"endpoint": "http://127.0.0.1:9/v1", "model": "m"}
    recipe = {"stage": "synth", "name": "synthetic", "prompts": str(prompts), "rubric": str(rubric), "judge": down,
              "generators": [down], **changes}
    path = tmp_path / "synth.yaml"
    path.write_text(json.dumps(recipe))
    code = main(["--runs-dir", str(runs.root), "synth", "--config", str(path)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and expected in lines[0], lines
    assert not (runs.root / "synthetic").exists()
