"""Metric tracking: TensorBoard files, reporter choice, failure isolation, Prometheus endpoint."""
from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from smolforge import tracking
from smolforge.prometheus import MetricsServer
from smolforge.tracking import Tracker
from smolforge.errors import RecipeError


@pytest.fixture(autouse=True)
def no_cloud_trackers(monkeypatch):
    """Tests never start wandb or trackio, whatever happens to be installed."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(tracking, "is_installed", lambda name: name == "tensorboard")


def read_tensorboard(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert files, f"no event file in {run_dir / 'tensorboard'}"
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return acc


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def test_tensorboard_holds_the_logged_scalars(tmp_path):
    with Tracker(tmp_path, "pretrain-test", {"lr": 3e-3}, report_to=["tensorboard"]) as tracker:
        assert tracker.active == ["tensorboard"]
        for step, loss in [(1, 3.0), (2, 2.5), (3, 2.0)]:
            tracker.log(step, {"loss": loss, "train/lr": 1e-3 * step, "phase": "warmup", "gn": None})
    acc = read_tensorboard(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 3.0), (2, 2.5), (3, 2.0)]
    assert [e.step for e in acc.Scalars("train/lr")] == [1, 2, 3]
    assert acc.Scalars("train/lr")[2].value == pytest.approx(3e-3)
    assert {"phase", "gn"}.isdisjoint(acc.Tags()["scalars"])


def test_event_is_readable_back_from_tensorboard(tmp_path):
    with Tracker(tmp_path, "pretrain-test", {}, report_to=["tensorboard"]) as tracker:
        tracker.log(4, {"loss": 2.0})
        tracker.event(5, "spike", loss=9.1, threshold=4.0)
    acc = read_tensorboard(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars("events/spike")] == [(5, 1.0)]
    text_tag = next(t for t in acc.Tags()["tensors"] if t.startswith("events/spike"))
    note = acc.Tensors(text_tag)[0]
    assert note.step == 5
    assert b'"loss": 9.1' in note.tensor_proto.string_val[0]


def test_auto_picks_up_tensorboard(tmp_path):
    with Tracker(tmp_path, "pretrain-test", {}, report_to=["auto"]) as tracker:
        assert tracker.active == ["tensorboard"]
        tracker.log(1, {"loss": 1.0})
    assert read_tensorboard(tmp_path).Scalars("loss")[0].value == 1.0


def test_auto_never_picks_trackio(monkeypatch):
    monkeypatch.setattr(tracking, "is_installed", lambda name: True)
    assert "trackio" not in tracking.resolve_report_to(["auto"])


def test_none_creates_nothing(tmp_path):
    with Tracker(tmp_path, "pretrain-test", {}, report_to=["none"]) as tracker:
        tracker.log(1, {"loss": 1.0})
        tracker.event(1, "spike")
        assert tracker.active == []
    assert list(tmp_path.iterdir()) == []


def test_unknown_reporter_names_a_close_match(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown reporter 'tensorbord' \(did you mean 'tensorboard'\?\)"):
        Tracker(tmp_path, "pretrain-test", {}, report_to=["tensorbord"])
    assert list(tmp_path.iterdir()) == []


def test_missing_reporter_is_named_with_what_is_installed(tmp_path):
    expected = ("report_to: 'wandb' is not installed (pip install wandb), "
                "installed reporters: tensorboard")
    with pytest.raises(RecipeError) as err:
        Tracker(tmp_path, "pretrain-test", {}, report_to=["tensorboard", "wandb"])
    assert str(err.value) == expected
    assert list(tmp_path.iterdir()) == []   # refused before any reporter opened


def test_none_cannot_be_combined_with_a_reporter(tmp_path):
    with pytest.raises(RecipeError, match="'none' cannot be combined"):
        Tracker(tmp_path, "pretrain-test", {}, report_to=["none", "tensorboard"])


def test_trackio_refuses_to_leave_this_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "is_installed", lambda name: True)
    monkeypatch.setenv("TRACKIO_SPACE_ID", "someone/space")
    with pytest.raises(RecipeError, match="unset TRACKIO_SPACE_ID"):
        Tracker(tmp_path, "pretrain-test", {}, report_to=["tensorboard", "trackio"])
    assert list(tmp_path.iterdir()) == []


def test_failing_reporter_is_disabled_after_one_warning(tmp_path, monkeypatch, caplog):
    calls = []

    def broken_log(self, step, values):
        calls.append(step)
        raise OSError("disk full")

    monkeypatch.setattr(tracking.TensorBoardReporter, "log", broken_log)
    with caplog.at_level(logging.WARNING, logger="smolforge.tracking"):
        with Tracker(tmp_path, "pretrain-test", {}, report_to=["tensorboard"]) as tracker:
            for step in range(1, 4):
                tracker.log(step, {"loss": 1.0})        # must not raise
            tracker.event(4, "spike")
            assert tracker.active == []
    assert calls == [1]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "disk full" in warnings[0].getMessage()


def test_reporter_that_cannot_start_does_not_stop_training(tmp_path, monkeypatch, caplog):
    def cannot_start(self, *args):
        raise RuntimeError("no space left")

    monkeypatch.setattr(tracking.TensorBoardReporter, "__init__", cannot_start)
    with caplog.at_level(logging.WARNING, logger="smolforge.tracking"):
        with Tracker(tmp_path, "pretrain-test", {}, report_to=["tensorboard"]) as tracker:
            tracker.log(1, {"loss": 1.0})
            assert tracker.active == []
    assert "no space left" in caplog.text


def test_warnings_never_show_secrets(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WANDB_API_KEY", "secret-key-1234567890")

    def leaky_log(self, step, values):
        raise RuntimeError("auth failed for secret-key-1234567890")

    monkeypatch.setattr(tracking.TensorBoardReporter, "log", leaky_log)
    with caplog.at_level(logging.DEBUG, logger="smolforge.tracking"):
        with Tracker(tmp_path, "pretrain-test", {}, report_to=["tensorboard"]) as tracker:
            tracker.log(1, {"loss": 1.0})
    assert "auth failed" in caplog.text and "secret-key-1234567890" not in caplog.text


def test_active_reporters_are_logged_once(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="smolforge.tracking"):
        with Tracker(tmp_path, "pretrain-test", {}, report_to=["tensorboard"]) as tracker:
            tracker.log(1, {"loss": 1.0})
            tracker.log(2, {"loss": 0.5})
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "tensorboard" in infos[0]


def test_prometheus_serves_metrics_and_frees_its_port():
    server = MetricsServer(port=0, run="pretrain-test").start()
    try:
        assert server.host == "127.0.0.1" and server.port > 0
        server.update({"loss": 1.5, "tokens_per_s": 100, "rewards/margins": 0.25, "note": "x"})
        page = get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()
    assert 'smolforge_train_loss{run="pretrain-test"} 1.5' in page
    assert 'smolforge_train_tokens_per_s{run="pretrain-test"} 100.0' in page
    assert 'smolforge_train_rewards_margins{run="pretrain-test"} 0.25' in page
    assert "note" not in page
    with pytest.raises(urllib.error.URLError):
        get(f"http://127.0.0.1:{server.port}/metrics")


def test_two_prometheus_servers_coexist():
    with MetricsServer(port=0, run="a") as first, MetricsServer(port=0, run="b") as second:
        first.update({"loss": 1.0})
        second.update({"loss": 2.0})
        page_a = get(first.url)
        page_b = get(second.url)
    assert first.port != second.port
    assert 'smolforge_train_loss{run="a"} 1.0' in page_a and 'run="b"' not in page_a
    assert 'smolforge_train_loss{run="b"} 2.0' in page_b and 'run="a"' not in page_b


def test_tracker_feeds_prometheus(tmp_path):
    with Tracker(tmp_path, "pretrain-test", {}, report_to=["none"], prometheus_port=0) as tracker:
        assert tracker.active == ["prometheus"]
        server = tracker._reporters[0].server
        tracker.log(7, {"loss": 1.25})
        tracker.event(7, "spike", loss=9.0)
        page = get(server.url)
    assert 'smolforge_train_loss{run="pretrain-test"} 1.25' in page
    assert 'smolforge_train_step{run="pretrain-test"} 7.0' in page
    assert 'smolforge_events_total{kind="spike",run="pretrain-test"} 1.0' in page
    with pytest.raises(urllib.error.URLError):
        get(server.url)
