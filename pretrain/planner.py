"""Plan a pretraining run before paying for it: parameters, FLOPs, GPU-hours, GPUs, cost, memory.

    smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11e12 --gpus 384 --days 24
    smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11T --mfu 0.3 --days 24 --price 2.5 --json
    smolforge plan recipes/smollm3-3b/ppo.yaml --model recipes/smollm3-3b/pretrain.yaml --gpus 8 --gpu h100
    smolforge plan recipes/smollm3-3b --gpus 384

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

A PPO recipe (``stage: ppo``, read as plain YAML: pretrain does not import alignment) gets a
memory plan instead (:func:`make_ppo_plan`): policy + value model states per ZeRO stage of its
``ppo.deepspeed`` JSON, the frozen reference, one mini-batch's activations and the rollout's KV
cache; the model's shape from ``--model`` or the recipe's parent run.

SFT, DPO and merge recipes, and a folder of recipes (one table, the total GPU-hours), are planned by
:mod:`~smolforge.pretrain.planner_posttrain` with the same parts; :func:`plan_file` picks the plan.

This module reads the inputs and makes the plan; the parts live beside it, and every name below is
importable from here:

- :mod:`~smolforge.pretrain.planner_memory`: bytes per parameter, activations, memory per ZeRO stage,
  PPO's memory by part;
- :mod:`~smolforge.pretrain.planner_report`: the plans as tables, their warnings.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError

from .flops import (DEVICES, attention_flops_per_token, device_key, embedding_params,
                    flops_per_token, host_memory_bytes, kv_cache_bytes_per_token,
                    measure_cpu_peak_flops, unknown_device_message)
from .model import ModelShape
from .planner_memory import (BYTES_PER_PARAM, MEMORY_HEADROOM, activation_bytes, memory_per_gpu, ppo_memory,
                             ppo_state_bytes_per_param)
from .planner_report import print_plan, warn

__all__ = [
    "DEFAULT_MFU", "MFU_WARNING", "DEFAULT_VOCAB", "load_pretrain_recipe", "parse_count",
    "activation_bytes", "memory_per_gpu", "make_plan", "plan_file", "print_plan", "warn",
    "DEFAULT_PROMPT_LEN", "PPO_DEFAULTS", "make_ppo_plan", "ppo_memory",
]

DEFAULT_MFU = 0.30              # SmolLM3's run implies ≈26–31 % (≈14k tokens/s per H100)
MFU_WARNING = 0.60              # above this, dense-training MFU is optimistic (the playbook)
DEFAULT_VOCAB = 128256          # Llama-3's tokenizer, which SmolLM3 reuses
CHINCHILLA_TOKENS_PER_PARAM = 20  # default --tokens: compute-optimal (Hoffmann et al. 2022)
SECONDS_PER_DAY = 86400.0
_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


# --------------------------------------------------------------------------- inputs


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
    from .planner_posttrain import sibling_recipe

    found = sibling_recipe(path, init)
    if found is not None and found[1] == "pretrain":
        return load_pretrain_recipe(found[0], depth=depth + 1).model
    raise RecipeError(f"{path}: init: {init} — smolforge plan needs the parent's shape: no pretrain recipe "
                      f"named '{init}' beside it in {path.parent}/")


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


def _device(gpu: str) -> dict[str, Any]:
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


@dataclass(frozen=True)
class _Given:
    """The plan's numbers, parsed and checked; None where not given."""
    gpus: int | None
    days: float | None
    mfu: float | None        # fraction of peak
    price: float | None      # USD per GPU-hour
    vocab: int
    seq_len: int             # --seq-len, else the recipe's train.seq_len
    micro_batch: int
    precision: str           # the recipe's train.precision


