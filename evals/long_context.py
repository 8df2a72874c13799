"""Long-context scoring: held-out perplexity by token position, and RoPE scaling (YaRN) at load.

A suite folder may hold, next to its lm-eval task YAMLs, a position-perplexity task: a YAML with
``type: position_perplexity``, ``dataset_kwargs.data_files`` (JSONL rows with a ``text`` field), ``max_tokens``
and ``buckets`` (position boundaries). Each document is cut to ``max_tokens`` tokens, scored in one
forward pass, and the loss of every predicted token is averaged per position bucket: a model that
uses far context has lower perplexity in the late buckets; one that breaks past its trained
length has higher. ``evals/suites/longctx`` holds one (``position_ppl``) with pass-key tasks.

``rope_scaling`` (an eval recipe field) scores a model beyond the length it was built for:
``{rope_type: yarn, factor: 4}`` becomes the config's ``rope_parameters`` (with
``original_max_position_embeddings`` = the trained length) and ``max_position_embeddings`` ×
factor, for HF (config at load) and vLLM (``hf_overrides``) alike.

    >>> import json, pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 1024,
    ...     "rope_parameters": {"rope_type": "default", "rope_theta": 40000.0}}))
    >>> rope_overrides(folder, {"rope_type": "yarn", "factor": 2})["max_position_embeddings"]
    2048
    >>> bucket_names([0, 256, 1024])
    ['0-256', '256-1024']
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError

TASK_TYPE = "position_perplexity"


def rope_overrides(model_dir: str | Path, rope_scaling: dict[str, Any]) -> dict[str, Any]:
    """Config fields that stretch ``model_dir``'s RoPE by ``rope_scaling`` ({} when it is empty)."""
    if not rope_scaling:
        return {}
    config = json.loads((Path(model_dir) / "config.json").read_text())
    factor = rope_scaling.get("factor")
    if not isinstance(factor, (int, float)) or factor <= 1:
        raise RecipeError(f"rope_scaling.factor must be a number > 1 (how far past the trained length), got {factor!r}")
    if rope_scaling.get("rope_type", "yarn") not in ("yarn", "linear", "dynamic", "longrope", "llama3"):
        raise RecipeError(f"rope_scaling.rope_type {rope_scaling.get('rope_type')!r}: expected yarn, linear, dynamic, "
                          "longrope or llama3")
    trained = int(config["max_position_embeddings"])
    base = config.get("rope_parameters") or {"rope_type": "default", "rope_theta": config.get("rope_theta", 10000.0)}
    params = {**base, "rope_type": "yarn", **rope_scaling, "factor": float(factor),
              "original_max_position_embeddings": int(rope_scaling.get("original_max_position_embeddings", trained))}
    return {"rope_parameters": params, "max_position_embeddings": int(params["original_max_position_embeddings"] * factor)}


def load_model(model_dir: str | Path, rope_scaling: dict[str, Any] | None = None, device: str = "cpu",
               dtype: str = "float32"):
    """``model_dir``'s causal LM in ``dtype`` (the eval's :func:`~smolforge.evals.backends.scoring_dtype`),
    its RoPE stretched by ``rope_scaling`` when given."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    for key, value in rope_overrides(model_dir, rope_scaling or {}).items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=dtype, use_safetensors=True)
    return model.to(device).eval()


def bucket_names(buckets: list[int]) -> list[str]:
    return [f"{lo}-{hi}" for lo, hi in zip(buckets, buckets[1:])]


def check_task(config: dict, source: str) -> None:
    """A position-perplexity YAML's fields, or a RecipeError naming the file and field."""
    buckets = config.get("buckets")
    if not (isinstance(buckets, list) and len(buckets) >= 2 and all(isinstance(b, int) for b in buckets)
            and buckets == sorted(set(buckets)) and buckets[0] >= 0):
        raise RecipeError(f"{source}: buckets must be increasing token positions like [0, 256, 1024], got {buckets!r}")
    if config.get("max_tokens", buckets[-1]) < buckets[-1]:
        raise RecipeError(f"{source}: max_tokens {config['max_tokens']} is below the last bucket {buckets[-1]}")


def position_perplexity(model, tokenizer, texts: list[str], buckets: list[int]) -> dict[str, float]:
    """Perplexity of each position bucket over ``texts`` (each cut to the last bucket's end).

    The token at position p (0-based) is predicted from positions < p; its loss counts in the
    bucket holding p. Buckets no document reaches are left out.
    """
    import torch

    sums = [0.0] * (len(buckets) - 1)
    counts = [0] * (len(buckets) - 1)
    device = next(model.parameters()).device
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:buckets[-1]]
        if len(ids) < 2:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=device), use_cache=False).logits[0, :-1].float()
        losses = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:], device=device), reduction="none")
        positions = torch.arange(1, len(ids))
        for i, (lo, hi) in enumerate(zip(buckets, buckets[1:])):
            inside = (positions >= lo) & (positions < hi)
            if inside.any():
                sums[i] += float(losses[inside.to(device)].sum())
                counts[i] += int(inside.sum())
    return {f"ppl@{name}": round(math.exp(total / n), 4)
            for name, total, n in zip(bucket_names(buckets), sums, counts) if n}


def score_task(model, tokenizer, config: dict, limit: int | None = None) -> dict[str, float]:
    """One position-perplexity task: ``{"ppl@0-256": …, …}`` over its documents."""
    texts = [json.loads(line)["text"] for f in config["dataset_kwargs"]["data_files"].values() for line in open(f) if line.strip()]
    return position_perplexity(model, tokenizer, texts[:limit] if limit else texts, config["buckets"])
