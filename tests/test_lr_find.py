"""`smolforge lr-find`: the LR range test.

The suggestion rule on hand-made loss curves whose answers are worked out by hand, then one real
sweep of the tiny pretrain recipe (through the CLI, in-process, --json) and one of the tiny SFT
recipe (TRL's SFTTrainer), each ~20-25 steps: exponential LRs, a loss per step, a valid SVG plot,
a suggestion inside the swept range and below the divergence, and SFT's 1/10-1/5 window.
"""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest
import yaml

from conftest import tiny_recipe
from smolforge.cli import main
from smolforge.errors import RecipeError, RunError
from smolforge.ops.lr_find import RULE, Sweep, divergence, exponential_lrs, suggest
from smolforge.recipe import to_dict
from smolforge.registry import load_stage

HALF_DECADES = exponential_lrs(1e-5, 1.0, 11)          # 1e-5, 3.2e-5, 1e-4, …, 0.32, 1
#            1e-5 3e-5 1e-4 3e-4 1e-3 3e-3 0.01 0.03 0.1  0.3  1
FALL_THEN_BLOW_UP = [5.0, 5.0, 5.0, 5.0, 4.5, 3.5, 2.0, 1.5, 1.2, 2.5, 20.0]


def test_the_suggestion_is_a_tenth_of_the_minimum_and_steepest_descent_the_cross_check():
    found = suggest(HALF_DECADES, FALL_THEN_BLOW_UP, half=0)       # no smoothing: the raw curve
    assert RULE == "minimum/10" and found["rule"] == RULE
    assert found["min_loss_lr"] == pytest.approx(0.1)               # loss 1.2
    assert found["suggestion"] == pytest.approx(0.01)
    # slopes per decade (central differences over one decade): 3e-3 falls fastest, (2.0-4.5)/1
    assert found["cross_check"] == {"rule": "steepest", "rule_text": found["cross_check"]["rule_text"],
                                    "lr": pytest.approx(10 ** -2.5)}
    assert found["diverged_lr"] == 1.0 and found["note"] is None   # 20 > 4 x 1.2


def test_smoothing_is_centred_so_a_symmetric_dip_keeps_its_place():
    lrs = exponential_lrs(1e-4, 1.0, 9)
    found = suggest(lrs, [5.0, 4.0, 3.0, 2.0, 1.0, 2.0, 3.0, 4.0, 5.0], half=1)
    assert found["min_loss_lr"] == lrs[4]                          # smoothed 2, 1.667, 2 around it
    assert found["diverged_lr"] is None                            # the trailing mean never passes 4 x 1.667


def test_smoothing_moves_the_minimum_only_as_far_as_the_neighbours_weigh():
    found = suggest(HALF_DECADES, FALL_THEN_BLOW_UP, half=1)
    # 3-point means: 0.03 holds (2.0+1.5+1.2)/3 = 1.567, 0.1 holds (1.5+1.2+2.5)/3 = 1.733
    assert found["min_loss_lr"] == pytest.approx(10 ** -1.5)
    assert found["suggestion"] == pytest.approx(10 ** -2.5)
    assert found["diverged_lr"] == 1.0                             # (2.5+20)/2 = 11.25 > 4 x 1.567


def test_the_sweep_stops_at_four_times_the_minimum_or_at_nan():
    assert divergence([6.0, 3.0, 2.0, 7.9, 8.1], half=0) == 4      # 8.1 > 4 x 2; 7.9 is not
    assert divergence([6.0, 3.0, float("nan")], half=0) == 2
    sweep = Sweep(1e-4, 1.0, steps=5)
    stops = [sweep.record(lr, loss) for lr, loss in zip(sweep.lrs, [6.0, 3.0, 2.0, 7.9, 40.0])]
    assert stops == [False, False, False, False, True] and "4x its minimum" in sweep.stopped


def test_a_curve_that_never_falls_suggests_the_lowest_lr_and_says_why():
    found = suggest(HALF_DECADES[:5], [2.0, 2.5, 3.0, 6.0, 9.0], half=0)
    assert found["suggestion"] == HALF_DECADES[0] and "never fell" in found["note"]
    with pytest.raises(RunError, match="only 2 finite losses"):
        suggest(HALF_DECADES, [2.0, 1.9, float("nan")], half=0)


