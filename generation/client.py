"""One HTTP client for OpenAI-compatible servers (vLLM, TGI, a hosted API): JSON in, JSON out.

    >>> client = Client("http://127.0.0.1:9/v1", retries=0)
    >>> client
    Client('http://127.0.0.1:9/v1')
    >>> client.url("/completions")
    'http://127.0.0.1:9/v1/completions'
    >>> client.get("/models")
    Traceback (most recent call last):
    ...
    smolforge.errors.ServiceError: GET http://127.0.0.1:9/v1/models: cannot connect (Connection refused)

Every request has a timeout. A refused or dropped connection, HTTP 429 and HTTP 5xx are retried
``retries`` times with exponential backoff (``backoff`` × 2^attempt seconds, honouring a
``Retry-After`` header up to 30 s); anything else fails at once. Failures are ServiceErrors that
name the method and URL and what went wrong, never the request body (prompts stay out of logs)
and never the API key. The key is read from the environment variable named by ``api_key_env``
at each request, sent as a Bearer token, and not kept.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from smolforge.errors import RecipeError, ServiceError

__all__ = ["Client", "RETRY_STATUS"]

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class Client:
    """Requests to ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``, or a server root for its own routes)."""

    def __init__(self, base_url: str, *, api_key_env: str | None = None, timeout: float = 600.0,
                 retries: int = 3, backoff: float = 0.5) -> None:
        if api_key_env and not os.environ.get(api_key_env):
            raise RecipeError(f"api_key_env: environment variable {api_key_env} is not set")
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def url(self, path: str) -> str:
        return self.base_url + "/" + path.lstrip("/") if path else self.base_url

    # -- the OpenAI routes
    def completions(self, payload: dict, *, timeout: float | None = None) -> dict:
        """``POST /completions`` with ``payload`` (``model``, ``prompt`` as text or token ids, sampling)."""
        return self._checked(self.post("/completions", payload, timeout=timeout), "/completions")

    def chat(self, payload: dict, *, timeout: float | None = None) -> dict:
        """``POST /chat/completions`` with ``payload`` (``model``, ``messages``, sampling)."""
        return self._checked(self.post("/chat/completions", payload, timeout=timeout), "/chat/completions")

    def _checked(self, reply: Any, path: str) -> dict:
        if not isinstance(reply, dict) or not isinstance(reply.get("choices"), list):
            raise ServiceError(f"POST {self.url(path)}: the reply has no 'choices' list: {str(reply)[:200]}")
        return reply

    # -- plain JSON requests
    def get(self, path: str = "", *, timeout: float | None = None) -> Any:
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str = "", payload: Any = None, *, timeout: float | None = None) -> Any:
        return self.request("POST", path, {} if payload is None else payload, timeout=timeout)

    def request(self, method: str, path: str, payload: Any = None, *, timeout: float | None = None,
                retry_status: Sequence[int] = RETRY_STATUS) -> Any:
        """The decoded JSON reply (None for an empty body), after up to ``retries`` retries."""
        url = self.url(path)
        what = f"{method} {url}"
        data = None if payload is None else json.dumps(payload).encode()
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(url, data=data, method=method, headers=self._headers())
            wait = self.backoff * 2 ** attempt
            try:
                with urllib.request.urlopen(request, timeout=timeout or self.timeout) as reply:  # noqa: S310
                    body = reply.read()
                break
            except urllib.error.HTTPError as err:
                detail = err.read().decode("utf-8", errors="replace")[:300]
                if err.code not in retry_status or attempt == self.retries:
                    hint = f" (check ${self.api_key_env})" if err.code in (401, 403) and self.api_key_env else ""
                    raise ServiceError(f"{what}: HTTP {err.code} {err.reason}{hint}: {detail}") from None
                wait = _retry_after(err.headers.get("Retry-After"), wait)
                problem = f"HTTP {err.code}"
            except (TimeoutError, socket.timeout):
                raise ServiceError(f"{what}: no answer within {timeout or self.timeout:.0f} s") from None
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as err:
                reason = getattr(err, "reason", err)
                if attempt == self.retries:
                    raise ServiceError(f"{what}: cannot connect ({_reason_text(reason)})") from None
                problem = _reason_text(reason)
            log.info("%s: %s; retry %d of %d in %.1f s", what, problem, attempt + 1, self.retries, wait)
            time.sleep(wait)
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            raise ServiceError(f"{what}: the reply is not JSON: {body[:200]!r}") from None

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers


def _reason_text(reason: Any) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


def _retry_after(header: str | None, default: float) -> float:
    """Seconds from a ``Retry-After`` header (capped at 30), else ``default``.

    >>> _retry_after("2", 0.5), _retry_after(None, 0.5), _retry_after("soon", 0.5), _retry_after("600", 1)
    (2.0, 0.5, 0.5, 30.0)
    """
    try:
        return min(max(float(header), 0.0), 30.0) if header is not None else default
    except ValueError:
        return default
