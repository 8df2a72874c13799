"""What a plan reads: numbers as written on the command line, the device, recipes and model shapes.

Shared by every plan (:mod:`.pretrain`, :mod:`.ppo`, :mod:`.posttrain`), below all of them.

    >>> parse_count("1.5k", "--gpus"), device_fields("h100")["gpu"]
    (1500.0, 'h100')
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError
from smolforge.pretrain.flops import (DEVICES, device_key, host_memory_bytes, measure_cpu_peak_flops,
                                     unknown_device_message)
from smolforge.pretrain.model import ModelShape

__all__ = ["DEFAULT_VOCAB", "parse_count", "device_fields", "sibling_recipe", "load_pretrain_recipe", "parameters",
           "deepspeed_file", "hf_model", "model_from"]

DEFAULT_VOCAB = 128256          # Llama-3's tokenizer, which SmolLM3 reuses
_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_RECIPES: dict[tuple[str, int, int], tuple[str, dict] | None] = {}   # (file, mtime, size) -> (stage, keys)


# --------------------------------------------------------------------------- numbers and the device


def parse_count(value: Any, what: str) -> float:
    """A positive number, written plainly (``11e12``) or with a suffix k/M/B/G/T (``11T``).

    >>> parse_count("11T", "--tokens"), parse_count("2.5e3", "--tokens"), parse_count(7, "--gpus")
    (11000000000000.0, 2500.0, 7.0)
    >>> parse_count("-3", "--days")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: --days must be a number > 0, got '-3'
    """
    text = str(value).strip()
    scale = 1.0
    match = re.fullmatch(r"(.*?)\s*([kKmMbBgGtT])", text)
    if match and not re.fullmatch(r".*[eE][-+]?", match.group(1)):
        text, scale = match.group(1), _SUFFIXES[match.group(2).lower()]
    try:
        number = float(text) * scale
    except ValueError:
        number = float("nan")
    if not (math.isfinite(number) and number > 0):
        raise RecipeError(f"{what} must be a number > 0, got {str(value)!r}")
    return number


def device_fields(gpu: str) -> dict[str, Any]:
    """The plan's device fields for a ``--gpu`` name (peak FLOP/s, memory, source); unknown → RecipeError."""
    key = device_key(gpu)
    if key is None:
        raise RecipeError(unknown_device_message(gpu))
    spec = DEVICES[key]
    if key == "cpu":
        peak = measure_cpu_peak_flops()
        peak_source, memory = f"{spec.source}: {peak / 1e9:.0f} GFLOP/s", host_memory_bytes()
    else:
        peak, peak_source, memory = float(spec.peak_flops), spec.source, spec.memory_bytes
    return {"gpu": key, "peak_flops_per_gpu": peak, "peak_source": peak_source, "gpu_memory_bytes": memory}


# --------------------------------------------------------------------------- recipes


def sibling_recipe(path: str | Path, name: str) -> tuple[Path, str, dict] | None:
    """(file, stage, keys) of the recipe beside ``path`` whose ``name:`` is ``name``, else None.

    Each file is read once while it is unchanged; the keys are shared: do not change them.

    >>> found = sibling_recipe("recipes/smollm3-3b/sft.yaml", "pretrain-smollm3-3b")
    >>> found[0].name, found[1]
    ('pretrain.yaml', 'pretrain')
    """
    from smolforge.recipe import load_recipe

    path = Path(path)
    for sibling in sorted(path.parent.glob("*.yaml")):
        if sibling.resolve() == path.resolve():
            continue
        stat = sibling.stat()
        key = (str(sibling.resolve()), stat.st_mtime_ns, stat.st_size)
        if key not in _RECIPES:
            try:
                _RECIPES[key] = load_recipe(sibling)
            except RecipeError:   # a pipeline recipe, a broken file: no model comes from it
                _RECIPES[key] = None
        loaded = _RECIPES[key]
        if loaded is not None and loaded[1].get("name") == name:
            return sibling, loaded[0], loaded[1]
    return None


def load_pretrain_recipe(path: str | Path, sets: list[str] | tuple[str, ...] = (), *, depth: int = 0):
    """Build the ``smolforge.pretrain.stage.Recipe`` in ``path``; any other stage is a RecipeError.
    With ``init:`` its ``model`` is the parent recipe's shape (see :func:`_parent_shape`)."""
    from smolforge.recipe import build_stage_recipe, load_recipe
    from smolforge.registry import load_stage

    stage, data = load_recipe(path, sets)
    if stage != "pretrain":
        raise RecipeError(f"{path}: recipe is for stage '{stage}'; smolforge plan needs a "
                          "pretrain recipe (stage: pretrain), e.g. recipes/smollm3-3b/pretrain.yaml, "
                          "or a PPO recipe (stage: ppo) with --model")
    recipe = build_stage_recipe(load_stage("pretrain"), data, source=str(path))
    if recipe.init:   # continued pretraining: the parent's shape, its positions changed by context:
        import dataclasses

        shape = _parent_shape(Path(path), recipe.init, depth)
        recipe.model = dataclasses.replace(
            shape, max_position_embeddings=recipe.context.max_position_embeddings or shape.max_position_embeddings,
            rope_theta=recipe.context.rope_theta or shape.rope_theta)
    return recipe