def _given(train: Any, *, gpus: Any, days: Any, mfu: Any, price: Any, seq_len: Any, vocab: Any) -> _Given:
    gpus_n = None if gpus is None else parse_count(gpus, "--gpus")
    if gpus_n is not None and not float(gpus_n).is_integer():
        raise RecipeError(f"--gpus must be a whole number, got {gpus!r}")
    days_n = None if days is None else parse_count(days, "--days")
    mfu_n = None if mfu is None else parse_count(mfu, "--mfu")
    if mfu_n is not None and mfu_n > 1:
        raise RecipeError(f"--mfu is a fraction of peak (0.3 = 30 %), got {mfu!r}")
    price_n = None if price is None else parse_count(price, "--price")
    vocab_n = int(parse_count(vocab, "--vocab"))
    seq = int(parse_count(seq_len if seq_len is not None else train.seq_len,
                          "--seq-len" if seq_len is not None else "train.seq_len"))
    micro_batch = int(parse_count(train.micro_batch_size, "train.micro_batch_size"))
    return _Given(gpus=None if gpus_n is None else int(gpus_n), days=days_n, mfu=mfu_n, price=price_n,
                  vocab=vocab_n, seq_len=seq, micro_batch=micro_batch,
                  precision=getattr(train, "precision", "bf16"))


# --------------------------------------------------------------------------- the plan


def make_plan(recipe, *, source: str = "recipe", tokens: Any = None, gpu: str = "h100",
              gpus: Any = None, days: Any = None, mfu: Any = None, price: Any = None,
              seq_len: Any = None, vocab: Any = DEFAULT_VOCAB, causal: bool = False) -> dict:
    """The plan for a built pretrain ``recipe`` as one JSON-ready dict (see the module docstring).

    Numbers may be given as numbers or strings (``"11T"``); each must be > 0. ``mfu`` is a
    fraction of peak (0.3 = 30 %).

    >>> from types import SimpleNamespace
    >>> demo = SimpleNamespace(model=ModelShape(), train=SimpleNamespace(seq_len=256, micro_batch_size=16))
    >>> plan = make_plan(demo, tokens="100M", mfu=0.3, days=1, vocab=1024)
    >>> plan["params"], round(plan["gpu_hours"] * 3600, 1), plan["gpus_needed"], plan["warnings"]
    (918656, 2.4, 1, [])
    """
    plan = {"recipe": source, "name": getattr(recipe, "name", None), **_device(gpu)}
    given = _given(recipe.train, gpus=gpus, days=days, mfu=mfu, price=price, seq_len=seq_len, vocab=vocab)
    shape: ModelShape = recipe.model
    plan.update(_size(shape, given, tokens, recipe.train))
    plan.update(_compute(shape, given, plan["params"], plan["tokens"], causal))
    plan.update(_schedule(given, plan["train_flops"], plan["flops_per_token"], plan["peak_flops_per_gpu"]))
    data_parallel_gpus = given.gpus or plan["gpus_needed"] or 1
    plan.update(_memory(shape, recipe.train, given, plan["params"], data_parallel_gpus, plan["gpu_memory_bytes"]))
    plan["warnings"] = _warnings(plan, given, shape.max_position_embeddings)
    return plan


_COUNTED: dict[tuple[str, int], int] = {}   # (repr of the shape, vocab) -> parameters


def _count_parameters(shape: ModelShape, vocab_size: int) -> int:
    """Parameters of ``shape`` on the meta device; counted once per shape (a folder plan asks often)."""
    from .model import count_parameters

    key = (repr(shape), vocab_size)
    if key not in _COUNTED:
        try:
            _COUNTED[key] = count_parameters(shape, vocab_size)
        except ValueError as exc:  # hidden/heads/kv_heads that do not divide
            raise RecipeError(f"model: {exc}") from None
    return _COUNTED[key]


def _size(shape: ModelShape, given: _Given, tokens: Any, train: Any = None) -> dict[str, Any]:
    """Parameters and training tokens: ``--tokens``; else ``train.max_steps`` × the tokens of a step
    on ``--gpus`` data-parallel GPUs; else 20 per parameter."""
    params = _count_parameters(shape, given.vocab)
    emb = embedding_params(shape, given.vocab)
    steps = getattr(train, "max_steps", None)
    if tokens is None and steps and steps > 0 and given.gpus is not None:
        accum = int(getattr(train, "grad_accum", 1))
        per_step = given.micro_batch * accum * given.seq_len * given.gpus
        tokens_n = float(steps * per_step)
        tokens_how = (f"train.max_steps {steps:,} × {per_step:,} tokens a step ({given.micro_batch} × {accum} × "
                      f"{given.seq_len} × {given.gpus} GPUs)")
    elif tokens is None:
        tokens_n = float(CHINCHILLA_TOKENS_PER_PARAM * params)
        tokens_how = "default: 20 × parameters (Chinchilla)" + ("; give --gpus for train.max_steps × the batch"
                                                                 if steps and steps > 0 else "")
    else:
        tokens_n, tokens_how = parse_count(tokens, "--tokens"), "--tokens"
    return {"params": params, "non_embedding_params": params - emb, "embedding_params": emb,
            "vocab_size": given.vocab, "seq_len": given.seq_len, "tokens": tokens_n, "tokens_source": tokens_how}


