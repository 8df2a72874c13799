"""`smolforge eval audit`: the statistics on hand-made score tables, then a real audit of two tiny
pretraining runs (seeds 0 and 1, a DeepSpeed checkpoint every 4 steps) on the embedded suite."""
from __future__ import annotations

import json
import math
import random

import pytest

from conftest import run_stage
from smolforge.evals.audit import (Thresholds, audit, export_checkpoint, find_checkpoints, format_audit, kendall_tau,
                         spearman, summarize, task_statistics, write_audit)
from smolforge.errors import RecipeError, RunError
from smolforge.runs import Runs

QUIET = {"tracking": {"report_to": ["none"]}}


def scipy_stats():
    """scipy.stats, the reference the audit's statistics are checked against (imported by the tests that use it,
    not when the suite is collected)."""
    from scipy import stats

    return stats


# -- statistics on hand-made tables ------------------------------------------------------------
def test_perfectly_monotone_task_gets_rho_one_and_passes():
    table = {"s0": {100: 0.30, 200: 0.42, 300: 0.55, 400: 0.70},
             "s1": {100: 0.31, 200: 0.40, 300: 0.57, 400: 0.69},
             "s2": {100: 0.29, 200: 0.43, 300: 0.56, 400: 0.71}}
    stats = task_statistics(table, random_baseline=0.25)
    assert stats["monotonicity"] == 1.0
    assert stats["monotonicity_per_run"] == {"s0": 1.0, "s1": 1.0, "s2": 1.0}
    assert stats["verdict"] == "fit" and stats["fit"] is True
    assert stats["reasons"] == [] and stats["unchecked"] == []
    assert stats["final"] == pytest.approx(0.70) and stats["first"] == pytest.approx(0.30)
    assert stats["margin"] == pytest.approx(0.45)
    # noise: mean over the 4 steps of the across-seed std (ddof=1)
    expected_noise = sum(scipy_stats().tstd([table[r][t] for r in table]) for t in (100, 200, 300, 400)) / 4
    assert stats["noise"] == pytest.approx(expected_noise, abs=1e-6)
    assert stats["snr"] == pytest.approx(0.40 / expected_noise, rel=1e-4)


def test_flat_noisy_task_fails_and_says_which_criteria():
    table = {"s0": {1: 0.40, 2: 0.30, 3: 0.35}, "s1": {1: 0.30, 2: 0.42, 3: 0.33}}
    stats = task_statistics(table, random_baseline=0.25)
    assert stats["verdict"] == "unfit" and stats["fit"] is False
    assert stats["monotonicity"] == 0.0
    failed = " | ".join(stats["reasons"])
    assert "monotonicity 0.000 < 0.5" in failed
    assert "signal-to-noise" in failed and "margin" in failed


def test_task_at_random_fails_the_margin_criterion_only():
    # rises steadily with little seed noise, but ends at chance level
    table = {"s0": {1: 0.20, 2: 0.23, 3: 0.26}, "s1": {1: 0.21, 2: 0.24, 3: 0.25}}
    stats = task_statistics(table, random_baseline=0.25)
    assert stats["monotonicity"] == 1.0 and stats["snr"] > 1
    assert stats["verdict"] == "unfit"
    assert len(stats["reasons"]) == 1 and stats["reasons"][0].startswith("margin 0.005 <= 2 x noise 0.007")
    # the same task clears the margin once the bar is lowered: the threshold is what decided
    assert task_statistics(table, 0.25, Thresholds(margin_noise_factor=0.5))["verdict"] == "fit"


@pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")
def test_ranks_with_ties_match_scipy():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(3, 8)
        x = [rng.choice([0.1, 0.2, 0.3, 0.4]) for _ in range(n)]
        y = [rng.choice([0.0, 0.5, 1.0]) for _ in range(n)]
        ours, theirs = spearman(x, y), scipy_stats().spearmanr(x, y).statistic
        if math.isnan(theirs):  # a constant side: no trend
            assert ours == 0.0
        else:
            assert ours == pytest.approx(theirs, abs=1e-4)
        tau, ref = kendall_tau(x, y), scipy_stats().kendalltau(x, y, variant="b").statistic
        assert (tau is None) if math.isnan(ref) else tau == pytest.approx(ref, abs=1e-4)
    # a plateau is a tie: average ranks, so not a perfect 1.0, but clearly monotone
    assert spearman([1, 2, 3, 4], [0.1, 0.2, 0.2, 0.5]) == pytest.approx(0.9487, abs=1e-4)


