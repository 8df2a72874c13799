"""Memory per GPU of a pretraining run (model states per ZeRO stage, one micro-batch's activations)
and of a PPO run (:func:`ppo_memory`: policy + value model + reference, train and rollout phases).

Mixed precision keeps bf16 weights and grads plus fp32 master weights and Adam m and v: 2 + 2 + 12
bytes per parameter (fp32 recipes: 4 + 4 + 8). ZeRO stage 1 shards the optimizer states over the
data-parallel GPUs, stage 2 also the gradients, stage 3 also the weights. Formulas and sources:
docs/planner.md.

    >>> memory_per_gpu(1000, {"full": 100, "checkpointed": 10}, dp_gpus=4)["3"]["total"]
    4100
"""
from __future__ import annotations

from smolforge.pretrain.flops import kv_cache_bytes_per_token
from smolforge.pretrain.model import ModelShape

__all__ = ["BYTES_PER_PARAM", "MEMORY_HEADROOM", "activation_bytes", "memory_per_gpu", "with_reference",
           "ppo_state_bytes_per_param", "ppo_memory"]

MEMORY_HEADROOM = 0.90          # "fits" = total <= 90 % of device memory (the playbook's alert line)
# bytes per parameter: (weights, grads, optimizer states)
BYTES_PER_PARAM = {
    "bf16": (2, 2, 12),         # bf16 weights + bf16 grads + fp32 master, Adam m, Adam v (4+4+4)
    "fp32": (4, 4, 8),          # fp32 weights + fp32 grads + Adam m, v
}


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


def with_reference(memory: dict[str, dict], reference_bytes: int, dp_gpus: int,
                   gpu_memory_bytes: int | None = None) -> dict[str, dict]:
    """:func:`memory_per_gpu`'s stages plus a frozen reference model of ``reference_bytes`` (DPO's):
    whole on every GPU under ZeRO 0-2 (TRL prepares it with stage 0 then), sharded under ZeRO-3.

    >>> m = with_reference(memory_per_gpu(1000, {"full": 100, "checkpointed": 10}, dp_gpus=4), 2000, dp_gpus=4)
    >>> [(m[z]["reference"], m[z]["total"]) for z in "03"]
    [(2000, 18100), (500, 4600)]
    """
    out: dict[str, dict] = {}
    for stage, row in memory.items():
        reference = int(round(reference_bytes / (dp_gpus if int(stage) >= 3 else 1)))
        row = {**row, "reference": reference, "total": row["total"] + reference,
               "total_checkpointed": row["total_checkpointed"] + reference}
        if gpu_memory_bytes:
            row["fits"] = row["total"] <= MEMORY_HEADROOM * gpu_memory_bytes
            row["fits_checkpointed"] = row["total_checkpointed"] <= MEMORY_HEADROOM * gpu_memory_bytes
        out[stage] = row
    return out


def ppo_state_bytes_per_param(precision: str, deepspeed: bool) -> tuple[int, int, int]:
    """(weights, grads, optimizer) bytes per trained parameter of smolforge's PPO.

    DeepSpeed's bf16 keeps bf16 weights and grads beside fp32 master weights and Adam m, v
    (2 + 2 + 12); accelerate's bf16 without DeepSpeed is autocast, which keeps fp32 weights and
    grads (4 + 4 + 8), as does fp32.

    >>> ppo_state_bytes_per_param("bf16", deepspeed=True), ppo_state_bytes_per_param("bf16", deepspeed=False)
    ((2, 2, 12), (4, 4, 8))
    """
    return BYTES_PER_PARAM["bf16"] if precision == "bf16" and deepspeed else BYTES_PER_PARAM["fp32"]