def _compute(shape: ModelShape, given: _Given, params: int, tokens: float, causal: bool) -> dict[str, Any]:
    """FLOPs per token (6·N plus attention) and for the whole run."""
    per_token = flops_per_token(shape, given.vocab, given.seq_len, params=params, causal=causal)
    return {"flops_per_token": per_token,
            "attention_flops_per_token": attention_flops_per_token(shape, given.seq_len, causal=causal),
            "causal_attention_halved": causal, "train_flops": per_token * tokens}


def _schedule(given: _Given, train_flops: float, per_token: float, peak: float) -> dict[str, Any]:
    """The MFU (required by --gpus × --days, and assumed), GPU-hours, GPUs or days needed, cost."""
    mfu_required = None
    if given.gpus is not None and given.days is not None:
        mfu_required = train_flops / (peak * given.gpus * given.days * SECONDS_PER_DAY)
    mfu_used, mfu_how = _assumed_mfu(given, mfu_required)
    gpu_seconds = train_flops / (peak * mfu_used)
    gpu_hours = gpu_seconds / 3600
    return {
        "mfu_assumed": mfu_used,
        "mfu_source": mfu_how,
        "mfu_required": mfu_required,
        "tokens_per_second_per_gpu": peak * mfu_used / per_token,
        "gpu_hours": gpu_hours,
        "gpus": given.gpus,
        "days": given.days,
        "gpus_needed": _ceil(gpu_seconds / (given.days * SECONDS_PER_DAY)) if given.days is not None else None,
        "days_needed": gpu_seconds / given.gpus / SECONDS_PER_DAY if given.gpus is not None else None,
        "price_usd_per_gpu_hour": given.price,
        "cost_usd": gpu_hours * given.price if given.price is not None else None,
    }


def _assumed_mfu(given: _Given, mfu_required: float | None) -> tuple[float, str]:
    """--mfu; else the MFU that --gpus and --days require; else the default."""
    if given.mfu is not None:
        return given.mfu, "--mfu"
    if mfu_required is not None:
        return mfu_required, f"required by --gpus {given.gpus} × --days {given.days:g}"
    return DEFAULT_MFU, "default (SmolLM3's run implies ≈26–31 %)"


def _ceil(x: float) -> int:
    """Ceiling that forgives float noise: 384.0000000001 GPUs is 384."""
    return max(1, math.ceil(x * (1 - 1e-9)))


def _memory(shape: ModelShape, train: Any, given: _Given, params: int, data_parallel_gpus: int,
            gpu_memory: int | None) -> dict[str, Any]:
    """KV cache per token, bytes per parameter, activations and memory per GPU for ZeRO 0-3."""
    activations = activation_bytes(shape, given.vocab, given.seq_len, given.micro_batch, given.precision)
    return {
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(shape),
        "kv_cache_bytes_per_token_fp8": kv_cache_bytes_per_token(shape, 1),
        "precision": given.precision,
        "bytes_per_param": dict(zip(("weights", "grads", "optimizer"),
                                    BYTES_PER_PARAM.get(given.precision, BYTES_PER_PARAM["bf16"]))),
        "data_parallel_gpus": data_parallel_gpus,
        "recipe_zero_stage": getattr(train, "zero_stage", None),
        "recipe_activation_checkpointing": getattr(train, "activation_checkpointing", None),
        "activations_bytes": activations,
        "memory_per_gpu_bytes": memory_per_gpu(params, activations, data_parallel_gpus, given.precision,
                                               gpu_memory),
    }


