"""The plan of a pretrain recipe (``stage: pretrain``): parameters, FLOPs, GPU-hours, GPUs or days, cost, memory.

Counts the model's parameters on the meta device and works in two directions:

* forward: assume an MFU (``--mfu``, default 0.30) → GPU-hours, then the GPUs that finish in
  ``--days`` and/or the days ``--gpus`` take;
* backwards: ``--gpus`` and ``--days`` → the MFU the run needs (``mfu_required``). Without
  ``--mfu`` the plan then assumes exactly that MFU, so its GPU-hours are the reservation's.

Memory per GPU is given for ZeRO stages 0–3 (:mod:`.memory`), plus the activations of one
micro-batch with and without activation checkpointing.
"""
from __future__ import annotations

from typing import Any

from smolforge.pretrain.flops import embedding_params, kv_cache_bytes_per_token
from smolforge.pretrain.model import ModelShape

from .inputs import DEFAULT_VOCAB, device_fields, parameters, parse_count
from .memory import BYTES_PER_PARAM, activation_bytes, memory_per_gpu
from .numbers import Given, compute, given_numbers, plan_warnings, schedule

__all__ = ["CHINCHILLA_TOKENS_PER_PARAM", "make_plan"]

CHINCHILLA_TOKENS_PER_PARAM = 20  # default --tokens: compute-optimal (Hoffmann et al. 2022)


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
    plan = {"recipe": source, "name": getattr(recipe, "name", None), **device_fields(gpu)}
    given = given_numbers(recipe.train, gpus=gpus, days=days, mfu=mfu, price=price, seq_len=seq_len, vocab=vocab)
    shape: ModelShape = recipe.model
    plan.update(_size(shape, given, tokens, recipe.train))
    plan.update(compute(shape, given, plan["params"], plan["tokens"], causal))
    plan.update(schedule(given, plan["train_flops"], plan["flops_per_token"], plan["peak_flops_per_gpu"]))
    data_parallel_gpus = given.gpus or plan["gpus_needed"] or 1
    plan.update(_memory(shape, recipe.train, given, plan["params"], data_parallel_gpus, plan["gpu_memory_bytes"]))
    plan["warnings"] = plan_warnings(plan, given, shape.max_position_embeddings)
    return plan


def _size(shape: ModelShape, given: Given, tokens: Any, train: Any = None) -> dict[str, Any]:
    """Parameters and training tokens: ``--tokens``; else ``train.max_steps`` × the tokens of a step
    on ``--gpus`` data-parallel GPUs; else 20 per parameter."""
    params = parameters(shape, given.vocab)
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


def _memory(shape: ModelShape, train: Any, given: Given, params: int, data_parallel_gpus: int,
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
