"""Loss/grad-norm spike detection against a rolling median (the playbook's 3× alert).

    >>> guard = SpikeGuard(factor=3.0, window=8, min_history=4)
    >>> for loss in [2.0, 2.1, 1.9, 2.0]:
    ...     guard.observe(loss=loss, grad_norm=1.0)
    >>> guard.check(loss=2.05, grad_norm=1.1) is None
    True
    >>> guard.check(loss=9.0, grad_norm=1.0)
    'loss 9 > 3.0x rolling median 2'
"""
from __future__ import annotations

import math
import statistics
from collections import deque

ACTIONS = ("skip", "rewind", "off")


class SpikeGuard:
    """Flags a value above ``factor`` × the median of the last ``window`` normal values.

    A non-finite loss or grad norm is always a spike. Spikes are not added to the history, so
    one bad batch does not raise the bar for the next.
    """

    def __init__(self, factor: float = 3.0, window: int = 50, min_history: int = 10) -> None:
        self.factor = factor
        self.window = window
        self.min_history = min_history
        self.losses: deque[float] = deque(maxlen=window)
        self.grad_norms: deque[float] = deque(maxlen=window)

    def _over(self, name: str, value: float | None, history: deque) -> str | None:
        if value is None:
            return None
        if not math.isfinite(value):
            return f"{name} is {value}"
        if len(history) < self.min_history:
            return None
        median = statistics.median(history)
        if median > 0 and value > self.factor * median:
            return f"{name} {value:.4g} > {self.factor}x rolling median {median:.4g}"
        return None

    def check(self, loss: float | None = None, grad_norm: float | None = None) -> str | None:
        """The reason this step is a spike, or None."""
        return self._over("loss", loss, self.losses) or self._over("grad norm", grad_norm, self.grad_norms)

    def observe(self, loss: float | None = None, grad_norm: float | None = None) -> None:
        if loss is not None and math.isfinite(loss):
            self.losses.append(loss)
        if grad_norm is not None and math.isfinite(grad_norm):
            self.grad_norms.append(grad_norm)

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms)}

    def load_state_dict(self, state: dict) -> None:
        self.losses = deque(state["losses"], maxlen=self.window)
        self.grad_norms = deque(state["grad_norms"], maxlen=self.window)
