"""The project builds as a wheel whose stage packages live under ``smolforge.`` and whose suites come along."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_namespaced_stages_and_their_suites_and_resists_a_shadowing_folder(tmp_path):
    source = tmp_path / "source"        # setuptools builds in the source tree (build/, *.egg-info): not in the repo
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".argilla-venv", "runs", "build", "*.egg-info", ".artifacts", "__pycache__", ".pytest_cache"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    assert "would be ignored" not in built.stderr                 # every package is declared
    [wheel] = (tmp_path / "dist").glob("smolforge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("data", "generation", "pretrain", "alignment", "evals", "annotate"):
        assert f"smolforge/{package}/__init__.py" in names
    assert not any(n.split("/")[0] in ("data", "evals", "alignment") for n in names)   # nothing top-level
    assert "smolforge/evals/suites/redteam/suite.yaml" in names
    assert {"smolforge/alerting/rules.yml", "smolforge/alerting/grafana-dashboard.json"} <= set(names)
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")

    work = tmp_path / "work"                                      # a user's folder with its own data/, evals/
    for package in ("data", "evals"):
        (work / package).mkdir(parents=True)
        (work / package / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    probe = ("import smolforge.data.stage, smolforge.evals.stage\n"
             "from smolforge.registry import suite_folders\n"
             "print(smolforge.data.stage.__file__)\nprint(sorted(suite_folders()))\n")
    # the unpacked wheel comes first on the path (the editable install's finder only answers after it)
    # an empty staged-tasks folder: the user's own staged standard tasks (~/.cache/smolforge/staged) are suites too
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "SMOLFORGE_STAGED": str(tmp_path / "staged")}
    env.pop("SMOLFORGE_SUITES", None)
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=work, env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    first, suites = ran.stdout.splitlines()
    assert first == str(tmp_path / "site" / "smolforge" / "data" / "stage.py")
    assert suites == "['embedded', 'longctx', 'redteam', 'tools']"
