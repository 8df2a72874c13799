"""Which attention implementation a training stage asks transformers for (``attn_implementation:``).

Packed rows put several documents in one row, ``position_ids`` restarting at 0 at each, with
``attention_mask`` None and no cache. transformers 5.19 keeps the documents apart in every
implementation, at very different cost:

- ``sdpa`` / ``eager``: a dense per-document causal mask of batch x length² (an SFT batch flattened
  into one 32k-token row: a 1 GiB mask, and attention over the whole row computed then masked);
- ``flex_attention``: PyTorch's own; a ``BlockMask`` from the packed-sequence indices (compiled
  ``create_block_mask``), so only the blocks on the documents' diagonal are computed and no
  length² tensor exists;
- ``flash_attention_2`` / ``flash_attention_3``: no mask; the varlen kernel gets ``cu_seqlens`` from
  the position ids (TRL's padding-free collator passes them precomputed; transformers derives them
  itself only for a batch of ONE row, so pretraining passes them, see
  :func:`smolforge.pretrain.model.varlen_kwargs`). Needs the ``flash-attn`` (FA2) or FA3 package, CUDA,
  and bf16/fp16.

``auto`` takes flash-attention where it is installed and can run, else ``flex_attention`` for packed
rows on CUDA, else ``sdpa``. Flex cannot train on CPU: PyTorch 2.13's FlexAttention has no backward
pass there (its forward runs, compiled by Inductor on first use; bench/packed_attention.py).

    >>> choose_attention("auto", packed=True, cuda=True, installed=())
    'flex_attention'
    >>> choose_attention("auto", packed=True, cuda=True, installed=("flash_attn",), half_precision=True)
    'flash_attention_2'
    >>> choose_attention("auto", packed=True, cuda=False, installed=("flash_attn",))
    'sdpa'
    >>> choose_attention("flash_attn2", packed=True, cuda=True, installed=())
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: attn_implementation is 'flash_attn2'; expected one of auto, sdpa, flex_attention, flash_attention_2, flash_attention_3, eager (did you mean 'flash_attention_2'?)
"""
from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Collection

from smolforge.errors import RecipeError

__all__ = ["CHOICES", "FLASH_PACKAGES", "check_choice", "choose_attention", "check_flash", "check_flex",
           "installed_flash_packages",
           "resolve_attention"]

CHOICES = ("auto", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "eager")
# implementation → the module transformers imports it from (pip: flash-attn; FA3: built from flash-attention/hopper)
FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def choose_attention(requested: str, *, packed: bool, cuda: bool, installed: Collection[str],
                     half_precision: bool = False, dropout: float = 0.0,
                     field: str = "attn_implementation") -> str:
    """The implementation to load the model with, from the machine's facts given as arguments.

    ``packed``: rows hold several documents (position ids restarting); ``cuda``: a CUDA device is
    present; ``installed``: the importable modules among :data:`FLASH_PACKAGES`' values;
    ``half_precision``: the model computes in bf16/fp16; ``dropout``: the model's attention dropout
    (flex attention in transformers 5.19 refuses any). ``field`` names the recipe field in errors.

    >>> choose_attention("auto", packed=False, cuda=True, installed=())
    'sdpa'
    >>> choose_attention("eager", packed=True, cuda=False, installed=())
    'eager'
    """
    check_choice(requested, field)
    if requested in FLASH_PACKAGES:
        check_flash(requested, cuda=cuda, installed=installed, half_precision=half_precision, field=field)
    if requested == "flex_attention":
        check_flex(cuda=cuda, dropout=dropout, field=field)
    if requested != "auto":
        return requested
    if cuda and half_precision and FLASH_PACKAGES["flash_attention_2"] in installed:
        return "flash_attention_2"
    if cuda and packed and dropout == 0:
        return "flex_attention"
    return "sdpa"


def check_choice(requested: str, field: str = "attn_implementation") -> None:
    """RecipeError naming ``field``, the valid values and the closest one, unless ``requested`` is one of them."""
    if requested not in CHOICES:
        close = difflib.get_close_matches(str(requested), CHOICES, n=1)
        raise RecipeError(f"{field} is {requested!r}; expected one of {', '.join(CHOICES)}"
                          + (f" (did you mean '{close[0]}'?)" if close else ""))


def check_flash(requested: str, *, cuda: bool, installed: Collection[str], half_precision: bool, field: str) -> None:
    """RecipeError unless flash-attention ``requested`` can run here (package, CUDA, bf16/fp16)."""
    package = FLASH_PACKAGES[requested]
    if package not in installed:
        raise RecipeError(f"{field}: {requested} needs the `{package}` package, which is not installed here "
                          f"({'pip install flash-attn' if package == 'flash_attn' else 'build flash-attention/hopper'}); "
                          "flex_attention needs no package (auto picks it for packed rows on CUDA)")
    if not cuda:
        raise RecipeError(f"{field}: {requested} runs on a CUDA GPU only and none is present; use sdpa or auto")
    if not half_precision:
        raise RecipeError(f"{field}: {requested} computes in bf16/fp16 only and this run trains in fp32; "
                          "train in bf16 or use flex_attention")


def check_flex(*, cuda: bool, dropout: float, field: str) -> None:
    """RecipeError unless flex attention can train here (CUDA; no attention dropout)."""
    if not cuda:
        raise RecipeError(f"{field}: flex_attention trains on a CUDA GPU only (PyTorch's FlexAttention has no "
                          "backward pass on CPU); use sdpa or auto")
    if dropout > 0:
        raise RecipeError(f"{field}: flex_attention has no attention dropout in transformers (the model's is "
                          f"{dropout}); set it to 0 or use sdpa")


def installed_flash_packages() -> set[str]:
    """The flash-attention modules importable here (found, not imported)."""
    return {module for module in FLASH_PACKAGES.values() if importlib.util.find_spec(module) is not None}


def resolve_attention(requested: str, *, packed: bool, half_precision: bool, dropout: float = 0.0,
                      field: str = "attn_implementation") -> str:
    """:func:`choose_attention` with this machine's facts (CUDA present, flash packages installed).

    >>> resolve_attention("sdpa", packed=True, half_precision=False)
    'sdpa'
    """
    import torch

    return choose_attention(requested, packed=packed, cuda=torch.cuda.is_available(),
                            installed=installed_flash_packages(), half_precision=half_precision,
                            dropout=dropout, field=field)
