"""A gate with ``inconclusive: rerun`` in a pipeline: the eval step scored a limited share of the suite,
the paired verdict is inconclusive there, both runs are scored on every item and the gate decides."""
from __future__ import annotations

import io
import json
import shutil
import textwrap

import pytest

from conftest import run_stage
from smolforge.item_scores import item_scores
from smolforge.paired import compare
from smolforge.pipeline import load_pipeline, run_pipeline
from smolforge.runs import Runs


@pytest.mark.slow
def test_an_inconclusive_gate_with_rerun_scores_both_runs_on_every_item_and_decides(tmp_path, pretrain_run, sft_run):
    """A pipeline eval step scores the SFT model on the first K facts items; the gate against the base model
    is inconclusive at K, so both are scored on all 120 and the gate decides (pass at its tolerance)."""
    runs = Runs(tmp_path / "runs")
    for run, name in ((pretrain_run, "base"), (sft_run, "tuned")):
        shutil.copytree(run.path, runs.root / name, symlinks=True)
        info = json.loads((runs.root / name / "run.json").read_text())
        (runs.root / name / "run.json").write_text(json.dumps({**info, "name": name}))
    full = {}
    for name in ("base", "tuned"):
        run_stage("eval", runs, run=name, suite="embedded", tasks=["facts"], modes=[], limit=None, batch_size=32)
        scores = item_scores(runs.get(name), "facts/acc")
        full[name] = [scores[f"facts#{i}"] for i in range(len(scores))]
    assert len(full["tuned"]) == 120
    diffs_low = compare(full["tuned"], full["base"], tolerance=0.0, higher_is_better=True).low
    tolerance = round(max(0.0, -diffs_low) + 0.01, 3)               # the whole suite passes at this tolerance
    assert compare(full["tuned"], full["base"], tolerance=tolerance, higher_is_better=True).verdict == "pass"
    k = next(k for k in range(4, 120) if compare(full["tuned"][:k], full["base"][:k], tolerance=tolerance,
                                                  higher_is_better=True).verdict == "inconclusive")
    run_stage("eval", runs, run="base", suite="embedded", tasks=["facts"], modes=[], limit=k, batch_size=32)
    (tmp_path / "p.yaml").write_text(textwrap.dedent(f"""\
        pipeline:
          - stage: eval
            name: eval-tuned
            run: tuned
            suite: embedded
            tasks: [facts]
            limit: {k}
            batch_size: 32
            gates: [{{metric: facts/acc, against: base, max_drop: {tolerance}, inconclusive: rerun}}]
        """))
    out = io.StringIO()
    run_pipeline(load_pipeline(tmp_path / "p.yaml"), runs.root, out=out)
    printed = out.getvalue()
    assert "inconclusive with rerun: scoring on every item of the suite" in printed
    verdict = json.loads(runs.get("tuned").gates_path.read_text())
    [result] = verdict["results"]
    assert verdict["passed"] and result["paired"][0]["items"] == 120 and result["paired"][0]["verdict"] == "pass"
    assert result["message"].endswith("(rerun on every item: base, tuned had been scored on fewer)")
    for name in ("base", "tuned"):
        assert json.loads((runs.get(name).eval_dir / "embedded.json").read_text())["limit"] is None
