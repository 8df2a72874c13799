"""At most ``rate`` requests a second, across threads: what keeps a judge under an API's rate limit.

    >>> now = [0.0]; slept = []
    >>> def sleep(s): slept.append(round(s, 3)); now[0] += s
    >>> limit = RateLimiter(4.0, clock=lambda: now[0], sleep=sleep)
    >>> for _ in range(5): limit.wait()
    >>> slept                                    # the first goes at once, then one every 0.25 s
    [0.25, 0.25, 0.25, 0.25]
    >>> RateLimiter(0).wait()                    # 0: no limit
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """Spaces calls to :meth:`wait` at least ``1 / rate`` seconds apart (``rate`` <= 0: no limit)."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.clock, self.sleep = clock, sleep
        self._next = None
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Return when the next request may go (its slot is taken under the lock, the sleep outside it)."""
        if not self.interval:
            return
        with self._lock:
            now = self.clock()
            slot = now if self._next is None else max(now, self._next)
            self._next = slot + self.interval
        if slot > now:
            self.sleep(slot - now)