def test_ranking_consistency_is_kendall_tau_between_consecutive_checkpoints():
    kept = {"a": {1: 0.3, 2: 0.5, 3: 0.7}, "b": {1: 0.2, 2: 0.4, 3: 0.6}, "c": {1: 0.1, 2: 0.3, 3: 0.5}}
    assert task_statistics(kept, 0.0)["ranking_consistency"] == 1.0
    flipping = {"a": {1: 0.3, 2: 0.4, 3: 0.7}, "b": {1: 0.2, 2: 0.5, 3: 0.6}}  # a>b, b>a, a>b
    stats = task_statistics(flipping, 0.0)
    assert stats["ranking_consistency"] == -1.0
    assert stats["verdict"] == "fit"  # reported, not gated by default
    gated = task_statistics(flipping, 0.0, Thresholds(min_ranking_consistency=0.5))
    assert gated["verdict"] == "unfit" and gated["reasons"] == ["ranking consistency -1.000 < 0.5"]
    # a step where every run ties has no ordering: that pair is left out, not counted as 0
    tied = {"a": {1: 0.3, 2: 0.5, 3: 0.7}, "b": {1: 0.2, 2: 0.5, 3: 0.6}}
    assert task_statistics(tied, 0.0)["ranking_consistency"] is None


def test_one_run_reports_noise_as_na_but_still_measures_monotonicity():
    result = summarize({"s0": {1: {"a": 0.3, "b": 0.2}, 2: {"a": 0.5, "b": 0.2}, 3: {"a": 0.7, "b": 0.2}}},
                       {"a": 0.25, "b": 0.25})
    a, b = result["tasks"]["a"], result["tasks"]["b"]
    assert a["monotonicity"] == 1.0
    assert a["noise"] is None and a["snr"] is None and a["ranking_consistency"] is None
    assert a["verdict"] == "undecided" and a["fit"] is None
    assert any("noise n/a" in u for u in a["unchecked"])
    assert b["verdict"] == "unfit" and "margin -0.050 <= 0 (not above random)" in b["reasons"]
    assert result["fit"] == [] and "noise, signal-to-noise and ranking consistency are n/a" in result["notes"][0]
    table = format_audit(result)
    assert "n/a" in table and "note: 1 run" in table


def test_fewer_than_three_checkpoints_makes_monotonicity_na():
    result = summarize({"s0": {1: {"a": 0.3}, 2: {"a": 0.6}}, "s1": {1: {"a": 0.3}, 2: {"a": 0.62}}}, {"a": 0.1})
    a = result["tasks"]["a"]
    assert a["monotonicity"] is None and a["noise"] is not None
    assert a["verdict"] == "undecided" and any("monotonicity n/a" in u for u in a["unchecked"])
    assert any("monotonicity is n/a" in n for n in result["notes"])


def test_noise_uses_the_steps_all_runs_share():
    result = summarize({"s0": {1: {"a": 0.3}, 2: {"a": 0.5}, 3: {"a": 0.7}},
                        "s1": {1: {"a": 0.4}, 3: {"a": 0.8}}}, {"a": 0.0})
    a = result["tasks"]["a"]
    assert result["common_steps"] == [1, 3] and a["common_steps"] == [1, 3]
    assert a["noise"] == pytest.approx(scipy_stats().tstd([0.3, 0.4]), abs=1e-6)
    assert a["monotonicity_per_run"] == {"s0": 1.0, "s1": None}  # s1 has 2 steps only
    assert any("share 2 step(s)" in n for n in result["notes"])


