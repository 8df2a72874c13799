"""Seeds as a setting (smolforge.seeds): ``--seeds`` and a pipeline step's ``seeds:`` run a stage once per
seed and write the spread of every metric; gates and ``compare`` use it.

The runs come from the real data stage on a tiny world (the cheapest stage that has a seed: a few
seconds each); the verdicts are checked on runs with constructed metrics.
"""
from __future__ import annotations

import io
import json
import statistics
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import DEMO, TINY, finished_run, tiny_recipe
from smolforge.cli import main
from smolforge.errors import RecipeError
from smolforge.evals.compare import compare_data, compare_table
from smolforge.gates import check_gates
from smolforge.pipeline import _gates_cell, load_pipeline, run_pipeline
from smolforge.recipe import deep_merge
from smolforge.registry import load_stage
from smolforge.runs import Runs
from smolforge.seeds import aggregate, metric_spread, read_seeds

# the demo's data recipe on a tiny world, without the parts no test here reads (long documents, packing)
SMALL = {"world": {"long_docs": 0}, "pack": {"enabled": False}, "decontaminate": {"enabled": False}}


def data_recipe(folder: Path, name: str) -> Path:
    recipe = deep_merge(deep_merge(yaml.safe_load((DEMO / "data.yaml").read_text()), TINY["data"]), SMALL)
    recipe["name"] = name
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


# --------------------------------------------------------------------------- --seeds on the command line


