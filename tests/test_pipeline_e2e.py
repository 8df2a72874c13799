"""The demo pipeline end to end through the shell, shrunk by overrides: data → pretrain → SFT →
DPO with an eval after each model stage, then `runs` and `lineage` on the result."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import DEMO, REPO, TINY

pytestmark = pytest.mark.slow  # real servers or whole pipelines: tens of seconds (make test-fast skips them)


def flatten(prefix: str, tree: dict) -> list[str]:
    items = []
    for key, value in tree.items():
        if isinstance(value, dict) and key != "extra":
            items += flatten(f"{prefix}.{key}", value)
        else:
            items.append(f"{prefix}.{key}={json.dumps(value)}")
    return items


def smolforge(runs_dir, *args, timeout=600, cwd=REPO):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "smolforge", "--runs-dir", str(runs_dir), *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def pipeline_result(tmp_path_factory):
    """The demo pipeline, run from a project folder that has its own ``data/`` and ``evals/`` packages:
    the stages install as ``smolforge.data``, ``smolforge.evals`` …, so those can never replace them."""
    runs_dir = tmp_path_factory.mktemp("pipeline-runs")
    project = tmp_path_factory.mktemp("project")
    for package in ("data", "evals"):
        (project / package).mkdir()
        (project / package / "__init__.py").write_text(f"raise SystemExit('the user\\'s own {package}/ was imported')\n")
    from smolforge.pipeline import load_pipeline

    present = {step.stage for step in load_pipeline(DEMO / "pipeline.yaml").steps} | {"eval"}
    sets = [item for stage, tree in TINY.items() if stage in present for item in flatten(stage, tree)]
    args = ["pipeline", str(DEMO / "pipeline.yaml"), "--json"]
    # GRPO generates with HF here: its rollouts through a vLLM server holding the policy (what `auto` picks on a
    # CPU with vLLM) are tests/test_real_model.py's, on the real model; this test is about the pipeline
    for item in sets + ['grpo.generation="hf"']:
        args += ["--set", item]
    proc = smolforge(runs_dir, *args, cwd=project)
    return runs_dir, proc


def test_demo_pipeline_runs_every_stage_and_scores_each_model(pipeline_result):
    runs_dir, proc = pipeline_result
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "own data/ was imported" not in proc.stderr and "own evals/ was imported" not in proc.stderr
    summary = json.loads(proc.stdout)
    model_steps = [s for s in summary["steps"] if s["stage"] in ("pretrain", "sft", "dpo", "merge", "grpo")]
    assert [s["run"] for s in model_steps] == ["pretrain-demo", "longctx-demo", "sft-demo", "dpo-demo", "merge-demo",
                                               "grpo-demo"]
    grpo = model_steps[-1]["metrics"]
    assert 0 <= grpo["rl/heldout_reward_before"] <= 1 and 0 <= grpo["rl/heldout_reward_after"] <= 1
    assert (grpo["rl/generation"], grpo["rl/weight_syncs"]) == ("hf", 0)      # as the fixture asked
    for step in model_steps:
        assert step["status"] == "done" and step["wall_s"] > 0
        assert step["stage"] == "merge" or step["tokens"] > 0
        for key in ("facts/acc", "arith/acc", "instruct/exact_match", "prefs/acc", "prefs/margin", "reason/exact_match",
                    "instruct@no_think/exact_match", "reason@no_think/exact_match",     # chat tasks in both modes
                    "position_ppl/ppl@512-1024", "passkey_1024/acc"):                  # the long-context suite
            assert key in step["metrics"], (step["run"], key)
        assert step["metrics"]["facts/acc/random"] == 0.125
        assert "redteam/attack_success" in step["metrics"]            # the last eval recipe ran too
    longctx = json.loads((runs_dir / "longctx-demo" / "run.json").read_text())
    assert longctx["recipe"]["init"] == "pretrain-demo" and longctx["parents"] == ["data-demo", "pretrain-demo"]
    assert model_steps[4]["metrics"]["merge/weight/dpo-demo"] == 0.9
    gates = json.loads((runs_dir / "dpo-demo" / "gates.json").read_text())
    assert gates["passed"] and len(gates["results"]) == 2            # the demo's DPO promotion gates
    statuses = {json.loads((p / "run.json").read_text())["status"] for p in runs_dir.iterdir() if p.is_dir()}
    assert statuses == {"done"}


def test_lineage_walks_from_dpo_back_to_the_data(pipeline_result):
    runs_dir, _ = pipeline_result
    proc = smolforge(runs_dir, "lineage", "dpo-demo")
    assert proc.returncode == 0, proc.stderr
    names = [line.strip(" │├└─").split(" ")[0] for line in proc.stdout.splitlines() if line.strip()]
    assert names[:5] == ["dpo-demo", "sft-demo", "longctx-demo", "data-demo", "pretrain-demo"]
    tree = json.loads(smolforge(runs_dir, "lineage", "dpo-demo", "--json").stdout)
    chain, node = [], tree
    while node:
        chain.append((node["name"], node["stage"]))
        node = node["parents"][0] if node["parents"] else None
    assert chain == [("dpo-demo", "dpo"), ("sft-demo", "sft"), ("longctx-demo", "pretrain"), ("data-demo", "data")]


def test_runs_lists_every_run_with_its_status(pipeline_result):
    runs_dir, _ = pipeline_result
    listed = json.loads(smolforge(runs_dir, "runs", "--json").stdout)
    rows = listed["runs"] if isinstance(listed, dict) else listed
    assert {r["name"]: r["status"] for r in rows} == {
        "data-demo": "done", "pretrain-demo": "done", "longctx-demo": "done", "sft-demo": "done", "dpo-demo": "done",
        "merge-demo": "done", "grpo-demo": "done"}
