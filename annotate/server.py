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
The owner ``argilla`` gets the API key ``ARGILLA_API_KEY`` and the password ``ARGILLA_PASSWORD``;
neither is ever logged. Without them: on loopback (the default bind) the demo pair ``argilla.apikey`` /
``12345678``; on any other address (``host="0.0.0.0"``, a team's server) the demo pair is refused and a
strong pair is generated on the first start, kept in ``<home>/owner.json`` (mode 0600) and used from then
on (``owner_credentials``). The server applies the pair to the owner at every start, so a demo key
from an earlier loopback start stops working.
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

from smolforge.access import generate_secret, is_loopback, local_address, write_secret_file
from smolforge.errors import RecipeError, ServiceError
from smolforge.processes import free_port, http_ok, log_tail, run_until_signal, stop_group, wait_until_ready
from smolforge.runs import write_json_atomic

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = Path(__file__).resolve().with_name("argilla_launch.py")
DEMO_API_KEY = "argilla.apikey"
DEMO_PASSWORD = "12345678"
SERVER_FILE = "server.json"  # {"url", "pid", "server_pid"} while a server runs for the home folder
OWNER_FILE = "owner.json"    # generated owner credentials (mode 0600): {"username", "api_key", "password"}
OWNER = "argilla"


def owner_credentials(home: Path, host: str = "127.0.0.1", *, generate: bool = False) -> tuple[str, str, bool]:
    """``(api_key, password, generated_now)`` for the owner of the server in ``home`` bound to ``host``.

    The environment wins; then ``<home>/owner.json``; then the demo pair on loopback, or (with
    ``generate``) a new strong pair written to ``owner.json`` for any other address. A demo or short
    key/password for a non-loopback bind is a RecipeError.

    >>> import tempfile
    >>> home = Path(tempfile.mkdtemp())
    >>> owner_credentials(home)[:2]
    ('argilla.apikey', '12345678')
    >>> key, password, new = owner_credentials(home, "0.0.0.0", generate=True)
    >>> new, len(key) >= 32, oct((home / OWNER_FILE).stat().st_mode & 0o777)
    (True, True, '0o600')
    >>> owner_credentials(home) == (key, password, False)      # used from then on, loopback too
    True
    """
    home = Path(home)
    key, password = os.environ.get("ARGILLA_API_KEY"), os.environ.get("ARGILLA_PASSWORD")
    stored = _stored_owner(home)
    generated = False
    if not key or not password:
        if stored is not None:
            key, password = key or stored["api_key"], password or stored["password"]
        elif not is_loopback(host) and generate:
            key, password, generated = key or generate_secret(24), password or generate_secret(12), True
            write_secret_file(home / OWNER_FILE, json.dumps({"username": OWNER, "api_key": key,
                                                              "password": password}))
        else:
            key, password = key or DEMO_API_KEY, password or DEMO_PASSWORD
    if not is_loopback(host) and (key == DEMO_API_KEY or password == DEMO_PASSWORD or len(key) < 16
                                  or len(password) < 12):
        check_owner_environment(host)
        raise RecipeError(f"annotate serve --host {host}: the owner's credentials are the demo pair or too short; "
                          f"remove {home / OWNER_FILE} to have strong ones generated")
    return key, password, generated


def database_url_for(url: str | None) -> str | None:
    """``url`` as argilla-server wants it (``postgresql+asyncpg://`` for PostgreSQL); None: SQLite in the home.

    >>> database_url_for("postgresql://team@db.lan:5432/argilla"), database_url_for(None)
    ('postgresql+asyncpg://team@db.lan:5432/argilla', None)
    >>> database_url_for("mysql://x/y")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: database mysql://x/y: expected postgresql://USER[:PASSWORD]@HOST:PORT/DB (or none: SQLite in the home folder)
    """
    if not url:
        return None
    scheme, _, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres", "postgresql+asyncpg", "postgresql+psycopg2") or not rest:
        raise RecipeError(f"database {masked_url(url)}: expected postgresql://USER[:PASSWORD]@HOST:PORT/DB (or none: "
                          "SQLite in the home folder)")
    return f"postgresql+asyncpg://{rest}"


def libpq_url(url: str) -> str:
    """The same database as a libpq URL (``postgresql://``), for pg_dump and pg_restore."""
    return "postgresql://" + url.partition("://")[2]


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs).

    >>> masked_url("postgresql://team:s3cret@db:5432/argilla")
    'postgresql://team:***@db:5432/argilla'
    """
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{location}"


def check_owner_environment(host: str) -> None:
    """For a non-loopback ``host``: ARGILLA_API_KEY/ARGILLA_PASSWORD, where set, are neither the demo
    pair nor short (a RecipeError otherwise)."""
    key, password = os.environ.get("ARGILLA_API_KEY"), os.environ.get("ARGILLA_PASSWORD")
    if is_loopback(host):
        return
    if key == DEMO_API_KEY or password == DEMO_PASSWORD:
        raise RecipeError(f"annotate serve --host {host}: the demo credentials (API key {DEMO_API_KEY!r} / "
                          f"password {DEMO_PASSWORD!r}) are refused on a network address; unset "
                          "ARGILLA_API_KEY/ARGILLA_PASSWORD to have strong ones generated")
    if (key is not None and len(key) < 16) or (password is not None and len(password) < 12):
        raise RecipeError(f"annotate serve --host {host}: ARGILLA_API_KEY needs at least 16 characters and "
                          "ARGILLA_PASSWORD at least 12 on a network address")


def _stored_owner(home: Path) -> dict | None:
    path = home / OWNER_FILE
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text())
        return {"api_key": str(stored["api_key"]), "password": str(stored["password"])}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ServiceError(f"{path}: unreadable owner credentials ({err}); restore it or remove it to have new "
                           "ones generated") from None


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
                 ready_timeout: float = 120.0, host: str = "127.0.0.1", database_url: str | None = None) -> None:
        self.home = Path(home).resolve()
        self.host = host
        self.database_url = database_url_for(database_url or os.environ.get("ARGILLA_DATABASE_URL"))
        self.port = port or free_port(host)
        self.redis_port = redis_port or free_port()
        self.ready_timeout = ready_timeout
        check_owner_environment(host)            # demo or weak credentials on a network address: refused now
        self.api_key, self.password = (owner_credentials(self.home, host)[:2] if is_loopback(host) or
                                       (self.home / OWNER_FILE).exists() else (None, None))   # else made at start
        self.credentials_generated = False
        self.logs = self.home / "logs"
        self.tmp = self.home / "tmp"
        self.procs: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, tuple[list[str], dict | None]] = {}    # name → (command, environment)
        self.restarts: list[float] = []                                  # monotonic times of restarts
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        """Where this machine reaches the server (loopback when it binds a wildcard address)."""
        return f"http://{local_address(self.host)}:{self.port}"

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("ARGILLA_API_KEY", "ARGILLA_PASSWORD")}
        env.update(ARGILLA_HOME_PATH=str(self.home), ARGILLA_REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
                   TMPDIR=str(self.tmp), ARGILLA_ENABLE_TELEMETRY="0", HF_HUB_DISABLE_TELEMETRY="1",
                   PYTHONUNBUFFERED="1")
        if self.database_url:
            env["ARGILLA_DATABASE_URL"] = self.database_url
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
        self.api_key, self.password, self.credentials_generated = owner_credentials(self.home, self.host,
                                                                                    generate=True)
        started = time.perf_counter()
        server_env = self.env()  # the server migrates the database and creates the owner before serving
        server_env.update(SMOLFORGE_ARGILLA_OWNER_KEY=self.api_key, SMOLFORGE_ARGILLA_OWNER_PASSWORD=self.password)
        if not is_loopback(self.host):
            server_env["SMOLFORGE_ARGILLA_NETWORK"] = "1"    # the launcher refuses any user left on demo credentials
        self.commands = {
            "redis": ([redis, "--bind", "127.0.0.1", "--port", str(self.redis_port), "--save", "", "--appendonly",
                       "no", "--dir", str(self.tmp)], None),
            "server": ([str(python), str(LAUNCHER), "server", "--host", self.host, "--port", str(self.port)],
                       server_env),
            "worker": ([str(python), str(LAUNCHER), "worker"], None)}
        try:
            for name, (cmd, env) in self.commands.items():
                self._spawn(name, cmd, env)
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - started
        self._write_server_file()
        return self

    def _write_server_file(self) -> None:
        write_json_atomic(self.home / SERVER_FILE, {"url": self.url, "pid": os.getpid(),
                                                    "server_pid": self.procs["server"].pid})

    def restart_exited(self, limit: int = 5, window_s: float = 600.0) -> dict[str, int]:
        """Start again each process (Redis, server, worker) that has exited, as a supervisor does;
        ``{name: its exit code}`` of those restarted. Annotations are in the database and Redis holds only the job queue, so a
        restart loses nothing acknowledged. More than ``limit`` restarts in ``window_s`` seconds (a
        crash loop) is a ServiceError with the log's end, as is a server that does not come back.
        """
        exited = {name: self.procs[name].returncode for name in self.commands
                  if name in self.procs and self.procs[name].poll() is not None}
        if not exited:
            return {}
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < window_s] + [now] * len(exited)
        if len(self.restarts) > limit:
            self.check_alive()               # raises with the exited process's log
        for name in exited:
            cmd, env = self.commands[name]
            self._spawn(name, cmd, env)
        if "server" in exited:
            self._wait_ready(time.perf_counter())
            self._write_server_file()
        return exited

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


def owner_api_key(home: Path) -> str:
    """The owner's API key for clients of the server in ``home``: ``ARGILLA_API_KEY``, the generated one, or the demo key."""
    return owner_credentials(home)[0]


