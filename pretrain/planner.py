"""Plan a pretraining run before paying for it: parameters, FLOPs, GPU-hours, GPUs, cost, memory.

    smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11e12 --gpus 384 --days 24
    smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11T --mfu 0.3 --days 24 --price 2.5 --json

Reads a pretrain recipe (``stage: pretrain``), counts the model's parameters on the meta device
and works in two directions:

* forward: assume an MFU (``--mfu``, default 0.30) → GPU-hours, then the GPUs that finish in
  ``--days`` and/or the days ``--gpus`` take;
* backwards: ``--gpus`` and ``--days`` → the MFU the run needs (``mfu_required``). Without
  ``--mfu`` the plan then assumes exactly that MFU, so its GPU-hours are the reservation's.

An MFU above 60 % gets a warning (the playbook: 0.6–0.8 is optimistic for dense training;
SmolLM3's own run implies ≈26–31 %). Memory per GPU is given for ZeRO stages 0–3 with mixed
precision (bf16 weights and grads, fp32 master weights + Adam m and v: 2 + 2 + 12 bytes per
parameter; fp32 recipes: 4 + 4 + 8), sharded over the data-parallel GPUs, plus the activations
of one micro-batch with and without activation checkpointing. Formulas and sources:
docs/planner.md and :mod:`smolforge.pretrain.flops`.
"""
from __future__ import annotations

import difflib
import math
import re
import sys
from pathlib import Path
from typing import Any, TextIO

from smolforge.errors import RecipeError

from .flops import (DEVICES, attention_flops_per_token, device_key, embedding_params,
                    flops_per_token, host_memory_bytes, kv_cache_bytes_per_token,
                    measure_cpu_peak_flops, unknown_device_message)
from .model import ModelShape

__all__ = [
    "DEFAULT_MFU", "MFU_WARNING", "DEFAULT_VOCAB", "load_pretrain_recipe", "parse_count",
    "activation_bytes", "memory_per_gpu", "make_plan", "plan_file", "print_plan",
]

DEFAULT_MFU = 0.30              # SmolLM3's run implies ≈26–31 % (≈14k tokens/s per H100)
MFU_WARNING = 0.60              # above this, dense-training MFU is optimistic (the playbook)
DEFAULT_VOCAB = 128256          # Llama-3's tokenizer, which SmolLM3 reuses
CHINCHILLA_TOKENS_PER_PARAM = 20  # default --tokens: compute-optimal (Hoffmann et al. 2022)
MEMORY_HEADROOM = 0.90          # "fits" = total <= 90 % of device memory (the playbook's alert line)
SECONDS_PER_DAY = 86400.0
# bytes per parameter: (weights, grads, optimizer states)
BYTES_PER_PARAM = {
    "bf16": (2, 2, 12),         # bf16 weights + bf16 grads + fp32 master, Adam m, Adam v (4+4+4)
    "fp32": (4, 4, 8),          # fp32 weights + fp32 grads + Adam m, v
}
_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


# --------------------------------------------------------------------------- inputs


def load_pretrain_recipe(path: str | Path, sets: list[str] | tuple[str, ...] = ()):
    """Build the ``smolforge.pretrain.stage.Recipe`` in ``path``; any other stage is a RecipeError."""
    from smolforge.recipe import build_stage_recipe, load_recipe
    from smolforge.registry import load_stage

    stage, data = load_recipe(path, sets)
    if stage != "pretrain":
        raise RecipeError(f"{path}: recipe is for stage '{stage}'; smolforge plan needs a "
                          "pretrain recipe (stage: pretrain), e.g. recipes/smollm3-3b/pretrain.yaml")
    return build_stage_recipe(load_stage("pretrain"), data, source=str(path))


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


def _device(gpu: str) -> tuple[str, float, int | None, str]:
    """(key, peak FLOP/s, memory bytes, source) of a ``--gpu`` name; unknown → RecipeError."""
    key = device_key(gpu)
    if key is None:
        raise RecipeError(unknown_device_message(gpu))
    spec = DEVICES[key]
    if key == "cpu":
        peak = measure_cpu_peak_flops()
        return key, peak, host_memory_bytes(), f"{spec.source}: {peak / 1e9:.0f} GFLOP/s"
    return key, float(spec.peak_flops), spec.memory_bytes, spec.source


