"""A real PostgreSQL for tests: a private cluster (Debian's postgresql package) on 127.0.0.1.

    with postgres_cluster() as pg:
        pg.create_database("argilla")
        url = pg.url("argilla")          # postgresql://smolforge@127.0.0.1:PORT/argilla (trust auth)

``initdb`` into ``<a fresh temp folder>/data`` with trust authentication for the one role ``smolforge``, a free
port, the socket in ``root``, listening on 127.0.0.1 only, fsync off (a throwaway cluster). As root
(PostgreSQL refuses to run as root) the server runs as the ``postgres`` user through ``setpriv``,
which execs it, so the PID we hold is the postmaster's. Stopped by PID when the block ends: SIGINT
(fast shutdown), SIGKILL after a grace period.
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from smolforge.processes import free_port, log_tail

ROLE = "smolforge"


def postgres_bin() -> Path | None:
    """Debian's versioned bin folder (the newest), or None when PostgreSQL is not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    return Path(found[-1]).parent if found else None


def postgres_available() -> str | None:
    if postgres_bin() is None:
        return "PostgreSQL is not installed (make setup installs Debian's postgresql)"
    if os.geteuid() == 0 and (shutil.which("setpriv") is None or not _has_user("postgres")):
        return "running as root needs setpriv and the postgres user (Debian's postgresql package)"
    return None


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@dataclass
class PostgresCluster:
    root: Path
    port: int
    bindir: Path
    process: subprocess.Popen | None = field(default=None, repr=False)

    def url(self, database: str) -> str:
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{database}"

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        """A client tool (psql, createdb, pg_dump …) against this cluster, as ``smolforge`` over TCP."""
        return subprocess.run([str(self.bindir / tool), "-h", "127.0.0.1", "-p", str(self.port), "-U", ROLE, *args],
                              capture_output=True, text=True, check=True)

    def create_database(self, name: str) -> str:
        self.run("createdb", name)
        return self.url(name)

    def kill(self) -> None:
        """SIGKILL the postmaster (a fault test); its backends exit when they notice."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def start(self) -> None:
        (self.root / "postgres.pid").unlink(missing_ok=True)
        cmd = [str(self.bindir / "postgres"), "-D", str(self.root / "data"), "-p", str(self.port),
               "-k", str(self.root), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
               "-c", "max_connections=200", "-c", "shared_buffers=32MB"]
        with open(self.root / "postgres.log", "ab") as log:
            self.process = subprocess.Popen(_as_postgres() + cmd, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + 60
        while subprocess.run([str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"]).returncode:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start; end of {self.root / 'postgres.log'}:\n"
                                   f"{log_tail(self.root / 'postgres.log', 20)}")
            time.sleep(0.1)

    def stop(self, grace: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)          # fast shutdown: disconnect clients, checkpoint
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A started cluster in a fresh folder under the temp dir (pytest's is root-only), removed at the end."""
    bindir = postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="smolforge-pg-"))
    try:
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(root, user.pw_uid, user.pw_gid)
        with _started(root, bindir) as cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _started(root: Path, bindir: Path) -> Iterator[PostgresCluster]:
    subprocess.run(_as_postgres() + [str(bindir / "initdb"), "-D", str(root / "data"), "-U", ROLE, "-A", "trust",
                                     "--no-sync", "-E", "UTF8", "--no-locale"],
                   capture_output=True, text=True, check=True)
    cluster = PostgresCluster(root=root, port=free_port(), bindir=bindir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
