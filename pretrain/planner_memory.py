"""Memory per GPU of a pretraining run: model states per ZeRO stage and one micro-batch's activations.

Mixed precision keeps bf16 weights and grads plus fp32 master weights and Adam m and v: 2 + 2 + 12
bytes per parameter (fp32 recipes: 4 + 4 + 8). ZeRO stage 1 shards the optimizer states over the
data-parallel GPUs, stage 2 also the gradients, stage 3 also the weights. Formulas and sources:
docs/planner.md.

    >>> memory_per_gpu(1000, {"full": 100, "checkpointed": 10}, dp_gpus=4)["3"]["total"]
    4100
"""
from __future__ import annotations

from .model import ModelShape

__all__ = ["BYTES_PER_PARAM", "MEMORY_HEADROOM", "activation_bytes", "memory_per_gpu"]

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
