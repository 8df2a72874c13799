"""Open the sampler of a backend on a model folder: :func:`open_sampler`.

It sits above both samplers (:mod:`smolforge.generation.hf`, :mod:`smolforge.generation.rollouts`)
and the interface they implement (:mod:`smolforge.generation.sampler`), so none of them imports
anything back; which backend runs here is :func:`smolforge.generation.backends.pick_backend`.

    >>> with open_sampler("runs/any/model", "tpu"):
    ...     pass
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: unknown generation backend 'tpu'; expected hf or vllm-server
"""
from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from smolforge.errors import RecipeError

from .sampler import Sampler

__all__ = ["open_sampler"]


@contextlib.contextmanager
def open_sampler(model_dir: str | Path, backend: str = "hf", *, seed: int = 0, device: str = "cpu",
                 batch_size: int | None = None, log_dir: str | Path | None = None) -> Iterator[Sampler]:
    """A sampler on ``model_dir`` for ``backend`` ("hf" or "vllm-server"); stopped on exit.

    "hf" seeds torch with ``seed``; "vllm-server" starts a server with ``--seed seed`` (its log
    goes to ``log_dir``, else a temp folder).
    """
    if backend == "hf":
        import torch

        from .hf import load_hf_sampler

        torch.manual_seed(seed)
        yield load_hf_sampler(model_dir, device=device, batch_size=batch_size)
    elif backend == "vllm-server":
        from .prompts import load_tokenizer
        from .rollouts import ServerRollouts, ServerSampler

        with contextlib.ExitStack() as stack:
            workdir = log_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="smolforge-sampler-"))
            rollouts = stack.enter_context(ServerRollouts(model_dir, workdir, seed=seed))
            yield ServerSampler(rollouts, load_tokenizer(model_dir))
    else:
        raise RecipeError(f"unknown generation backend {backend!r}; expected hf or vllm-server")
