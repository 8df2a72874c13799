"""Promotion gates: the rules on run.json metrics, and a pipeline step that a gate stops.

The pipeline tests use tiny fake stages (no torch): a training stage whose run reports the
metrics its recipe names, and an eval stage that scores a run by its recipe's ``quality``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import finished_run
from smolforge.errors import RecipeError
from smolforge.gates import Gate, check_gates, failures, parse_gates
from smolforge.pipeline import load_pipeline
from smolforge.runs import Runs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(tmp_path / "runs")


def messages(run, runs, *specs):
    return [r.message for r in check_gates(run, runs, list(specs))]


# --------------------------------------------------------------------------- paired, noise-aware verdicts


def scored(runs: Runs, name: str, per_item: list[float], parents=(), redteam: bool = False):
    """A run whose eval/ holds per-item scores as the scorers write them (lm-eval's instruct task, or a
    red-team suite's jailbreak items), and the mean in run.json."""
    metric = "redteam/attack_success" if redteam else "instruct/exact_match"
    run = finished_run(runs, name, {metric: sum(per_item) / len(per_item)}, parents=parents)
    run.eval_dir.mkdir(exist_ok=True)
    if redteam:
        rows = [{"id": f"jb-{i}", "category": "jailbreak", "failed": bool(v)} for i, v in enumerate(per_item)]
        (run.eval_dir / "redteam.json").write_text(json.dumps({"kind": "adversarial",
                                                                "categories": {"jailbreak": {"kind": "attack"}}}))
    else:
        rows = [{"task": "instruct", "doc_id": i, "scores": {"exact_match": v}} for i, v in enumerate(per_item)]
        (run.eval_dir / "embedded.json").write_text(json.dumps({"tasks": {"instruct": {}}}))
    name_ = "redteam" if redteam else "embedded"
    (run.eval_dir / f"{name_}-samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.mark.parametrize("flips, verdict, passed", [
    ((0, 0), "pass", True),            # 400 items, the same answers: no change, tight bounds
    ((6, 4), "pass", True),            # a few items change either way: the drop is well inside 0.05
    ((60, 0), "fail", False),          # 60 of 400 items lost (−0.15): worse beyond 0.05 with 95 % confidence
    ((20, 0), "inconclusive", False),  # 20 lost (−0.05): the interval holds −0.05, the suite cannot tell
])
def test_a_paired_gate_gives_each_verdict_on_constructed_scores(runs, flips, verdict, passed):
    parent = [1.0] * 300 + [0.0] * 100
    lost, won = flips
    child = [0.0] * lost + [1.0] * (300 - lost) + [1.0] * won + [0.0] * (100 - won)
    scored(runs, "sft-p", parent)
    run = scored(runs, "dpo-p", child, parents=["sft-p"])
    [result] = check_gates(run, runs, [{"metric": "instruct/exact_match", "against": "parent", "max_drop": 0.05}])
    [paired] = result.paired
    assert (paired["verdict"], result.passed, paired["items"]) == (verdict, passed, 400)
    assert paired["difference"] == pytest.approx((won - lost) / 400)
    assert paired["low"] <= paired["difference"] <= paired["high"]
    assert f"paired items, tolerance 0.050): {verdict}" in result.message
    if verdict == "inconclusive":
        assert "(counted as fail)" in result.message
        [lenient] = check_gates(run, runs, [{"metric": "instruct/exact_match", "against": "parent", "max_drop": 0.05,
                                              "inconclusive": "pass"}])
        assert lenient.passed and "(counted as pass)" in lenient.message


def test_a_paired_safety_gate_fails_a_rise_in_attack_success_and_passes_noise(runs):
    scored(runs, "sft-r", [0.0] * 180 + [1.0] * 20, redteam=True)
    noisy = scored(runs, "dpo-r", [1.0] * 3 + [0.0] * 177 + [1.0] * 17 + [0.0] * 3, parents=["sft-r"], redteam=True)
    worse = scored(runs, "dpo-w", [1.0] * 40 + [0.0] * 140 + [1.0] * 20, parents=["sft-r"], redteam=True)
    gate = {"metric": "redteam/attack_success", "against": "parent", "max_rise": 0.05}
    [ok], [bad] = check_gates(noisy, runs, [gate]), check_gates(worse, runs, [gate])
    assert ok.passed and ok.paired[0]["verdict"] == "pass" and ok.paired[0]["difference"] == 0.0
    assert not bad.passed and bad.paired[0]["verdict"] == "fail" and bad.paired[0]["difference"] == 0.2
    with pytest.raises(RecipeError, match=r"'confidence' must be between 0.5 and 1"):
        parse_gates([{**gate, "confidence": 95}])
    with pytest.raises(RecipeError, match=r"'inconclusive' must be one of fail, pass, rerun, got 'retry'"):
        parse_gates([{**gate, "inconclusive": "retry"}])


