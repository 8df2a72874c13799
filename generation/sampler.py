"""The one interface every caller samples through: prompts in, :class:`Sample` s out.

    >>> s = Sample("7.", [22, 2])
    >>> s.text, s.token_ids, s.logprobs
    ('7.', [22, 2], None)

A :class:`Sampler` has a ``backend`` name and one method, ``sample(prompts, *, max_new_tokens,
n=1, temperature=1.0, top_p=1.0)``: ``n`` samples per prompt, prompt-major; ``temperature=0``
is greedy. A prompt is a string or a list of chat messages (rendered with the model's chat
template). Two samplers implement it:

- :class:`~smolforge.generation.hf.HFSampler`: HF ``generate`` on a model in this process;
- :class:`~smolforge.generation.rollouts.ServerSampler`: a vLLM server holding the model, over
  HTTP (token ids out, sampled ids and log-probs back); RL syncs the policy into it in place.

:func:`~smolforge.generation.open_sampler.open_sampler` gives the right one for a model folder and a backend
name (:func:`~smolforge.generation.backends.pick_backend`), and stops what it started. An in-process
vLLM engine is driven by the libraries that own one (TRL's colocate mode, lm-eval's ``vllm``
model) with the settings of :mod:`smolforge.generation.inprocess`. Conversations → replies
(the red team, judges) is :mod:`smolforge.generation.chat`, built on these.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

__all__ = ["Sample", "Sampler"]


class Sample(NamedTuple):
    """One completion: its text (special tokens dropped), its token ids (the end token included)."""

    text: str
    token_ids: list[int]
    logprobs: list[float] | None = None   # of each sampled token, where the backend reports them


class Sampler(Protocol):
    backend: str

    def sample(self, prompts: Sequence[Any], *, max_new_tokens: int, n: int = 1, temperature: float = 1.0,
               top_p: float = 1.0) -> list[Sample]: ...
