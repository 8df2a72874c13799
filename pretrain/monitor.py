"""Throughput, model FLOPs utilisation, memory and the wait for data, per logging window.

MFU = achieved model FLOP/s ÷ (peak FLOP/s per device × devices), with model FLOPs per token from
:func:`smolforge.pretrain.flops.flops_per_token` (6N plus the attention term). On CPU the peak is measured
once with a matmul benchmark, so the figure says how close the loop runs to what this machine's
matmuls reach; without a known peak MFU is reported as None (n/a).

The time the loop spends waiting for its batches (reading packed rows, building tensors) is
counted by :meth:`ThroughputMonitor.timed` around the batch iterator: ``data_s`` is those seconds
in the window and ``data_share`` their fraction of the window's wall time, so a throughput drop
can be told apart as a data stall (the share rises) or a compute/communication one (it does not).

    >>> monitor = ThroughputMonitor(flops_per_token=6e6, peak_flops=1e12, devices=1)
    >>> batches = list(monitor.timed(iter([{"input_ids": [1, 2]}, {"input_ids": [3, 4]}])))
    >>> monitor.add_tokens(1000)
    >>> figures = monitor.window()
    >>> sorted(figures)
    ['data_s', 'data_share', 'memory_gb', 'mfu', 'tokens_per_s']
    >>> 0 <= figures["data_share"] <= 1
    True
"""
from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def peak_memory_gb() -> float:
    """Peak GPU memory allocated on this device, else this process's peak resident set size."""
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**30, 3)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(rss / (2**30 if sys.platform == "darwin" else 2**20), 3)


def device_memory_gb() -> float | None:
    """Total memory of this process's GPU, else of the machine (the CPU device's memory), in GB as
    :func:`peak_memory_gb` counts them; None where unknown."""
    import torch

    from .flops import host_memory_bytes

    if torch.cuda.is_available():
        return round(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30, 3)
    total = host_memory_bytes()
    return None if total is None else round(total / 2**30, 3)


def gpu_temperature_c() -> float | None:
    """This process's GPU temperature in °C through NVML (``torch.cuda.temperature``); None without
    a GPU or without pynvml (the CPU demo), so the figure is simply absent there."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return float(torch.cuda.temperature())
    except Exception:  # noqa: BLE001 - no pynvml, no NVML driver, a virtualised GPU: no reading
        return None


class ThroughputMonitor:
    def __init__(self, flops_per_token: float, peak_flops: float | None, devices: int = 1) -> None:
        self.flops_per_token = flops_per_token
        self.peak_total = None if not peak_flops else peak_flops * devices
        self.tokens = 0
        self.data_seconds = 0.0
        self.started = time.perf_counter()

    def add_tokens(self, count: int) -> None:
        self.tokens += count

    def timed(self, batches: Iterable[T]) -> Iterator[T]:
        """Yield from ``batches``, counting the time spent waiting for each one as data time."""
        iterator = iter(batches)
        while True:
            began = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.data_seconds += time.perf_counter() - began
            yield item

    def window(self) -> dict:
        """Figures since the last call; starts a new window."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        tokens_per_s = self.tokens / elapsed
        mfu = None if self.peak_total is None else tokens_per_s * self.flops_per_token / self.peak_total
        data_s = self.data_seconds
        self.tokens, self.data_seconds, self.started = 0, 0.0, time.perf_counter()
        figures = {"tokens_per_s": round(tokens_per_s, 1), "mfu": None if mfu is None else round(mfu, 5),
                   "memory_gb": peak_memory_gb(), "data_s": round(data_s, 4),
                   "data_share": round(min(data_s / elapsed, 1.0), 4)}
        temperature = gpu_temperature_c()
        if temperature is not None:       # the accelerator-temperature alert reads it
            figures["gpu_temperature_c"] = temperature
        return figures