# --------------------------------------------------------------------------- rules


def test_gate_against_parent_fails_with_metric_values_and_rule(runs):
    finished_run(runs, "sft-demo", {"instruct/exact_match": 0.7083})
    dpo = finished_run(runs, "dpo-demo", {"instruct/exact_match": 0.65}, parents=["sft-demo"], stage="dpo")
    [result] = check_gates(dpo, runs, [{"metric": "instruct/exact_match", "against": "parent", "max_drop": 0.01}])
    assert not result.passed
    assert result.message == "gate failed: instruct/exact_match 0.650 < parent sft-demo 0.708 - 0.010 (unpaired)"
    assert (result.value, result.reference, result.reference_run) == (0.65, 0.7083, "sft-demo")


def test_gate_against_parent_passes_within_the_allowed_drop(runs):
    finished_run(runs, "sft-demo", {"instruct/exact_match": 0.708})
    dpo = finished_run(runs, "dpo-demo", {"instruct/exact_match": 0.698}, parents=["sft-demo"])
    [result] = check_gates(dpo, runs, [{"metric": "instruct/exact_match", "against": "parent", "max_drop": 0.01}])
    assert result.passed, result.message  # exactly at the edge: float slack, not a spurious fail
    assert result.message == "gate passed: instruct/exact_match 0.698 >= parent sft-demo 0.708 - 0.010 (unpaired)"
    # without max_drop the metric may not drop at all
    assert messages(dpo, runs, {"metric": "instruct/exact_match", "against": "parent"}) == [
        "gate failed: instruct/exact_match 0.698 < parent sft-demo 0.708 - 0.000 (unpaired)"]


def test_absolute_max_and_min(runs):
    run = finished_run(runs, "r", {"redteam/jailbreak/attack_success": 0.35, "facts/acc": 0.8})
    assert messages(run, runs, {"metric": "redteam/jailbreak/attack_success", "max": 0.2},
                    {"metric": "facts/acc", "min": 0.5}, {"metric": "facts/acc", "min": 0.9, "max": 1.0}) == [
        "gate failed: redteam/jailbreak/attack_success 0.350 > max 0.200",
        "gate passed: facts/acc 0.800 >= min 0.500",
        "gate failed: facts/acc 0.800 < min 0.900"]


def test_max_rise_for_metrics_where_lower_is_better(runs):
    finished_run(runs, "sft-a", {"redteam/attack_success": 0.10})
    run = finished_run(runs, "dpo-a", {"redteam/attack_success": 0.20}, parents=["sft-a"])
    assert messages(run, runs, {"metric": "redteam/attack_success", "against": "parent", "max_rise": 0.05}) == [
        "gate failed: redteam/attack_success 0.200 > parent sft-a 0.100 + 0.050 (unpaired)"]


def test_missing_metric_fails_and_lists_the_close_and_existing_metrics(runs):
    run = finished_run(runs, "r", {"instruct/exact_match": 0.7, "facts/acc": 0.5, "train/loss": 1.0})
    [result] = check_gates(run, runs, [{"metric": "instruct/exact_mach", "min": 0.5}])
    assert not result.passed and result.value is None
    assert result.message.startswith("gate failed: run r has no metric 'instruct/exact_mach' "
                                     "(did you mean 'instruct/exact_match'?")
    assert "its metrics: facts/acc, instruct/exact_match, train/loss" in result.message


def test_against_a_named_run(runs):
    finished_run(runs, "baseline", {"facts/acc": 0.9})
    finished_run(runs, "sft-a", {"facts/acc": 0.5})
    run = finished_run(runs, "dpo-a", {"facts/acc": 0.6}, parents=["sft-a"])
    [result] = check_gates(run, runs, [{"metric": "facts/acc", "against": "baseline", "max_drop": 0.1}])
    assert result.message == "gate failed: facts/acc 0.600 < baseline 0.900 - 0.100 (unpaired)"
    assert result.reference_run == "baseline"
    assert check_gates(run, runs, [{"metric": "facts/acc", "against": "parent", "max_drop": 0.1}])[0].passed
    [typo] = check_gates(run, runs, [{"metric": "facts/acc", "against": "baselin", "max_drop": 0.1}])
    assert not typo.passed and "run 'baselin' not found" in typo.message and "did you mean 'baseline'" in typo.message