def _warnings(plan: dict[str, Any], given: _Given, max_position_embeddings: int) -> list[str]:
    """What makes the plan impossible, optimistic or inconsistent with its recipe."""
    warnings: list[str] = []
    key, mfu_used, mfu_required = plan["gpu"], plan["mfu_assumed"], plan["mfu_required"]
    if mfu_used > 1:
        warnings.append(f"this plan needs an MFU of {mfu_used:.0%}: more than the {key}'s peak — "
                        "impossible; add GPUs or days")
    elif mfu_used > MFU_WARNING:
        warnings.append(f"this plan assumes an MFU of {mfu_used:.0%} (> {MFU_WARNING:.0%}): optimistic "
                        "for dense training; SmolLM3's run implies ≈26–31 %")
    if given.mfu is not None and mfu_required is not None and given.mfu < mfu_required * (1 - 1e-9):
        warnings.append(f"at --mfu {given.mfu:g}, {given.gpus} GPUs need {plan['days_needed']:.1f} days, more "
                        f"than --days {given.days:g} (that needs an MFU of {mfu_required:.1%})")
    if given.precision == "fp32" and key != "cpu":
        warnings.append(f"the recipe trains in fp32 but {key}'s peak is a bf16 tensor-core figure; "
                        "set train.precision: bf16 or expect a far lower MFU")
    if given.seq_len > max_position_embeddings:
        warnings.append(f"seq_len {given.seq_len} exceeds model.max_position_embeddings "
                        f"{max_position_embeddings}")
    return warnings


def plan_file(path: str | Path, sets: list[str] | tuple[str, ...] = (), *, runs_dir: str | Path | None = None,
              **options: Any) -> dict:
    """The plan of the recipe at ``path`` (``sets``: ``key=value`` overrides): :func:`make_plan` for a
    pretrain recipe, :func:`make_ppo_plan` for a PPO recipe (``runs_dir``: where its parent run is),
    :mod:`~smolforge.pretrain.planner_posttrain`'s plans for sft, dpo and merge recipes, and for a
    folder :func:`~smolforge.pretrain.planner_posttrain.plan_folder`. An option the recipe's stage
    does not take (not None) is a RecipeError, as is a stage no plan is made for.

    Checks the cheap things first (device, numbers) so a typo fails before transformers loads.

    >>> plan_file("recipes/smollm3-3b/pretrain.yaml", gpu="b200")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: unknown GPU 'b200' (did you mean 'h200'?; known: a100, a100-40g, a10g, cpu, h100, h100-pcie, h200, l40s)
    >>> plan_file("recipes/smollm3-3b/ppo.yaml", tokens="1B")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: --tokens is for pretrain, sft and dpo recipes; recipes/smollm3-3b/ppo.yaml is a ppo recipe
    """
    if device_key(options.get("gpu", "h100")) is None:
        raise RecipeError(unknown_device_message(options.get("gpu")))
    from smolforge.recipe import load_recipe

    from . import planner_posttrain as post

    if Path(path).is_dir():
        if sets:
            raise RecipeError(f"--set changes one recipe; plan the file alone (smolforge plan {path}/FILE.yaml --set ...)")
        return post.plan_folder(path, runs_dir=runs_dir, **options)
    stage, data = load_recipe(path, sets)
    if stage not in _STAGE_OPTIONS:
        raise RecipeError(f"{path}: recipe is for stage '{stage}'; smolforge plan plans recipes for stage: pretrain, "
                          "sft, dpo, merge (GPU-hours, memory) and ppo (memory, with --model), "
                          "e.g. recipes/smollm3-3b/pretrain.yaml, or a folder of them")
    for key, value in options.items():
        if value is not None and key not in _STAGE_OPTIONS[stage] + _COMMON_OPTIONS:
            takes = [s for s, keys in _STAGE_OPTIONS.items() if key in keys]
            kinds = ", ".join(takes[:-1]) + f" and {takes[-1]}" if len(takes) > 1 else takes[0]
            raise RecipeError(f"--{key.replace('_', '-')} is for {kinds} recipes; {path} is a {stage} recipe")
    options = {k: v for k, v in options.items() if k in _STAGE_OPTIONS[stage] + _COMMON_OPTIONS}
    if stage == "ppo":
        return make_ppo_plan(data, source=str(path), runs_dir=runs_dir, **options)
    if stage in ("sft", "dpo"):
        return post.make_posttrain_plan(stage, data, source=str(path), runs_dir=runs_dir, **options)
    if stage == "merge":
        return post.make_merge_plan(data, source=str(path), runs_dir=runs_dir, **options)
    return make_plan(load_pretrain_recipe(path, sets), source=str(path), **options)


