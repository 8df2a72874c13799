"""Conversations in, one reply each out: what the red team, judges and other evaluators call.

A generator is any callable ``generate(conversations) -> replies``: each conversation is a list of
``{"role": ..., "content": ...}`` messages, each reply a string, same order, same count. Eval code
takes one and does not care where the text comes from. Two are provided:

- :func:`hf_generator`: a model folder loaded in-process, greedy, through
  :class:`~smolforge.generation.hf.HFSampler` (the sampler the RL stages use).
- :class:`EndpointGenerator`: an OpenAI-compatible server (vLLM, TGI, a hosted API). It POSTs to
  ``/v1/chat/completions`` with temperature 0 through :class:`~smolforge.generation.client.Client`
  (timeouts, retries). The API key is read from an environment variable whose *name* it is
  given, and is never stored, logged or shown.

Any plain function works as well, which is how tests fake a model:

    >>> shout = lambda conversations: [c[-1]["content"].upper() for c in conversations]
    >>> check_replies(shout([[{"role": "user", "content": "hi"}]]), 1)
    ['HI']
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from smolforge.errors import RecipeError, RunError, ServiceError

from .client import Client

__all__ = ["Conversation", "Generate", "check_replies", "hf_generator", "chat_url", "EndpointGenerator"]

log = logging.getLogger(__name__)

Conversation = Sequence[dict]
Generate = Callable[[Sequence[Conversation]], list[str]]


def check_replies(replies: object, expected: int) -> list[str]:
    """``replies`` as a list of strings, or a ServiceError when a generator broke its contract.

    >>> check_replies(["a", "b"], 2)
    ['a', 'b']
    >>> check_replies(["a"], 2)
    Traceback (most recent call last):
    ...
    smolforge.errors.ServiceError: the generator returned 1 replies for 2 conversations
    """
    if not isinstance(replies, (list, tuple)):
        raise ServiceError(f"the generator returned a {type(replies).__name__}, expected a list of strings")
    if len(replies) != expected:
        raise ServiceError(f"the generator returned {len(replies)} replies for {expected} conversations")
    bad = [i for i, r in enumerate(replies) if not isinstance(r, str)]
    if bad:
        raise ServiceError(f"the generator returned a {type(replies[bad[0]]).__name__} for conversation "
                           f"{bad[0] + 1}, expected a string")
    return list(replies)


def _device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def hf_generator(model_dir: str | Path, *, max_new_tokens: int = 128, batch_size: int = 8,
                 device: str = "auto") -> Generate:
    """A generator running the HF model in ``model_dir`` in this process (greedy, batched).

    Conversations go through the tokenizer's chat template, are sorted by length so a batch pads
    little, are left-padded ``batch_size`` at a time, and stop at eos or ``max_new_tokens``.
    Replies come back in the input order, decoded without special tokens. A folder without a
    model is a RunError; a tokenizer without a chat template is a RecipeError.

    >>> hf_generator("/nonexistent")
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: /nonexistent: no HF model here (config.json missing)
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise RunError(f"{model_dir}: no HF model here (config.json missing)")
    if max_new_tokens < 1 or batch_size < 1:
        raise RecipeError(f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens} and {batch_size}")
    from .hf import load_hf_sampler
    from .prompts import encode_prompts

    sampler = load_hf_sampler(model_dir, device=_device(device), batch_size=batch_size)
    tokenizer, model = sampler.tokenizer, sampler.model
    if not getattr(tokenizer, "chat_template", None):
        raise RecipeError(f"{model_dir}: the tokenizer has no chat template; conversations need a chat model")
    context = getattr(model.config, "max_position_embeddings", None)
    warned: list[bool] = []

    def run(conversations: Sequence[Conversation]) -> list[str]:
        prompts = [list(c) for c in conversations]
        if not prompts:
            return []
        lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
        if context and max(lengths) + max_new_tokens > context and not warned:
            warned.append(True)
            log.warning("%s: a prompt of %d tokens + %d new tokens exceeds the model's %d positions; "
                        "replies to long prompts may degrade", model_dir, max(lengths), max_new_tokens, context)
        order = sorted(range(len(prompts)), key=lengths.__getitem__)
        outs = sampler.sample([prompts[i] for i in order], max_new_tokens=max_new_tokens, temperature=0.0)
        replies = [""] * len(prompts)
        for i, sample in zip(order, outs):
            replies[i] = sample.text
        return replies

    run.description = f"hf:{model_dir}"  # type: ignore[attr-defined]
    return run


