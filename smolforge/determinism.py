"""Bit-reproducible training: one seed, one thread count, deterministic kernels, recorded in run.json.

A training stage (pretraining, the TRL stages, online RL) enters :func:`reproducible` before it
builds its model and trainer and leaves it when the training is done::

    with reproducible(recipe.determinism, seed=recipe.trainer.seed) as record:
        run.update_metrics(as_metrics(record))     # run.json's metrics: determinism/threads, ...
        ...build the model and the trainer, train...

Inside, on a CPU run (``determinism.deterministic: null``, the default, means on without a GPU):

- Python's ``random``, NumPy and torch are seeded with the recipe's seed (the Trainer seeds them
  again itself; what runs before it, a LoRA adapter's initialisation, the held-out answers, sees
  the same state whatever ran earlier in the process);
- torch computes with a fixed number of threads (``threads``; default ``$OMP_NUM_THREADS`` when set,
  else the CPUs this process may run on, shared among the ranks on this machine). This is what made
  CPU runs differ: at one thread count a stage repeats bit for bit in a fresh process, but a matmul
  or reduction split over 2 threads adds in another order than over 1 (the demo's model, 8
  pretraining steps: weights 1.5e-5 apart), and the count moved with ``$OMP_NUM_THREADS`` and with
  what ran earlier in the process (vLLM's CPU worker, accelerate's CPU launcher, a test);
- ``torch.use_deterministic_algorithms(True, warn_only=True)``: a kernel without a deterministic
  version warns instead of failing (none warned in the CPU stages). Its filling of every new
  uninitialised tensor with NaN stays off: it changed no result and made the TRL stages 2.4x slower.

On leaving, torch's previous thread count and deterministic setting come back, so a later stage in
the same process (a pipeline with ``share_process``) starts from what it would have had alone.

The record lands in run.json's metrics as ``determinism/*`` (:func:`as_metrics`): whether the
settings were on, the seed, the thread count, and what they cannot fix, named with its seed under
``determinism/nondeterministic`` (the vLLM server's sampling: its batches depend on request timing).

    >>> spec = DeterminismSpec(threads=1)
    >>> with reproducible(spec, seed=3, cuda=False) as record:
    ...     import torch
    ...     torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    (1, True)
    >>> record["deterministic"], record["threads"], record["seed"]
    (True, 1, 3)
    >>> as_metrics(record)["determinism/threads"]
    1
    >>> check_spec(DeterminismSpec(threads=0))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: determinism.threads must be >= 1 (or null: $OMP_NUM_THREADS, else this machine's CPUs), got 0
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

from smolforge.errors import RecipeError

log = logging.getLogger(__name__)

__all__ = ["DeterminismSpec", "check_spec", "default_threads", "reproducible", "nondeterministic", "as_metrics"]


@dataclass
class DeterminismSpec:
    """A training recipe's ``determinism:`` section."""

    deterministic: bool | None = None  # seed, fix the threads, deterministic kernels; null: on for CPU runs, off on a GPU
    threads: int | None = None         # torch compute threads while training; null: $OMP_NUM_THREADS, else this machine's CPUs


def check_spec(spec: DeterminismSpec) -> None:
    """RecipeError before any run exists when ``determinism:`` cannot be applied."""
    if spec.threads is not None and spec.threads < 1:
        raise RecipeError(f"determinism.threads must be >= 1 (or null: $OMP_NUM_THREADS, else this machine's "
                          f"CPUs), got {spec.threads}")


def default_threads() -> int:
    """``$OMP_NUM_THREADS`` when it holds a positive number, else the CPUs this process may run on
    shared among the launcher's ranks on this machine (``$LOCAL_WORLD_SIZE``).

    Decided from the environment, not from torch's current count, which anything earlier in the
    process may have changed (a test, vLLM's CPU worker, accelerate's CPU launcher).

    >>> default_threads() >= 1
    True
    """
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS
        cpus = os.cpu_count() or 1
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return max(1, cpus // (int(ranks) if ranks.isdigit() and int(ranks) > 0 else 1))


def nondeterministic(component: str, seed: int | None, why: str) -> dict:
    """An entry of the record's ``nondeterministic`` list: a part of the run these settings do not fix.

    >>> nondeterministic("vllm-server sampling", 0, "batches depend on request timing")["seed"]
    0
    """
    return {"component": component, "seed": seed, "why": why}


def as_metrics(record: dict) -> dict:
    """A :func:`reproducible` record as run.json metrics (``determinism/<key>``).

    >>> as_metrics({"deterministic": True, "seed": 0, "threads": 2, "nondeterministic": []})
    {'determinism/deterministic': True, 'determinism/seed': 0, 'determinism/threads': 2, 'determinism/nondeterministic': []}
    """
    return {f"determinism/{key}": value for key, value in record.items()}


@contextlib.contextmanager
def reproducible(spec: DeterminismSpec | None, seed: int, *, cuda: bool | None = None) -> Iterator[dict]:
    """Apply ``spec`` for the body and yield its record (:func:`as_metrics` for run.json); restore on exit.

    ``cuda`` says whether this stage trains on a GPU (default: whether torch sees one); with
    ``deterministic: null`` that turns the settings off. Off, the record still says so, with the seed
    and the thread count the run had. The body may append to ``record["nondeterministic"]``.
    """
    import torch
    import torch.utils.deterministic

    spec = spec or DeterminismSpec()
    on_gpu = torch.cuda.is_available() if cuda is None else cuda
    on = (not on_gpu) if spec.deterministic is None else bool(spec.deterministic)
    saved_threads = torch.get_num_threads()
    saved_mode = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    saved_cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    saved_fill = torch.utils.deterministic.fill_uninitialized_memory
    record: dict = {"deterministic": on, "seed": seed, "threads": saved_threads, "nondeterministic": []}
    try:
        if on:
            wanted = spec.threads or default_threads()
            torch.set_num_threads(wanted)
            if torch.get_num_threads() != wanted:  # vLLM's CPU worker, once in this process, makes it a no-op
                log.warning("determinism: torch keeps %d threads (asked for %d): something in this process froze "
                            "the count (vLLM's CPU worker does); runs reproduce only at the same count",
                            torch.get_num_threads(), wanted)
                record["nondeterministic"].append(nondeterministic(
                    "torch threads", None, f"frozen at {torch.get_num_threads()} in this process (asked for {wanted})"))
            if on_gpu:  # cuBLAS reads it when its handle is made: before the first matmul of the process
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
                torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.utils.deterministic.fill_uninitialized_memory = False   # see the module docstring
            random.seed(seed)
            torch.manual_seed(seed)  # every device's generator too
            try:
                import numpy

                numpy.random.seed(seed % 2**32)
            except ImportError:  # pragma: no cover - numpy comes with torch's stack
                pass
        record["threads"] = torch.get_num_threads()
        if on_gpu and on:
            record["cublas_workspace_config"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        yield record
    finally:
        torch.set_num_threads(saved_threads)
        torch.use_deterministic_algorithms(saved_mode[0], warn_only=saved_mode[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved_cudnn
        torch.utils.deterministic.fill_uninitialized_memory = saved_fill