# --------------------------------------------------------------------------- memory


def activation_bytes(shape: ModelShape, vocab_size: int, seq_len: int, micro_batch_size: int,
                     precision: str = "bf16") -> dict:
    """Activation memory of one micro-batch on one GPU (no tensor/sequence parallelism).

    Per layer, from Korthikanti et al. 2022 ("Reducing activation recomputation in large
    transformer models", eq. 1), for 16-bit activations:

    * ``s·b·h·(34 + 5·a·s/h)`` without recomputation and an attention that stores the
      ``a × s × s`` scores, softmax and dropout mask (``per_layer_eager_attention``);
    * ``34·s·b·h`` with a fused attention kernel (FlashAttention / SDPA), which keeps no s×s
      tensor — what SmolLM3 and the GPU path train with, so ``per_layer`` and ``full`` use it;
    * ``2·s·b·h`` with full activation checkpointing (only each layer's input is kept).

    Both totals add the fp32 logits of the loss, ``4·s·b·vocab`` (Korthikanti's output-layer
    term), and the checkpointed total adds one layer's ``34·s·b·h`` that backward recomputes at a
    time. fp32 recipes double the 16-bit terms.
    """
    s, b, h, a, layers = seq_len, micro_batch_size, shape.hidden_size, shape.num_heads, shape.num_layers
    scale = 2 if precision == "fp32" else 1
    sbh = s * b * h
    per_layer = 34 * sbh * scale
    per_layer_eager = sbh * (34 + 5 * a * s / h) * scale
    per_layer_ckpt = 2 * sbh * scale
    logits = 4 * s * b * vocab_size
    return {
        "micro_batch_size": b, "seq_len": s, "layers": layers,
        "per_layer": per_layer,
        "per_layer_eager_attention": int(round(per_layer_eager)),
        "per_layer_checkpointed": per_layer_ckpt,
        "logits": logits,
        "full": layers * per_layer + logits,
        "full_eager_attention": int(round(layers * per_layer_eager)) + logits,
        "checkpointed": layers * per_layer_ckpt + per_layer + logits,
    }


def memory_per_gpu(params: int, activations: dict, dp_gpus: int, precision: str = "bf16",
                   gpu_memory_bytes: int | None = None) -> dict[str, dict]:
    """Bytes per GPU for each ZeRO stage "0".."3" over ``dp_gpus`` data-parallel GPUs.

    Stage 1 shards the optimizer states, stage 2 also the gradients, stage 3 also the weights.

    >>> act = {"full": 100, "checkpointed": 10}
    >>> m = memory_per_gpu(1000, act, dp_gpus=4)
    >>> [m[z]["weights"] + m[z]["grads"] + m[z]["optimizer"] for z in "0123"]
    [16000, 7000, 5500, 4000]
    """
    w, g, o = BYTES_PER_PARAM.get(precision, BYTES_PER_PARAM["bf16"])
    weights, grads, optim = w * params, g * params, o * params
    out: dict[str, dict] = {}
    for stage in range(4):
        row = {
            "weights": weights / dp_gpus if stage >= 3 else weights,
            "grads": grads / dp_gpus if stage >= 2 else grads,
            "optimizer": optim / dp_gpus if stage >= 1 else optim,
        }
        row = {k: int(round(v)) for k, v in row.items()}
        states = row["weights"] + row["grads"] + row["optimizer"]
        row["activations"] = activations["full"]
        row["activations_checkpointed"] = activations["checkpointed"]
        row["total"] = states + activations["full"]
        row["total_checkpointed"] = states + activations["checkpointed"]
        if gpu_memory_bytes:
            limit = MEMORY_HEADROOM * gpu_memory_bytes
            row["fits"] = row["total"] <= limit
            row["fits_checkpointed"] = row["total_checkpointed"] <= limit
        else:
            row["fits"] = row["fits_checkpointed"] = None
        out[str(stage)] = row
    return out


# --------------------------------------------------------------------------- the plan


def _ceil(x: float) -> int:
    """Ceiling that forgives float noise: 384.0000000001 GPUs is 384."""
    return max(1, math.ceil(x * (1 - 1e-9)))


