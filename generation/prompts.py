"""Prompts as the model sees them: the tokenizer, chat rendering, token ids, padding, end of text.

Prompts follow TRL's formats: a list of ``{"role", "content"}`` messages is rendered with the
tokenizer's chat template (``add_generation_prompt=True``); a string is used as it is.

    >>> left_pad([[5, 6, 7], [8]], pad_id=0)[0].tolist()
    [[5, 6, 7], [0, 0, 8]]
    >>> cut_at_eos([4, 5, 2, 3, 3], {2}), cut_at_eos([4, 5], {2})
    ([4, 5, 2], [4, 5])
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["load_tokenizer", "render_prompt", "encode_prompts", "left_pad", "cut_at_eos", "eos_ids", "pad_id"]


def load_tokenizer(model_dir: str | Path):
    """The model folder's tokenizer, with the eos token as pad token when it has none."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


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
    >>> mask.tolist()
    [[1, 1, 1], [0, 0, 1]]
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


def cut_at_eos(ids: Sequence[int], eos: set[int]) -> list[int]:
    """Generated ids up to and including the first end token (all of them when there is none)."""
    out = []
    for token in ids:
        out.append(int(token))
        if token in eos:
            break
    return out


def eos_ids(tokenizer, model=None) -> set[int]:
    """Every token that ends a completion: the tokenizer's eos and the model's ``generation_config`` ones.

    A chat model often stops at an end-of-turn token that only its generation config names; a
    completion that ends there has ended, as far as sampling and rewards are concerned.

    >>> class Tok: eos_token_id = 2
    >>> class Config: eos_token_id = [2, 7]
    >>> class Model: generation_config = Config()
    >>> sorted(eos_ids(Tok(), Model())), sorted(eos_ids(Tok()))
    ([2, 7], [2])
    """
    found = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        found.add(config_eos)
    elif isinstance(config_eos, (list, tuple)):
        found.update(int(e) for e in config_eos)
    return found


def pad_id(tokenizer) -> int:
    """The id to pad with: the tokenizer's pad token, else its eos."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
