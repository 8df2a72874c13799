"""What every server smolforge starts shares: ports, readiness, log tails, stopping by PID.

    >>> 1024 <= free_port() < 65536
    True
    >>> http_ok("http://127.0.0.1:1/health")
    False
    >>> log_tail("/no/such.log")
    '(no log)'

Servers are started with ``start_new_session=True`` so that a process's group id is its PID:
:func:`stop_group` then reaches the workers it spawned too.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from .errors import ServiceError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether ``GET url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def log_tail(path: str | Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("(no log)" when it cannot be read)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until_ready(health_url: str, watched: Mapping[str, tuple[subprocess.Popen, Path]], *, what: str,
                     started: float, timeout: float, poll: float = 0.5) -> None:
    """Poll ``health_url`` until it answers 200. ``watched`` maps a label ("vLLM server for …") to its
    process and log; one that exits first, or no answer within ``timeout`` seconds of ``started``
    (a ``perf_counter`` time), is a ServiceError with the end of the log that explains it.

    >>> import sys
    >>> proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    >>> wait_until_ready("http://127.0.0.1:1/", {"toy server": (proc, Path("/no/such.log"))}, what="toy",
    ...                  started=time.perf_counter(), timeout=30)
    Traceback (most recent call last):
    ...
    smolforge.errors.ServiceError: toy server exited with code 3 before it was ready; end of /no/such.log:
    (no log)
    """
    while True:
        for label, (proc, log) in watched.items():
            if proc.poll() is not None:
                raise ServiceError(f"{label} exited with code {proc.returncode} before it was ready; "
                                   f"end of {log}:\n{log_tail(log)}")
        if http_ok(health_url):
            return
        if time.perf_counter() - started > timeout:
            log = next(iter(watched.values()))[1]
            raise ServiceError(f"{what} not ready after {timeout:.0f} s ({health_url}); end of {log}:\n"
                               f"{log_tail(log)}")
        time.sleep(poll)


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL what is left after ``grace`` seconds, reap it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers (engine cores, work horses) once the leader is gone
    except ProcessLookupError:
        pass
    proc.wait(timeout=grace)


def run_until_signal(check: Callable[[], None], start: Callable[[], None] | None = None,
                     interval: float = 0.5) -> int:
    """Call ``start``, then ``check`` (which raises when a served process died) until SIGINT/SIGTERM; 0.

    The handlers are in place before ``start`` runs, so a signal during start-up cannot kill the
    caller before its ``finally`` stops what it started.
    """
    stopping: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: stopping.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if start is not None:
            start()
        while not stopping:
            check()
            time.sleep(interval)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