def ppo_memory(shape: ModelShape, vocab_size: int, *, policy_params: int, value_params: int,
               reference_params: int, precision: str, deepspeed: bool, zero_stage: int, dp_gpus: int,
               prompt_len: int, response_len: int, mini_batch_size: int, batch_size: int,
               gradient_checkpointing: bool, vllm_share: float | None = None,
               gpu_memory_bytes: int | None = None) -> dict:
    """Bytes per GPU of smolforge's PPO (policy + value model trained, frozen reference), by part.

    * model states: policy + value model at :func:`ppo_state_bytes_per_param`, ZeRO stage 1
      sharding the optimizer over ``dp_gpus``, 2 also the grads, 3 also the weights;
    * reference: 2 bytes/param in bf16, 4 in fp32; sharded only under ZeRO-3;
    * train activations of one mini-batch of ``prompt_len + response_len`` tokens
      (:func:`activation_bytes`, full or checkpointed) in each trunk, plus the policy's fp32 logits
      for the ``response_len + 1`` positions it keeps (``logits_to_keep``); the value model has none;
    * rollout: the KV cache of ``batch_size`` sequences (HF generate, 2 or 4 bytes per element),
      plus under ZeRO-3 the full weights of the prepared module (policy and value model: TRL's
      ``unwrap_model_for_generation`` gathers all of it). With a vLLM server instead
      (``vllm_share``: one process on the GPU), the KV cache lives in the server's reservation,
      ``vllm_share`` × device memory, held all along; the trainer then clones the policy's
      weights for each sync;
    * peak = states + reference + server + max(train activations, rollout); fits when ≤ 90 %.

    >>> from smolforge.pretrain.model import ModelShape
    >>> m = ppo_memory(ModelShape(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1), 100,
    ...                policy_params=1000, value_params=900, reference_params=1000, precision="bf16",
    ...                deepspeed=True, zero_stage=3, dp_gpus=4, prompt_len=6, response_len=2,
    ...                mini_batch_size=1, batch_size=2, gradient_checkpointing=True)
    >>> m["states"], m["reference"], m["kv_cache"], m["gathered_weights"]
    (7600, 500, 4096, 3800)
    """
    bf16 = precision == "bf16"
    trained = policy_params + value_params
    w, g, o = ppo_state_bytes_per_param(precision, deepspeed)
    out: dict = {
        "weights": w * trained / (dp_gpus if zero_stage >= 3 else 1),
        "grads": g * trained / (dp_gpus if zero_stage >= 2 else 1),
        "optimizer": o * trained / (dp_gpus if zero_stage >= 1 else 1),
        "reference": (2 if bf16 else 4) * reference_params / (dp_gpus if zero_stage >= 3 else 1),
    }
    seq_len = prompt_len + response_len
    act = activation_bytes(shape, vocab_size, seq_len, mini_batch_size, precision)
    trunk = act["checkpointed" if gradient_checkpointing else "full"] - act["logits"]
    out["activations_policy"] = trunk + 4 * mini_batch_size * (response_len + 1) * vocab_size
    out["activations_value"] = trunk
    out["train_activations"] = out["activations_policy"] + out["activations_value"]
    element = 2 if bf16 else 4
    out["gathered_weights"] = element * trained if zero_stage >= 3 else 0
    if vllm_share and gpu_memory_bytes:
        out["kv_cache"], out["sync_copy"] = 0, w * policy_params
        out["vllm_server"] = vllm_share * gpu_memory_bytes
    else:
        out["kv_cache"] = batch_size * seq_len * kv_cache_bytes_per_token(shape, element)
        out["sync_copy"] = out["vllm_server"] = 0
    out["rollout"] = out["kv_cache"] + out["gathered_weights"] + out["sync_copy"]
    out = {k: int(round(v)) for k, v in out.items()}
    out["states"] = out["weights"] + out["grads"] + out["optimizer"]
    out["resident"] = out["states"] + out["reference"]
    out["peak"] = out["resident"] + out["vllm_server"] + max(out["train_activations"], out["rollout"])
    out["fits"] = out["peak"] <= MEMORY_HEADROOM * gpu_memory_bytes if gpu_memory_bytes else None
    return out