def _parent_shape(path: Path, init: str, depth: int) -> ModelShape:
    """The model shape of ``init``: the pretrain recipe named so beside ``path`` (followed through its
    own ``init:``), for planning a run whose parent does not exist yet."""
    if depth > 8:
        raise RecipeError(f"{path}: init: chain longer than 8 recipes (a cycle?)")
    found = sibling_recipe(path, init)
    if found is not None and found[1] == "pretrain":
        return load_pretrain_recipe(found[0], depth=depth + 1).model
    raise RecipeError(f"{path}: init: {init} — smolforge plan needs the parent's shape: no pretrain recipe "
                      f"named '{init}' beside it in {path.parent}/")


# --------------------------------------------------------------------------- models and DeepSpeed files


_COUNTED: dict[tuple[str, int], int] = {}   # (repr of the shape, vocab) -> parameters


def parameters(shape: ModelShape, vocab_size: int) -> int:
    """Parameters of ``shape`` on the meta device; counted once per shape (a folder plan asks often)."""
    from smolforge.pretrain.model import count_parameters

    key = (repr(shape), vocab_size)
    if key not in _COUNTED:
        try:
            _COUNTED[key] = count_parameters(shape, vocab_size)
        except ValueError as exc:  # hidden/heads/kv_heads that do not divide
            raise RecipeError(f"model: {exc}") from None
    return _COUNTED[key]


def model_from(model: str | Path | None, data: dict, runs_dir: str | Path | None,
               vocab: Any) -> tuple[ModelShape, int, int, str]:
    """(shape, vocabulary, parameters, where from) of the PPO recipe's model."""
    if model is None:
        parent = data.get("parent")
        from smolforge.runs import RunLayout, runs_root

        root = Path(runs_dir) if runs_dir is not None else runs_root()
        for folder in ([root / str(parent), Path(str(parent))] if parent else []):
            config = RunLayout(folder).model_dir / "config.json"
            if config.is_file():
                return hf_model(config)
        raise RecipeError(f"the PPO recipe's model shape is unknown: its parent run '{parent}' has no "
                          f"model/config.json under {root}/; pass --model (a pretrain recipe such as "
                          "recipes/smollm3-3b/pretrain.yaml, or a HF config.json or model folder)")
    path = Path(model)
    if path.is_dir() or path.name.endswith(".json"):
        return hf_model(path / "config.json" if path.is_dir() else path)
    recipe = load_pretrain_recipe(path)
    vocab_n = int(parse_count(vocab, "--vocab"))
    return recipe.model, vocab_n, parameters(recipe.model, vocab_n), f"{path} (model:, vocab {vocab_n})"


def hf_model(config_path: Path) -> tuple[ModelShape, int, int, str]:
    """Shape, vocabulary and parameters (counted on the meta device) of a HF ``config.json``."""
    if not config_path.is_file():
        raise RecipeError(f"--model: {config_path} not found (a pretrain recipe, a HF config.json or model folder)")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(config_path))
    except (OSError, ValueError) as exc:
        raise RecipeError(f"--model: {config_path} is not a HF model config ({exc})") from None
    text = getattr(config, "get_text_config", lambda: config)()
    heads = text.num_attention_heads
    shape = ModelShape(hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
                       num_layers=text.num_hidden_layers, num_heads=heads,
                       num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
                       max_position_embeddings=getattr(text, "max_position_embeddings", 2048),
                       tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
                       extra={"head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads})
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    return shape, int(text.vocab_size), params, str(config_path)


def deepspeed_file(path: Any, source: str, key: str = "ppo.deepspeed") -> tuple[str | None, int, bool | None]:
    """``ppo.deepspeed`` (or ``key``): (its path, ZeRO stage, bf16.enabled when stated), (None, 0, None) without one.

    A relative path is read from the working directory (the repo root, as the recipes write
    it), else from the recipe file's folder or one above it.
    """
    if path is None:
        return None, 0, None
    if isinstance(path, dict):   # an inline DeepSpeed config (TrainingArguments takes one)
        config, path = path, "inline"
    else:
        found = _find_file(str(path), source, key)
        try:
            config = json.loads(found.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RecipeError(f"{key}: {path} is not JSON ({exc})") from None
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if stage not in (0, 1, 2, 3):
        raise RecipeError(f"{key}: {path} must set zero_optimization.stage to 0-3, got {stage!r}")
    enabled = (config.get("bf16") or {}).get("enabled")
    return str(path), stage, enabled if isinstance(enabled, bool) else None


def _find_file(path: str, source: str, key: str = "ppo.deepspeed") -> Path:
    candidates = [Path(path)]
    if not Path(path).is_absolute():
        candidates += [folder / path for folder in Path(source).resolve().parents]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise RecipeError(f"{key}: {path} not found (relative to the working directory, "
                      "e.g. recipes/smollm3-3b/zero3.json from the repo root)")