def _count_parameters(shape: ModelShape, vocab_size: int) -> int:
    from .model import count_parameters

    try:
        return count_parameters(shape, vocab_size)
    except ValueError as exc:  # hidden/heads/kv_heads that do not divide
        raise RecipeError(f"model: {exc}") from None


def make_plan(recipe, *, source: str = "recipe", tokens: Any = None, gpu: str = "h100",
              gpus: Any = None, days: Any = None, mfu: Any = None, price: Any = None,
              seq_len: Any = None, vocab: Any = DEFAULT_VOCAB, causal: bool = False) -> dict:
    """The plan for a built pretrain ``recipe`` as one JSON-ready dict (see the module docstring).

    Numbers may be given as numbers or strings (``"11T"``); each must be > 0. ``mfu`` is a
    fraction of peak (0.3 = 30 %).
    """
    key, peak, gpu_memory, peak_source = _device(gpu)
    gpus_n = None if gpus is None else parse_count(gpus, "--gpus")
    if gpus_n is not None and not float(gpus_n).is_integer():
        raise RecipeError(f"--gpus must be a whole number, got {gpus!r}")
    gpus_n = None if gpus_n is None else int(gpus_n)
    days_n = None if days is None else parse_count(days, "--days")
    mfu_n = None if mfu is None else parse_count(mfu, "--mfu")
    if mfu_n is not None and mfu_n > 1:
        raise RecipeError(f"--mfu is a fraction of peak (0.3 = 30 %), got {mfu!r}")
    price_n = None if price is None else parse_count(price, "--price")
    vocab_n = int(parse_count(vocab, "--vocab"))
    t = recipe.train
    shape: ModelShape = recipe.model
    seq = int(parse_count(seq_len if seq_len is not None else t.seq_len,
                          "--seq-len" if seq_len is not None else "train.seq_len"))
    micro_batch = int(parse_count(t.micro_batch_size, "train.micro_batch_size"))
    precision = getattr(t, "precision", "bf16")
    warnings: list[str] = []

    params = _count_parameters(shape, vocab_n)
    emb = embedding_params(shape, vocab_n)
    if tokens is None:
        tokens_n = float(CHINCHILLA_TOKENS_PER_PARAM * params)
        tokens_how = "default: 20 × parameters (Chinchilla)"
    else:
        tokens_n, tokens_how = parse_count(tokens, "--tokens"), "--tokens"

    per_token = flops_per_token(shape, vocab_n, seq, params=params, causal=causal)
    attention = attention_flops_per_token(shape, seq, causal=causal)
    train_flops = per_token * tokens_n

    mfu_required = None
    if gpus_n is not None and days_n is not None:
        mfu_required = train_flops / (peak * gpus_n * days_n * SECONDS_PER_DAY)
    if mfu_n is not None:
        mfu_used, mfu_how = mfu_n, "--mfu"
    elif mfu_required is not None:
        mfu_used, mfu_how = mfu_required, f"required by --gpus {gpus_n} × --days {days_n:g}"
    else:
        mfu_used, mfu_how = DEFAULT_MFU, "default (SmolLM3's run implies ≈26–31 %)"

    gpu_seconds = train_flops / (peak * mfu_used)
    gpu_hours = gpu_seconds / 3600
    gpus_needed = _ceil(gpu_seconds / (days_n * SECONDS_PER_DAY)) if days_n is not None else None
    days_needed = gpu_seconds / gpus_n / SECONDS_PER_DAY if gpus_n is not None else None
    dp_gpus = gpus_n or gpus_needed or 1
    cost = gpu_hours * price_n if price_n is not None else None

    if mfu_used > 1:
        warnings.append(f"this plan needs an MFU of {mfu_used:.0%}: more than the {key}'s peak — "
                        "impossible; add GPUs or days")
    elif mfu_used > MFU_WARNING:
        warnings.append(f"this plan assumes an MFU of {mfu_used:.0%} (> {MFU_WARNING:.0%}): optimistic "
                        "for dense training; SmolLM3's run implies ≈26–31 %")
    if mfu_n is not None and mfu_required is not None and mfu_n < mfu_required * (1 - 1e-9):
        warnings.append(f"at --mfu {mfu_n:g}, {gpus_n} GPUs need {days_needed:.1f} days, more than "
                        f"--days {days_n:g} (that needs an MFU of {mfu_required:.1%})")
    if precision == "fp32" and key != "cpu":
        warnings.append(f"the recipe trains in fp32 but {key}'s peak is a bf16 tensor-core figure; "
                        "set train.precision: bf16 or expect a far lower MFU")
    if seq > shape.max_position_embeddings:
        warnings.append(f"seq_len {seq} exceeds model.max_position_embeddings "
                        f"{shape.max_position_embeddings}")

    activations = activation_bytes(shape, vocab_n, seq, micro_batch, precision)
    memory = memory_per_gpu(params, activations, dp_gpus, precision, gpu_memory)
    kv = kv_cache_bytes_per_token(shape)
    return {
        "recipe": source,
        "name": getattr(recipe, "name", None),
        "gpu": key,
        "peak_flops_per_gpu": peak,
        "peak_source": peak_source,
        "gpu_memory_bytes": gpu_memory,
        "params": params,
        "non_embedding_params": params - emb,
        "embedding_params": emb,
        "vocab_size": vocab_n,
        "seq_len": seq,
        "tokens": tokens_n,
        "tokens_source": tokens_how,
        "flops_per_token": per_token,
        "attention_flops_per_token": attention,
        "causal_attention_halved": causal,
        "train_flops": train_flops,
        "mfu_assumed": mfu_used,
        "mfu_source": mfu_how,
        "mfu_required": mfu_required,
        "tokens_per_second_per_gpu": peak * mfu_used / per_token,
        "gpu_hours": gpu_hours,
        "gpus": gpus_n,
        "days": days_n,
        "gpus_needed": gpus_needed,
        "days_needed": days_needed,
        "price_usd_per_gpu_hour": price_n,
        "cost_usd": cost,
        "kv_cache_bytes_per_token": kv,
        "kv_cache_bytes_per_token_fp8": kv_cache_bytes_per_token(shape, 1),
        "precision": precision,
        "bytes_per_param": dict(zip(("weights", "grads", "optimizer"),
                                    BYTES_PER_PARAM.get(precision, BYTES_PER_PARAM["bf16"]))),
        "data_parallel_gpus": dp_gpus,
        "recipe_zero_stage": getattr(t, "zero_stage", None),
        "recipe_activation_checkpointing": getattr(t, "activation_checkpointing", None),
        "activations_bytes": activations,
        "memory_per_gpu_bytes": memory,
        "warnings": warnings,
    }


