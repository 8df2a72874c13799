"""Training FLOPs, peak device FLOP/s and KV-cache size: what the planner and the MFU meter share.

    >>> from smolforge.pretrain.model import ModelShape
    >>> shape = ModelShape(hidden_size=2048, intermediate_size=11008, num_layers=36, num_heads=16,
    ...                    num_kv_heads=4)
    >>> kv_cache_bytes_per_token(shape)           # 36 layers x 4 KV heads x 128 x (K, V) x bf16
    73728
    >>> attention_flops_per_token(shape, seq_len=4096) / 1e9   # 12 * 36 * 4096 * 2048
    3.623878656
    >>> peak_flops("h100"), peak_flops("NVIDIA A100-SXM4-40GB"), peak_flops("tpu")
    (989400000000000.0, 312000000000000.0, None)

Conventions (also in docs/planner.md):

* **Dense matmul FLOPs** are ``6 · N_matmul`` per trained token (2 forward + 4 backward per
  multiply-add weight), where ``N_matmul`` = non-embedding parameters + the output projection
  (``vocab · hidden``). The input embedding is a lookup, not a matmul, so an untied input table
  adds no FLOPs; with tied embeddings (SmolLM3) ``N_matmul`` equals the full parameter count N,
  i.e. the familiar ``6 · N``. Norms, activations, RoPE and the softmax are ignored (< 1 %).
* **Attention** (the score and value matmuls, which hold no parameters): per token and layer the
  forward pass does ``QKᵀ`` = ``2 · seq_len · (heads · head_dim)`` FLOPs and ``A·V`` the same, so
  ``4 · seq_len · hidden`` forward and ``12 · seq_len · hidden`` for training (backward = 2 ×
  forward). GQA does not reduce it (every query head still scores every key).
  **Causal masking is NOT credited**: the full ``seq_len × seq_len`` square is counted, as in
  PaLM's MFU definition (Chowdhery et al. 2022, app. B: ``6N + 12·L·H·Q·T``), so MFU figures
  compare with published ones. ``causal=True`` halves the term (what a causal FlashAttention
  kernel actually executes); for SmolLM3-3B at 4k that lowers the FLOPs by ≈ 8 %.
* **Peak FLOP/s** are dense (no 2:4 sparsity) bf16 tensor-core figures from the vendor
  datasheets; ``cpu`` is measured (an fp32 matmul benchmark), so it is an achievable rate, not
  a theoretical peak.
"""
from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass

from .model import ModelShape

__all__ = [
    "DeviceSpec", "DEVICES", "device_key", "peak_flops", "measure_cpu_peak_flops",
    "embedding_params", "attention_flops_per_token", "flops_per_token",
    "kv_cache_bytes_per_token", "unknown_device_message",
]

GB = 10**9


@dataclass(frozen=True)
class DeviceSpec:
    peak_flops: float | None      # dense bf16 FLOP/s per device (None: measured at run time)
    memory_bytes: int | None      # device memory (None: unknown / host RAM)
    source: str                   # where the figure comes from


