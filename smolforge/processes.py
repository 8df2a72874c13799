"""What every process smolforge starts shares: ports, readiness, log tails, stopping by PID, output.

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
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from .errors import ServiceError


def use_environment_extension_cache() -> None:
    """Use this Python environment's own cache of JIT-compiled torch extensions (DeepSpeed's CPU
    comm op), which ``make setup`` fills, unless ``TORCH_EXTENSIONS_DIR`` already names one.

    torch's default cache (``~/.cache/torch_extensions``) is shared by every environment on the
    machine, and an op built against another environment's torch is rebuilt (about a minute on
    2 cores) on its next use; the environment's own folder is built once, at set-up.
    """
    cache = Path(sys.prefix) / "torch_extensions"
    if "TORCH_EXTENSIONS_DIR" not in os.environ and cache.is_dir():
        os.environ["TORCH_EXTENSIONS_DIR"] = str(cache)


def release_process_group() -> None:
    """Destroy torch.distributed's default process group if this process holds one.

    A process that exits with a Gloo group alive can abort in interpreter shutdown (SIGABRT,
    "terminate called without an active exception": Gloo's worker threads outlive Python), so a
    run already marked done would exit -6. Cheap when torch was never imported.

    >>> release_process_group()  # no group: nothing to do
    """
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default where unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", *, tries: int = 64) -> int:
    """A TCP port nobody listens on right now, chosen below the kernel's ephemeral range.

    A server binds the port it is given seconds later (vLLM after its imports); a port from the
    ephemeral range can be taken meanwhile by any outgoing connection on the machine, so the
    choice is a random free port from 20000 up to that range's start (port 0's pick as a fallback).
    """
    low = ephemeral_range()[0]
    picker = random.SystemRandom()
    for _ in range(tries if low > 20000 + 1000 else 0):
        port = picker.randrange(20000, low)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def port_taken(log: str | Path, since: int = 0) -> bool:
    r"""Whether a server's log, from byte ``since`` on, shows its bind failing on a port in use.

    >>> import tempfile
    >>> log = Path(tempfile.mkstemp()[1]); _ = log.write_text("OSError: [Errno 98] Address already in use\n")
    >>> port_taken(log), port_taken(log, since=log.stat().st_size), port_taken("/no/such.log")
    (True, False, False)
    """
    try:
        with open(log, "rb") as text:
            text.seek(since)
            return b"Address already in use" in text.read()[-8192:]
    except OSError:
        return False


def http_text(url: str, timeout: float = 2.0) -> str | None:
    """The body of ``GET url`` when it answers 200, else None: a health or metrics probe."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.read().decode("utf-8", errors="replace") if reply.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether ``GET url`` answers 200."""
    return http_text(url, timeout) is not None


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


class OutputTail:
    """The last ``size`` non-empty lines of a byte stream (progress-bar redraws split on ``\\r``).

    >>> tail = OutputTail(2)
    >>> for chunk in (b"loading\\r10%\\r100%\\nstep 1", b"\\nstep 2\\n"):
    ...     tail.feed(chunk)
    >>> tail.lines()
    ['step 1', 'step 2']
    """

    def __init__(self, size: int = 12) -> None:
        self.size = size
        self._lines: list[str] = []
        self._partial: dict[int, str] = {}      # per stream: stdout and stderr lines must not mix
        self._lock = threading.Lock()

    def feed(self, chunk: bytes, stream: int = 1) -> None:
        with self._lock:
            text = self._partial.get(stream, "") + chunk.decode("utf-8", errors="replace")
            *complete, self._partial[stream] = text.replace("\r", "\n").split("\n")
            self._lines = (self._lines + [line for line in complete if line.strip()])[-self.size:]

    def lines(self) -> list[str]:
        with self._lock:
            last = [part for part in self._partial.values() if part.strip()]
            return (self._lines + last)[-self.size:]


def _forward(source: int, sink: TextIO, tail: OutputTail) -> None:
    raw = getattr(sink, "buffer", None)  # bytes go through untouched; a captured stream gets text
    while True:
        try:
            chunk = os.read(source, 65536)
        except OSError:  # a pty whose other side is closed answers EIO
            break
        if not chunk:
            break
        tail.feed(chunk, source)
        if raw is not None:
            raw.write(chunk)
            raw.flush()
        else:
            sink.write(chunk.decode("utf-8", errors="replace"))
            sink.flush()


def run_showing_output(cmd: list[str], *, env: Mapping[str, str] | None = None, stdout_to_stderr: bool = False,
                       tail_lines: int = 12) -> tuple[int, list[str]]:
    """Run ``cmd``, passing its output through as it comes; ``(exit code, its last output lines)``.

    On a terminal the child gets a pseudo-terminal, so its progress bars and colours look as if it
    ran alone; otherwise stdout and stderr go through pipes and keep their streams
    (``stdout_to_stderr`` sends the child's stdout to our stderr, for callers whose stdout carries
    JSON). A negative exit code is the signal that killed the child.

    >>> import sys
    >>> run_showing_output([sys.executable, "-c", "print('a'); import sys; sys.exit(3)"], tail_lines=1)
    a
    (3, ['a'])
    """
    out_sink = sys.stderr if stdout_to_stderr else sys.stdout
    sys.stdout.flush()
    sys.stderr.flush()
    tail = OutputTail(tail_lines)
    if sys.stdout.isatty() and sys.stderr.isatty() and not stdout_to_stderr:
        import pty

        parent, child = pty.openpty()
        with subprocess.Popen(cmd, env=env, stdout=child, stderr=child) as proc:
            os.close(child)
            _forward(parent, out_sink, tail)
            os.close(parent)
        return proc.returncode, tail.lines()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        threads = [threading.Thread(target=_forward, args=(stream.fileno(), sink, tail), daemon=True)
                   for stream, sink in ((proc.stdout, out_sink), (proc.stderr, sys.stderr))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return proc.returncode, tail.lines()


def exit_text(code: int) -> str:
    """How a process ended, in words.

    >>> exit_text(2), exit_text(-9)
    ('failed with exit code 2', 'was killed by SIGKILL')
    """
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"failed with exit code {code}"