def plan_file(path: str | Path, sets: list[str] | tuple[str, ...] = (), **options: Any) -> dict:
    """:func:`make_plan` for the pretrain recipe at ``path`` (``sets``: ``key=value`` overrides).

    Checks the cheap things first (device, numbers) so a typo fails before transformers loads.
    """
    if device_key(options.get("gpu", "h100")) is None:
        raise RecipeError(unknown_device_message(options.get("gpu")))
    recipe = load_pretrain_recipe(path, sets)
    return make_plan(recipe, source=str(path), **options)


# --------------------------------------------------------------------------- output


def _si(x: float | None, unit: str = "") -> str:
    """3.075B, 11T, 2.43e+23 — short human numbers.

    >>> _si(3075098624), _si(11e12), _si(950), _si(2.43e23)
    ('3.075B', '11T', '950', '2.43e+23')
    """
    if x is None:
        return "-"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            if abs(x) >= 1000 * 1e12:
                return f"{x:.3g}{unit}"
            return f"{x / scale:.4g}{suffix}{unit}"
    return f"{x:.4g}{unit}"


def _gib(x: float) -> float:
    return round(x / 2**30, 2)


def summary_rows(plan: dict) -> list[list[str]]:
    """The (quantity, value, how) rows of the plan table."""
    p = plan
    seq, vocab = p["seq_len"], p["vocab_size"]
    act = p["activations_bytes"]
    days_how = f"for --days {p['days']:g}" if p["days"] is not None else "give --days D"
    rows = [
        ["parameters", _si(p["params"]), f"counted on the meta device, vocab {vocab}"],
        ["non-embedding parameters", _si(p["non_embedding_params"]),
         f"minus {_si(p['embedding_params'])} embedding"],
        ["tokens", _si(p["tokens"]), p["tokens_source"]],
        ["FLOPs per token", f"{p['flops_per_token']:.4g}",
         f"6 × matmul params + {p['attention_flops_per_token']:.3g} attention (seq {seq}"
         f"{', causal halved' if p['causal_attention_halved'] else ', full square'})"],
        ["training FLOPs", f"{p['train_flops']:.4g}", "FLOPs per token × tokens"],
        ["peak per GPU", f"{p['peak_flops_per_gpu'] / 1e12:.4g} TFLOP/s", f"{p['gpu']}: {p['peak_source']}"],
        ["MFU assumed", f"{p['mfu_assumed']:.1%}", p["mfu_source"]],
        ["MFU required", "-" if p["mfu_required"] is None else f"{p['mfu_required']:.1%}",
         "by --gpus × --days" if p["mfu_required"] is not None else "give --gpus G and --days D"],
        ["tokens/s per GPU", _si(p["tokens_per_second_per_gpu"]), "peak × MFU ÷ FLOPs per token"],
        ["GPU-hours", _si(p["gpu_hours"]), "training FLOPs ÷ (peak × MFU) ÷ 3600"],
        ["GPUs needed", "-" if p["gpus_needed"] is None else str(p["gpus_needed"]), days_how],
        ["days", "-" if p["days_needed"] is None else f"{p['days_needed']:.1f}",
         f"on --gpus {p['gpus']}" if p["gpus"] is not None else "give --gpus G"],
        ["cost", "-" if p["cost_usd"] is None else f"${_si(p['cost_usd'])}",
         f"GPU-hours × ${p['price_usd_per_gpu_hour']:g}" if p["cost_usd"] is not None
         else "give --price USD_PER_GPU_HOUR"],
        ["KV cache per token", f"{p['kv_cache_bytes_per_token']} B",
         "layers × kv_heads × head_dim × 2 (K, V) × 2 B (bf16)"],
        ["activations / micro-batch", f"{_gib(act['full'])} GiB",
         f"{act['micro_batch_size']} × {seq} tokens, fused attention; eager attention "
         f"{_gib(act['full_eager_attention'])} GiB"],
    ]
    return rows


