"""``smolforge annotate backup FILE`` and ``restore FILE``: the annotation database, copied consistently
while annotators submit.

    smolforge annotate backup reviews-2026-12-02.db               # the embedded server's SQLite
    ARGILLA_DATABASE_URL=postgresql://argilla@db:5432/argilla smolforge annotate backup team.dump
    smolforge annotate restore reviews-2026-12-02.db --home runs/.argilla-restored

SQLite (the embedded default, ``<home>/argilla.db``): SQLite's online backup API copies every page
under one read transaction, so the copy is a snapshot of one moment even while the server writes.
PostgreSQL (``ARGILLA_DATABASE_URL`` or ``--database``): ``pg_dump -Fc`` (one transaction, one
snapshot) and ``pg_restore --clean --if-exists --no-owner``; a password in the URL reaches them as
``PGPASSWORD``, never on a command line. Backups are written to a temporary file and renamed, so
a failed backup leaves no partial file. A restore goes into a home whose server is not running; a
SQLite restore replaces ``argilla.db`` atomically. The owner's credentials are not part of the
database copy: the next ``annotate serve`` applies the home's (``owner_credentials``).

    >>> backup_kind(Path(__file__))      # neither SQLite nor pg_dump's custom format
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: ...backup.py: not an annotation backup (expected an SQLite database or a pg_dump custom-format file)
"""
from __future__ import annotations

import glob
import os
import shutil
import sqlite3
import subprocess
import tempfile
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from smolforge.errors import RecipeError, ServiceError

from .server import libpq_url, masked_url, running_url

__all__ = ["DB_FILE", "backup", "restore", "backup_kind"]

DB_FILE = "argilla.db"     # argilla-server's SQLite file in its home folder
SQLITE_MAGIC, PGDUMP_MAGIC = b"SQLite format 3\x00", b"PGDMP"


def backup_kind(path: Path) -> str:
    """``sqlite`` or ``postgresql``, from the file's first bytes; a RecipeError for anything else."""
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(PGDUMP_MAGIC):
        return "postgresql"
    raise RecipeError(f"{path}: not an annotation backup (expected an SQLite database or a pg_dump custom-format file)")


def backup(home: Path, target: Path, *, database_url: str | None = None) -> dict:
    """Copy the annotation database of ``home`` (or ``database_url``) to ``target``; a summary dict."""
    target = Path(target)
    if target.exists():
        raise RecipeError(f"{target} exists; choose a new file (a backup never overwrites one)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        if database_url:
            _pg("pg_dump", database_url, ["-Fc", "--no-owner", "-f", partial])
            kind = "postgresql"
        else:
            _sqlite_copy(Path(home) / DB_FILE, Path(partial))
            kind = "sqlite"
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return {"backup": str(target), "database": kind, "bytes": target.stat().st_size}


def restore(source: Path, home: Path, *, database_url: str | None = None) -> dict:
    """Restore ``source`` into ``home`` (SQLite) or ``database_url`` (PostgreSQL); a summary dict."""
    source, home = Path(source), Path(home)
    if not source.is_file():
        raise RecipeError(f"{source}: no such backup file")
    kind = backup_kind(source)
    if running_url(home) is not None:
        raise RecipeError(f"an Argilla server is running for {home}; stop it before restoring into it")
    if kind == "postgresql":
        if not database_url:
            raise RecipeError(f"{source} is a PostgreSQL dump: set ARGILLA_DATABASE_URL (or --database) to the "
                              "database to restore into")
        _pg("pg_restore", database_url, ["--clean", "--if-exists", "--no-owner", "--exit-on-error", str(source)])
        return {"restored": str(source), "database": "postgresql", "into": masked_url(database_url)}
    if database_url:
        raise RecipeError(f"{source} is an SQLite backup, but a PostgreSQL database was given; unset "
                          "ARGILLA_DATABASE_URL to restore into the home folder")
    home.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=home, prefix=f".{DB_FILE}.")
    os.close(fd)
    try:
        _sqlite_copy(source, Path(partial))
        os.replace(partial, home / DB_FILE)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return {"restored": str(source), "database": "sqlite", "into": str(home / DB_FILE)}


def _sqlite_copy(source: Path, target: Path) -> None:
    if not source.is_file():
        raise RecipeError(f"{source}: no annotation database here (has `smolforge annotate serve` run for this home?)")
    with closing(sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True, timeout=30)) as src, \
            closing(sqlite3.connect(target)) as dst:
        src.backup(dst)            # one read transaction: the pages of one moment, while the server writes
    with closing(sqlite3.connect(target)) as check:
        verdict = check.execute("PRAGMA integrity_check").fetchone()[0]
    if verdict != "ok":
        raise ServiceError(f"the copy of {source} failed SQLite's integrity check: {verdict}")


def _pg_tool(name: str) -> str:
    """The newest installed ``name`` (pg_dump must not be older than the server)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(Path(p).parts[4]))
    tool = found[-1] if found else shutil.which(name)
    if tool is None:
        raise ServiceError(f"{name} is not installed; run `make setup` (apt-get install postgresql-client)")
    return tool


def _pg(tool: str, database_url: str, args: list[str]) -> None:
    parts = urlsplit(libpq_url(database_url))
    env = dict(os.environ)
    if parts.password:
        env["PGPASSWORD"] = parts.password
        netloc = parts.netloc.rsplit("@", 1)
        parts = parts._replace(netloc=f"{parts.username}@{netloc[1]}")
    done = subprocess.run([_pg_tool(tool), "-d", urlunsplit(parts), *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise ServiceError(f"{tool} of {masked_url(database_url)} failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-1500:]}")
