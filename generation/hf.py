"""HF ``generate`` as a sampler: batched, left-padded, stopping at every end token of the model.

    >>> HFSampler.backend
    'hf'

:class:`HFSampler` wraps a loaded model (the policy during RL, or a model folder loaded for an
eval) behind :class:`~smolforge.generation.sampler.Sampler`'s ``sample``. Sampling is from the
full softmax at ``temperature`` (``top_k`` off; keep ``top_p=1`` when the log-probs of the
samples must match the policy, as in PPO); ``temperature=0`` is greedy. Prompts go through
``batch_size`` at a time (default: all at once); the model's train/eval mode is restored after.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .prompts import cut_at_eos, encode_prompts, eos_ids, left_pad, load_tokenizer, pad_id
from .sampler import Sample

__all__ = ["HFSampler", "load_hf_sampler"]


class HFSampler:
    """Samples from ``model`` (an HF causal LM) in this process."""

    backend = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    def sample(self, prompts: Sequence[Any], *, max_new_tokens: int, n: int = 1, temperature: float = 1.0,
               top_p: float = 1.0) -> list[Sample]:
        """``n`` completions per prompt, prompt-major; ids run up to and including the first end token."""
        import torch

        if not prompts:
            return []
        model, tokenizer = self.model, self.tokenizer
        pad, ends = pad_id(tokenizer), eos_ids(tokenizer, model)
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 \
            else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        encoded = encode_prompts(tokenizer, prompts)
        step = self.batch_size or len(encoded)
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        results: list[Sample] = []
        try:
            with torch.no_grad():
                for start in range(0, len(encoded), step):
                    ids, mask = left_pad(encoded[start:start + step], pad)
                    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                         max_new_tokens=max_new_tokens, num_return_sequences=n,
                                         eos_token_id=sorted(ends) or None, pad_token_id=pad, use_cache=True,
                                         **sampling)
                    for row in out[:, ids.shape[1]:].tolist():
                        completion = cut_at_eos(row, ends)
                        results.append(Sample(tokenizer.decode(completion, skip_special_tokens=True), completion))
        finally:
            model.train(was_training)
        return results


def load_hf_sampler(model_dir: str | Path, *, device: str = "cpu", batch_size: int | None = None) -> HFSampler:
    """An :class:`HFSampler` on the model folder, loaded in fp32 from safetensors."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, use_safetensors=True).to(device)
    return HFSampler(model, load_tokenizer(model_dir), batch_size=batch_size)