def test_learning_rates_grow_by_a_constant_factor_from_min_to_max():
    lrs = exponential_lrs(1e-6, 1.0, 100)
    ratios = [b / a for a, b in zip(lrs, lrs[1:])]
    assert lrs[0] == 1e-6 and lrs[-1] == 1.0
    assert max(ratios) == pytest.approx(min(ratios)) == pytest.approx(1e6 ** (1 / 99))


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    assert main(["lr-find", "--config", "recipes/demo/pretrain.yaml", "--min", "0.1", "--max", "0.01",
                 "--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "RecipeError: lr-find: --min 0.1 must be below --max 0.01"
    assert main(["lr-find", "--config", "recipes/demo/dpo.yaml", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("RecipeError: recipes/demo/dpo.yaml: lr-find sweeps pretrain and sft recipes; "
                   "this one is for stage 'dpo'")
    assert not list(tmp_path.iterdir())


def test_a_failed_sweep_leaves_no_run_and_another_stage_s_run_is_never_replaced(runs, data_run):
    with pytest.raises(RuntimeError, match="boom"):
        with Sweep(1e-4, 1.0, 10).run(runs, "pretrain", tiny_recipe("pretrain", name="lrf-broken"), [data_run]):
            raise RuntimeError("boom")
    assert not (runs.root / "lrfind-lrf-broken").exists()
    with runs.start("pretrain", "lrfind-taken", {}):
        pass
    with pytest.raises(RunError, match="'lrfind-taken' exists and is a pretrain run"):
        with Sweep(1e-4, 1.0, 10).run(runs, "pretrain", tiny_recipe("pretrain", name="taken"), [data_run]):
            pass
    assert runs.get("lrfind-taken").stage == "pretrain"


def check_sweep(result: dict, sweep: Sweep) -> None:
    """What every real sweep must show."""
    lrs, losses = result["lrs"], result["losses"]
    assert 3 <= len(lrs) == len(losses) == result["steps_run"] <= sweep.steps
    assert lrs == pytest.approx(sweep.lrs[: len(lrs)], rel=1e-6)       # the LRs the optimizer applied
    assert lrs[0] == pytest.approx(sweep.lr_min)
    ratios = [b / a for a, b in zip(lrs, lrs[1:])]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)        # exponential
    assert all(math.isfinite(x) for x in losses[:-1])
    assert result["diverged_lr"] is not None, result["stopped"]        # the tiny model blows up below --max
    assert sweep.lr_min <= result["suggestion"] < result["diverged_lr"] <= sweep.lr_max
    assert result["rule"] == RULE and result["cross_check"]["lr"] is not None
    root = ET.parse(result["plot"]).getroot()                          # a valid SVG file
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) == 2


def test_pretrain_sweep_through_the_cli(runs, data_run, tmp_path, capsys):
    recipe = tiny_recipe("pretrain", name="lrf-pretrain")
    config = tmp_path / "pretrain.yaml"
    config.write_text(yaml.safe_dump({"stage": "pretrain", **to_dict(recipe)}))
    capsys.readouterr()
    assert main(["lr-find", "--config", str(config), "--min", "1e-4", "--max", "10", "--steps", "24", "--json",
                 "--runs-dir", str(runs.root)]) == 0
    result = json.loads(capsys.readouterr().out)                       # stdout is one JSON object
    check_sweep(result, Sweep(1e-4, 10.0, 24))
    assert result["recipe_lr"] == recipe.train.learning_rate and "window" not in result
    run = runs.get("lrfind-lrf-pretrain")
    assert run.stage == "lr-find" and run.parents == [data_run.name] and not run.model_dir.exists()
    assert run.metrics["lr_find/suggested_lr"] == result["suggestion"]
    assert json.loads((run.path / "lr_find.json").read_text())["lrs"] == result["lrs"]


def test_sft_sweep_reports_the_playbook_window(runs, pretrain_run):
    from smolforge.ops.lr_find.sft import lr_find

    recipe = tiny_recipe("sft", name="lrf-sft")
    load_stage("sft").validate(recipe, runs)
    sweep = Sweep(1e-4, 10.0, steps=20)
    run = lr_find(recipe, runs, sweep)
    result = sweep.result
    check_sweep(result, sweep)
    peak = pretrain_run.info["recipe"]["train"]["learning_rate"]
    assert (result["window"]["low"], result["window"]["high"]) == pytest.approx((0.1 * peak, 0.2 * peak))
    assert result["window"]["pretraining_lr"] == peak
    assert result["recipe_lr"] == recipe.trainer.learning_rate          # set in the recipe: kept
    assert run.status == "done" and sorted(p.name for p in run.path.iterdir()) == [
        "lr_find.json", "lr_find.svg", "metrics.jsonl", "run.json"]


def test_an_sft_recipe_without_a_pretraining_ancestor_has_no_window():
    from smolforge.ops.lr_find.sft import window

    class NoRuns:
        def get(self, name):
            raise RunError(f"run '{name}' not found")

    assert window(NoRuns(), "imported")["low"] is None


def test_too_few_steps_is_a_recipe_error():
    with pytest.raises(RecipeError, match="--steps must be at least 3"):
        Sweep(1e-4, 1.0, steps=2)