def serve(home: Path, port: int | None = None, host: str = "127.0.0.1", database_url: str | None = None) -> int:
    """Run the embedded server until SIGINT/SIGTERM; prints one line when ready. Exit code 0.

    A process that dies (Redis, the server, the worker) is started again and a line says so; more
    than 5 restarts in 10 minutes stops everything with the log's end (a ServiceError).

    On a non-loopback ``host`` the first start prints the generated owner credentials once (to the
    terminal, not to any log); they stay in ``<home>/owner.json``.
    """
    server = ArgillaServer(home, port=port, host=host, database_url=database_url)

    def supervise() -> None:
        for name, code in server.restart_exited().items():
            print(f"Argilla's {name} process exited (code {code}); started it again "
                  f"(log: {server.logs / (name + '.log')})", file=sys.stderr, flush=True)

    def start() -> None:
        print(f"starting Argilla in {server.home} (logs: {server.logs}) …", file=sys.stderr, flush=True)
        server.start()
        if server.credentials_generated:
            print(f"generated the owner's credentials (shown only now; kept in {server.home / OWNER_FILE}, mode "
                  f"0600): username {OWNER}, password {server.password}, API key {server.api_key}", flush=True)
        print(f"Argilla at http://{host}:{server.port} (owner '{OWNER}'; ready in {server.ready_s:.1f} s); "
              "Ctrl-C stops it", flush=True)

    try:
        return run_until_signal(supervise, start)
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
