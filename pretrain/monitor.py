"""Throughput, model FLOPs utilisation and memory, per logging window.

MFU = achieved model FLOP/s ÷ (peak FLOP/s per device × devices), with model FLOPs per token from
:func:`smolforge.pretrain.flops.flops_per_token` (6N plus the attention term). On CPU the peak is measured
once with a matmul benchmark, so the figure says how close the loop runs to what this machine's
matmuls reach; without a known peak MFU is reported as None (n/a).

    >>> monitor = ThroughputMonitor(flops_per_token=6e6, peak_flops=1e12, devices=1)
    >>> monitor.add_tokens(1000)
    >>> figures = monitor.window()
    >>> sorted(figures)
    ['memory_gb', 'mfu', 'tokens_per_s']
"""
from __future__ import annotations

import resource
import sys
import time


def peak_memory_gb() -> float:
    """Peak GPU memory allocated on this device, else this process's peak resident set size."""
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**30, 3)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(rss / (2**30 if sys.platform == "darwin" else 2**20), 3)


class ThroughputMonitor:
    def __init__(self, flops_per_token: float, peak_flops: float | None, devices: int = 1) -> None:
        self.flops_per_token = flops_per_token
        self.peak_total = None if not peak_flops else peak_flops * devices
        self.tokens = 0
        self.started = time.perf_counter()

    def add_tokens(self, count: int) -> None:
        self.tokens += count

    def window(self) -> dict:
        """Figures since the last call; starts a new window."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        tokens_per_s = self.tokens / elapsed
        mfu = None if self.peak_total is None else tokens_per_s * self.flops_per_token / self.peak_total
        self.tokens, self.started = 0, time.perf_counter()
        return {"tokens_per_s": round(tokens_per_s, 1), "mfu": None if mfu is None else round(mfu, 5),
                "memory_gb": peak_memory_gb()}
