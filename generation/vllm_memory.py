"""How much of a GPU a vLLM engine or server may take: sized from the memory free as it starts.

    >>> gpu_share(free=30 * GIB, total=80 * GIB)      # 50 GiB of an 80 GiB card taken: ask for 29 GiB
    0.36
    >>> vllm_memory_share("runs/any/model", "cpu") is None     # off CUDA there is nothing to size
    True

vLLM refuses to start unless its share (``gpu_memory_utilization``) × the card's total memory is
free at start-up, and its own default share is a fixed 0.9. An engine or server that starts after
something else took part of the card (an HF model just scored, another process) asks instead for
what is free now, less a margin (:func:`vllm_memory_share`); off CUDA there is nothing to size
(vLLM's CPU build ignores the share).
"""
from __future__ import annotations

import math
from pathlib import Path

from smolforge.errors import ServiceError

__all__ = ["GIB", "VLLM_SHARE", "VLLM_MARGIN", "gpu_share", "weights_bytes", "vllm_memory_share"]

GIB = 2**30
VLLM_SHARE = 0.9            # vLLM's own default share of the card, the most we ask for
VLLM_MARGIN = 1 * GIB       # left free for the new engine's CUDA context and allocator slack


def gpu_share(free: int, total: int, *, wanted: float = VLLM_SHARE, margin: int = VLLM_MARGIN,
              needed: int = 0) -> float:
    """vLLM's ``gpu_memory_utilization`` when ``free`` of ``total`` bytes are free on the card now.

    vLLM refuses to start unless share × total is free at start-up, so the share is what is free
    less ``margin``, rounded down to 0.01, and at most ``wanted``. ``needed``: bytes the engine must
    hold at least (the weights); a ServiceError when the share leaves less.

    >>> gpu_share(80 * GIB, 80 * GIB), gpu_share(30 * GIB, 80 * GIB)
    (0.9, 0.36)
    >>> gpu_share(2 * GIB, 80 * GIB, needed=6 * GIB)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.ServiceError: vLLM needs 6.0 GiB of GPU memory but only 2.0 of 80.0 GiB are free (1.0 GiB ...
    """
    share = min(wanted, math.floor((free - margin) / total * 100) / 100)
    if share <= 0 or share * total < needed:
        raise ServiceError(f"vLLM needs {needed / GIB:.1f} GiB of GPU memory but only {free / GIB:.1f} of "
                           f"{total / GIB:.1f} GiB are free ({margin / GIB:.1f} GiB kept as margin); free the GPU "
                           "(other processes) or score with backend hf")
    return share


def weights_bytes(model_dir: str | Path) -> int:
    """The size of ``model_dir``'s weight files: what a vLLM engine holds at least."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))


def vllm_memory_share(model_dir: str | Path, device: str) -> float | None:
    """The share of the GPU a vLLM engine or server may take now (None off CUDA: the CPU build ignores it).

    Frees what this process no longer holds first (a scored HF model's reference cycles, torch's
    cached blocks), then sizes the share from the memory free on the card (:func:`gpu_share`).
    """
    if not str(device).startswith("cuda"):
        return None
    import torch

    from smolforge.step_batch import release_memory

    release_memory()
    free, total = torch.cuda.mem_get_info()
    return gpu_share(free, total, needed=weights_bytes(model_dir))