def chat_url(base_url: str) -> str:
    """The chat-completions URL for a server's base URL (with or without ``/v1``).

    >>> chat_url("http://127.0.0.1:8000"), chat_url("http://127.0.0.1:8000/v1/")
    ('http://127.0.0.1:8000/v1/chat/completions', 'http://127.0.0.1:8000/v1/chat/completions')
    >>> chat_url("https://api.example.com/v1/chat/completions")
    'https://api.example.com/v1/chat/completions'
    """
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


class EndpointGenerator:
    """A generator backed by an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    ``base_url`` is the server (``http://127.0.0.1:8000`` or ``.../v1``), ``model`` the served
    model name. ``api_key_env`` names the environment variable holding the key (sent as a Bearer
    token; read at each request, never kept or shown); unset means no key. Requests run
    ``workers`` at a time with ``temperature: 0`` and ``max_tokens``; refused connections, 429 and
    5xx are retried ``retries`` times with backoff. Every failure is a ServiceError naming the
    request (URL, model, which conversation, never its text): unreachable server, an HTTP error,
    a reply that is not JSON or has no message content.

    >>> gen = EndpointGenerator("http://127.0.0.1:9", "tiny", max_tokens=16)
    >>> gen
    EndpointGenerator('http://127.0.0.1:9/v1/chat/completions', model='tiny', max_tokens=16)
    >>> EndpointGenerator("http://127.0.0.1:9", "tiny", api_key_env="SMOLFORGE_NO_SUCH_KEY")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: api_key_env: environment variable SMOLFORGE_NO_SUCH_KEY is not set
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None, max_tokens: int = 256,
                 timeout: float = 120.0, workers: int = 4, retries: int = 3) -> None:
        if max_tokens < 1 or workers < 1:
            raise RecipeError(f"max_tokens and workers must be >= 1, got {max_tokens} and {workers}")
        self.url = chat_url(base_url)
        self.client = Client(self.url.removesuffix("/chat/completions"), api_key_env=api_key_env, timeout=timeout,
                             retries=retries)
        self.model = model
        self.max_tokens = max_tokens
        self.workers = workers
        self.description = f"endpoint:{self.url}#{model}"

    def __repr__(self) -> str:
        return f"EndpointGenerator({self.url!r}, model={self.model!r}, max_tokens={self.max_tokens})"

    def __call__(self, conversations: Sequence[Conversation]) -> list[str]:
        """One reply per conversation, in order (requests in parallel, ``workers`` at a time)."""
        total = len(conversations)
        jobs = [(list(c), f"conversation {i + 1} of {total}") for i, c in enumerate(conversations)]
        if self.workers == 1 or total < 2:
            return [self.chat(messages, label=label) for messages, label in jobs]
        with ThreadPoolExecutor(max_workers=min(self.workers, total)) as pool:
            return list(pool.map(lambda job: self.chat(job[0], label=job[1]), jobs))

    def chat(self, messages: Conversation, *, label: str = "conversation") -> str:
        """The assistant's reply to one conversation (``label`` names it in errors; its text never does)."""
        payload = {"model": self.model, "messages": list(messages), "temperature": 0, "max_tokens": self.max_tokens}
        what = f"POST {self.url} (model {self.model}, {label})"
        try:
            reply = self.client.chat(payload)
        except ServiceError as err:
            raise ServiceError(str(err).replace(f"POST {self.url}", what, 1)) from None
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ServiceError(f"{what}: the reply has no choices[0].message.content: {str(reply)[:200]}") from None
        if content is not None and not isinstance(content, str):
            raise ServiceError(f"{what}: choices[0].message.content is a {type(content).__name__}, expected text")
        return content or ""