def test_zero_noise_means_infinite_signal_and_json_says_inf(tmp_path):
    same = {"s0": {1: {"a": 0.3}, 2: {"a": 0.5}, 3: {"a": 0.7}}, "s1": {1: {"a": 0.3}, 2: {"a": 0.5}, 3: {"a": 0.7}}}
    result = summarize(same, {"a": 0.25})
    assert result["tasks"]["a"]["snr"] == math.inf and result["tasks"]["a"]["verdict"] == "fit"
    written = json.loads(write_audit(result, tmp_path / "audit.json").read_text())
    assert written["tasks"]["a"]["snr"] == "inf" and written["fit"] == ["a"]
    assert "inf" in format_audit(result)


# -- errors ------------------------------------------------------------------------------------
def _fake_run(runs: Runs, name: str, checkpoints: tuple[str, ...] = ()) -> None:
    with runs.start("pretrain", name, recipe={}) as run:
        run.model_dir.mkdir()
        (run.model_dir / "config.json").write_text("{}")
        for folder in checkpoints:
            (run.checkpoints_dir / folder).mkdir(parents=True)
        run.finish(metrics={"train/steps": 12})


def test_unknown_run_names_the_closest_one(tmp_path):
    runs = Runs(tmp_path)
    _fake_run(runs, "pretrain-s0")
    with pytest.raises(RunError, match="did you mean 'pretrain-s0'"):
        audit(runs, ["pretrain-s9"])


def test_run_without_checkpoints_is_a_clear_error(tmp_path):
    runs = Runs(tmp_path)
    _fake_run(runs, "bare", checkpoints=("not-a-step", "step-4"))  # step-4 is empty: not a checkpoint
    assert [c.kind for c in find_checkpoints(runs.get("bare"))] == ["model"]
    with pytest.raises(RunError, match=r"run 'bare' has no checkpoints to audit.*checkpoint\.every_steps"):
        audit(runs, ["bare"])


def test_bad_arguments_fail_before_any_scoring(tmp_path, monkeypatch):
    runs = Runs(tmp_path)
    _fake_run(runs, "a")
    monkeypatch.setattr("smolforge.evals.stage.evaluate", lambda *a, **k: pytest.fail("nothing may be scored"))
    with pytest.raises(RunError, match="given more than once"):
        audit(runs, ["a", "a"])
    with pytest.raises(RecipeError, match="has no task 'fatcs' \\(did you mean 'facts'\\?\\)"):
        audit(runs, ["a"], tasks=["fatcs"])


# -- a real audit of two tiny pretraining runs -------------------------------------------------
@pytest.fixture(scope="module")
def seeds(runs, data_run):
    """Two tiny pretraining runs of one recipe, seeds 0 and 1, DeepSpeed checkpoints at 4, 8, 12."""
    return [run_stage("pretrain", runs, name=f"audit-s{seed}", train={"seed": seed, "max_steps": 12},
                      checkpoint={"every_steps": 4, "keep": 10}, **QUIET) for seed in (0, 1)]


@pytest.fixture(scope="module")
def shared_task_index():
    """lm-eval's TaskManager() indexes every installed task (~6 s); evaluate() builds one per call.
    One shared index changes no score and keeps this test at seconds per checkpoint."""
    from lm_eval import tasks

    original = tasks.TaskManager
    index = original()
    mp = pytest.MonkeyPatch()
    mp.setattr(tasks, "TaskManager", lambda *a, **k: index)
    yield
    mp.undo()


def test_deepspeed_checkpoint_exports_to_the_same_weights_as_the_final_model(seeds, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    run = seeds[0]
    points = find_checkpoints(run)
    assert [(p.step, p.kind) for p in points] == [(4, "deepspeed"), (8, "deepspeed"), (12, "model")]
    exported = export_checkpoint(run.checkpoints_dir / "step-12", run.model_dir, tmp_path / "m")
    a = AutoModelForCausalLM.from_pretrained(exported).state_dict()
    b = AutoModelForCausalLM.from_pretrained(run.model_dir).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)
    assert (exported / "tokenizer.json").is_file() and (exported / "chat_template.jinja").is_file()
    early = AutoModelForCausalLM.from_pretrained(
        export_checkpoint(run.checkpoints_dir / "step-4", run.model_dir, tmp_path / "m4")).state_dict()
    assert not torch.equal(early["model.embed_tokens.weight"], b["model.embed_tokens.weight"])