def test_against_parent_walks_up_the_lineage_to_the_nearest_scored_ancestor(runs):
    finished_run(runs, "data-a", {"data/rows": 10}, stage="data")
    finished_run(runs, "pretrain-a", {"facts/acc": 0.4}, parents=["data-a"], stage="pretrain")
    finished_run(runs, "sft-a", {"train/loss": 1.0}, parents=["pretrain-a", "data-a"])  # not evaluated
    run = finished_run(runs, "dpo-a", {"facts/acc": 0.35}, parents=["sft-a", "data-a"], stage="dpo")
    [result] = check_gates(run, runs, [{"metric": "facts/acc", "against": "parent", "max_drop": 0.01}])
    assert result.reference_run == "pretrain-a"
    assert result.message == "gate failed: facts/acc 0.350 < parent pretrain-a 0.400 - 0.010 (unpaired)"
    [nobody] = check_gates(run, runs, [{"metric": "arith/acc", "against": "parent"}])
    assert not nobody.passed and "has no metric 'arith/acc'" in nobody.message
    orphan = finished_run(runs, "orphan", {"arith/acc": 0.3})
    [alone] = check_gates(orphan, runs, [{"metric": "arith/acc", "against": "parent"}])
    assert alone.message == ("gate failed: no ancestor of orphan has metric 'arith/acc' to compare against "
                             "(looked at: it has no parents)")
    [scored] = check_gates(finished_run(runs, "child", {"arith/acc": 0.3}, parents=["dpo-a"]), runs,
                           [{"metric": "arith/acc", "against": "parent"}])
    assert "(looked at: dpo-a, sft-a, data-a, pretrain-a)" in scored.message  # breadth-first, no repeats


def test_malformed_gates_are_recipe_errors_naming_the_key():
    with pytest.raises(RecipeError, match=r"gates\[1\]: unknown key 'max_dorp' \(did you mean 'max_drop'\?\)"):
        parse_gates([{"metric": "a/acc", "against": "parent", "max_dorp": 0.1}])
    with pytest.raises(RecipeError, match=r"'max_drop' needs 'against'"):
        parse_gates([{"metric": "a/acc", "max_drop": 0.1}])
    with pytest.raises(RecipeError, match=r"gate on 'a/acc' has no rule"):
        parse_gates([{"metric": "a/acc"}])
    with pytest.raises(RecipeError, match=r"'max' must be a number, got 'high'"):
        parse_gates([{"metric": "a/acc", "max": "high"}])
    with pytest.raises(RecipeError, match=r"gates\[2\]: 'metric' must name"):
        parse_gates([{"metric": "a/acc", "min": 0}, {"max": 1}])
    assert parse_gates([{"metric": "a/acc", "against": "sft-demo"}]) == [
        Gate("a/acc", against="sft-demo", max_drop=0.0)]
    assert failures([]) == []


# --------------------------------------------------------------------------- pipelines

TRAIN_STAGE = '''
"""Fake {stage} stage: a run whose metrics are its recipe's ``metrics``."""
from dataclasses import dataclass, field
from smolforge.recipe import to_dict


@dataclass
class Recipe:
    name: str = "{stage}-fake"                   # run name
    parent: str | None = None                    # parent run
    quality: float = 0.5                         # what the fake eval will score
    metrics: dict = field(default_factory=dict)  # reported by the stage itself


def validate(recipe, runs):
    if recipe.parent:
        runs.get(recipe.parent)


def run(recipe, runs, *, overwrite=False):
    parents = [runs.get(recipe.parent)] if recipe.parent else []
    with runs.start("{stage}", recipe.name, to_dict(recipe), parents=parents, overwrite=overwrite) as run:
        run.log(0, loss=1.0)
        run.finish({{"train/tokens": 10, **recipe.metrics}})
    return run
'''