# Dense bf16 tensor-core peaks. Datasheets print the 2:4-sparsity figure first and mark it with
# an asterisk; the dense figure is half of it. NOT 3e15 for an H100 (the playbook's correction).
DEVICES: dict[str, DeviceSpec] = {
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5: "BF16 Tensor Core 1,979 TFLOPS*" (*with
    # sparsity) -> 989.4 TFLOPS dense (H100 architecture whitepaper, table 2: 989.4 / 1978.9). 80 GB.
    "h100": DeviceSpec(989.4e12, 80 * GB,
                    "NVIDIA H100 datasheet (SXM5): 1,979 TFLOPS bf16 with sparsity -> 989.4 dense"),
    # Same datasheet, H100 PCIe: "BF16 Tensor Core 1,513 TFLOPS*" -> 756 TFLOPS dense. 80 GB.
    "h100-pcie": DeviceSpec(756e12, 80 * GB,
                    "NVIDIA H100 datasheet (PCIe): 1,513 TFLOPS bf16 with sparsity -> 756 dense"),
    # NVIDIA H200 datasheet (SXM): "BF16 Tensor Core 1,979 TFLOPS" with sparsity -> 989 dense, the
    # same Hopper compute as the H100; what changes is memory: 141 GB HBM3e at 4.8 TB/s.
    "h200": DeviceSpec(989.4e12, 141 * GB,
                    "NVIDIA H200 datasheet (SXM): 1,979 TFLOPS bf16 with sparsity -> 989.4 dense; 141 GB"),
    # NVIDIA A100 Tensor Core GPU datasheet: "BF16 Tensor Core 312 TFLOPS | 624 TFLOPS*". 80 GB.
    "a100": DeviceSpec(312e12, 80 * GB,
                    "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense (624 with sparsity); 80 GB"),
    # Same datasheet, 40 GB model: same compute, half the memory.
    "a100-40g": DeviceSpec(312e12, 40 * GB,
                    "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense; 40 GB"),
    # NVIDIA L40S datasheet: "BF16 Tensor Core TFLOPS (FP32 accumulate) 362.05 | 733*". 48 GB.
    "l40s": DeviceSpec(362.05e12, 48 * GB,
                    "NVIDIA L40S datasheet: 362.05 TFLOPS bf16 dense (733 with sparsity); 48 GB"),
    # AWS's A10G (g5 instances) has no NVIDIA datasheet of its own; the NVIDIA A10 datasheet (same
    # GA102 chip) gives "BF16 Tensor Core 125 TF | 250 TF*". Figures quoted for the A10G vary
    # (~70-125 TFLOPS), so read an A10G MFU as relative to this nominal A10 figure. 24 GB.
    "a10g": DeviceSpec(125e12, 24 * GB,
                    "NVIDIA A10 datasheet (A10G = AWS's A10 variant): 125 TFLOPS bf16 dense; 24 GB"),
    # Measured: fp32 matmul throughput of this machine's CPU (measure_cpu_peak_flops); host RAM.
    "cpu": DeviceSpec(None, None,
                    "measured here: best of a few 1024x1024 fp32 torch matmuls"),
}

# Substrings of torch.cuda.get_device_name() / free text -> table key, most specific first.
_ALIASES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h200",), "h200"),
    (("h100", "pcie"), "h100-pcie"),
    (("h100",), "h100"),
    (("a100", "40g"), "a100-40g"),
    (("a100",), "a100"),
    (("l40s",), "l40s"),
    (("a10g",), "a10g"),
)


def device_key(device: str) -> str | None:
    """The table key for a device name: a key itself, a torch device name or a GPU model string.

    >>> device_key("H100"), device_key("NVIDIA H100 80GB HBM3"), device_key("NVIDIA A100-PCIE-40GB")
    ('h100', 'h100', 'a100-40g')
    >>> device_key("a100-80g")
    'a100'
    >>> device_key("v100") is None
    True
    """
    name = str(device).strip().lower()
    if name in DEVICES:
        return name
    if name.startswith("cuda"):
        name = _cuda_device_name(name)
        if name is None:
            return None
    if name == "cpu" or name.startswith("cpu:"):
        return "cpu"
    for parts, key in _ALIASES:
        if all(p in name for p in parts):
            return key
    return None


def _cuda_device_name(name: str) -> str | None:
    """``cuda`` / ``cuda:1`` -> the model string torch reports, or None without a GPU."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    index = int(name.partition(":")[2] or 0)
    return torch.cuda.get_device_name(index).lower()


def unknown_device_message(device: str) -> str:
    """The error text for an unknown device, with the closest known one and the full list.

    >>> unknown_device_message("h10")
    "unknown GPU 'h10' (did you mean 'h100'?; known: a100, a100-40g, a10g, cpu, h100, h100-pcie, h200, l40s)"
    """
    known = sorted(DEVICES)
    close = difflib.get_close_matches(str(device).strip().lower(), known, n=1)
    hint = f"did you mean '{close[0]}'?; " if close else ""
    return f"unknown GPU '{device}' ({hint}known: {', '.join(known)})"


@functools.lru_cache(maxsize=1)
def measure_cpu_peak_flops(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of this CPU on fp32 ``n × n`` torch matmuls (best of ``repeats`` after a warm-up).

    ``2·n³`` FLOPs per matmul; with n = 1024 a run takes well under a second on two cores.
    Cached for the process: the MFU meter and the planner call it more than once.
    """
    import time

    import torch

    a = torch.randn(n, n, dtype=torch.float32)
    b = torch.randn(n, n, dtype=torch.float32)
    torch.matmul(a, b)  # warm-up: thread pool, caches
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / max(best, 1e-9)