@pytest.mark.slow
def test_audit_of_two_seeds_scores_every_checkpoint_once_then_reads_the_cache(
        runs, seeds, shared_task_index, monkeypatch, tmp_path):
    from smolforge.evals import stage

    calls = []
    real = stage.evaluate

    def counting(model_dir, suite, task_names, *args, **kwargs):
        calls.append((str(model_dir), list(task_names)))
        return real(model_dir, suite, task_names, *args, **kwargs)

    monkeypatch.setattr(stage, "evaluate", counting)
    names = [r.name for r in seeds]
    first = audit(runs, names, suite="embedded", tasks=["arith", "facts"], limit=4, batch_size=8, device="cpu")

    assert len(calls) == 6 and first["evaluated"] == 6 and first["cached"] == 0
    assert sum("/eval/audit/.model-step-" in c for c, _ in calls) == 4  # the DeepSpeed checkpoints, exported
    assert first["runs"] == names and first["suite"] == "embedded" and first["limit"] == 4
    assert first["steps"] == {n: [4, 8, 12] for n in names} and first["common_steps"] == [4, 8, 12]
    assert first["sources"]["audit-s0"] == {"4": "checkpoints/step-4", "8": "checkpoints/step-8", "12": "model"}
    assert set(first["tasks"]) == {"arith", "facts"}
    for name, task in first["tasks"].items():
        assert task["metric"] == "acc" and task["verdict"] in ("fit", "unfit", "undecided")
        assert task["monotonicity"] is not None and task["noise"] is not None
        assert (task["verdict"] == "fit") == (not task["reasons"] and not task["unchecked"])
        for run in names:
            assert all(0.0 <= first["scores"][run][str(s)][name] <= 1.0 for s in (4, 8, 12))
    assert first["tasks"]["facts"]["random"] == 0.125 and first["tasks"]["arith"]["random"] == 0.25
    assert not list((seeds[0].eval_dir / "audit").glob(".model-step-*"))  # exports cleaned up
    cache = json.loads((seeds[1].eval_dir / "audit" / "8.json").read_text())
    entry = cache["results"]["embedded|limit=4"]
    assert cache["step"] == 8 and entry["source"] == "checkpoints/step-8"
    assert entry["scores"]["facts"]["acc"] == first["scores"]["audit-s1"]["8"]["facts"]

    calls.clear()
    second = audit(runs, names, suite="embedded", tasks=["arith", "facts"], limit=4, batch_size=8, device="cpu")
    assert calls == [] and second["evaluated"] == 0 and second["cached"] == 6
    assert second["scores"] == first["scores"] and second["tasks"] == first["tasks"]

    subset = audit(runs, names, suite="embedded", tasks=["facts"], limit=4)  # a subset: still cached
    assert calls == [] and list(subset["tasks"]) == ["facts"]
    more = audit(runs, names, suite="embedded", tasks=["arith", "facts", "prefs"], limit=4, batch_size=8)
    assert [t for _, t in calls] == [["prefs"]] * 6  # only the new task is scored, at every checkpoint
    assert more["evaluated"] == 6
    assert more["scores"]["audit-s0"]["4"]["arith"] == first["scores"]["audit-s0"]["4"]["arith"]
    assert more["tasks"]["prefs"]["metric"] == "acc" and more["tasks"]["prefs"]["random"] == 0.5

    text = format_audit(first)
    assert text.splitlines()[0].startswith("eval audit of 2 runs (audit-s0, audit-s1) on suite embedded, limit 4")
    assert all(t in text for t in ("arith", "facts", "monoton.", "rank cons.", "audit-s1"))
    assert json.loads(write_audit(first, tmp_path / "a.json").read_text())["steps"]["audit-s0"] == [4, 8, 12]
    print("\n" + text)