def memory_rows(plan: dict) -> list[list[Any]]:
    rows = []
    for stage, m in plan["memory_per_gpu_bytes"].items():
        fits = "-" if m["fits"] is None else ("yes" if m["fits"] else
                                              ("ckpt" if m["fits_checkpointed"] else "no"))
        mark = "*" if str(plan.get("recipe_zero_stage")) == stage else ""
        rows.append([f"{stage}{mark}", _gib(m["weights"]), _gib(m["grads"]), _gib(m["optimizer"]),
                     _gib(m["activations"]), _gib(m["activations_checkpointed"]), _gib(m["total"]),
                     _gib(m["total_checkpointed"]), fits])
    return rows


def print_plan(plan: dict, file: TextIO | None = None) -> None:
    """The plan as two tables (summary, memory per ZeRO stage); warnings go to stderr."""
    from smolforge.table import print_table

    out = file or sys.stdout
    title = f"plan for {plan['recipe']}" + (f" ({plan['name']})" if plan.get("name") else "")
    print_table(["quantity", "value", "how"], summary_rows(plan), title=title, file=out)
    print(file=out)
    b = plan["bytes_per_param"]
    mem = plan["gpu_memory_bytes"]
    fits_head = f"fits {mem / 1e9:.0f} GB" if mem else "fits"
    print_table(
        ["zero", "weights", "grads", "optimizer", "activations", "act. ckpt", "total", "total ckpt",
         fits_head],
        memory_rows(plan),
        title=(f"memory per GPU (GiB) over {plan['data_parallel_gpus']} data-parallel GPUs, "
               f"{plan['precision']} {b['weights']}+{b['grads']}+{b['optimizer']} bytes/param"),
        file=out)
    print(f"* the recipe's zero_stage; fits: total <= {MEMORY_HEADROOM:.0%} of device memory, "
          "ckpt: only with activation checkpointing", file=out)
    warn(plan)


def warn(plan: dict, file: TextIO | None = None) -> None:
    for line in plan.get("warnings", []):
        print(f"warning: {line}", file=file or sys.stderr)


def close_option(option: str, known: list[str]) -> str:
    """``unrecognized argument`` text with the closest known option, for the CLI."""
    close = difflib.get_close_matches(option.split("=", 1)[0], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"plan: unrecognized argument '{option}'{hint}"