def peak_flops(device: str) -> float | None:
    """Peak dense bf16 FLOP/s of one ``device`` (a table key, ``cuda[:i]``, a GPU model name).

    ``cpu`` is measured once per process (:func:`measure_cpu_peak_flops`); an unknown device
    gives None, so an MFU meter can log tokens/s without an MFU instead of a wrong one.
    """
    key = device_key(device)
    if key is None:
        return None
    if key == "cpu":
        return measure_cpu_peak_flops()
    return DEVICES[key].peak_flops


def host_memory_bytes() -> int | None:
    """Total RAM of this machine (the ``cpu`` device's memory), or None where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return None


def embedding_params(shape: ModelShape, vocab_size: int) -> int:
    """Parameters in the embedding table(s): ``vocab · hidden``, twice when untied.

    >>> embedding_params(ModelShape(hidden_size=64, tie_word_embeddings=False), 100)
    12800
    """
    return vocab_size * shape.hidden_size * (1 if shape.tie_word_embeddings else 2)


def _head_dim(shape: ModelShape) -> int:
    head_dim = shape.extra.get("head_dim") if shape.extra else None
    return int(head_dim or shape.hidden_size // shape.num_heads)


def attention_flops_per_token(shape: ModelShape, seq_len: int, *, causal: bool = False) -> float:
    """Training FLOPs per token of the parameter-free attention matmuls (QKᵀ and A·V).

    ``3 (fwd + bwd) × 2 matmuls × 2 FLOPs/MAC × seq_len × heads · head_dim`` per layer
    = ``12 · L · seq_len · hidden``; halved with ``causal=True`` (see the module docstring).
    """
    width = shape.num_heads * _head_dim(shape)
    flops = 12.0 * shape.num_layers * seq_len * width
    return flops / 2 if causal else flops


def flops_per_token(shape: ModelShape, vocab_size: int, seq_len: int, *,
                    params: int | None = None, causal: bool = False) -> float:
    """Training FLOPs per token (forward + backward): ``6 · N_matmul`` + the attention term.

    ``params`` is the model's total parameter count; when None it is counted on the meta device
    (:func:`smolforge.pretrain.model.count_parameters`, which imports transformers). A training loop that
    has the model passes ``sum(p.numel() for p in model.parameters())``.

    >>> shape = ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
    ...                    num_kv_heads=1)
    >>> flops_per_token(shape, vocab_size=100, seq_len=32, params=100_000)
    649152.0
    """
    if params is None:
        from .model import count_parameters

        params = count_parameters(shape, vocab_size)
    matmul_params = params - embedding_params(shape, vocab_size) + vocab_size * shape.hidden_size
    return 6.0 * matmul_params + attention_flops_per_token(shape, seq_len, causal=causal)


def kv_cache_bytes_per_token(shape: ModelShape, bytes_per_element: int = 2) -> int:
    """KV-cache bytes one token occupies at inference: ``layers × kv_heads × head_dim × 2 × bytes``.

    The 2 is K and V; ``bytes_per_element`` = 2 for bf16/fp16, 1 for an fp8 cache. NoPE layers
    still cache K and V, so every layer counts.

    >>> kv_cache_bytes_per_token(ModelShape(hidden_size=2048, num_layers=36, num_heads=16,
    ...                                     num_kv_heads=16))
    294912
    """
    return shape.num_layers * shape.num_kv_heads * _head_dim(shape) * 2 * bytes_per_element
