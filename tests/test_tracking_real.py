"""The trackers for real: wandb (offline) and trackio (local) runs hold what a Tracker logged, and a
TRL stage whose recipe names trackers reports the same per-step figures as its metrics.jsonl."""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from conftest import run_stage
from smolforge.tracking import Tracker


@pytest.fixture
def local_trackers(monkeypatch):
    """wandb offline; trackio in the session's private folder (conftest sets TRACKIO_DIR, which trackio
    reads once, at import); neither may reach a network. Returns trackio's folder."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # a CPU-machine test extra: on a GPU machine vLLM 0.33 needs pillow>=13 and trackio pillow<13 (docs/stack.md)
    pytest.importorskip("trackio", reason="trackio is not installed (make setup installs it on CPU machines only)")
    import trackio.utils

    assert str(trackio.utils.TRACKIO_DIR) == os.environ["TRACKIO_DIR"]
    return Path(trackio.utils.TRACKIO_DIR)


def trackio_rows(folder, run_name: str) -> list[tuple[int, dict]]:
    """(step, metrics) of a trackio run, from trackio's own SQLite store (project ``smolforge``)."""
    with sqlite3.connect(folder / "smolforge.db") as db:
        rows = db.execute("SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY id", (run_name,)).fetchall()
    return [(step, json.loads(metrics)) for step, metrics in rows]


def test_wandb_offline_and_trackio_runs_hold_the_logged_scalars(tmp_path, local_trackers):
    with Tracker(tmp_path / "run", "tracked", {"lr": 1e-3}, report_to=["wandb", "trackio"]) as tracker:
        assert tracker.active == ["wandb", "trackio"]
        tracker.log(1, {"loss": 2.718281, "lr": 1e-3})
        tracker.log(2, {"loss": 1.414213, "lr": 1e-3})
        tracker.event(2, "spike", loss=9.5)
    [record] = (tmp_path / "run").glob("wandb/offline-run-*/run-*.wandb")   # wandb's own offline run file
    blob = record.read_bytes()
    assert b"loss" in blob and b"2.718281" in blob and b"1.414213" in blob and b"events/spike" in blob
    assert trackio_rows(local_trackers, "tracked") == [
        (1, {"loss": 2.718281, "lr": 1e-3}), (2, {"loss": 1.414213, "lr": 1e-3}), (2, {"events/spike": 1.0})]


def test_a_trl_stage_reports_to_the_trackers_its_recipe_names(runs, pretrain_run, data_run, local_trackers):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = run_stage("sft", runs, name="sft-tracked", tracking={"report_to": ["tensorboard", "trackio"]},
                    trainer={"max_steps": 4, "eval_steps": 10})
    logged = {line["step"]: line["loss"] for line in map(json.loads, run.metrics_path.read_text().splitlines())
              if "loss" in line}
    assert sorted(logged) == [1, 2, 3, 4]
    events = EventAccumulator(str(run.path / "tensorboard"))
    events.Reload()
    assert {e.step: e.value for e in events.Scalars("loss")} == pytest.approx(logged)
    assert {step: m["loss"] for step, m in trackio_rows(local_trackers, "sft-tracked") if "loss" in m} == \
        pytest.approx(logged)
    untracked = run_stage("sft", runs, name="sft-untracked", trainer={"max_steps": 1})
    assert not (untracked.path / "tensorboard").exists()        # the TRL stages' default: metrics.jsonl only