_COMMON_OPTIONS = ("gpu", "gpus", "vocab")
_STAGE_OPTIONS = {   # what each stage's plan takes besides the common options
    "pretrain": ("tokens", "days", "mfu", "price", "seq_len"),
    "sft": ("tokens", "days", "mfu", "price", "seq_len", "model"),
    "dpo": ("tokens", "days", "mfu", "price", "seq_len", "model"),
    "merge": (),
    "ppo": ("model", "prompt_len"),
}


# --------------------------------------------------------------------------- PPO

DEFAULT_PROMPT_LEN = 512        # --prompt-len: prompt tokens before the completion
# alignment.ppo.PPOSpec's defaults for the keys the estimate reads (pretrain cannot import
# alignment; tests/test_planner.py checks that they agree)
PPO_DEFAULTS = {"batch_size": 64, "mini_batch_size": 16, "max_new_tokens": 24, "precision": "auto",
                "deepspeed": None, "gradient_checkpointing": False, "vllm_gpu_memory_utilization": 0.3}


def make_ppo_plan(data: dict, *, source: str = "recipe", model: str | Path | None = None,
                  runs_dir: str | Path | None = None, gpu: str = "h100", gpus: Any = None,
                  prompt_len: Any = None, vocab: Any = DEFAULT_VOCAB) -> dict:
    """Memory per GPU of a PPO recipe (``data``: its keys as read from YAML) on ``gpus`` GPUs.

    The model's shape comes from ``model`` (a pretrain recipe, a HF ``config.json`` or a model
    folder), else from the recipe's parent run's ``model/config.json`` under ``runs_dir``.
    Formulas: :func:`~smolforge.pretrain.planner_memory.ppo_memory`, docs/planner.md ("PPO").
    """
    plan: dict[str, Any] = {"recipe": source, "stage": "ppo", "name": data.get("name"), **_device(gpu)}
    spec = data.get("ppo") or {}
    if not isinstance(spec, dict):
        raise RecipeError(f"{source}: ppo: must be a mapping of PPO settings, got {spec!r}")
    spec = {**PPO_DEFAULTS, **spec}
    counts = {key: int(parse_count(spec[key], f"ppo.{key}")) for key in ("batch_size", "mini_batch_size",
                                                                          "max_new_tokens")}
    gpus_n = _whole(gpus if gpus is not None else 1, "--gpus")
    prompt = _whole(prompt_len if prompt_len is not None else DEFAULT_PROMPT_LEN, "--prompt-len")
    deepspeed_path, zero_stage, ds_bf16 = _deepspeed_file(spec["deepspeed"], source)
    precision = _ppo_precision(spec["precision"], ds_bf16, plan["gpu"])
    checkpointing = spec["gradient_checkpointing"]
    if not isinstance(checkpointing, bool):
        raise RecipeError(f"ppo.gradient_checkpointing must be true or false, got {checkpointing!r}")
    shape, vocab_n, params, model_source = _ppo_model(model, data, runs_dir, vocab)
    value_params = params - (0 if shape.tie_word_embeddings else vocab_n * shape.hidden_size) + shape.hidden_size + 1
    vllm = gpus_n == 1 and data.get("generation", "auto") != "hf" and plan["gpu"] != "cpu"
    share = float(spec["vllm_gpu_memory_utilization"]) if vllm else None
    plan.update({
        "model_source": model_source, "vocab_size": vocab_n, "policy_params": params, "value_params": value_params,
        "reference_params": params, "precision": precision, "precision_source": f"ppo.precision {spec['precision']}",
        "deepspeed": deepspeed_path, "zero_stage": zero_stage, "data_parallel_gpus": gpus_n,
        "gradient_checkpointing": checkpointing, "prompt_len": prompt, "max_new_tokens": counts["max_new_tokens"],
        "seq_len": prompt + counts["max_new_tokens"], "batch_size": counts["batch_size"],
        "mini_batch_size": counts["mini_batch_size"], "rollouts": "vllm-server" if vllm else "hf",
        "vllm_gpu_memory_utilization": share,
        "bytes_per_param": dict(zip(("weights", "grads", "optimizer"),
                                    ppo_state_bytes_per_param(precision, deepspeed_path is not None))),
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(shape, 2 if precision == "bf16" else 4),
    })
    plan["memory_per_gpu_bytes"] = ppo_memory(
        shape, vocab_n, policy_params=params, value_params=value_params, reference_params=params,
        precision=precision, deepspeed=deepspeed_path is not None, zero_stage=zero_stage, dp_gpus=gpus_n,
        prompt_len=prompt, response_len=counts["max_new_tokens"], mini_batch_size=counts["mini_batch_size"],
        batch_size=counts["batch_size"], gradient_checkpointing=checkpointing, vllm_share=share,
        gpu_memory_bytes=plan["gpu_memory_bytes"])
    plan["warnings"] = _ppo_warnings(plan)
    return plan