EVAL_STAGE = '''
"""Fake eval stage: scores a run by its recipe's ``quality`` and writes the score into it."""
from dataclasses import dataclass


@dataclass
class Recipe:
    name: str = "eval-fake"
    run: str = ""   # the run to evaluate


def validate(recipe, runs):
    runs.get(recipe.run)


def run(recipe, runs, *, overwrite=False):
    target = runs.get(recipe.run)
    quality = target.info["recipe"]["quality"]
    target.update_metrics({"toy/acc": quality, "toy/acc/stderr": 0.01, "toy/acc/random": 0.25})
    return target
'''


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "gate_fake_pretrain.py").write_text(TRAIN_STAGE.format(stage="pretrain"))
    (plugins / "gate_fake_sft.py").write_text(TRAIN_STAGE.format(stage="sft"))
    (plugins / "gate_fake_eval.py").write_text(EVAL_STAGE)
    monkeypatch.setenv("SMOLFORGE_EXTRA_STAGES",
                       "pretrain=gate_fake_pretrain,sft=gate_fake_sft,eval=gate_fake_eval")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(plugins), str(REPO)]))
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.setenv("SMOLFORGE_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def smolforge(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smolforge", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_gates_are_validated_before_the_first_step_starts(fake_env):
    f = write(fake_env / "pipe.yaml", """\
        pipeline:
          - {stage: pretrain, name: p1}
          - {stage: sft, name: s1, parent: p1, gates: [{metric: toy/acc, against: parent, max_drp: 0.01}]}
        """)
    with pytest.raises(RecipeError, match=r"pipeline step 2 gates\[1\]: unknown key 'max_drp' \(did you mean 'max_drop'"):
        load_pipeline(f)
    out = smolforge("pipeline", str(f), cwd=fake_env)
    assert out.returncode == 2 and "unknown key 'max_drp'" in out.stderr
    assert not (fake_env / "runs").exists()  # nothing ran
    write(fake_env / "sft.yaml", "stage: sft\nname: s1\nparent: p1\n")
    write(f, """\
        pipeline:
          - {stage: pretrain, name: p1}
          - recipe: sft.yaml
            gates: [{metric: toy/acc, min: 0.5}]
          - {stage: sft, name: s2, parent: s1, gates: {metric: toy/acc, max: 0.9}}
        """)
    pipe = load_pipeline(f)
    assert pipe.steps[1].gates == [Gate("toy/acc", min=0.5)]
    assert pipe.steps[2].gates == [Gate("toy/acc", max=0.9)]
    assert "gates" not in pipe.steps[2].recipe  # the stage never sees the key


@pytest.mark.parametrize("share_process", [False, True])   # True: the steps run in one process, which stops
def test_failing_gate_fails_the_pipeline_step_with_the_reason(fake_env, share_process):
    f = write(fake_env / "pipe.yaml", f"""\
        share_process: {str(share_process).lower()}
        pipeline:
          - {{stage: pretrain, name: p1, quality: 0.7}}
          - stage: sft
            name: s1
            parent: p1
            quality: 0.65
            gates:
              - {{metric: toy/acc, against: parent, max_drop: 0.01}}
              - {{metric: toy/acc, min: 0.5}}
          - {{stage: sft, name: s2, parent: s1}}
        eval: {{stage: eval}}
        """)
    out = smolforge("pipeline", str(f), cwd=fake_env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "RunError: pipeline step 2 (stage sft, run s1) failed its promotion gates: "
        "gate failed: toy/acc 0.650 < parent p1 0.700 - 0.010 (unpaired)")
    assert "gate passed: toy/acc 0.650 >= min 0.500" in out.stdout  # every verdict is printed
    assert out.stdout.count("gates on s1:") == 1                    # once, after the last eval
    table = out.stdout[out.stdout.index("pipeline summary"):]
    row = next(line for line in table.splitlines() if line.startswith("sft"))
    assert "s1" in row and "FAILED 1/2: toy/acc" in row
    runs_dir = fake_env / "runs"
    assert not (runs_dir / "s2").exists()  # the next step never started
    s1 = json.loads((runs_dir / "s1" / "run.json").read_text())
    assert s1["status"] == "done" and s1["metrics"]["toy/acc"] == 0.65  # scored before the gate
    verdict = json.loads((runs_dir / "s1" / "gates.json").read_text())
    assert verdict["passed"] is False and [r["passed"] for r in verdict["results"]] == [False, True]
    assert verdict["results"][0]["reference_run"] == "p1" and verdict["results"][0]["reference"] == 0.7


def test_passing_gates_let_the_pipeline_go_on_and_show_in_the_summary(fake_env):
    f = write(fake_env / "pipe.yaml", """\
        pipeline:
          - {stage: pretrain, name: p1, quality: 0.7}
          - {stage: sft, name: s1, parent: p1, quality: 0.72, gates: [{metric: toy/acc, against: parent}]}
          - stage: sft
            name: s2
            parent: s1
            metrics: {redteam/attack_success: 0.1}
            gates: [{metric: redteam/attack_success, max: 0.2}, {metric: toy/acc, against: p1, max_drop: 0.5}]
        eval: {stage: eval}
        """)
    out = smolforge("pipeline", str(f), "--json", cwd=fake_env)
    assert out.returncode == 0, out.stderr
    steps = json.loads(out.stdout)["steps"]
    assert [(s["stage"], s["run"]) for s in steps] == [
        ("pretrain", "p1"), ("eval", "p1"), ("sft", "s1"), ("eval", "s1"), ("sft", "s2"), ("eval", "s2")]
    gated = {s["run"]: s["gates"] for s in steps if "gates" in s}
    assert set(gated) == {"s1", "s2"}
    assert [g["passed"] for g in gated["s2"]] == [True, True]
    assert gated["s1"][0]["message"] == "gate passed: toy/acc 0.720 >= parent p1 0.700 - 0.000 (unpaired)"
    assert "gates on s1:" in out.stderr  # verdicts go to stderr with --json


def test_gate_on_a_step_without_pipeline_eval_checks_the_stage_metrics(fake_env):
    f = write(fake_env / "pipe.yaml", """\
        pipeline:
          - {stage: pretrain, name: p1, metrics: {redteam/attack_success: 0.3},
             gates: [{metric: redteam/attack_success, max: 0.2}]}
          - {stage: sft, name: s1, parent: p1}
        """)
    out = smolforge("pipeline", str(f), cwd=fake_env)
    assert out.returncode == 2
    assert "pipeline step 1 (stage pretrain, run p1) failed its promotion gates: " \
           "gate failed: redteam/attack_success 0.300 > max 0.200" in out.stderr
    assert not (fake_env / "runs" / "s1").exists()


# --------------------------------------------------------------------------- inconclusive: rerun


def test_rerun_on_a_suite_scored_whole_has_nothing_to_add_and_counts_as_fail(runs):
    from smolforge.gates import rerun_with_more_items

    scored(runs, "base", [1.0] * 20)
    new = scored(runs, "new", [1.0] * 17 + [0.0] * 3, parents=["base"])   # -0.15 ± 0.08 against 0.1
    gate = parse_gates([{"metric": "instruct/exact_match", "against": "parent", "max_drop": 0.1,
                         "inconclusive": "rerun"}])
    first = check_gates(new, runs, gate)
    assert not first[0].passed and first[0].paired[0]["verdict"] == "inconclusive"
    assert first[0].message.endswith("(counted as fail until rerun on more items)")
    asked = []
    [again] = rerun_with_more_items(new, runs, first, asked.extend)
    assert asked == [] and not again.passed
    assert again.message.endswith("rerun: both runs were already scored on every item of the suite, none to add")


def test_a_process_batch_stopped_by_a_rerun_gate_says_the_pipeline_reruns_it(runs, capsys):
    """``share_process``: the batch stops at a failing gate; what it prints depends on why (a rerun gate
    whose paired verdict is inconclusive goes on after the pipeline's rerun, a plain failure does not)."""
    from smolforge.step_batch import gates_pass

    scored(runs, "base", [1.0] * 20)
    scored(runs, "new", [1.0] * 17 + [0.0] * 3, parents=["base"])        # -0.15 ± 0.08 against 0.1: inconclusive
    rule = {"metric": "instruct/exact_match", "against": "parent", "max_drop": 0.1}
    gated = {"run": "new", "runs_dir": str(runs.root)}
    assert gates_pass({**gated, "gates": parse_gates([{**rule, "inconclusive": "rerun"}])}) is False
    assert "are inconclusive and ask for a rerun" in capsys.readouterr().err
    assert gates_pass({**gated, "gates": parse_gates([rule])}) is False               # inconclusive counted as fail
    assert "failed; the steps after it in this process do not run" in capsys.readouterr().err
    assert gates_pass({**gated, "gates": parse_gates([{**rule, "max_drop": 0.5}])}) is True
