"""Who may reach a server smolforge starts: bind addresses, API keys and passwords.

A server bound to loopback is reachable from this machine only, so the demo credentials are fine
there. Anything else is a network service and needs a real secret: one given by the user (an
environment variable or a file) or one generated here and kept in a 0600 file. Secrets are never
printed by these helpers and never put on a command line (where ``ps`` shows them).

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, True, False)
    >>> local_address("0.0.0.0"), local_address("127.0.0.1"), local_address("10.1.2.3")
    ('127.0.0.1', '127.0.0.1', '10.1.2.3')
    >>> len(generate_secret()) >= 32
    True
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import tempfile
from pathlib import Path

from .errors import RecipeError

__all__ = ["MIN_SECRET_LENGTH", "is_loopback", "local_address", "generate_secret", "read_secret",
           "write_secret_file"]

MIN_SECRET_LENGTH = 16   # shorter keys are guessable; refused for a server open to the network


def is_loopback(host: str) -> bool:
    """True when ``host`` is a loopback address (or ``localhost``): reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False           # a host name: it may resolve to anything


def local_address(host: str) -> str:
    """The address that reaches a server bound to ``host`` from this machine (loopback for a wildcard)."""
    bare = host.strip("[]")
    if bare in ("0.0.0.0", "") or is_loopback(bare):
        return "127.0.0.1"
    if bare == "::":
        return "::1"
    return bare


def generate_secret(nbytes: int = 24) -> str:
    """A random URL-safe secret (``nbytes`` of entropy)."""
    return secrets.token_urlsafe(nbytes)


def read_secret(what: str, *, env: str | None = None, file: str | Path | None = None,
                min_length: int = 0) -> str | None:
    """The secret from ``file`` (first line) or the environment variable ``env``; None when neither is
    given. A RecipeError names the source (never the value) when it is unreadable, empty or too short.

    >>> import os
    >>> os.environ["DOCTEST_KEY"] = "short"
    >>> read_secret("API key", env="DOCTEST_KEY", min_length=16)
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: API key from $DOCTEST_KEY is 5 characters; use at least 16 (e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')
    """
    if file is not None:
        path = Path(file)
        try:
            lines = path.read_text().splitlines()
        except OSError as err:
            raise RecipeError(f"{path}: cannot read the {what} ({err.strerror})") from None
        value, source = (lines[0].strip() if lines else ""), str(path)
    elif env and os.environ.get(env) is not None:
        value, source = os.environ[env].strip(), f"${env}"
    else:
        return None
    if not value:
        raise RecipeError(f"{what} from {source} is empty")
    if len(value) < min_length:
        raise RecipeError(f"{what} from {source} is {len(value)} characters; use at least {min_length} "
                          "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    return value


def write_secret_file(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically with mode 0600 (created that way, never readable by others)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")   # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