def _whole(value: Any, what: str) -> int:
    number = parse_count(value, what)
    if not float(number).is_integer():
        raise RecipeError(f"{what} must be a whole number, got {value!r}")
    return int(number)


def _deepspeed_file(path: Any, source: str, key: str = "ppo.deepspeed") -> tuple[str | None, int, bool | None]:
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


def _ppo_precision(precision: Any, ds_bf16: bool | None, gpu: str) -> str:
    """fp32 or bf16: ``ppo.precision``; "auto" is bf16 on a GPU, fp32 on cpu, or what DeepSpeed's JSON states."""
    if precision not in ("auto", "fp32", "bf16"):
        raise RecipeError(f"ppo.precision must be one of auto, fp32, bf16, got {precision!r}")
    if precision != "auto":
        return precision
    if ds_bf16 is not None:
        return "bf16" if ds_bf16 else "fp32"
    return "fp32" if gpu == "cpu" else "bf16"


def _ppo_model(model: str | Path | None, data: dict, runs_dir: str | Path | None,
               vocab: Any) -> tuple[ModelShape, int, int, str]:
    """(shape, vocabulary, parameters, where from) of the PPO recipe's model."""
    if model is None:
        parent = data.get("parent")
        from smolforge.runs import RunLayout, runs_root

        root = Path(runs_dir) if runs_dir is not None else runs_root()
        for folder in ([root / str(parent), Path(str(parent))] if parent else []):
            config = RunLayout(folder).model_dir / "config.json"
            if config.is_file():
                return _hf_model(config)
        raise RecipeError(f"the PPO recipe's model shape is unknown: its parent run '{parent}' has no "
                          f"model/config.json under {root}/; pass --model (a pretrain recipe such as "
                          "recipes/smollm3-3b/pretrain.yaml, or a HF config.json or model folder)")
    path = Path(model)
    if path.is_dir() or path.name.endswith(".json"):
        return _hf_model(path / "config.json" if path.is_dir() else path)
    recipe = load_pretrain_recipe(path)
    vocab_n = int(parse_count(vocab, "--vocab"))
    return recipe.model, vocab_n, _count_parameters(recipe.model, vocab_n), f"{path} (model:, vocab {vocab_n})"


def _hf_model(config_path: Path) -> tuple[ModelShape, int, int, str]:
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


def _ppo_warnings(plan: dict[str, Any]) -> list[str]:
    m, mem = plan["memory_per_gpu_bytes"], plan["gpu_memory_bytes"]
    warnings = []
    if m["fits"] is False:
        warnings.append(f"PPO peaks at {m['peak'] / 1e9:.1f} GB per GPU, more than {MEMORY_HEADROOM:.0%} of the "
                        f"{plan['gpu']}'s {mem / 1e9:.0f} GB: use ppo.deepspeed (ZeRO-3, e.g. "
                        "recipes/smollm3-3b/zero3.json) over more GPUs, ppo.precision bf16, "
                        "ppo.gradient_checkpointing, or smaller ppo.mini_batch_size / ppo.batch_size")
    if plan["precision"] == "fp32" and plan["gpu"] != "cpu":
        warnings.append(f"ppo.precision fp32 on {plan['gpu']}: bf16 halves the reference, the KV cache and the "
                        "activations, and runs on its tensor cores")
    return warnings
