"""An embedded Argilla 2.8 server: private Redis, SQLite under a home folder, 127.0.0.1 only.

    with ArgillaServer(Path("runs/.argilla")) as server:      # migrate, owner, redis, server, worker
        client = rg.Argilla(api_url=server.url, api_key=server.api_key)

    client = connect(server.url, server.api_key)               # ServiceError: unreachable / bad key
    serve(Path("runs/.argilla"), port=6900)                    # `smolforge annotate serve`: until SIGTERM

argilla-server runs from its own venv (``.argilla-venv/``, ``make setup``; or ``SMOLFORGE_ARGILLA_VENV``)
through ``annotate/argilla_launch.py``. Annotations live in ``<home>/argilla.db`` (SQLite), so Redis
runs without persistence; only the background job queue lives there. Search is the database-backed
``smolforge-sql`` engine unless ``ARGILLA_ELASTICSEARCH`` is set, in which case the user's
Elasticsearch (or OpenSearch, with ``ARGILLA_SEARCH_ENGINE=opensearch``) is used.
The owner ``argilla`` gets the API key ``ARGILLA_API_KEY`` (the demo default ``argilla.apikey``
otherwise) and the password ``ARGILLA_PASSWORD`` (default ``12345678``); neither is ever logged.
Logs: ``<home>/logs/{redis,server,worker}.log``; ``<home>/server.json`` names the URL while it
runs, so ``smolforge annotate push|pull`` find a server that ``smolforge annotate serve`` started. Failures are ServiceError with the log's end.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from smolforge.errors import ServiceError
from smolforge.processes import free_port, http_ok, log_tail, run_until_signal, stop_group, wait_until_ready
from smolforge.runs import write_json_atomic

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = Path(__file__).resolve().with_name("argilla_launch.py")
DEMO_API_KEY = "argilla.apikey"
DEMO_PASSWORD = "12345678"
SERVER_FILE = "server.json"  # {"url", "pid", "server_pid"} while a server runs for the home folder


def argilla_python() -> Path:
    """The argilla-server venv's python; a ServiceError that says how to get it when missing."""
    venv = Path(os.environ.get("SMOLFORGE_ARGILLA_VENV", REPO / ".argilla-venv"))
    python = venv / "bin" / "python"
    if not python.exists():
        raise ServiceError(f"argilla-server is not installed: {venv} is missing; run `make setup` "
                           "(it creates the venv with argilla-server==2.8.0)")
    return python


