"""Learning-rate schedules as plain functions of the step (multipliers of the peak LR).

    >>> f = lr_multiplier("cosine", total_steps=100, warmup_steps=10, min_ratio=0.1)
    >>> round(f(0), 2), f(9), round(f(99), 3)
    (0.1, 1.0, 0.1)
    >>> g = lr_multiplier("wsd", total_steps=100, warmup_steps=10, min_ratio=0.0, decay_fraction=0.2)
    >>> g(50), g(79), round(g(99), 2)
    (1.0, 1.0, 0.0)
"""
from __future__ import annotations

import math
from collections.abc import Callable

SCHEDULES = ("cosine", "wsd", "constant")


def lr_multiplier(kind: str, total_steps: int, warmup_steps: int, min_ratio: float = 0.1,
                  decay_fraction: float = 0.2) -> Callable[[int], float]:
    """Linear warmup over ``warmup_steps`` (0-based step s gets (s+1)/warmup), then:

    - ``cosine``: cosine decay to ``min_ratio`` at the last step;
    - ``wsd``: warmup–stable–decay; flat at 1.0, then linear decay to ``min_ratio`` over the last
      ``decay_fraction`` of the steps;
    - ``constant``: 1.0 after warmup.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; expected one of {', '.join(SCHEDULES)}")
    decay_steps = max(1, round(total_steps * decay_fraction))
    decay_start = total_steps - decay_steps

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        if kind == "cosine":
            span = max(1, total_steps - 1 - warmup_steps)
            progress = min(1.0, (step - warmup_steps) / span)
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / decay_steps)
        return 1.0 - (1.0 - min_ratio) * progress

    return multiplier
