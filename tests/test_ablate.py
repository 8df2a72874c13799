"""`smolforge ablate`: the ablation file's checks, the plan, the pipeline it runs (its runs sharing
one process), and a real tiny ablation: two arms x two seeds of pretraining, the baseline audited,
every final model scored, a verdict per task, the result run with its table and plots."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import tiny_recipe
from smolforge import cli
from smolforge.errors import RecipeError, RunError
from smolforge.ops.ablate import load_ablation, pipeline_file
from smolforge.ops.ablate.stats import compare
from smolforge.gates import Gate
from smolforge.launchers import LaunchSpec
from smolforge.pipeline import Step, _next_group, load_pipeline
from smolforge.recipe import to_dict


def _write(folder, name: str, data: dict):
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _tiny_pretrain(folder, **changes):
    data = {"stage": "pretrain", **to_dict(tiny_recipe("pretrain"))}
    data["train"].update(max_steps=6, log_every=2)
    data["checkpoint"].update(every_steps=2, keep=5)
    data["tracking"] = {"report_to": ["none"]}
    for key, value in changes.items():
        data[key] = value
    return _write(folder, "pretrain.yaml", data)


def _ablation(folder, **changes):
    _tiny_pretrain(folder)
    data = {"ablation": "t", "recipe": "pretrain.yaml", "seeds": [0, 1],
            "variants": [{"key": "train.learning_rate", "values": [0.02]}], "tasks": ["arith"], "limit": 4,
            **changes}
    return _write(folder, "ablate.yaml", data)


# -- the file and the plan ---------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    ({"variant": []}, "unknown key 'variant' \\(did you mean 'variants'\\?\\)"),
    ({"seeds": [0, 0]}, "'seeds' must be a list of distinct integers"),
    ({"variants": [{"key": "mixture", "values": [[{"until": 1.0}]]}]}, "needs a name: values: \\{name: value\\}"),
    ({"variants": [{"key": "a", "values": [1], "also": 2}]}, "one key per variant"),
    ({"mode": "anneal"}, "mode anneal needs 'from: <main run>'"),
    ({"from": "pretrain-demo"}, "'from' and 'from_step' are for mode anneal"),
    ({"mode": "anneal", "from": "p", "from_step": 0}, "'from_step' must be a checkpoint's step"),
    ({"limit": 0}, "'limit' must be a positive integer"),
])
def test_a_bad_ablation_file_names_the_key(tmp_path, change, message):
    with pytest.raises(RecipeError, match=message):
        load_ablation(_ablation(tmp_path, **change))


def test_the_plan_changes_one_key_per_variant_and_the_seed(tmp_path):
    path = _ablation(tmp_path, variants=[{"key": "train.learning_rate", "values": [0.02, 0.05]},
                                         {"key": "mixture", "values": {"math": [{"until": 1.0, "weights": {"math": 1.0}}]}}])
    ablation = load_ablation(path, ["seeds=[3, 4]"])
    plan = ablation.plan()
    assert [p.name for p in plan] == ["t-baseline-s3", "t-baseline-s4", "t-learning_rate-0.02-s3",
                                      "t-learning_rate-0.02-s4", "t-learning_rate-0.05-s3", "t-learning_rate-0.05-s4",
                                      "t-mixture-math-s3", "t-mixture-math-s4"]
    base, lr, mix = plan[0].recipe, plan[2].recipe, plan[7].recipe
    assert base["train"]["seed"] == 3 and lr["train"]["seed"] == 3 and mix["train"]["seed"] == 4
    assert lr["train"]["learning_rate"] == 0.02 and base["train"]["learning_rate"] == mix["train"]["learning_rate"]
    assert mix["mixture"] == [{"until": 1.0, "weights": {"math": 1.0}}] and base["mixture"] != mix["mixture"]
    # everything else is the baseline's
    strip = lambda r: {k: v for k, v in r.items() if k not in ("name", "train", "mixture")}  # noqa: E731
    assert strip(base) == strip(lr) == strip(mix)


def test_the_pipeline_runs_consecutive_one_rank_runs_in_one_process(tmp_path):
    ablation = load_ablation(_ablation(tmp_path))
    pipeline = load_pipeline(_write(tmp_path, "p.yaml", pipeline_file(ablation, ablation.plan())))
    assert pipeline.share_process and len(pipeline.steps) == 4
    queue = list(pipeline.steps)
    group, carried = _next_group(queue, pipeline)
    assert [s.name for s in group] == [p.name for p in ablation.plan()] and queue == [] and carried == []
    # a gated step joins (the shared process checks its gates and stops there when one fails);
    # one launched on several ranks keeps a process of its own
    gated = Step("step 2", "pretrain", {"name": "g"}, "p.yaml", gates=[Gate("arith/acc", min=0.1)])
    ranks = Step("step 3", "pretrain", {"name": "r"}, "p.yaml", launch=LaunchSpec(processes=2))
    queue = [pipeline.steps[0], gated, ranks, pipeline.steps[1]]
    group, _ = _next_group(queue, pipeline)
    assert [s.name for s in group] == ["t-baseline-s0", "g"] and group[1].gates and queue[0] is ranks
    # with an eval after every model step, each model carries its evals into the shared process
    pipeline.evals = [{"stage": "eval", "suite": "embedded"}, {"stage": "eval", "suite": "redteam", "backend": "vllm"}]
    queue = list(pipeline.steps[:2])
    group, carried = _next_group(queue, pipeline)
    assert [(s.stage, s.name) for s in group] == [("pretrain", "t-baseline-s0"), ("eval", "eval-t-baseline-s0")]
    assert carried == pipeline.steps[:1] and [s.recipe["backend"] for s in queue[:1]] == ["vllm"]  # alone: vLLM
    pipeline.evals = pipeline.evals[:1]
    queue = list(pipeline.steps[:2])
    group, carried = _next_group(queue, pipeline)
    assert [s.name for s in group] == ["t-baseline-s0", "eval-t-baseline-s0", "t-baseline-s1", "eval-t-baseline-s1"]
    assert carried == pipeline.steps[:2] and queue == []
    # a one-process data step joins too (the demo: data, pretrain, longctx and SFT in one process)
    data = Step("step 0", "data", {"name": "d"}, "p.yaml")
    queue = [data, pipeline.steps[0]]
    group, carried = _next_group(queue, pipeline)
    assert [s.name for s in group] == ["d", "t-baseline-s0", "eval-t-baseline-s0"] and carried == pipeline.steps[:1]
    pipeline.share_process = False
    queue = [data, pipeline.steps[0]]
    assert _next_group(queue, pipeline)[0] == [data] and len(queue) == 1


def test_anneal_mode_continues_the_main_run(tmp_path, runs, pretrain_run, capsys):
    path = _ablation(tmp_path, mode="anneal", **{"from": pretrain_run.name},
                     variants=[{"key": "mixture", "values": {"math": [{"until": 1.0, "weights": {"math": 1.0}}]}}])
    target = tmp_path / "anneal.pipeline.yaml"
    assert cli.main(["--runs-dir", str(runs.root), "ablate", "--config", str(path), "--write-pipeline", str(target)]) == 0
    steps = yaml.safe_load(target.read_text())["pipeline"]
    assert [s["init"] for s in steps] == [pretrain_run.name] * 4
    assert [s["mixture"][0]["weights"] for s in steps][2:] == [{"math": 1.0}] * 2
    # from_step: the main run's DeepSpeed checkpoint, exported once as a run of its own
    args = ["--runs-dir", str(runs.root), "ablate", "--config", str(path), "--write-pipeline", str(target),
            "--set", "from_step=6"]
    assert cli.main(args) == 0
    branch = runs.get(f"{pretrain_run.name}-step6")
    assert branch.parents == [pretrain_run.name] and branch.metrics["train/steps"] == 6
    assert (branch.model_dir / "model.safetensors").is_file() and (branch.model_dir / "tokenizer.json").is_file()
    assert {s["init"] for s in yaml.safe_load(target.read_text())["pipeline"]} == {branch.name}
    made = branch.info["started_at"]
    assert cli.main(args) == 0 and runs.get(branch.name).info["started_at"] == made      # made once
    capsys.readouterr()
    assert cli.main([*args[:-1], "from_step=5"]) == 2
    assert "has no DeepSpeed checkpoint at step 5 (it keeps: 6" in capsys.readouterr().err
    with pytest.raises(RecipeError, match="continues a pretraining run"):
        sft = _write(tmp_path, "sft.yaml", {"stage": "sft", "parent": pretrain_run.name})
        load_ablation(_write(tmp_path, "a2.yaml", {"ablation": "x", "recipe": sft.name, "mode": "anneal",
                                                   "from": "p", "variants": [{"key": "a", "values": [1]}]}))


def test_verdicts_need_a_difference_beyond_the_seed_noise():
    # hand-worked: sd 0.01 on both sides, n 3: noise = sqrt(2 x 0.01^2 / 3) = 0.008165
    row = compare([0.50, 0.51, 0.52], [0.53, 0.54, 0.55])
    assert row["noise"] == pytest.approx(0.008165, abs=1e-6) and row["difference"] == pytest.approx(0.03)
    assert row["ratio"] == pytest.approx(3.674, abs=1e-3) and row["verdict"] == "better"
    assert compare([0.50, 0.51, 0.52], [0.51, 0.52, 0.53])["verdict"] == "within noise"   # 1.22 x noise
    assert compare([0.50, 0.51, 0.52], [0.45, 0.46, 0.47])["verdict"] == "worse"
    assert compare([9.0, 9.1, 9.2], [8.0, 8.1, 8.2], higher_is_better=False)["verdict"] == "better"
    assert compare([0.5, 0.5], [0.6, 0.6])["verdict"] == "better"        # no noise at all: any change is real
    assert compare([0.5, 0.6], [0.7])["verdict"] == "no verdict"


# -- a real tiny ablation ----------------------------------------------------------------------
@pytest.mark.slow
def test_a_tiny_ablation_trains_audits_scores_and_judges(tmp_path, runs, data_run, capsys):
    path = _ablation(tmp_path)
    args = ["--runs-dir", str(runs.root), "ablate", "--config", str(path)]
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "ablation t: 4 runs (2 arms x 2 seeds), 0 already done, 4 to train" in printed
    result = json.loads((runs.root / "ablate-t" / "ablation.json").read_text())
    names = ["t-baseline-s0", "t-baseline-s1", "t-learning_rate-0.02-s0", "t-learning_rate-0.02-s1"]
    for name in names:
        run = runs.get(name)
        assert run.metrics["train/steps"] == 6 and run.info["recipe"]["train"]["seed"] == int(name[-1])
    assert runs.get("t-learning_rate-0.02-s1").info["recipe"]["train"]["learning_rate"] == 0.02
    assert result["audit_steps"] == [2, 4, 6] and set(result["audit"]) == {"arith"}
    assert result["audit"]["arith"]["verdict"] in ("fit", "unfit", "undecided")
    scores = result["scores"]
    assert set(scores) == {"baseline", "learning_rate=0.02"} and set(scores["baseline"]) == set(names[:2])
    (row,) = result["rows"]
    base = [scores["baseline"][n]["arith"] for n in names[:2]]
    var = [scores["learning_rate=0.02"][n]["arith"] for n in names[2:]]
    assert row == {**row, **compare(base, var)} and row["task"] == "arith"
    # the variants' final models were scored (cached beside their audit scores), not their checkpoints
    assert [p.name for p in (runs.root / names[2] / "eval" / "audit").glob("*.json")] == ["6.json"]
    table = (runs.root / "ablate-t" / "table.txt").read_text()
    assert table.splitlines()[0].startswith("ablation t: pretrain from scratch, 2 seeds (0, 1), suite embedded")
    assert "learning_rate=0.02" in table and row["verdict"] in table and "verdict: |difference| > 2 x noise" in table
    assert ("arith*" in table) == (result["audit"]["arith"]["verdict"] != "fit")
    svg = (runs.root / "ablate-t" / "plots" / "arith.svg").read_text()
    assert svg.count('class="seed"') == 4 and svg.count('class="mean"') == 2
    assert runs.get("ablate-t").parents == names

    # again: every run is done with the same recipe, so nothing trains and nothing is re-scored
    assert cli.main(args) == 0
    assert "4 already done, 0 to train" in capsys.readouterr().out
    again = json.loads((runs.root / "ablate-t" / "ablation.json").read_text())
    assert again["rows"] == result["rows"]


def test_done_runs_with_the_planned_recipe_are_reused_and_others_need_overwrite(tmp_path, data_run):
    from smolforge.ops.ablate.run import _check_runs
    from smolforge.recipe import build_stage_recipe
    from smolforge.registry import load_stage
    from smolforge.runs import Runs

    runs = Runs(tmp_path / "runs")
    (runs.root / data_run.name).parent.mkdir(parents=True)
    (runs.root / data_run.name).symlink_to(data_run.path)
    ablation = load_ablation(_ablation(tmp_path))
    same, other = ablation.plan()[:2]
    with runs.start("pretrain", same.name, build_stage_recipe(load_stage("pretrain"), same.recipe, "t")):
        pass
    with runs.start("pretrain", other.name, {"train": {"seed": 99}}):
        pass
    with pytest.raises(RunError, match=f"run '{other.name}' is done with another recipe .* pass --overwrite"):
        _check_runs(ablation, runs, overwrite=False)
    todo, reused = _check_runs(ablation, runs, overwrite=True)
    assert reused == [same.name] and [p.name for p in todo] == [p.name for p in ablation.plan()[1:]]
    # a parent made again after the run started: the run no longer follows from it
    import shutil

    shutil.rmtree(runs.root / other.name)
    info = json.loads((runs.root / same.name / "run.json").read_text())
    (runs.root / "data-later").mkdir()
    (runs.root / "data-later" / "run.json").write_text(json.dumps(
        {"name": "data-later", "stage": "data", "status": "done", "ended_at": "2999-01-01T00:00:00.000+00:00"}))
    (runs.root / same.name / "run.json").write_text(json.dumps({**info, "parents": [*info["parents"], "data-later"]}))
    with pytest.raises(RunError, match=f"run '{same.name}' was trained before its parent data-later was made again"):
        _check_runs(ablation, runs, overwrite=False)
