"""The arithmetic every plan shares: the given numbers checked, FLOPs, the MFU, GPU-hours, GPUs or
days, cost, and the warnings that make a plan impossible or optimistic.

    >>> from types import SimpleNamespace
    >>> given = given_numbers(SimpleNamespace(seq_len=256, micro_batch_size=16), gpus=8, days=None, mfu="0.5",
    ...                       price=None, seq_len=None, vocab=1024)
    >>> plan = schedule(given, train_flops=3.6e18, per_token=6e6, peak=1e15)
    >>> plan["gpu_hours"], plan["days_needed"] * 24 * 8, plan["mfu_source"]
    (2.0, 2.0, '--mfu')
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from smolforge.errors import RecipeError
from smolforge.pretrain.flops import attention_flops_per_token, flops_per_token
from smolforge.pretrain.model import ModelShape

from .inputs import parse_count

__all__ = ["DEFAULT_MFU", "MFU_WARNING", "SECONDS_PER_DAY", "Given", "given_numbers", "compute", "schedule",
           "plan_warnings"]

DEFAULT_MFU = 0.30              # SmolLM3's run implies ≈26–31 % (≈14k tokens/s per H100)
MFU_WARNING = 0.60              # above this, dense-training MFU is optimistic (the playbook)
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class Given:
    """The plan's numbers, parsed and checked; None where not given."""
    gpus: int | None
    days: float | None
    mfu: float | None        # fraction of peak
    price: float | None      # USD per GPU-hour
    vocab: int
    seq_len: int             # --seq-len, else the recipe's train.seq_len
    micro_batch: int
    precision: str           # the recipe's train.precision


def given_numbers(train: Any, *, gpus: Any, days: Any, mfu: Any, price: Any, seq_len: Any, vocab: Any) -> Given:
    gpus_n = None if gpus is None else parse_count(gpus, "--gpus")
    if gpus_n is not None and not float(gpus_n).is_integer():
        raise RecipeError(f"--gpus must be a whole number, got {gpus!r}")
    days_n = None if days is None else parse_count(days, "--days")
    mfu_n = None if mfu is None else parse_count(mfu, "--mfu")
    if mfu_n is not None and mfu_n > 1:
        raise RecipeError(f"--mfu is a fraction of peak (0.3 = 30 %), got {mfu!r}")
    price_n = None if price is None else parse_count(price, "--price")
    vocab_n = int(parse_count(vocab, "--vocab"))
    seq = int(parse_count(seq_len if seq_len is not None else train.seq_len,
                          "--seq-len" if seq_len is not None else "train.seq_len"))
    micro_batch = int(parse_count(train.micro_batch_size, "train.micro_batch_size"))
    return Given(gpus=None if gpus_n is None else int(gpus_n), days=days_n, mfu=mfu_n, price=price_n,
                  vocab=vocab_n, seq_len=seq, micro_batch=micro_batch,
                  precision=getattr(train, "precision", "bf16"))


def compute(shape: ModelShape, given: Given, params: int, tokens: float, causal: bool) -> dict[str, Any]:
    """FLOPs per token (6·N plus attention) and for the whole run."""
    per_token = flops_per_token(shape, given.vocab, given.seq_len, params=params, causal=causal)
    return {"flops_per_token": per_token,
            "attention_flops_per_token": attention_flops_per_token(shape, given.seq_len, causal=causal),
            "causal_attention_halved": causal, "train_flops": per_token * tokens}


def schedule(given: Given, train_flops: float, per_token: float, peak: float) -> dict[str, Any]:
    """The MFU (required by --gpus × --days, and assumed), GPU-hours, GPUs or days needed, cost."""
    mfu_required = None
    if given.gpus is not None and given.days is not None:
        mfu_required = train_flops / (peak * given.gpus * given.days * SECONDS_PER_DAY)
    mfu_used, mfu_how = _assumed_mfu(given, mfu_required)
    gpu_seconds = train_flops / (peak * mfu_used)
    gpu_hours = gpu_seconds / 3600
    return {
        "mfu_assumed": mfu_used,
        "mfu_source": mfu_how,
        "mfu_required": mfu_required,
        "tokens_per_second_per_gpu": peak * mfu_used / per_token,
        "gpu_hours": gpu_hours,
        "gpus": given.gpus,
        "days": given.days,
        "gpus_needed": _ceil(gpu_seconds / (given.days * SECONDS_PER_DAY)) if given.days is not None else None,
        "days_needed": gpu_seconds / given.gpus / SECONDS_PER_DAY if given.gpus is not None else None,
        "price_usd_per_gpu_hour": given.price,
        "cost_usd": gpu_hours * given.price if given.price is not None else None,
    }


def _assumed_mfu(given: Given, mfu_required: float | None) -> tuple[float, str]:
    """--mfu; else the MFU that --gpus and --days require; else the default."""
    if given.mfu is not None:
        return given.mfu, "--mfu"
    if mfu_required is not None:
        return mfu_required, f"required by --gpus {given.gpus} × --days {given.days:g}"
    return DEFAULT_MFU, "default (SmolLM3's run implies ≈26–31 %)"


def _ceil(x: float) -> int:
    """Ceiling that forgives float noise: 384.0000000001 GPUs is 384."""
    return max(1, math.ceil(x * (1 - 1e-9)))


def plan_warnings(plan: dict[str, Any], given: Given, max_position_embeddings: int) -> list[str]:
    """What makes the plan impossible, optimistic or inconsistent with its recipe."""
    warnings: list[str] = []
    key, mfu_used, mfu_required = plan["gpu"], plan["mfu_assumed"], plan["mfu_required"]
    if mfu_used > 1:
        warnings.append(f"this plan needs an MFU of {mfu_used:.0%}: more than the {key}'s peak — "
                        "impossible; add GPUs or days")
    elif mfu_used > MFU_WARNING:
        warnings.append(f"this plan assumes an MFU of {mfu_used:.0%} (> {MFU_WARNING:.0%}): optimistic "
                        "for dense training; SmolLM3's run implies ≈26–31 %")
    if given.mfu is not None and mfu_required is not None and given.mfu < mfu_required * (1 - 1e-9):
        warnings.append(f"at --mfu {given.mfu:g}, {given.gpus} GPUs need {plan['days_needed']:.1f} days, more "
                        f"than --days {given.days:g} (that needs an MFU of {mfu_required:.1%})")
    if given.precision == "fp32" and key != "cpu":
        warnings.append(f"the recipe trains in fp32 but {key}'s peak is a bf16 tensor-core figure; "
                        "set train.precision: bf16 or expect a far lower MFU")
    if given.seq_len > max_position_embeddings:
        warnings.append(f"seq_len {given.seq_len} exceeds model.max_position_embeddings "
                        f"{max_position_embeddings}")
    return warnings