class ArgillaServer:
    """Redis + argilla-server + rq worker for one home folder (a context manager)."""

    def __init__(self, home: Path, port: int | None = None, redis_port: int | None = None,
                 ready_timeout: float = 120.0) -> None:
        self.home = Path(home).resolve()
        self.port = port or free_port()
        self.redis_port = redis_port or free_port()
        self.ready_timeout = ready_timeout
        self.api_key = os.environ.get("ARGILLA_API_KEY") or DEMO_API_KEY
        self.password = os.environ.get("ARGILLA_PASSWORD") or DEMO_PASSWORD
        self.logs = self.home / "logs"
        self.tmp = self.home / "tmp"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("ARGILLA_API_KEY", "ARGILLA_PASSWORD")}
        env.update(ARGILLA_HOME_PATH=str(self.home), ARGILLA_REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
                   TMPDIR=str(self.tmp), ARGILLA_ENABLE_TELEMETRY="0", HF_HUB_DISABLE_TELEMETRY="1",
                   PYTHONUNBUFFERED="1")
        if os.environ.get("ARGILLA_ELASTICSEARCH"):
            env["ARGILLA_SEARCH_ENGINE"] = os.environ.get("ARGILLA_SEARCH_ENGINE", "elasticsearch")
        else:
            env["ARGILLA_SEARCH_ENGINE"] = "smolforge-sql"
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env or self.env(),
                                    cwd=self.home, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start(self) -> "ArgillaServer":
        """Start everything and wait for ``GET /api/v1/status``; a ServiceError (with logs) otherwise."""
        python = argilla_python()
        redis = shutil.which("redis-server")
        if redis is None:
            raise ServiceError("redis-server is not installed; run `make setup` "
                               "(apt-get install redis-server)")
        other = running_url(self.home)
        if other is not None:
            raise ServiceError(f"an Argilla server for {self.home} is already running at {other}; use it "
                               "(push/pull find it) or stop it first")
        self.logs.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        try:
            self._spawn("redis", [redis, "--bind", "127.0.0.1", "--port", str(self.redis_port), "--save", "",
                                  "--appendonly", "no", "--dir", str(self.tmp)])
            env = self.env()  # the server migrates the database and creates the owner before serving
            env.update(SMOLFORGE_ARGILLA_OWNER_KEY=self.api_key, SMOLFORGE_ARGILLA_OWNER_PASSWORD=self.password)
            self._spawn("server", [str(python), str(LAUNCHER), "server", "--port", str(self.port)], env)
            self._spawn("worker", [str(python), str(LAUNCHER), "worker"])
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - started
        write_json_atomic(self.home / SERVER_FILE, {"url": self.url, "pid": os.getpid(),
                                                    "server_pid": self.procs["server"].pid})
        return self

    def _wait_ready(self, started: float) -> None:
        watched = {f"Argilla's {name} process": (self.procs[name], self.logs / f"{name}.log")
                   for name in ("server", "redis", "worker")}
        wait_until_ready(f"{self.url}/api/v1/status", watched, what="Argilla server", started=started,
                         timeout=self.ready_timeout, poll=0.3)

    def healthy(self) -> bool:
        return http_ok(f"{self.url}/api/v1/status")

    def check_alive(self) -> None:
        """A ServiceError (with its log's end) when one of the processes has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ServiceError(f"Argilla's {name} process exited with code {proc.returncode}; end of "
                                   f"{self.logs / (name + '.log')}:\n{log_tail(self.logs / (name + '.log'), 25)}")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM worker, server, then redis by PID (process group); SIGKILL after ``grace`` s."""
        owned = bool(self.procs)
        for name in ("worker", "server", "redis"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_group(proc, grace)
        shutil.rmtree(self.tmp, ignore_errors=True)
        if owned:
            (self.home / SERVER_FILE).unlink(missing_ok=True)

    def __enter__(self) -> "ArgillaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def running_url(home: Path) -> str | None:
    """The URL of a server already running for ``home`` (``smolforge annotate serve``), or None.

    >>> import tempfile
    >>> running_url(Path(tempfile.mkdtemp())) is None
    True
    """
    path = Path(home) / SERVER_FILE
    try:
        url = json.loads(path.read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return url if http_ok(f"{url}/api/v1/status") else None


def serve(home: Path, port: int | None = None) -> int:
    """Run the embedded server until SIGINT/SIGTERM; prints one line when ready. Exit code 0."""
    server = ArgillaServer(home, port=port)

    def start() -> None:
        print(f"starting Argilla in {server.home} (logs: {server.logs}) …", file=sys.stderr, flush=True)
        server.start()
        print(f"Argilla at {server.url} (owner 'argilla'; ready in {server.ready_s:.1f} s); Ctrl-C stops it",
              flush=True)

    try:
        return run_until_signal(server.check_alive, start)
    finally:
        server.stop()


def connect(url: str, api_key: str):
    """An ``argilla.Argilla`` client for ``url``; a ServiceError when the server is not reachable or
    rejects the key (the key itself is never part of the message)."""
    import argilla as rg
    from argilla._exceptions import ArgillaCredentialsError
    from httpx import HTTPError

    from smolforge.processes import http_ok

    if not http_ok(f"{url.rstrip('/')}/api/v1/status", timeout=5):  # the SDK would retry with backoff first
        raise ServiceError(f"Argilla is not reachable at {url} (no answer on /api/v1/status); start it with "
                           "`smolforge annotate serve` or check the URL")
    try:
        return rg.Argilla(api_url=url, api_key=api_key)
    except ArgillaCredentialsError:
        raise ServiceError(f"Argilla at {url} rejected the API key (HTTP 401); set ARGILLA_API_KEY to the "
                           "owner's or an annotator's key") from None
    except HTTPError as err:  # raised by the SDK's HTTP client
        raise ServiceError(f"Argilla is not reachable at {url} ({err}); start it with `smolforge annotate serve` "
                           "or check the URL") from None
