"""The memory plan of a PPO recipe (``stage: ppo``): policy + value model states per ZeRO stage of its
``ppo.deepspeed`` JSON, the frozen reference, one mini-batch's activations and the rollout's KV cache;
the model's shape from ``--model`` or the recipe's parent run. Formulas: docs/planner.md ("PPO").

    smolforge plan recipes/smollm3-3b/ppo.yaml --model recipes/smollm3-3b/pretrain.yaml --gpus 8 --gpu h100

The recipe is read as plain YAML; the keys it leaves out take :class:`~smolforge.alignment.ppo.PPOSpec`'s
defaults (:data:`PPO_DEFAULTS`).

    >>> PPO_DEFAULTS["mini_batch_size"], DEFAULT_PROMPT_LEN
    (16, 512)
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from smolforge.alignment.ppo import PPOSpec
from smolforge.errors import RecipeError
from smolforge.pretrain.flops import kv_cache_bytes_per_token

from .inputs import DEFAULT_VOCAB, deepspeed_file, device_fields, model_from, parse_count
from .memory import MEMORY_HEADROOM, ppo_memory, ppo_state_bytes_per_param

__all__ = ["DEFAULT_PROMPT_LEN", "PPO_DEFAULTS", "make_ppo_plan"]

DEFAULT_PROMPT_LEN = 512        # --prompt-len: prompt tokens before the completion
_READ = ("batch_size", "mini_batch_size", "max_new_tokens", "precision", "deepspeed", "gradient_checkpointing",
         "vllm_gpu_memory_utilization")
# the stage's own defaults (PPOSpec, the recipe's ppo: section) for the keys the estimate reads
PPO_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PPOSpec) if f.name in _READ}


def make_ppo_plan(data: dict, *, source: str = "recipe", model: str | Path | None = None,
                  runs_dir: str | Path | None = None, gpu: str = "h100", gpus: Any = None,
                  prompt_len: Any = None, vocab: Any = DEFAULT_VOCAB) -> dict:
    """Memory per GPU of a PPO recipe (``data``: its keys as read from YAML) on ``gpus`` GPUs.

    The model's shape comes from ``model`` (a pretrain recipe, a HF ``config.json`` or a model
    folder), else from the recipe's parent run's ``model/config.json`` under ``runs_dir``.
    Formulas: :func:`~smolforge.ops.plan.memory.ppo_memory`, docs/planner.md ("PPO").
    """
    plan: dict[str, Any] = {"recipe": source, "stage": "ppo", "name": data.get("name"), **device_fields(gpu)}
    spec = data.get("ppo") or {}
    if not isinstance(spec, dict):
        raise RecipeError(f"{source}: ppo: must be a mapping of PPO settings, got {spec!r}")
    spec = {**PPO_DEFAULTS, **spec}
    counts = {key: int(parse_count(spec[key], f"ppo.{key}")) for key in ("batch_size", "mini_batch_size",
                                                                          "max_new_tokens")}
    gpus_n = _whole(gpus if gpus is not None else 1, "--gpus")
    prompt = _whole(prompt_len if prompt_len is not None else DEFAULT_PROMPT_LEN, "--prompt-len")
    deepspeed_path, zero_stage, ds_bf16 = deepspeed_file(spec["deepspeed"], source)
    precision = _ppo_precision(spec["precision"], ds_bf16, plan["gpu"])
    checkpointing = spec["gradient_checkpointing"]
    if not isinstance(checkpointing, bool):
        raise RecipeError(f"ppo.gradient_checkpointing must be true or false, got {checkpointing!r}")
    shape, vocab_n, params, model_source = model_from(model, data, runs_dir, vocab)
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


def _ppo_precision(precision: Any, ds_bf16: bool | None, gpu: str) -> str:
    """fp32 or bf16: ``ppo.precision``; "auto" is bf16 on a GPU, fp32 on cpu, or what DeepSpeed's JSON states."""
    if precision not in ("auto", "fp32", "bf16"):
        raise RecipeError(f"ppo.precision must be one of auto, fp32, bf16, got {precision!r}")
    if precision != "auto":
        return precision
    if ds_bf16 is not None:
        return "bf16" if ds_bf16 else "fp32"
    return "fp32" if gpu == "cpu" else "bf16"


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
