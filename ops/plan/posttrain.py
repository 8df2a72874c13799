"""Plan post-training recipes: sft, dpo (GPU-hours and memory, as pretraining) and merge.

    smolforge plan recipes/smollm3-3b/sft.yaml --gpus 8
    smolforge plan recipes/smollm3-3b/apo.yaml --gpus 8 --tokens 0.5B
    smolforge plan recipes/smollm3-3b/merge.yaml

The same FLOPs, schedule, memory and warnings as a pretrain plan (:mod:`.numbers`, :mod:`.memory`),
with what post-training changes. Recipes are read as plain YAML, with the stage's own defaults for
the trainer keys they leave out (:func:`trainer_defaults`: the stage's ``Recipe`` builds them).

* **Model**: ``--model`` (a pretrain recipe, a HF config.json or model folder); else the recipe's
  ``parent:`` followed through the recipes beside it (each ``name:`` a run another recipe
  produces) down to a pretrain recipe (:func:`recipe_lineage`); else the parent run's
  ``model/config.json``.
* **Tokens**: ``--tokens``; else ``trainer.max_steps`` × the tokens of a step (full rows, an upper
  bound); else the data's tokens × ``trainer.num_train_epochs``: the data run's
  ``data_card.json``, else the published size of a SmolLM3 data run (:data:`PUBLISHED_DATA_TOKENS`).
* **DPO** trains on chosen + rejected (2 rows per pair) and adds the frozen reference's forward
  pass, a third of the training FLOPs per token: ≈ 4/3 of SFT's FLOPs per pair token, the
  reference's once per pass over the data with ``trainer.precompute_ref_log_probs``. Memory adds
  the reference's bf16 weights (none with ``precompute_ref_log_probs``).
* **Merge** trains nothing: MergeKit runs on the CPU; its memory is at most the models it loads.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from smolforge.errors import RecipeError
from smolforge.pretrain.flops import embedding_params, kv_cache_bytes_per_token

from .inputs import (DEFAULT_VOCAB, deepspeed_file, device_fields, hf_model, load_pretrain_recipe, model_from,
                     parameters, parse_count, sibling_recipe)
from .memory import activation_bytes, memory_per_gpu, ppo_state_bytes_per_param, with_reference
from .numbers import compute, given_numbers, plan_warnings, schedule

__all__ = ["PUBLISHED_DATA_TOKENS", "trainer_defaults", "recipe_lineage", "make_posttrain_plan", "make_merge_plan"]

# the trainer keys the plan reads (their defaults: trainer_defaults)
_TRAINER_KEYS = ("max_steps", "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "max_length", "deepspeed", "bf16", "gradient_checkpointing")
_BY_DEVICE = ("bf16", "gradient_checkpointing")   # the stage: true on a GPU; the plan: by --gpu (None here)

# Tokens in one pass over the data of SmolLM3's data runs (recipes/smollm3-3b), for planning before
# they exist; a data run that exists counts its own (data_card.json).
_PREFS = (0.18e9, "180M assumed: pairs = 1/10 of SmolLM3's SFT tokens (not published)")
PUBLISHED_DATA_TOKENS = {
    ("data-smollm3-mid", "sft"): (35e9, "35B: SmolLM3's reasoning mid-training data (model card: 140B in 4 epochs)"),
    ("data-smollm3-post", "sft"): (1.8e9, "1.8B: SmolLM3's SFT mixture (blog: 1B no-think + 0.8B think)"),
    ("data-smollm3-post", "prefs"): _PREFS,
    ("data-smollm3-prefs", "prefs"): _PREFS,
}
MERGE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@functools.cache
def trainer_defaults(stage: str) -> dict[str, Any]:
    """The trainer keys the plan reads, as the ``stage`` (sft or dpo) builds them: its ``Recipe``'s
    ``trainer`` default (its ``defaults()`` over TRL's config); bf16 and gradient_checkpointing are
    None, set by ``--gpu`` (the stage sets them by the machine it runs on). Imports TRL.

    >>> trainer_defaults("dpo")["max_length"], trainer_defaults("dpo")["bf16"]
    (128, None)
    """
    from smolforge.alignment import dpo, sft

    module = {"sft": sft, "dpo": dpo}[stage]
    trainer = next(f for f in dataclasses.fields(module.Recipe) if f.name == "trainer").default_factory()
    keys = _TRAINER_KEYS + (("precompute_ref_log_probs",) if stage == "dpo" else ())
    return {key: None if key in _BY_DEVICE else getattr(trainer, key) for key in keys}


# --------------------------------------------------------------------------- the recipes beside


def _parents(stage: str, data: dict) -> list[str]:
    """The runs a recipe's model comes from: init (pretrain), the merged runs (merge), else parent."""
    if stage == "pretrain":
        names = [data.get("init")]
    elif stage == "merge":
        names = [m.get("run") if isinstance(m, dict) else m for m in data.get("models") or []] + [data.get("base")]
    else:
        names = [data.get("parent")]
    return [str(n) for n in names if n]


def recipe_lineage(path: str | Path, stage: str, data: dict, depth: int = 0) -> list[tuple[Path, str]] | None:
    """(file, stage) of the recipes whose runs lead to this one, from its pretrain root to itself,
    through each ``init:`` / ``parent:`` (a merge: its longest) naming a recipe beside it; None when
    one is not there.

    >>> from smolforge.recipe import load_recipe
    >>> stage, data = load_recipe("recipes/smollm3-3b/sft.yaml")
    >>> [f.stem for f, _ in recipe_lineage("recipes/smollm3-3b/sft.yaml", stage, data)]
    ['pretrain', 'midtrain-32k', 'midtrain-64k', 'midtrain-reasoning', 'sft']
    """
    if depth > 16:
        raise RecipeError(f"{path}: a chain of more than 16 parent recipes (a cycle?)")
    ups = []
    for name in _parents(stage, data):
        found = sibling_recipe(path, name)
        up = None if found is None else recipe_lineage(found[0], found[1], found[2], depth + 1)
        if up is None and stage != "merge":
            return None
        ups.append(up or [])
    if stage == "merge" and not any(ups):
        return None
    return max(ups, key=len, default=[]) + [(Path(path), stage)]


def _model(path: str | Path, parent: str | None, *, model: Any, runs_dir: Any, vocab: Any) -> dict[str, Any]:
    """Shape, vocabulary, parameters and where they come from, of the model a recipe starts from."""
    if model is not None:
        shape, vocab_n, params, where = model_from(model, {}, runs_dir, vocab)
        return {"shape": shape, "vocab": vocab_n, "params": params, "source": where, "lineage": []}
    vocab_n = int(parse_count(vocab, "--vocab"))
    found = sibling_recipe(path, parent) if parent else None
    lineage = recipe_lineage(*found) if found else None
    roots = [f for f, stage in lineage or [] if stage == "pretrain"]
    if roots:
        shape = load_pretrain_recipe(roots[-1]).model
        names = " → ".join(f.name for f, _ in lineage)
        return {"shape": shape, "vocab": vocab_n, "params": parameters(shape, vocab_n),
                "source": f"{names} (model: of {roots[-1].name}, vocab {vocab_n})", "lineage": [f.name for f, _ in lineage]}
    from smolforge.runs import RunLayout, runs_root

    root = Path(runs_dir) if runs_dir is not None else runs_root()
    config = RunLayout(root / str(parent)).model_dir / "config.json"
    if parent and config.is_file():
        shape, vocab_n, params, where = hf_model(config)
        return {"shape": shape, "vocab": vocab_n, "params": params, "source": where, "lineage": []}
    raise RecipeError(f"{path}: the model's shape is unknown: no recipe beside it leads from '{parent}' to a "
                      f"pretrain recipe, and no run '{parent}' has model/config.json under {root}/; pass --model "
                      "(a pretrain recipe such as recipes/smollm3-3b/pretrain.yaml, or a HF config.json or model folder)")


# --------------------------------------------------------------------------- sft and dpo


def _trainer(stage: str, data: dict, source: str, gpu: str) -> dict[str, Any]:
    trainer = data.get("trainer") or {}
    if not isinstance(trainer, dict):
        raise RecipeError(f"{source}: trainer: must be a mapping of TRL settings, got {trainer!r}")
    merged = {**trainer_defaults(stage), **trainer}
    for key in ("bf16", "gradient_checkpointing"):
        if merged[key] is None:
            merged[key] = gpu != "cpu"
        if not isinstance(merged[key], bool):
            raise RecipeError(f"{source}: trainer.{key} must be true or false, got {merged[key]!r}")
    return merged


def _tokens(stage: str, data: dict, trainer: dict, *, tokens: Any, gpus: int | None, seq_len: int,
            runs_dir: Any, source: str) -> tuple[float, str, float]:
    """(training tokens, where from, tokens the reference reads) of an sft or dpo recipe."""
    kind, rows = ("prefs", 2) if stage == "dpo" else ("sft", 1)
    epochs = float(parse_count(trainer["num_train_epochs"], "trainer.num_train_epochs"))
    once = stage == "dpo" and bool(trainer["precompute_ref_log_probs"])
    if tokens is not None:
        n = parse_count(tokens, "--tokens")
        return n, "--tokens", n / epochs if once else n
    steps = int(trainer["max_steps"])
    if steps > 0:
        batch, accum = int(trainer["per_device_train_batch_size"]), int(trainer["gradient_accumulation_steps"])
        per_step = batch * accum * (gpus or 1) * rows * seq_len
        how = (f"trainer.max_steps {steps:,} × {per_step:,} tokens a step ({batch} × {accum} × {gpus or 1} GPUs"
               f"{' × 2 (chosen, rejected)' if rows == 2 else ''} × {seq_len}; full rows: at most)")
        return float(steps * per_step), how, float(steps * per_step)
    per_pass, how = _data_tokens(str(data.get("data")), kind, runs_dir, source, steps)
    return (per_pass * epochs, f"{how} × {epochs:g} epoch{'' if epochs == 1 else 's'}",
            per_pass if once else per_pass * epochs)


def _data_tokens(name: str, kind: str, runs_dir: Any, source: str, steps: int) -> tuple[float, str]:
    """Tokens in one pass over a data run's ``kind`` rows: its data card, else the published figure."""
    from smolforge.runs import RunLayout, runs_root

    root = Path(runs_dir) if runs_dir is not None else runs_root()
    card = RunLayout(root / name).data_card_path
    if card.is_file():
        counted = (json.loads(card.read_text(encoding="utf-8")).get("tokens") or {}).get(kind)
        if counted:
            return float(counted), f"{kind} tokens in {card}"
    if (name, kind) in PUBLISHED_DATA_TOKENS:
        return PUBLISHED_DATA_TOKENS[name, kind]
    raise RecipeError(f"{source}: training tokens unknown: trainer.max_steps is {steps} (epochs) and data run "
                      f"'{name}' has no data_card.json under {root}/; pass --tokens N (its {kind} tokens × "
                      "trainer.num_train_epochs)")


def make_posttrain_plan(stage: str, data: dict, *, source: str = "recipe", tokens: Any = None, gpu: str = "h100",
                        gpus: Any = None, days: Any = None, mfu: Any = None, price: Any = None, seq_len: Any = None,
                        vocab: Any = DEFAULT_VOCAB, model: Any = None, runs_dir: Any = None) -> dict:
    """The plan of an sft or dpo recipe (``data``: its keys as read from YAML, ``source``: its file),
    with :func:`~smolforge.ops.plan.pretrain.make_plan`'s keys and numbers.

    >>> from smolforge.recipe import load_recipe
    >>> sft = "recipes/smollm3-3b/sft.yaml"
    >>> plan = make_posttrain_plan("sft", load_recipe(sft)[1], source=sft, gpus=8, runs_dir="/nonexistent")
    >>> plan["lineage"][0], plan["params"], plan["tokens"]   # 1.8B tokens (published) × 2 epochs
    ('pretrain.yaml', 3075098624, 3600000000.0)
    """
    if stage not in ("sft", "dpo"):
        raise RecipeError(f"{source}: make_posttrain_plan plans sft and dpo recipes, not {stage}")
    device = device_fields(gpu)
    trainer = _trainer(stage, data, source, device["gpu"])
    deepspeed, zero, ds_bf16 = deepspeed_file(trainer["deepspeed"], source, "trainer.deepspeed")
    precision = "bf16" if (ds_bf16 if ds_bf16 is not None else trainer["bf16"]) else "fp32"
    if trainer["max_length"] is None and seq_len is None:
        raise RecipeError(f"{source}: trainer.max_length is null (no truncation): pass --seq-len L, the longest row")
    rows = int(parse_count(trainer["per_device_train_batch_size"], "trainer.per_device_train_batch_size"))
    rows *= 2 if stage == "dpo" else 1
    checkpointing = trainer["gradient_checkpointing"]
    train = SimpleNamespace(seq_len=trainer["max_length"], micro_batch_size=rows, precision=precision)
    given = given_numbers(train, gpus=gpus, days=days, mfu=mfu, price=price, seq_len=seq_len, vocab=vocab)
    m = _model(source, data.get("parent"), model=model, runs_dir=runs_dir, vocab=vocab)
    shape, params, given = m["shape"], m["params"], dataclasses.replace(given, vocab=m["vocab"])
    tokens_n, tokens_how, reference_tokens = _tokens(stage, data, trainer, tokens=tokens, gpus=given.gpus,
                                                     seq_len=given.seq_len, runs_dir=runs_dir, source=source)
    emb = embedding_params(shape, given.vocab)
    plan: dict[str, Any] = {
        "recipe": source, "stage": stage, "name": data.get("name"), **device, "model_source": m["source"],
        "lineage": m["lineage"], "params": params, "non_embedding_params": params - emb, "embedding_params": emb,
        "vocab_size": given.vocab, "seq_len": given.seq_len, "tokens": tokens_n, "tokens_source": tokens_how}
    plan.update(compute(shape, given, params, tokens_n, causal=False))
    reference = _reference(stage, data, trainer)
    if reference != "none":   # its forward pass, a third of a training step's FLOPs per token
        plan["reference_flops"] = plan["flops_per_token"] / 3 * reference_tokens
        plan["train_flops"] += plan["reference_flops"]
        plan["train_flops_how"] = (f"FLOPs per token × tokens + reference forward (⅓ of it) × {reference_tokens:.3g} "
                                   "tokens" + (" (once: precompute_ref_log_probs)" if reference == "precomputed" else ""))
    plan.update(schedule(given, plan["train_flops"], plan["train_flops"] / tokens_n, plan["peak_flops_per_gpu"]))
    dp = given.gpus or plan["gpus_needed"] or 1
    bytes_per_param = ppo_state_bytes_per_param(precision, deepspeed is not None)
    activations = activation_bytes(shape, given.vocab, given.seq_len, rows, precision)
    memory = memory_per_gpu(params, activations, dp, "bf16" if bytes_per_param[0] == 2 else "fp32",
                            plan["gpu_memory_bytes"])
    if reference == "model":
        memory = with_reference(memory, (2 if precision == "bf16" else 4) * params, dp, plan["gpu_memory_bytes"])
    plan.update({
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(shape),
        "kv_cache_bytes_per_token_fp8": kv_cache_bytes_per_token(shape, 1), "precision": precision,
        "bytes_per_param": dict(zip(("weights", "grads", "optimizer"), bytes_per_param)),
        "deepspeed": deepspeed, "reference": reference, "data_parallel_gpus": dp, "recipe_zero_stage": zero,
        "recipe_activation_checkpointing": checkpointing, "activations_bytes": activations,
        "memory_per_gpu_bytes": memory})
    plan["warnings"] = plan_warnings(plan, given, shape.max_position_embeddings)
    if data.get("lora"):
        plan["warnings"].append("lora: planned as full fine-tuning; LoRA trains far fewer parameters "
                                "(less memory, about 2/3 of the FLOPs)")
    return plan


def _reference(stage: str, data: dict, trainer: dict) -> str:
    """DPO's frozen reference: "model" (a second model in memory), "adapter" (LoRA's base with the
    adapter off: no second copy), "precomputed" (one pass before training, then gone) or "none" (SFT)."""
    if stage != "dpo":
        return "none"
    if trainer["precompute_ref_log_probs"]:
        return "precomputed"
    if data.get("lora") and str(data.get("reference", "parent")).strip() in ("parent", "none"):
        return "adapter"
    return "model"


# --------------------------------------------------------------------------- merge


def make_merge_plan(data: dict, *, source: str = "recipe", gpu: str = "h100", gpus: Any = None,
                    vocab: Any = DEFAULT_VOCAB, runs_dir: Any = None) -> dict:
    """A merge recipe's plan: no training FLOPs (MergeKit runs on the CPU), memory at most the sum of
    the models it loads at ``dtype`` (it reads them tensor by tensor, so less in practice).

    >>> from smolforge.recipe import load_recipe
    >>> merge = "recipes/smollm3-3b/merge.yaml"
    >>> plan = make_merge_plan(load_recipe(merge)[1], source=merge, runs_dir="/nonexistent")
    >>> [m["run"] for m in plan["models"]], plan["gpu_hours"], plan["memory_bytes"] == 2 * 2 * 3075098624  # bf16
    (['apo-smollm3-3b', 'midtrain-64k-smollm3-3b'], 0.0, True)
    """
    device_fields(gpu)
    dtype = data.get("dtype", "float32")
    if dtype not in MERGE_DTYPE_BYTES:
        raise RecipeError(f"{source}: dtype is {dtype!r}; expected float32, bfloat16 or float16")
    names = _parents("merge", data)
    if not names:
        raise RecipeError(f"{source}: models: name at least one run to merge ({{run: NAME, weight: W}})")
    models = []
    for name in names:
        m = _model(source, name, model=None, runs_dir=runs_dir, vocab=vocab)
        models.append({"run": name, "params": m["params"], "model_source": m["source"]})
    total = sum(MERGE_DTYPE_BYTES[dtype] * m["params"] for m in models)
    return {"recipe": source, "stage": "merge", "name": data.get("name"), "method": data.get("method", "linear"),
            "dtype": dtype, "models": models, "memory_bytes": total, "memory_on": "host", "tokens": None,
            "train_flops": 0.0, "gpu_hours": 0.0,
            "runs_on": "CPU (MergeKit's default): minutes for models of a few billion parameters; no GPU-hours",
            "warnings": []}
