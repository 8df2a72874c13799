"""Running model-written Python in a sandbox: a subprocess with limits, no network, a private temp folder.

A tool-using policy (GRPO with a Python tool, a ``tools`` eval) hands code it wrote to
:func:`run_python`; nothing it writes may reach the machine. Each call gets:

- a fresh private folder (mode 0700) as its working directory and ``HOME``, removed afterwards;
- ``python -I`` (no user site, no ``PYTHON*`` variables) with an almost empty environment;
- no network: a new network namespace (``unshare -rn``: only a loopback that is down) where the
  machine allows it, and in any case an audit hook that refuses every socket;
- an audit hook (installed before the code runs; Python offers no way to remove one) that refuses
  opening or listing anything outside the private folder and Python's own installation, removing,
  renaming or changing anything outside the folder, starting processes (``fork``, ``subprocess``,
  ``os.system``, ``exec``, ``posix_spawn``, and importing ``_posixsubprocess``, whose ``fork_exec``
  raises no audit event) and native calls (``ctypes``);
- limits: CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``), output (stdout and stderr go to
  files capped by ``RLIMIT_FSIZE``: a huge print is cut off there; the cap holds for every file the code
  writes) and a wall-clock timeout after which the whole process group is killed;
- no native code of its own: a module it writes loads only as Python source.

The result says what happened: ``ok``, ``error`` (the code raised; its traceback's last line is kept),
``refused`` (the sandbox said no), ``cpu_limit``, ``memory_limit``, ``output_limit`` or ``timeout``.

    >>> result = run_python("print(sum(range(10)))")
    >>> result.outcome, result.stdout
    ('ok', '45\\n')
    >>> run_python("open('/etc/hostname').read()").outcome
    'refused'
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["SandboxResult", "run_python", "network_isolation"]

REFUSED = "SandboxRefused"

# Runs first in the child, from the command line: the audit hook, then the model's file.
BOOTSTRAP = r'''
import os, sys
ROOT = os.path.realpath(sys.argv[1])
READABLE = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                                 os.path.dirname(os.__file__))})
class SandboxRefused(PermissionError):
    pass
WRITES = {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.truncate", "os.utime", "os.chown", "os.chflags",
          "os.lchown", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile", "shutil.copymode",
          "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.chown", "shutil.make_archive",
          "shutil.unpack_archive"}
MODULES = {"_posixsubprocess", "_ctypes", "ctypes"}   # process spawning and native calls below the audit events
def inside(path, roots):
    try:
        path = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return any(path == r or path.startswith(r + os.sep) for r in roots)
def hook(event, args):
    if event == "open":
        path, mode, flags = args[0], args[1] or "r", args[2] or 0
        if isinstance(path, int):
            return
        writing = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        if inside(path, (ROOT,)) or (not writing and inside(path, READABLE)):
            return
        raise SandboxRefused(f"open {path!r}: outside the sandbox folder")
    if event in WRITES:
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg, (ROOT,)):
                raise SandboxRefused(f"{event} {arg!r}: outside the sandbox folder")
        return
    if event == "import" and args and args[0] in MODULES:
        raise SandboxRefused(f"import {args[0]}: not allowed in the sandbox")
    if event == "import" and len(args) > 1 and args[1] and inside(args[1], (ROOT,)) \
            and not str(args[1]).endswith(".py"):   # native code written here would run without this hook
        raise SandboxRefused(f"import {args[0]} from {args[1]!r}: only Python source loads from the sandbox folder")
    if event in ("os.listdir", "os.scandir") and args and args[0] not in (None, ".", b"."):
        if not (inside(args[0], (ROOT,)) or inside(args[0], READABLE)):
            raise SandboxRefused(f"listing {args[0]!r}: outside the sandbox folder")
    if event.startswith("socket.") or event in ("os.fork", "os.forkpty", "os.system", "os.posix_spawn", "os.exec",
                                               "os.spawn", "subprocess.Popen", "os.kill", "os.killpg",
                                               "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
                                               "os.chdir", "os.putenv", "os.unsetenv", "os.chmod", "os.symlink",
                                               "os.link", "sys.addaudithook"):
        raise SandboxRefused(f"{event}: not allowed in the sandbox")
sys.addaudithook(hook)
del hook
sys.argv = [sys.argv[2]]
code = open(sys.argv[0]).read()
exec(compile(code, "tool.py", "exec"), {"__name__": "__main__"})
'''


@dataclass
class SandboxResult:
    outcome: str          # ok | error | refused | cpu_limit | memory_limit | output_limit | timeout
    stdout: str
    stderr: str
    exit_code: int | None
    isolated_network: bool

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@lru_cache(maxsize=1)
def network_isolation() -> list[str]:
    """The command prefix that gives the child a network namespace of its own, or [] where the
    machine does not allow one (the audit hook still refuses sockets)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    try:
        probe = subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [unshare, "-rn"] if probe.returncode == 0 else []


def _limits(cpu_seconds: int, memory_mb: int, output_bytes: int):
    def apply() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes, output_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_python(code: str, *, cpu_seconds: int = 2, memory_mb: int = 512, output_bytes: int = 16_384,
               wall_seconds: float = 10.0) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox (see the module's docstring) and say what happened."""
    folder = Path(tempfile.mkdtemp(prefix="smolforge-tool-"))
    os.chmod(folder, 0o700)
    work, logs = folder / "work", folder / "logs"
    work.mkdir()
    logs.mkdir()
    (work / "tool.py").write_text(code)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "TMPDIR": str(work)}
    prefix = network_isolation()
    command = [*prefix, sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(work), str(work / "tool.py")]
    try:
        with open(logs / "stdout", "wb") as out, open(logs / "stderr", "wb") as err:
            child = subprocess.Popen(command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     preexec_fn=_limits(cpu_seconds, memory_mb, output_bytes))
            try:
                code_ = child.wait(timeout=wall_seconds)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
                code_ = None
            finally:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.wait()
        stdout = (logs / "stdout").read_bytes()[:output_bytes].decode("utf-8", errors="replace")
        stderr = (logs / "stderr").read_bytes()[:output_bytes].decode("utf-8", errors="replace")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return SandboxResult(_outcome(code_, timed_out, stderr), stdout, stderr, code_, bool(prefix))


def _outcome(code: int | None, timed_out: bool, stderr: str) -> str:
    if timed_out:
        return "timeout"
    if code == 0:
        return "ok"
    if code == -signal.SIGXCPU or code == -signal.SIGKILL and not stderr:
        return "cpu_limit"
    if code == -signal.SIGXFSZ:
        return "output_limit"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if REFUSED in last:
        return "refused"
    if last.startswith("MemoryError"):
        return "memory_limit"
    if "[Errno 27]" in last:             # EFBIG: Python ignores SIGXFSZ, so the write past RLIMIT_FSIZE fails
        return "output_limit"
    return "error"
