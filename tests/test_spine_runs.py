"""Run folders: the run.json contract, lifecycle, lookup errors, lineage and atomic writes."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from smolforge.errors import RunError
from smolforge.runs import RUN_KEYS, Run, Runs, file_fingerprint, runs_root, write_json_atomic


def read(path: Path) -> dict:
    return json.loads((path / "run.json").read_text())


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(tmp_path / "runs")


def test_run_json_has_every_key_and_goes_running_to_done(runs):
    @dataclass
    class R:
        lr: float = 1e-4
        out: Path = Path("x")

    with runs.start("sft", "sft-demo", R(), data_fingerprints={"a.jsonl": "sha256:00"}) as run:
        info = read(run.path)
        assert set(info) == set(RUN_KEYS)
        assert info["status"] == "running" and info["ended_at"] is None
        assert info["recipe"] == {"lr": 1e-4, "out": "x"}
        assert info["parents"] == [] and info["data_fingerprints"] == {"a.jsonl": "sha256:00"}
        assert "smolforge" in info["versions"]
        run.log(step=1, loss=2.0)
        run.log(step=2, loss=1.5)
        run.finish(metrics={"train/tokens": 100})
    info = read(run.path)
    assert info["status"] == "done" and info["error"] is None
    assert info["metrics"] == {"train/tokens": 100}
    assert info["started_at"] <= info["ended_at"] and info["ended_at"].endswith("+00:00")
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert [(x["step"], x["loss"]) for x in lines] == [(1, 2.0), (2, 1.5)] and "time" in lines[0]


def test_exception_marks_run_failed_and_is_reraised(runs):
    with pytest.raises(ValueError, match="boom"):
        with runs.start("sft", "bad", {}):
            raise ValueError("boom")
    info = read(runs.root / "bad")
    assert info["status"] == "failed" and info["error"] == "ValueError: boom" and info["ended_at"]


def test_keyboard_interrupt_marks_run_failed_interrupted(runs):
    with pytest.raises(KeyboardInterrupt):
        with runs.start("sft", "stopped", {}):
            raise KeyboardInterrupt
    assert read(runs.root / "stopped")["error"] == "interrupted"


def test_exit_without_finish_marks_done(runs):
    with runs.start("data", "d", {}) as run:
        pass
    assert read(run.path)["status"] == "done" and run.status == "done"


def test_existing_run_without_overwrite_is_an_error(runs):
    with runs.start("data", "d", {}):
        pass
    with pytest.raises(RunError) as err:
        with runs.start("data", "d", {}):
            pass
    assert str(err.value) == (f"run 'd' already exists (status done) at {runs.root / 'd'}; "
                              "pass --overwrite or choose another name")
    with runs.start("data", "d", {"v": 2}, overwrite=True) as run:
        (run.path / "marker").write_text("new")
    assert read(run.path)["recipe"] == {"v": 2}


def test_overwrite_removes_old_contents(runs):
    with runs.start("data", "d", {}) as run:
        (run.path / "old.txt").write_text("x")
    with runs.start("data", "d", {}, overwrite=True) as run:
        assert not (run.path / "old.txt").exists()


def test_get_missing_run_suggests_close_name(runs):
    for name in ("sft-demo", "dpo-demo"):
        with runs.start("sft", name, {}):
            pass
    with pytest.raises(RunError) as err:
        runs.get("sft-dmo")
    assert str(err.value) == (f"run 'sft-dmo' not found under {runs.root}/; did you mean 'sft-demo'? "
                              "(known runs: dpo-demo, sft-demo)")


def test_get_failed_run_says_fix_and_rerun(runs):
    with pytest.raises(RuntimeError):
        with runs.start("sft", "sft-demo", {}):
            raise RuntimeError("out of memory")
    with pytest.raises(RunError) as err:
        runs.get("sft-demo")
    assert str(err.value) == ("run 'sft-demo' failed (RuntimeError: out of memory); "
                              "fix it and rerun before using it as a parent")
    assert runs.get("sft-demo", require_done=False).status == "failed"


def test_get_running_run_says_running_or_crashed(runs):
    with runs.start("sft", "live", {}):
        with pytest.raises(RunError, match="still running or it crashed"):
            runs.get("live")


def test_get_folder_without_run_json_is_not_a_run(runs, tmp_path):
    (runs.root / "junk").mkdir(parents=True)
    with pytest.raises(RunError, match="is not a run"):
        runs.get("junk")
    with runs.start("data", "d", {}):
        pass
    assert runs.get(str(runs.root / "d")).name == "d"  # a path works too


def test_list_is_sorted_by_start(runs):
    for name in ("b", "a", "c"):
        with runs.start("data", name, {}):
            pass
    assert [r.name for r in runs.list()] == ["b", "a", "c"]


def test_parents_are_names_under_root_and_paths_outside(runs, tmp_path):
    elsewhere = Runs(tmp_path / "other")
    with elsewhere.start("data", "ext", {}) as ext:
        pass
    with runs.start("data", "d", {}) as d:
        pass
    with runs.start("pretrain", "p", {}, parents=[d, ext]) as p:
        pass
    assert read(p.path)["parents"] == ["d", str(ext.path.resolve())]


def test_lineage_tree_and_missing_parent(runs):
    with runs.start("data", "data-demo", {}) as data:
        pass
    with runs.start("pretrain", "pretrain-demo", {}, parents=[data]) as pre:
        pass
    with runs.start("sft", "sft-demo", {}, parents=[pre]) as sft:
        pass
    with runs.start("dpo", "dpo-demo", {}, parents=[sft]):
        pass
    import shutil
    shutil.rmtree(data.path)
    tree = runs.lineage("dpo-demo")
    assert (tree["name"], tree["stage"], tree["status"]) == ("dpo-demo", "dpo", "done")
    node = tree["parents"][0]["parents"][0]
    assert node["name"] == "pretrain-demo"
    assert node["parents"] == [{"name": "data-demo", "stage": None, "status": "missing",
                                "path": str(runs.root / "data-demo"), "parents": []}]


def test_lineage_survives_cycles(runs):
    with runs.start("data", "a", {}) as a:
        pass
    with runs.start("data", "b", {}, parents=[a]) as b:
        pass
    a.info["parents"] = ["b"]
    write_json_atomic(a.json_path, a.info)
    tree = runs.lineage("a")
    assert tree["parents"][0]["name"] == "b"
    assert tree["parents"][0]["parents"][0]["status"] == "cycle"


def test_update_metrics_merges_into_a_done_run(runs):
    with runs.start("sft", "m", {}) as run:
        run.finish({"train/tokens": 5})
    runs.get("m").update_metrics({"toy/acc": 0.5})
    assert read(run.path)["metrics"] == {"train/tokens": 5, "toy/acc": 0.5}


def test_save_model_swaps_folder_atomically(runs):
    class Saver:
        def __init__(self, text):
            self.text = text

        def save_pretrained(self, directory, safe_serialization=False):
            assert safe_serialization
            Path(directory, f"{type(self).__name__}.txt").write_text(self.text)

    class Tok:
        def save_pretrained(self, directory):  # no safe_serialization keyword: retried without
            Path(directory, "tokenizer.json").write_text("{}")

    with runs.start("sft", "s", {}) as run:
        run.save_model(Saver("v1"), Tok())
        run.save_model(Saver("v2"), None)
    assert sorted(os.listdir(run.model_dir)) == ["Saver.txt"]
    assert (run.model_dir / "Saver.txt").read_text() == "v2"
    assert not [p for p in os.listdir(run.path) if p.startswith(".model")]


def test_atomic_json_write_leaves_no_temp_files(tmp_path):
    target = tmp_path / "x.json"
    write_json_atomic(target, {"a": 1})
    write_json_atomic(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["x.json"]
    with pytest.raises(TypeError):  # a failed write keeps the old file and cleans up its temp
        write_json_atomic(target, {1j: "complex keys are not JSON"})
    assert os.listdir(tmp_path) == ["x.json"] and json.loads(target.read_text()) == {"a": 2}


def test_runs_root_precedence(monkeypatch):
    monkeypatch.setenv("SMOLFORGE_RUNS", "/env/runs")
    assert runs_root("/cli") == Path("/cli")
    assert runs_root(None) == Path("/env/runs")
    monkeypatch.delenv("SMOLFORGE_RUNS")
    assert runs_root(None) == Path("runs")


def test_fingerprint_is_sha256(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"abc")
    assert file_fingerprint(f) == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert Run.fingerprint(f) == {str(f): file_fingerprint(f)}


def _add_metrics(path: str, prefix: str, count: int) -> None:
    from smolforge.runs import Run

    for i in range(count):
        Run(path).update_metrics({f"{prefix}/m{i}": i})


def test_metric_updates_from_two_processes_at_once_are_all_kept(tmp_path):
    import multiprocessing

    runs = Runs(tmp_path)
    with runs.start("sft", "target", {}) as run:
        run.log(0, loss=1.0)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_add_metrics, args=(str(run.path), prefix, 60)) for prefix in ("a", "b")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    metrics = runs.get("target").metrics
    assert {k for k in metrics if k[:2] in ("a/", "b/")} == {f"{p}/m{i}" for p in "ab" for i in range(60)}


def test_finishing_a_run_keeps_metrics_another_process_wrote_meanwhile(tmp_path):
    runs = Runs(tmp_path)
    with runs.start("sft", "busy", {}) as run:
        Run(run.path).update_metrics({"arith/acc": 0.5})     # e.g. an eval of the running run
        run.finish({"train/loss": 1.0})
    assert runs.get("busy").metrics == {"arith/acc": 0.5, "train/loss": 1.0}
