"""The CLI edge and the pipeline runner, driven through tiny fake stages (no torch needed).

Fake stage modules are written into tmp_path and plugged in with $SMOLFORGE_EXTRA_STAGES,
which also replaces the built-in pretrain/sft/eval stages for the pipeline subprocesses.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from smolforge.cli import main
from smolforge.commands import extra_overrides
from smolforge.errors import RecipeError
from smolforge.pipeline import load_pipeline
from smolforge.runs import Runs
from smolforge.spine_commands import lineage_lines

REPO = Path(__file__).resolve().parents[1]

TRAIN_STAGE = '''
"""Fake {stage} stage for the spine tests."""
from __future__ import annotations
import os
from dataclasses import dataclass, field
from smolforge.errors import DataError
from smolforge.recipe import to_dict


@dataclass
class Trainer:
    max_steps: int = 2        # steps to "train"
    learning_rate: float = 1e-3


@dataclass
class Recipe:
    name: str = "{stage}-fake"     # run name
    parent: str | None = None      # parent run
    fail: bool = False             # raise DataError inside the run
    crash: bool = False            # raise RuntimeError inside the run (a bug: a traceback, exit code 1)
    tokens: int = 100              # reported as train/tokens
    trainer: Trainer = field(default_factory=Trainer)


def defaults():
    return {{"trainer": {{"learning_rate": 0.01}}}}


def validate(recipe, runs):
    if recipe.parent:
        runs.get(recipe.parent)


def run(recipe, runs, *, overwrite=False):
    parents = [runs.get(recipe.parent)] if recipe.parent else []
    with runs.start("{stage}", recipe.name, to_dict(recipe), parents=parents, overwrite=overwrite) as run:
        for step in range(recipe.trainer.max_steps):
            run.log(step, loss=1.0 / (step + 1))
        if recipe.fail:
            raise DataError("fake failure inside the stage")
        if recipe.crash:
            raise RuntimeError("fake bug inside the stage")
        run.finish({{"train/tokens": recipe.tokens, "train/loss": 0.5, "train/pid": os.getpid()}})
    return run
'''

EVAL_STAGE = '''
"""Fake eval stage: scores the run named by `run` and writes them into it."""
from __future__ import annotations

import os
from dataclasses import dataclass
from smolforge.errors import DataError
from smolforge.recipe import to_dict


@dataclass
class Recipe:
    name: str = "eval-fake"
    run: str = ""            # the run to evaluate
    score: float = 0.25
    backend: str = "hf"      # only recorded
    fail: bool = False       # raise DataError inside the run


def validate(recipe, runs):
    runs.get(recipe.run)


def run(recipe, runs, *, overwrite=False):
    target = runs.get(recipe.run)
    scores = {"toy/acc": recipe.score, "toy/acc/random": 0.125, "toy/acc/stderr": 0.01,
              "eval/seconds": 1.0}
    with runs.start("eval", recipe.name, to_dict(recipe), parents=[target], overwrite=overwrite) as run:
        if recipe.fail:
            raise DataError("fake eval failure")
        target.update_metrics(scores)
        run.finish({**scores, "eval/pid": os.getpid()})
    return run
'''


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    """Fake pretrain/sft/eval stages importable here and in subprocesses; runs under tmp_path."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "fake_pretrain.py").write_text(TRAIN_STAGE.format(stage="pretrain"))
    (plugins / "fake_sft.py").write_text(TRAIN_STAGE.format(stage="sft"))
    (plugins / "fake_eval.py").write_text(EVAL_STAGE)
    stages = "pretrain=fake_pretrain,sft=fake_sft,eval=fake_eval"
    monkeypatch.setenv("SMOLFORGE_EXTRA_STAGES", stages)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(plugins), str(REPO)]))
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.setenv("SMOLFORGE_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def smolforge(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smolforge", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


# --------------------------------------------------------------------------- the edge


def test_help_imports_no_torch():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "smolforge", "--help"], capture_output=True,
                         text=True, env=env, timeout=30)  # how fast: bench/cli_startup.py
    assert out.returncode == 0 and "pipeline" in out.stdout and "lineage" in out.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import smolforge.cli, smolforge.pipeline, sys; "
         "print(sorted({'torch', 'transformers', 'trl', 'rich'} & set(sys.modules)))"],
        capture_output=True, text=True, env=env, timeout=30)
    assert probe.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["pipeline", "sft", "dpo", "data", "pretrain", "eval", "runs", "lineage"])
