"""Bad input: a clear message naming file/line/field, exit code 2, and no run that looks done."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import DEMO, REPO, run_stage
from smolforge.cli import main
from smolforge.errors import RunError


def cli(runs, *args) -> int:
    return main(["--runs-dir", str(runs.root), *args])


def write(path, text):
    path.write_text(text)
    return path


def test_misspelled_recipe_key_names_file_key_and_closest_key(tmp_path, runs, capsys):
    recipe = write(tmp_path / "sft.yaml", (DEMO / "sft.yaml").read_text().replace("max_steps:", "max_step:"))
    code = cli(runs, "sft", "--config", str(recipe), "--set", "name=typo-run")
    err = capsys.readouterr().err
    assert code == 2
    assert f"RecipeError: {recipe}: unknown key 'trainer.max_step' (did you mean 'trainer.max_steps'?)" in err
    assert "Traceback" not in err
    assert not (runs.root / "typo-run").exists()


def test_misspelled_key_exits_nonzero_from_the_shell(tmp_path):
    recipe = write(tmp_path / "pre.yaml", "stage: pretrain\nname: x\ntrain:\n  max_stepz: 3\n")
    proc = subprocess.run([sys.executable, "-m", "smolforge", "--runs-dir", str(tmp_path / "runs"), "pretrain",
                           "--config", str(recipe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown key 'train.max_stepz' (did you mean 'train.max_steps'?)" in proc.stderr
    assert not (tmp_path / "runs" / "x").exists()


def test_malformed_jsonl_line_names_file_and_line(tmp_path, runs, capsys):
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    sft_file = write(tmp_path / "chats.jsonl", good + "\n" + '{"messages": [oops}\n')
    recipe = write(tmp_path / "data.yaml", f"stage: data\nname: bad-data\nsources:\n  sft: {sft_file}\n")
    code = cli(runs, "data", "--config", str(recipe))
    err = capsys.readouterr().err
    assert code == 2
    assert f"DataError: {sft_file} line 2: not valid JSON" in err
    assert not (runs.root / "bad-data").exists()


def test_preference_row_missing_rejected_is_refused_before_training(tmp_path, runs, sft_run, capsys):
    row = {"prompt": [{"role": "user", "content": "What is 1 plus 1?"}],
           "chosen": [{"role": "assistant", "content": "1 plus 1 is 2."}]}
    prefs = write(tmp_path / "prefs.jsonl", json.dumps(row) + "\n")
    code = cli(runs, "dpo", "--config", str(DEMO / "dpo.yaml"), "--set", f"data={prefs}",
               "--set", f"parent={sft_run.name}", "--set", "name=dpo-bad")
    err = capsys.readouterr().err
    assert code == 2
    assert f"DataError: {prefs} line 1: field 'rejected' is missing (expected prompt, chosen, rejected)" in err
    assert not (runs.root / "dpo-bad").exists()


def test_missing_parent_run_is_named_with_known_runs(runs, sft_run, capsys):
    code = cli(runs, "dpo", "--config", str(DEMO / "dpo.yaml"), "--set", "parent=sft-dmeo", "--set", "name=dpo-orphan")
    err = capsys.readouterr().err
    assert code == 2
    assert "RunError: run 'sft-dmeo' not found" in err and sft_run.name in err
    assert not (runs.root / "dpo-orphan").exists()


def test_failed_parent_run_cannot_be_built_on(runs, data_run, capsys):
    # A pretraining run whose loss turns NaN (a NaN norm epsilon) is marked failed...
    with pytest.raises(RuntimeError, match="loss became nan"):
        run_stage("pretrain", runs, name="pretrain-diverged", model={"extra": {"rms_norm_eps": float("nan")}},
                  train={"max_steps": 6}, checkpoint={"every_steps": 0})
    failed = json.loads((runs.root / "pretrain-diverged" / "run.json").read_text())
    assert failed["status"] == "failed" and "loss became" in failed["error"]
    assert not (runs.root / "pretrain-diverged" / "model").exists()
    # ...and a stage asked to start from it refuses, naming the reason.
    code = cli(runs, "sft", "--config", str(DEMO / "sft.yaml"), "--set", "parent=pretrain-diverged",
               "--set", "name=sft-on-failed")
    err = capsys.readouterr().err
    assert code == 2
    assert "RunError: run 'pretrain-diverged' failed" in err
    assert not (runs.root / "sft-on-failed").exists()


def test_existing_run_is_not_overwritten_without_the_flag(runs, data_run, capsys):
    before = (data_run.path / "run.json").read_text()
    code = cli(runs, "data", "--config", str(DEMO / "data.yaml"), "--set", f"name={data_run.name}")
    assert code == 2
    assert "already exists" in capsys.readouterr().err
    assert (data_run.path / "run.json").read_text() == before


def test_cli_help_shows_a_runnable_example():
    proc = subprocess.run([sys.executable, "-m", "smolforge", "dpo", "--help"], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0 and "smolforge dpo --config recipes/demo/dpo.yaml" in proc.stdout


def _truncate(model):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return "model.safetensors: truncated"


def _bad_config(model):
    (model / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    return "config.json is not readable JSON"


def _no_tokenizer(model):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink(missing_ok=True)
    return "has no tokenizer"


def _no_weights(model):
    (model / "model.safetensors").unlink()
    return "has no weights (no model.safetensors"


@pytest.mark.parametrize("damage", [_truncate, _bad_config, _no_tokenizer, _no_weights])
def test_a_broken_model_folder_is_named_before_any_command_loads_it(damage, tmp_path, sft_run, data_run, capsys):
    """eval, serve and the alignment stages check model/ first: one line naming run and file, exit 2."""
    import shutil

    from smolforge.runs import Runs

    runs = Runs(tmp_path / "runs")
    shutil.copytree(sft_run.path, runs.root / "broken", ignore=shutil.ignore_patterns("checkpoints"))
    info = runs.root / "broken" / "run.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "name": "broken"}))
    expected = damage(runs.root / "broken" / "model")
    commands = {"eval": ["eval", "broken", "--suite", "embedded"],
                "serve": ["serve", "broken"],
                "sft": ["sft", "--config", str(DEMO / "sft.yaml"), "--set", "parent=broken",
                        "--set", f"data={data_run.path}", "--set", "name=from-broken"],
                "dpo": ["dpo", "--config", str(DEMO / "dpo.yaml"), "--set", "parent=broken",
                        "--set", f"data={data_run.path}", "--set", "name=from-broken"]}
    for command, args in commands.items():
        assert cli(runs, *args) == 2, command
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and "'broken'" in lines[0] and expected in lines[0], (command, lines)
        assert "Traceback" not in lines[0]
    assert sorted(p.name for p in runs.root.iterdir()) == ["broken"]        # nothing half-written


def test_an_unreadable_run_json_is_named_by_lineage_and_the_stages(tmp_path, sft_run, capsys):
    import shutil

    from smolforge.runs import Runs

    runs = Runs(tmp_path / "runs")
    shutil.copytree(sft_run.path, runs.root / "cut", ignore=shutil.ignore_patterns("checkpoints", "model"))
    info = runs.root / "cut" / "run.json"
    info.write_text(info.read_text()[:40])
    for args in (["lineage", "cut"], ["eval", "cut", "--suite", "embedded"], ["serve", "cut"]):
        assert cli(runs, *args) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and f"{info}: cannot read run.json" in lines[0], (args, lines)


def test_a_model_folder_that_passed_is_not_read_again_until_a_file_changes(tmp_path, sft_run, monkeypatch):
    import shutil

    from smolforge import model_folder

    model = shutil.copytree(sft_run.model_dir, tmp_path / "model")
    reads = []
    check = model_folder._check_model_folder
    monkeypatch.setattr(model_folder, "_check_model_folder", lambda *a, **k: (reads.append(a[0]), check(*a, **k)))
    for _ in range(3):                                   # a stage's validate, run and loaders
        model_folder.check_model_folder(model, "parent run 'sft'")
    assert reads == [model]
    model_folder.check_model_folder(model, "parent run 'sft'", tokenizer=False)   # another check: read
    assert len(reads) == 2
    _truncate(model)
    with pytest.raises(RunError, match=r"parent run 'sft': model/ .*model.safetensors: .*truncated"):
        model_folder.check_model_folder(model, "parent run 'sft'")
