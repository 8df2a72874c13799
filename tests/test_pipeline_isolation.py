"""A pipeline is not at the mercy of the folder it runs in, and two evaluations of one run both count.

The stage folders install as ``smolforge.data``, ``smolforge.evals`` …, so a user's own ``data/`` or
``evals/`` package in the working directory cannot replace a stage; and run.json's read-modify-write
is locked, so evaluations of one run at the same time keep each other's scores.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import TINY

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


def test_a_pipeline_run_from_a_folder_with_its_own_data_and_evals_packages_uses_the_stages(tmp_path, sft_run):
    work = tmp_path / "project"
    for package in ("data", "evals"):
        (work / package).mkdir(parents=True)
        (work / package / "__init__.py").write_text(f"raise SystemExit('the user\\'s own {package}/ was imported')\n")
    runs_dir = tmp_path / "runs"
    copy_run(sft_run, runs_dir, "sft-here")
    data_step = {"stage": "data", "name": "data-here", **TINY["data"]}
    eval_step = {"stage": "eval", "name": "eval-here", "run": "sft-here", "suite": "embedded", "tasks": ["arith"],
                 "limit": 4}
    (work / "pipeline.yaml").write_text(yaml.safe_dump({"pipeline": [data_step, eval_step]}))
    proc = smolforge("pipeline", "pipeline.yaml", "--json", cwd=work, runs_dir=runs_dir)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "own data/ was imported" not in err and "own evals/ was imported" not in err
    steps = json.loads(out)["steps"]
    assert [(s["stage"], s["run"], s["status"]) for s in steps] == [("data", "data-here", "done"),
                                                                   ("eval", "sft-here", "done")]  # scores the run
    assert "arith/acc" in json.loads((runs_dir / "sft-here" / "run.json").read_text())["metrics"]


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