def test_seeds_run_the_stage_per_seed_and_write_mean_and_sd_of_every_metric(tmp_path, capsys):
    root = tmp_path / "runs"
    recipe = data_recipe(tmp_path, "data-s")
    assert main(["--runs-dir", str(root), "data", "prepare", str(recipe), "--seeds", "3"]) == 0
    out = capsys.readouterr().out
    runs = Runs(root)
    seeded = [runs.get(f"data-s-seed{seed}") for seed in range(3)]
    assert [r.info["recipe"]["world"]["seed"] for r in seeded] == [0, 1, 2]   # each seed recorded in its run

    run = runs.get("data-s")   # the seeds run: an ordinary done run of the same stage over the seed runs
    assert run.stage == "data" and run.parents == ["data-s-seed0", "data-s-seed1", "data-s-seed2"]
    record = read_seeds(run)
    assert record["seeds"] == [0, 1, 2] and record["seed_key"] == "world.seed" and record["linked"] == "data-s-seed0"
    numeric = {k for k, v in seeded[0].metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert numeric and numeric <= set(record["metrics"])
    for key in numeric:
        values = [r.metrics[key] for r in seeded]
        stats = record["metrics"][key]
        assert stats["n"] == 3 and stats["values"] == values
        assert stats["mean"] == pytest.approx(statistics.mean(values)) == run.metrics[key]
        assert stats["sd"] == pytest.approx(statistics.stdev(values))
    assert any(record["metrics"][k]["sd"] > 0 for k in numeric if k != "data/seconds")   # the worlds differ
    assert "mean ± sd" in out and "data/pretrain_rows" in out and "(n=3)" in out

    # a later stage naming the seeds run reads the first seed's files; the lineage goes through every seed
    assert run.tokenizer_dir.resolve() == seeded[0].tokenizer_dir.resolve()
    assert run.data_card_path.read_text() == seeded[0].data_card_path.read_text()
    assert not run.eval_dir.exists() and not run.metrics_path.exists()
    assert [p["name"] for p in runs.lineage("data-s")["parents"]] == ["data-s-seed0", "data-s-seed1", "data-s-seed2"]
    load_stage("pretrain").validate(tiny_recipe("pretrain", data="data-s"), runs)   # a stage reading it: fine


# --------------------------------------------------------------------------- gates with a spread


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(tmp_path / "runs")


def seeds_run(runs: Runs, name: str, values: list[float], parents=(), metric: str = "facts/acc"):
    """Seed runs ``NAME-seedS`` with ``metric`` = each value, and the seeds run ``NAME`` over them."""
    seeded = [finished_run(runs, f"{name}-seed{seed}", {metric: value, f"{metric}/random": 0.25}, parents)
              for seed, value in enumerate(values)]
    return aggregate(runs, name, seeded, list(range(len(values))), "trainer.seed")


def verdict(runs: Runs, run, **rule):
    result = check_gates(run, runs, [{"metric": "facts/acc", **rule}])[0]
    return result, (result.paired[0] if result.paired else None)


@pytest.mark.parametrize("values, inconclusive, expected, passed", [
    ([0.52, 0.53, 0.51], None, "pass", True),            # up 0.02 ± 0.008: above the reference with 95 %
    ([0.46, 0.47, 0.45], None, "fail", False),           # down 0.04 ± 0.008: below it with 95 %
    ([0.50, 0.52, 0.48], None, "inconclusive", False),   # level, sd 0.02: three seeds cannot tell
    ([0.50, 0.52, 0.48], "pass", "inconclusive", True),  # ... and the gate lets that through
])
def test_a_gate_against_a_seeds_parent_judges_the_difference_of_means(runs, values, inconclusive, expected, passed):
    seeds_run(runs, "base", [0.50, 0.51, 0.49])          # mean 0.50, sd 0.01
    new = seeds_run(runs, "new", values, parents=["base"])
    rule = {"against": "parent", "max_drop": 0.0, **({"inconclusive": inconclusive} if inconclusive else {})}
    result, seen = verdict(runs, new, **rule)
    assert (seen["verdict"], result.passed, seen["basis"], seen["seeds"]) == (expected, passed, "seeds", [3, 3])
    assert result.reference_run == "base"          # the parent above the seed runs, not a seed run
    assert "3 seeds against 3" in result.message
    cell = _gates_cell({"gates": [result.to_dict()]})
    assert f"facts/acc Δ{seen['difference']:+.3f} [" in cell and cell.endswith(expected)


def test_seeds_against_a_single_run_borrow_its_sd_and_bounds_judge_the_mean(runs):
    finished_run(runs, "single", {"facts/acc": 0.50})
    new = seeds_run(runs, "new", [0.52, 0.53, 0.51], parents=["single"])
    result, seen = verdict(runs, new, against="single", max_drop=0.0)
    # 0.02 ± 0.01·sqrt(1/3 + 1), t at 2 df: the interval holds 0
    assert seen["verdict"] == "inconclusive" and not result.passed and "against a single run" in result.message
    assert verdict(runs, new, against="single", max_drop=0.05)[1]["verdict"] == "pass"
    assert [verdict(runs, new, **rule)[1]["verdict"] for rule in ({"min": 0.4}, {"max": 0.3}, {"min": 0.515})] == [
        "pass", "fail", "inconclusive"]
    assert verdict(runs, new, min=0.515, inconclusive="pass")[0].passed
    # a single run against a single run: the point comparison, as before
    plain = finished_run(runs, "plain", {"facts/acc": 0.49}, parents=["single"])
    result, seen = verdict(runs, plain, against="parent", max_drop=0.02)
    assert seen is None and result.passed and "(unpaired)" in result.message


def test_compare_shows_mean_sd_and_the_difference_with_its_stderr(runs):
    seeds_run(runs, "base", [0.50, 0.51, 0.49])
    seeds_run(runs, "new", [0.52, 0.53, 0.51])
    finished_run(runs, "single", {"facts/acc": 0.55, "facts/acc/random": 0.25})
    data = compare_data(runs, ["base", "new", "single"])
    new = data["runs"][1]["scores"]["facts/acc"]
    assert new["n"] == 3 and new["sd"] == pytest.approx(0.01)
    assert new["vs_first"]["difference"] == pytest.approx(0.02)
    assert new["vs_first"]["stderr"] == pytest.approx((2 * 0.01 ** 2 / 3) ** 0.5)
    table = compare_table(runs, ["base", "new", "single"])
    assert "0.500 ± 0.010 (n=3)" in table and "0.520 ± 0.010 (n=3)" in table
    assert "facts/acc Δ vs base" in table and "+0.020 ± 0.008" in table and "+0.050 ± 0.012" in table
    assert metric_spread(runs.get("single"), "facts/acc") is None


# --------------------------------------------------------------------------- a pipeline step's seeds:


def test_a_pipeline_step_with_seeds_runs_each_seed_then_gates_the_spread(tmp_path):
    data_recipe(tmp_path, "data-p")
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(textwrap.dedent("""\
        share_process: true
        pipeline:
          - recipe: data-p.yaml
            seeds: [4, 5]
            gates: [{metric: data/pretrain_rows, min: 1}]
        """))
    loaded = load_pipeline(pipe)
    assert [(s.label, s.name) for s in loaded.steps] == [
        ("step 1 seed 4", "data-p-seed4"), ("step 1 seed 5", "data-p-seed5"), ("step 1", "data-p")]
    assert [s.recipe["world"]["seed"] for s in loaded.steps[:2]] == [4, 5] and not loaded.steps[0].gates
    out = io.StringIO()
    rows = run_pipeline(loaded, tmp_path / "runs", as_json=True, out=out)
    assert json.loads(out.getvalue())["steps"] == json.loads(json.dumps(rows, default=str))
    runs = Runs(tmp_path / "runs")
    assert [runs.get(f"data-p-seed{s}").info["recipe"]["world"]["seed"] for s in (4, 5)] == [4, 5]
    last = rows[-1]
    assert last["run"] == "data-p" and last["seeds"]["data/pretrain_rows"]["n"] == 2
    values = [runs.get(f"data-p-seed{s}").metrics["data/pretrain_rows"] for s in (4, 5)]
    assert last["metrics"]["data/pretrain_rows"] == pytest.approx(statistics.mean(values))
    gate = last["gates"][0]
    assert gate["passed"] and gate["paired"][0]["basis"] == "seeds" and gate["paired"][0]["seeds"] == [2, 1]
    assert json.loads(runs.get("data-p").gates_path.read_text())["passed"]


def test_seeded_steps_chain_seed_by_seed_and_their_gate_pairs_the_seeds(tmp_path, runs):
    """A seeded step whose parent (or data) is an earlier seeded step with the same seeds trains seed S
    from that step's run of seed S; the gate then judges the differences seed by seed, which cancel the
    chain's own spread: a rise of 0.04 ± 0.005 resolves where the difference of two means could not."""
    data_recipe(tmp_path, "data-c")
    pipe = tmp_path / "chain.yaml"
    pipe.write_text(textwrap.dedent("""        pipeline:
          - {recipe: data-c.yaml, seeds: [4, 5]}
          - {stage: pretrain, name: pre-c, data: data-c, seeds: [4, 5]}
          - {stage: pretrain, name: pre-one, data: data-c, seeds: [4]}
        """))
    steps = load_pipeline(pipe).steps
    assert [s.recipe["data"] for s in steps if s.name and s.name.startswith("pre-c-")] == ["data-c-seed4", "data-c-seed5"]
    assert [s.recipe["data"] for s in steps if s.name == "pre-one-seed4"] == ["data-c"]   # other seeds: no chain
    sft = seeds_run(runs, "sft-c", [0.05, 0.04, 0.08], metric="redteam/attack_success")
    dpo_seeds = [finished_run(runs, f"dpo-c-seed{i}", {"redteam/attack_success": v}, parents=[f"sft-c-seed{i}"])
                 for i, v in enumerate([0.09, 0.085, 0.12])]
    dpo = aggregate(runs, "dpo-c", dpo_seeds, [0, 1, 2], "trainer.seed")
    result = check_gates(dpo, runs, [{"metric": "redteam/attack_success", "against": "sft-c", "max_rise": 0.05}])[0]
    by_seed = result.paired[0]
    assert by_seed["basis"] == "seed pairs" and by_seed["verdict"] == "pass" and by_seed["high"] < 0.05
    assert "3 seed pairs" in result.message
    [by_parent] = check_gates(dpo, runs, [{"metric": "redteam/attack_success", "against": "parent", "max_rise": 0.05}])
    assert by_parent.reference_run == "sft-c" and by_parent.paired[0]["basis"] == "seed pairs"   # not sft-c-seed0
    unmatched = [finished_run(runs, f"dpo-u-seed{i}", {"redteam/attack_success": v}, parents=["sft-c-seed0"])
                 for i, v in enumerate([0.09, 0.085, 0.12])]
    loose = check_gates(aggregate(runs, "dpo-u", unmatched, [0, 1, 2], "trainer.seed"), runs,
                        [{"metric": "redteam/attack_success", "against": "sft-c", "max_rise": 0.05}])[0]
    assert loose.paired[0]["basis"] == "seeds" and loose.paired[0]["verdict"] == "inconclusive"


# --------------------------------------------------------------------------- bad input


def test_bad_seeds_are_refused_before_any_run_folder_exists(tmp_path, capsys, runs):
    root = tmp_path / "runs"
    recipe = data_recipe(tmp_path, "data-x")
    for seeds, message in (("0", "give a count of at least 1"), ("x", "give a count of at least 1"),
                           ("1,1", "each seed once"), ("-2,3", "never negative")):
        assert main(["--runs-dir", str(root), "data", "prepare", str(recipe), f"--seeds={seeds}"]) == 2
        assert message in capsys.readouterr().err
    assert main(["--runs-dir", str(root), "eval", "some-run", "--seeds", "3"]) == 2
    assert "stage 'eval' has no seed setting" in capsys.readouterr().err
    finished_run(runs, "data-x", {"data/pretrain_rows": 1}, stage="data")   # the seeds run's name is taken
    assert main(["--runs-dir", str(root), "data", "prepare", str(recipe), "--seeds", "2"]) == 2
    assert "run 'data-x' already exists" in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir()) == ["data-x"]

    pipe = tmp_path / "pipe.yaml"
    for step, message in (("{stage: data, name: d, seeds: 0}", "step 1 seeds: give a count of at least 1"),
                          ("{stage: eval, name: e, run: d, seeds: 2}", "seeds: stage 'eval' has no seed setting"),
                          ("{stage: data, seeds: 2}", "a step with seeds: needs a name"),
                          ("{recipe: data-x.yaml, seeds: [1, 1]}", "step 1 seeds: each seed once")):
        pipe.write_text(f"pipeline:\n  - {step}\n")
        with pytest.raises(RecipeError, match=message):
            load_pipeline(pipe)
    pipe.write_text("pipeline:\n  - {stage: data, name: d, seeds: 2}\n  - {stage: data, name: d-seed1}\n")
    with pytest.raises(RecipeError, match="both write run 'd-seed1'"):
        load_pipeline(pipe)