def test_every_command_help_shows_an_example(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "example:\n  smolforge " in out


def test_misspelled_key_exits_2_without_traceback(fake_env):
    recipe = fake_env / "sft.yaml"
    recipe.write_text("stage: sft\nname: s\ntrainer:\n  max_stpes: 3\n")
    out = smolforge("sft", "--config", str(recipe))
    assert out.returncode == 2
    assert out.stderr.strip() == (f"RecipeError: {recipe}: unknown key 'trainer.max_stpes' "
                                  "(did you mean 'trainer.max_steps'?)")
    assert "Traceback" not in out.stderr
    debug = smolforge("--debug", "sft", "--config", str(recipe))
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_stage_command_runs_and_reports(fake_env, capsys):
    recipe = fake_env / "pre.yaml"
    recipe.write_text("stage: pretrain\nname: p1\n")
    assert main(["pretrain", "--config", str(recipe), "--set", "tokens=7",
                 "--max_steps", "3", "--learning_rate=5e-4"]) == 0
    out = capsys.readouterr().out
    run_dir = fake_env / "runs" / "p1"
    assert out.strip() == f"run p1 done → {run_dir}"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["recipe"]["trainer"] == {"max_steps": 3, "learning_rate": 5e-4}
    assert info["metrics"]["train/tokens"] == 7
    # second time: already exists → RunError, exit 2; --overwrite replaces it
    assert main(["pretrain", "--config", str(recipe)]) == 2
    assert "RunError: run 'p1' already exists (status done)" in capsys.readouterr().err
    assert main(["pretrain", "--config", str(recipe), "--overwrite"]) == 0


def test_stage_mismatch_and_missing_parent_are_errors(fake_env, capsys):
    recipe = fake_env / "sft.yaml"
    recipe.write_text("stage: sft\nname: s\nparent: nope\n")
    assert main(["pretrain", "--config", str(recipe)]) == 2
    assert "recipe is for stage 'sft', not 'pretrain'" in capsys.readouterr().err
    assert main(["sft", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("RunError: run 'nope' not found under ")
    assert not (fake_env / "runs" / "s").exists()  # validate ran before any work


def test_extra_flags_map_to_trainer_or_top_level():
    top = ["name", "parent", "trainer"]
    assert extra_overrides(["--parent", "p", "--max-steps", "4", "--bf16"], top, True) == [
        "parent=p", "trainer.max_steps=4", "trainer.bf16=true"]
    assert extra_overrides(["--x=1"], ["x"], False) == ["x=1"]
    with pytest.raises(RecipeError):
        extra_overrides(["stray"], top, True)


def test_runs_and_lineage_commands(fake_env, capsys):
    runs = Runs(fake_env / "runs")
    with runs.start("data", "data-demo", {}) as d:
        pass
    with runs.start("pretrain", "pretrain-demo", {}, parents=[d]) as p:
        pass
    with runs.start("sft", "sft-demo", {}, parents=[p, d]):
        pass
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["name", "stage", "status", "started", "wall", "s", "parents"]
    assert "sft-demo" in out and "pretrain-demo, data-demo" in out
    assert main(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in listed["runs"]] == ["data-demo", "pretrain-demo", "sft-demo"]

    assert main(["lineage", "sft-demo"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "sft-demo (sft, done)",
        "├─ pretrain-demo (pretrain, done)",
        "│  └─ data-demo (data, done)",
        "└─ data-demo (data, done)",
    ]
    assert main(["lineage", "sft-demo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parents"][0]["name"] == "pretrain-demo"
    assert main(["lineage", "sft-dem"]) == 2
    assert "did you mean 'sft-demo'?" in capsys.readouterr().err


def test_lineage_lines_show_missing_parents():
    tree = {"name": "a", "stage": "sft", "status": "done",
            "parents": [{"name": "gone", "stage": None, "status": "missing", "parents": []}]}
    assert lineage_lines(tree) == ["a (sft, done)", "└─ gone (missing)"]


# --------------------------------------------------------------------------- pipelines


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_pipeline_validation_errors(fake_env):
    f = write(fake_env / "p.yaml", "pipeline:\n  - {stage: sft, name: a}\npipline: []\n")
    with pytest.raises(RecipeError, match=r"p.yaml: unknown key 'pipline' \(did you mean 'pipeline'\?\)"):
        load_pipeline(f)
    write(f, "pipeline:\n  - {stage: stf, name: a}\n")
    with pytest.raises(RecipeError, match=r"p.yaml: pipeline step 1: unknown stage 'stf' \(did you mean 'sft'"):
        load_pipeline(f)
    write(f, "pipeline:\n  - missing.yaml\n")
    with pytest.raises(RecipeError, match=r"missing.yaml: recipe file not found"):
        load_pipeline(f)
    write(f, "pipeline:\n  - {stage: sft, name: a}\n")
    with pytest.raises(RecipeError, match=r"--set dpo.trainer.beta=0.2: no 'dpo' step in .*stages here: sft"):
        load_pipeline(f, ["dpo.trainer.beta=0.2"])
    with pytest.raises(RecipeError, match=r"must look like STAGE.key.path=value"):
        load_pipeline(f, ["max_steps=3"])
    write(f, "pipeline:\n  - {stage: sft, name: a}\n  - {stage: sft, name: a}\n")
    with pytest.raises(RecipeError, match=r"step 2 and step 1 both write run 'a'"):
        load_pipeline(f)
    write(f, "pipeline:\n  - {recipe: s.yaml, sett: {}}\n")
    with pytest.raises(RecipeError, match=r"unknown key 'sett' \(did you mean 'set'\?\)"):
        load_pipeline(f)


def test_pipeline_overrides_reach_the_right_steps(fake_env):
    write(fake_env / "pre.yaml", "stage: pretrain\nname: p1\n")
    f = write(fake_env / "p.yaml", """\
        pipeline:
          - recipe: pre.yaml
            set: {trainer.max_steps: 5}
          - {stage: sft, name: s1, parent: p1}
        eval: {name: "{run}-scored"}
        """)
    pipe = load_pipeline(f, ["sft.trainer.learning_rate=1e-5", "eval.score=0.5"])
    assert pipe.steps[0].recipe == {"stage": "pretrain", "name": "p1", "trainer": {"max_steps": 5}}
    assert pipe.steps[1].recipe["trainer"] == {"learning_rate": "1e-5"}
    ev = pipe.eval_step(pipe.steps[1], "s1")
    assert ev.recipe == {"name": "s1-scored", "stage": "eval", "score": 0.5, "run": "s1"}


def test_a_list_of_eval_recipes_runs_each_after_every_model_step(fake_env):
    write(fake_env / "first.yaml", "stage: eval\nsuite: embedded\n")
    f = write(fake_env / "p.yaml", """\
        pipeline:
          - {stage: sft, name: s1}
        eval: [first.yaml, {suite: redteam, name: "{run}-redteam"}]
        """)
    pipe = load_pipeline(f, ["eval.limit=3"])
    steps = pipe.eval_steps(pipe.steps[0], "s1")
    assert [(s.label, s.recipe["name"], s.recipe["suite"], s.recipe["limit"]) for s in steps] == [
        ("step 1 eval", "eval-s1", "embedded", 3), ("step 1 eval 2", "s1-redteam", "redteam", 3)]
    assert all(s.recipe["run"] == "s1" for s in steps) and pipe.eval == pipe.evals[0]


def test_pipeline_runs_steps_in_subprocesses_with_eval(fake_env):
    write(fake_env / "pre.yaml", "stage: pretrain\nname: p1\ntokens: 1000\n")
    f = write(fake_env / "pipe.yaml", """\
        pipeline:
          - pre.yaml
          - {stage: sft, name: s1, parent: p1, tokens: 50}
        eval: {stage: eval}
        """)
    out = smolforge("pipeline", str(f), "--set", "eval.score=0.412", cwd=fake_env)
    assert out.returncode == 0, out.stderr
    runs = Runs(fake_env / "runs")
    assert {r.name for r in runs.list()} == {"p1", "s1", "eval-p1", "eval-s1"}
    assert runs.get("s1").parents == ["p1"]
    assert runs.get("s1").metrics["toy/acc"] == 0.412
    table = out.stdout[out.stdout.index("pipeline summary"):].splitlines()
    assert table[1].split()[:7] == ["stage", "run", "status", "wall", "s", "tokens", "toy/acc"]
    assert table[3].split()[:3] == ["pretrain", "p1", "done"]
    assert "1000" in table[3] and "0.412 (rnd 0.125)" in table[3]
    assert table[4].split()[:3] == ["sft", "s1", "done"] and "0.412 (rnd 0.125)" in table[4]

    again = smolforge("pipeline", str(f), "--overwrite", "--json", cwd=fake_env)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)  # stage output went to stderr: stdout is one JSON object
    assert [(s["stage"], s["run"], s["status"]) for s in summary["steps"]] == [
        ("pretrain", "p1", "done"), ("eval", "eval-p1", "done"),
        ("sft", "s1", "done"), ("eval", "eval-s1", "done")]
    assert summary["steps"][0]["tokens"] == 1000 and summary["steps"][0]["wall_s"] >= 0


def test_a_model_step_and_its_evals_share_a_process_and_a_failing_eval_stops_the_pipeline(fake_env):
    f = write(fake_env / "pipe.yaml", """\
        pipeline:
          - {stage: pretrain, name: p1}
          - {stage: sft, name: s1, parent: p1}
        eval: [{stage: eval}, {stage: eval, name: "{run}-b"}, {stage: eval, name: "{run}-vllm", backend: vllm}]
        """)
    out = smolforge("pipeline", str(f), cwd=fake_env)
    assert out.returncode == 0, out.stderr
    runs = Runs(fake_env / "runs")
    pid = {name: runs.get(name).metrics["eval/pid"] for name in
           ("eval-p1", "p1-b", "p1-vllm", "eval-s1", "s1-b", "s1-vllm")}
    trained = {name: runs.get(name).metrics["train/pid"] for name in ("p1", "s1")}
    assert trained["p1"] == pid["eval-p1"] == pid["p1-b"] != trained["s1"] == pid["eval-s1"] == pid["s1-b"]
    assert len({pid["p1-vllm"], pid["s1-vllm"], pid["eval-p1"], pid["eval-s1"]}) == 4  # vLLM evals stay alone

    broken = write(fake_env / "broken.yaml", """\
        pipeline:
          - {stage: pretrain, name: p2}
          - {stage: sft, name: s2, parent: p2}
        eval: [{stage: eval}, {stage: eval, name: "{run}-b", fail: true}, {stage: eval, name: "{run}-c"}]
        """)
    out = smolforge("pipeline", str(broken), cwd=fake_env)
    assert out.returncode == 2
    runs_dir = (fake_env / "runs").resolve()
    assert out.stderr.strip().splitlines()[-1] == (
        "RunError: pipeline step 1 eval 2 (stage eval, run p2-b) failed with exit code 2; "
        f"see the output above and {runs_dir / 'p2-b' / 'run.json'}")
    assert runs.get("eval-p2").status == "done" and runs.get("p2-b", require_done=False).status == "failed"
    assert not (runs_dir / "p2-c").exists() and not (runs_dir / "s2").exists()


def test_failing_pipeline_step_stops_the_pipeline(fake_env):
    f = write(fake_env / "pipe.yaml", """\
        pipeline:
          - {stage: pretrain, name: p1}
          - {stage: sft, name: s1, parent: p1, fail: true}
          - {stage: sft, name: s2, parent: s1}
        """)
    out = smolforge("pipeline", str(f), cwd=fake_env)
    assert out.returncode == 2
    runs_dir = (fake_env / "runs").resolve()
    assert out.stderr.strip().splitlines()[-1] == (
        "RunError: pipeline step 2 (stage sft, run s1) failed with exit code 2; "
        f"see the output above and {runs_dir / 's1' / 'run.json'}")
    assert "DataError: fake failure inside the stage" in out.stderr  # the step's own message
    info = json.loads((runs_dir / "s1" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"] == "DataError: fake failure inside the stage"
    assert not (runs_dir / "s2").exists()
    assert "s1" in out.stdout and "failed" in out.stdout  # summary so far was printed


def test_a_step_that_crashes_shows_its_traceback_and_stops_the_pipeline(fake_env):
    f = write(fake_env / "pipe.yaml", """\
        pipeline:
          - {stage: pretrain, name: p1, crash: true}
          - {stage: sft, name: s1, parent: p1}
        """)
    out = smolforge("pipeline", str(f), cwd=fake_env)
    assert out.returncode == 2
    # the stage's traceback ends in its RuntimeError, which the pipeline points to
    assert "Traceback" in out.stderr and "RuntimeError: fake bug inside the stage" in out.stderr
    assert "pipeline step 1 (stage pretrain, run p1) failed with exit code 1; see the output above" in out.stderr
    runs_dir = (fake_env / "runs").resolve()
    info = json.loads((runs_dir / "p1" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"] == "RuntimeError: fake bug inside the stage"
    assert not (runs_dir / "s1").exists()


def test_pipeline_step_failing_validation_names_the_step(fake_env):
    f = write(fake_env / "pipe.yaml", "pipeline:\n  - {stage: sft, name: s1, parent: ghost}\n")
    out = smolforge("pipeline", str(f), cwd=fake_env)
    assert out.returncode == 2
    assert "RunError: run 'ghost' not found" in out.stderr
    assert "pipeline step 1 (stage sft, run s1) failed with exit code 2" in out.stderr


def test_stage_defaults_survive_a_partial_trainer_mapping(fake_env, capsys):
    recipe = fake_env / "pre.yaml"
    recipe.write_text("stage: pretrain\nname: p2\ntrainer:\n  max_steps: 1\n")
    assert main(["pretrain", "--config", str(recipe)]) == 0
    info = json.loads((fake_env / "runs" / "p2" / "run.json").read_text())
    assert info["recipe"]["trainer"] == {"max_steps": 1, "learning_rate": 0.01}


# --------------------------------------------------------------------------- steps that die before reporting

DYING_STAGE = '''
"""Fake stage whose process dies mid-run: SIGKILL after some output (as the OOM killer would)."""
import os
import signal
import sys
from dataclasses import dataclass


@dataclass
class Recipe:
    name: str = "dies"


def validate(recipe, runs):
    pass


def run(recipe, runs, *, overwrite=False):
    print("loading shards", flush=True)
    print("step 1/100 loss 2.31", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_step_killed_before_it_reports_shows_its_last_lines_and_the_signal(fake_env):
    (fake_env / "plugins" / "fake_dies.py").write_text(DYING_STAGE)
    f = write(fake_env / "pipe.yaml", "pipeline:\n  - {stage: dies, name: d1}\n")
    env = {**os.environ, "SMOLFORGE_EXTRA_STAGES": os.environ["SMOLFORGE_EXTRA_STAGES"] + ",dies=fake_dies"}
    out = subprocess.run([sys.executable, "-m", "smolforge", "pipeline", str(f)], capture_output=True, text=True,
                         cwd=fake_env, env=env, timeout=60)
    assert out.returncode == 2
    error = out.stderr[out.stderr.index("RunError:"):]
    assert error.startswith("RunError: pipeline step 1 (stage dies, run d1) was killed by SIGKILL before it "
                            "reported an error")
    lines = error.splitlines()[1:]       # stdout's and stderr's lines, whole, in the order they arrived
    assert sorted(lines) == ["  | loading shards", "  | step 1/100 loss 2.31"]
    assert "see the output above" not in error


def test_a_step_that_exits_while_importing_shows_what_it_printed_or_that_it_printed_nothing(fake_env):
    (fake_env / "plugins" / "fake_boom.py").write_text(
        "import sys\nprint('fake_boom: no GPU driver', file=sys.stderr)\nraise SystemExit(3)\n")
    (fake_env / "plugins" / "fake_mute.py").write_text("raise SystemExit(2)\n")
    extra = os.environ["SMOLFORGE_EXTRA_STAGES"] + ",boom=fake_boom,mute=fake_mute"
    env = {**os.environ, "SMOLFORGE_EXTRA_STAGES": extra}
    for stage, expected in (("boom", "failed with exit code 3 before it reported an error; its last output lines:\n"
                                     "  | fake_boom: no GPU driver"),
                            ("mute", "failed with exit code 2 before it printed anything")):
        f = write(fake_env / f"{stage}.yaml", f"pipeline:\n  - {{stage: {stage}, name: x}}\n")
        out = subprocess.run([sys.executable, "-m", "smolforge", "pipeline", str(f)], capture_output=True, text=True,
                             cwd=fake_env, env=env, timeout=60)
        assert out.returncode == 2
        assert f"RunError: pipeline step 1 (stage {stage}, run x) {expected}" in out.stderr, out.stderr


# --------------------------------------------------------------------------- global options, typos, '--'


def test_global_options_work_before_or_after_the_command(fake_env, capsys):
    runs = Runs(fake_env / "elsewhere")
    with runs.start("data", "d0", {}):
        pass
    for argv in (["--runs-dir", str(runs.root), "--json", "runs"], ["runs", "--runs-dir", str(runs.root), "--json"],
                 ["runs", "--json", f"--runs-dir={runs.root}"]):
        assert main(argv) == 0
        assert [r["name"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["d0"]
    assert main(["lineage", "d0", "--runs-dir", str(runs.root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "d0"


def test_a_float_for_an_int_recipe_field_exits_2_before_any_run(fake_env, capsys):
    recipe = fake_env / "sft.yaml"
    recipe.write_text("stage: sft\nname: s\n")
    assert main(["sft", "--config", str(recipe), "--set", "trainer.max_steps=1.0e+30"]) == 2
    assert capsys.readouterr().err.strip() == (f"RecipeError: {recipe}: 'trainer.max_steps' must be an int, "
                                               "got 1e+30 (a float)")
    recipe.write_text("stage: sft\nname: s\ntrainer:\n  max_steps: true\n")
    out = smolforge("sft", "--config", str(recipe))
    assert out.returncode == 2 and out.stderr.strip() == (
        f"RecipeError: {recipe}: 'trainer.max_steps' must be an int, got true (a boolean)")
    assert not (fake_env / "runs").exists()      # refused before any run folder
    assert main(["sft", "--config", str(recipe), "--set", "trainer.max_steps=3.0"]) == 0
    info = json.loads((fake_env / "runs" / "s" / "run.json").read_text())
    assert info["recipe"]["trainer"]["max_steps"] == 3


def test_a_runs_dir_that_is_a_file_is_an_error_for_every_command(fake_env, monkeypatch, capsys):
    afile = fake_env / "afile"
    afile.write_text("not a folder\n")
    recipe = fake_env / "sft.yaml"
    recipe.write_text("stage: sft\nname: s\n")
    pipeline = fake_env / "pipe.yaml"
    pipeline.write_text("pipeline:\n  - {stage: sft, name: s}\n")
    commands = (["runs"], ["runs", "--json"], ["lineage", "s"], ["sft", "--config", str(recipe)],
                ["pipeline", str(pipeline)])
    for command in commands:
        assert main(["--runs-dir", "afile", *command]) == 2
        assert capsys.readouterr().err.strip() == "RecipeError: --runs-dir afile: not a folder (it is a file)"
        assert main([*command, "--runs-dir", "afile/sub"]) == 2
        assert capsys.readouterr().err.strip() == ("RecipeError: --runs-dir afile/sub: cannot be a folder "
                                                   "(afile is a file)")
    monkeypatch.setenv("SMOLFORGE_RUNS", "afile")
    assert main(["runs"]) == 2
    assert capsys.readouterr().err.strip() == "RecipeError: $SMOLFORGE_RUNS=afile: not a folder (it is a file)"
    monkeypatch.delenv("SMOLFORGE_RUNS")
    (fake_env / "runs").write_text("")
    out = smolforge("runs", cwd=fake_env)
    assert out.returncode == 2 and out.stderr.strip() == (
        "RecipeError: ./runs: not a folder (it is a file); choose another runs folder with --runs-dir DIR")
    assert afile.read_text() == "not a folder\n" and (fake_env / "runs").read_text() == ""

    # a runs folder that does not exist yet is made by the first run
    assert main(["--runs-dir", "new/deeper", "runs"]) == 0
    assert capsys.readouterr().out.strip() == "no runs under new/deeper/"
    assert main(["sft", "--config", str(recipe), "--runs-dir", "new/deeper"]) == 0
    assert (fake_env / "new" / "deeper" / "s" / "run.json").is_file()


def test_a_mistyped_option_is_one_line_and_exit_2():
    for args, expected in ((["serve", "sft-demo", "--prot", "8000"], "unknown option '--prot' (did you mean '--port'?)"),
                           (["runs", "--sortt"], "unknown option '--sortt'"),
                           (["lineage"], "the following arguments are required: RUN")):
        out = smolforge(*args)
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and expected in out.stderr, out.stderr


def test_only_what_follows_double_dash_reaches_vllm(fake_env, monkeypatch):
    import smolforge.generation.serve as serve_module

    seen = {}

    def fake_serve(runs, run_ref, **options):
        seen.update(options, runs=runs.root, run=run_ref)
        return 0

    monkeypatch.setattr(serve_module, "serve", fake_serve)
    assert main(["serve", "sft-demo", "--runs-dir", "r2", "--port", "8123", "--", "--max-num-seqs", "8"]) == 0
    assert seen["extra_args"] == ["--max-num-seqs", "8"] and seen["port"] == 8123 and seen["runs"] == Path("r2")
    assert main(["runs", "--", "--max-num-seqs", "8"]) == 2


def test_the_parser_is_built_once_per_stage_table_in_a_process(monkeypatch, tmp_path, capsys):
    import smolforge.cli as cli

    built = []
    build = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: (built.append(1), build())[1])
    monkeypatch.setattr(cli, "_PARSERS", {})
    monkeypatch.delenv("SMOLFORGE_EXTRA_STAGES", raising=False)
    for _ in range(3):
        assert main(["--runs-dir", str(tmp_path), "runs", "--json"]) == 0
    assert main(["--runs-dir", str(tmp_path), "runs", "--sort"]) == 2      # a parse error: the same parser
    assert len(built) == 1
    monkeypatch.setenv("SMOLFORGE_EXTRA_STAGES", "toy=json")                # another stage table: its own parser
    capsys.readouterr()
    assert main(["--runs-dir", str(tmp_path), "toy", "--help"]) == 0 and len(built) == 2
    assert "smolforge toy" in capsys.readouterr().out
