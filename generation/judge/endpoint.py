"""The judge model behind an OpenAI-compatible endpoint, asked many chats at once: cached, rate-limited,
``workers`` requests in flight, each distinct chat once, with a progress bar.

``/v1/chat/completions`` through smolforge's one HTTP client (:class:`~smolforge.generation.client.Client`:
timeouts, retries with backoff on refused connections, 429 and 5xx; the API key read from the environment
variable ``api_key_env`` names, never kept or logged), temperature 0, and the first token's top log-probs
where the server gives them (vLLM and OpenAI do), from which a pairwise judge's confidence is read. A
server that stays down fails the whole call with a ServiceError naming the URL: no request is
silently skipped and no verdict invented.

    >>> judge = JudgeEndpoint("http://127.0.0.1:9/v1", "tiny-judge", retries=0)
    >>> judge.identity
    'http://127.0.0.1:9/v1#tiny-judge'
    >>> judge.ask([[{"role": "user", "content": "A or B?"}]], max_tokens=1)
    Traceback (most recent call last):
    ...
    smolforge.errors.ServiceError: POST http://127.0.0.1:9/v1/chat/completions (judge tiny-judge, chat 1 of 1): cannot connect (Connection refused)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError, ServiceError
from smolforge.generation.client import Client

from .cache import JudgeCache, request_key
from .limiter import RateLimiter

__all__ = ["JudgeEndpoint", "TOP_LOGPROBS", "cache_for", "served_run"]

TOP_LOGPROBS = 10


class JudgeEndpoint:
    """``model`` served at ``base_url`` (``http://host:port/v1``) as a judge."""

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None, workers: int = 4,
                 rate: float = 0.0, timeout: float = 120.0, retries: int = 3, cache: JudgeCache | None = None,
                 progress: bool = False, identity: str | None = None) -> None:
        base = base_url.rstrip("/").removesuffix("/chat/completions")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = model
        self.client = Client(self.base_url, api_key_env=api_key_env, timeout=timeout, retries=retries)
        self.workers = max(1, workers)
        self.limiter = RateLimiter(rate)
        self.cache = cache
        self.progress = progress
        self.asked = 0            # requests sent (the rest came from the cache)
        self.cached = 0
        self._identity = identity

    @property
    def identity(self) -> str:
        """What names this judge in run.json and in its cache: the endpoint and the served model (or the
        name given, e.g. ``run:<folder>`` for a run served at a new port each time)."""
        return self._identity or f"{self.base_url}#{self.model}"

    def served_models(self) -> list[str]:
        """The model ids the endpoint lists (``GET /v1/models``): the check before judging starts, so a
        refused connection is retried once (0.5 s), not with the requests' full backoff."""
        probe = Client(self.base_url, api_key_env=self.client.api_key_env, timeout=30, retries=min(1, self.client.retries))
        reply = probe.get("/models")
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list):
            raise ServiceError(f"GET {self.base_url}/models: the reply has no 'data' list: {str(reply)[:200]}")
        return [str(m.get("id")) for m in data if isinstance(m, dict)]

    def check_model(self, field: str = "judge.model") -> None:
        """The endpoint answers and serves the judge model; with no model named, the one it serves is taken
        (a RecipeError naming ``field`` when it serves none or several)."""
        served = self.served_models()
        if not self.model:
            if len(served) != 1:
                raise RecipeError(f"{field}: {self.base_url} serves {', '.join(served) or 'no model'}; "
                                  "name the judge model")
            self.model = served[0]
        elif self.model not in served:
            raise RecipeError(f"{field}: {self.base_url} does not serve {self.model!r} "
                              f"(it serves {', '.join(served) or 'no model'})")

    def ask(self, chats: Sequence[list[dict]], *, max_tokens: int, what: str = "judge") -> list[dict]:
        """``{"reply", "top"}`` for each chat, in order (``top``: the first token's top log-probs, or {})."""
        keys = [request_key(self.identity, list(chat), max_tokens, temperature=0, top_logprobs=TOP_LOGPROBS)
                for chat in chats]
        answers: list[dict | None] = [self.cache.get(k) if self.cache else None for k in keys]
        first_of = {}                            # a chat asked twice in one call is sent once
        for i, answer in enumerate(answers):
            if answer is None:
                first_of.setdefault(keys[i], i)
        todo = list(first_of.values())
        self.cached += sum(a is not None for a in answers)
        bar = None
        if self.progress and todo:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(todo), desc=f"{what} ({self.model})", unit="req")

        def one(i: int) -> None:
            self.limiter.wait()
            answers[i] = self._request(chats[i], max_tokens, f"chat {i + 1} of {len(chats)}")
            if self.cache is not None:
                self.cache.put(keys[i], answers[i])
            if bar is not None:
                bar.update(1)

        try:
            if self.workers == 1 or len(todo) < 2:
                for i in todo:
                    one(i)
            else:
                with ThreadPoolExecutor(max_workers=min(self.workers, len(todo))) as pool:
                    list(pool.map(one, todo))     # the first failure is raised here, after the others end
        finally:
            if bar is not None:
                bar.close()
        self.asked += len(todo)
        answers = [a if a is not None else answers[first_of[keys[i]]] for i, a in enumerate(answers)]
        return [{"reply": a["reply"], "top": a.get("top") or {}} for a in answers]

    def _request(self, messages: list[dict], max_tokens: int, label: str) -> dict:
        url = f"{self.base_url}/chat/completions"
        what = f"POST {url} (judge {self.model}, {label})"
        payload = {"model": self.model, "messages": list(messages), "temperature": 0, "max_tokens": max_tokens,
                   "logprobs": True, "top_logprobs": TOP_LOGPROBS}
        try:
            reply = self.client.chat(payload)
        except ServiceError as err:
            raise ServiceError(str(err).replace(f"POST {url}", what, 1)) from None
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise ServiceError(f"{what}: the reply has no choices[0].message.content: {str(reply)[:200]}") from None
        return {"reply": text, "top": _first_token_top(choice.get("logprobs"))}


def _first_token_top(logprobs: object) -> dict[str, float]:
    """``{token: logprob}`` of the first generated token's alternatives (OpenAI's chat ``logprobs`` shape)."""
    try:
        first = logprobs["content"][0]                       # type: ignore[index]
        return {str(t["token"]): float(t["logprob"]) for t in first.get("top_logprobs") or []}
    except (KeyError, IndexError, TypeError, ValueError):
        return {}


def cache_for(cache_dir: str | Path, identity: str) -> JudgeCache:
    """The cache file of one judge inside ``cache_dir``."""
    import hashlib

    return JudgeCache(Path(cache_dir) / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.jsonl")


@contextlib.contextmanager
def served_run(run: Any, log_path: str | Path) -> Iterator[tuple[str, str, str]]:
    """A run's model served by vLLM for the duration: ``(base URL, served model name, identity)``. The server
    gets a new port each time, so the identity (what names the judge, and its cache) is the run's folder."""
    from smolforge.generation.vllm_server import VLLMServer

    with VLLMServer(run.model_dir, served_name=run.name, log_path=log_path) as server:
        print(f"serving the judge {run.name} at {server.url} (ready in {server.ready_s:.1f} s)", flush=True)
        yield server.url + "/v1", run.name, f"run:{Path(run.path).resolve()}"
