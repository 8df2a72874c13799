"""Responses to review: ``k`` completions per prompt from one run, or split between two runs.

    >>> slots_per_run(["sft-demo"], 3)
    [('sft-demo', 3)]
    >>> slots_per_run(["sft-demo", "dpo-demo"], 3)
    [('sft-demo', 2), ('dpo-demo', 1)]
    >>> response_runs(["sft-demo", "dpo-demo"], 3)
    ['sft-demo', 'dpo-demo', 'sft-demo']

With two runs the ``k`` slots alternate between them (k=2: one answer each, an A/B review). Each run
samples its share with the recipe's settings (``temperature``, ``top_p``, ``max_new_tokens``,
``seed``), through :func:`smolforge.generation.open_sampler.open_sampler`: batched HF ``generate`` in this
process, or a vLLM server holding the run's model (``vllm-server``; the GPU build or vLLM's CPU
build, see :func:`smolforge.generation.backends.pick_backend`). The same seed gives the same texts on HF, so
pushing again updates the same records with the same responses.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["slots_per_run", "response_runs", "generate_responses", "SAMPLING_DEFAULTS"]

SAMPLING_DEFAULTS = {"temperature": 0.8, "top_p": 1.0, "max_new_tokens": 64, "seed": 0}


def slots_per_run(run_names: Sequence[str], k: int) -> list[tuple[str, int]]:
    """How many of the ``k`` responses each run writes (round robin, the first run first)."""
    return [(name, len(range(i, k, len(run_names)))) for i, name in enumerate(run_names)]


def response_runs(run_names: Sequence[str], k: int) -> list[str]:
    """The run behind each of the ``k`` responses of a record, in response order."""
    return [run_names[i % len(run_names)] for i in range(k)]


def _sample_one_run(model_dir: Path, prompts: Sequence[Any], n: int, sampling: Mapping[str, Any], backend: str,
                    batch_size: int) -> list[list[str]]:
    from smolforge.generation.open_sampler import open_sampler

    with open_sampler(model_dir, backend, seed=int(sampling["seed"]), batch_size=batch_size) as sampler:
        flat = sampler.sample(list(prompts), max_new_tokens=int(sampling["max_new_tokens"]), n=n,
                              temperature=float(sampling["temperature"]), top_p=float(sampling["top_p"]))
    texts = [sample.text.strip() for sample in flat]
    return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]


def generate_responses(model_dirs: Mapping[str, Path], prompts: Sequence[Any], k: int,
                       sampling: Mapping[str, Any], backend: str = "hf", batch_size: int = 32,
                       progress: Any = None) -> list[list[str]]:
    """``k`` responses per prompt, in :func:`response_runs` order; ``model_dirs`` maps run name → model/.

    ``progress(run_name, done_prompts)`` is called after each run has sampled.
    """
    names = list(model_dirs)
    per_run: dict[str, list[list[str]]] = {}
    for name, count in slots_per_run(names, k):
        log.info("push: sampling %d response(s) per prompt for %d prompts from %s (%s)", count, len(prompts),
                 name, backend)
        per_run[name] = _sample_one_run(model_dirs[name], prompts, count, sampling, backend, batch_size)
        if progress is not None:
            progress(name, len(prompts))
    out = []
    for i in range(len(prompts)):
        used = dict.fromkeys(names, 0)
        row = []
        for name in response_runs(names, k):
            row.append(per_run[name][i][used[name]])
            used[name] += 1
        out.append(row)
    return out
