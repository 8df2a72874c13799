"""Two evaluations of one run at the same time both count: run.json's read-modify-write is locked.

(That a pipeline is not at the mercy of the folder it runs in, whose own ``data/`` or ``evals/``
package cannot replace a stage, is checked by tests/test_pipeline_e2e.py: the demo pipeline runs
from such a folder.)
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # real servers or whole pipelines: tens of seconds (make test-fast skips them)


def smolforge(*args: str, cwd, runs_dir) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "smolforge", *args, "--runs-dir", str(runs_dir)], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def copy_run(run, runs_dir, name: str) -> None:
    """A copy of a session run under ``runs_dir`` (its scores then change only there)."""
    shutil.copytree(run.path, runs_dir / name)
    info = json.loads((runs_dir / name / "run.json").read_text())
    (runs_dir / name / "run.json").write_text(json.dumps({**info, "name": name, "metrics": {}}))


def test_two_evaluations_of_one_run_at_once_both_land_in_its_run_json(tmp_path, sft_run):
    runs_dir = tmp_path / "runs"
    copy_run(sft_run, runs_dir, "sft-twice")
    both = [smolforge("eval", "sft-twice", "--set", "suite=embedded", "--set", "tasks=[arith]", "--set", "limit=4",
                      "--set", "name=eval-embedded", cwd=tmp_path, runs_dir=runs_dir),
            smolforge("eval", "sft-twice", "--set", "suite=redteam", "--set", "limit=2", "--set", "max_new_tokens=8",
                      "--set", "name=eval-redteam", cwd=tmp_path, runs_dir=runs_dir)]
    results = [proc.communicate(timeout=600) for proc in both]
    assert [proc.returncode for proc in both] == [0, 0], [err[-2000:] for _, err in results]
    metrics = json.loads((runs_dir / "sft-twice" / "run.json").read_text())["metrics"]
    assert "arith/acc" in metrics and "redteam/attack_success" in metrics
    assert {"embedded.json", "redteam.json"} <= {p.name for p in (runs_dir / "sft-twice" / "eval").iterdir()}
