"""The GRPO loss family and its reward aggregation, written from the papers in plain torch.

TRL's ``GRPOTrainer`` computes these inside its training step; here each is one small function, so
tests/test_grpo_math.py can hold TRL's implementation (the one smolforge's GRPO stage runs) to the
formulas on hand-built tensors, as :mod:`smolforge.alignment.ppo.math` is held to worked numbers.
Tensors are ``[B, T]`` over completion tokens; ``mask`` marks the valid ones; ``advantages`` is ``[B]``.

The per-token ratio is r = exp(log π − log π_old); GSPO (``importance_sampling_level: sequence``)
uses one ratio per sequence, s = exp(mean over its tokens of (log π − log π_old)).

==========  ======================================================  ==========================================
loss_type   per-token term                                          aggregation
==========  ======================================================  ==========================================
grpo        −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)                 mean over sequences of each one's token mean
bnpo        same                                                    Σ over tokens / tokens in the micro-batch
dr_grpo     same                                                    Σ over tokens / (B · max_completion_length)
dapo        same                                                    Σ over tokens / tokens in the whole batch
cispo       −sg(min(r, ε_max))·A·log π                              as dapo
==========  ======================================================  ==========================================

    >>> import torch
    >>> logps = torch.tensor([[-1.0, -2.0, 0.0]])
    >>> mask = torch.tensor([[1, 1, 0]])
    >>> round(policy_loss(logps, logps, torch.tensor([2.0]), mask, "grpo").item(), 4)   # r = 1: −A
    -2.0
    >>> round(policy_loss(logps, logps, torch.tensor([2.0]), mask, "dr_grpo", max_completion_length=4).item(), 4)
    -1.0
"""
from __future__ import annotations

import torch

__all__ = ["LOSS_TYPES", "AGGREGATIONS", "importance_ratio", "policy_loss", "advantages"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def importance_ratio(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor,
                     level: str = "token") -> torch.Tensor:
    """r = exp(log π − log π_old) per token (``[B, T]``), or GSPO's per-sequence
    exp(mean_t(log π − log π_old)) (``[B, 1]``) with ``level="sequence"``.

    >>> logps, old = torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, -2.0]])
    >>> [round(v, 4) for v in importance_ratio(logps, old, torch.ones(1, 2)).flatten().tolist()]
    [1.0, 2.7183]
    >>> round(importance_ratio(logps, old, torch.ones(1, 2), "sequence").item(), 4)   # exp(0.5)
    1.6487
    """
    log_ratio = logps - old_logps
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        m = mask.to(log_ratio.dtype)
        return torch.exp((log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0))
    raise ValueError(f"importance sampling level must be token or sequence, got {level!r}")


def policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                loss_type: str = "grpo", *, epsilon_low: float = 0.2, epsilon_high: float = 0.2,
                level: str = "token", max_completion_length: int | None = None,
                batch_tokens: float | None = None) -> torch.Tensor:
    """The policy loss of one micro-batch (no KL term, no gradient-accumulation scaling).

    ``epsilon_high`` is CISPO's ratio cap ε_max; ``max_completion_length`` is Dr. GRPO's constant
    length; ``batch_tokens`` is DAPO's and CISPO's token count over the whole generation batch
    (default: this micro-batch's).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    m = mask.to(logps.dtype)
    ratio = importance_ratio(logps, old_logps, mask, level)
    adv = advantages.to(logps.dtype).unsqueeze(-1)
    if loss_type == "cispo":
        per_token = -torch.clamp(ratio, max=epsilon_high).detach() * adv * logps
    else:
        clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
    per_token = per_token.expand_as(logps) * m
    if loss_type == "grpo":
        return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return per_token.sum() / m.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo divides by B · max_completion_length: give max_completion_length")
        return per_token.sum() / (logps.shape[0] * max_completion_length)
    tokens = m.sum() if batch_tokens is None else torch.as_tensor(batch_tokens, dtype=logps.dtype)
    return per_token.sum() / tokens.clamp(min=1.0)


def _group_stats(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group mean and sample standard deviation of ``x`` (``[N, ...]``, groups of consecutive rows)."""
    grouped = x.view(-1, group_size, *x.shape[1:])
    return grouped.mean(1, keepdim=True), grouped.std(1, keepdim=True)


def advantages(rewards: torch.Tensor, weights: torch.Tensor, group_size: int, *,
               aggregation: str = "sum_then_normalize", scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages of ``N`` completions (``group_size`` per prompt, consecutive) scored by ``K``
    reward functions (``rewards``: ``[N, K]``), weighted by ``weights`` (``[K]``).

    ``sum_then_normalize``: R = Σ_k w_k·r_k, then A = (R − mean_group(R)) / (std(R) + eps) with the std
    of the group (``scale: group``), of the whole batch (``batch``) or no division (``none``: Dr. GRPO).
    ``normalize_then_sum`` (GDPO): each reward is normalised within its group first,
    r̂_k = (r_k − mean_group) / (std_group + eps), summed with the weights, and the sum is normalised
    over the batch. One reward on a large scale (a length penalty in tokens) then cannot drown the others.

    >>> r = torch.tensor([[1.0, 0.0], [0.0, 10.0], [1.0, 20.0], [0.0, 30.0]])   # 2 groups of 2
    >>> [round(v, 3) for v in advantages(r, torch.tensor([1.0, 0.0]), 2).tolist()]
    [0.707, -0.707, 0.707, -0.707]
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    weights = weights.to(rewards.dtype)
    if aggregation == "normalize_then_sum":
        mean_k, std_k = _group_stats(rewards, group_size)
        normalised = ((rewards.view(-1, group_size, rewards.shape[1]) - mean_k) / (std_k + eps)).view_as(rewards)
        total = (normalised * weights).sum(-1)
        return (total - total.mean()) / (total.std() + eps)
    total = (rewards * weights).sum(-1)
    mean, std = _group_stats(total, group_size)
    centred = (total.view(-1, group_size) - mean).view(-1)
    if scale == "none":
        return centred
    if scale == "group":
        return centred / (std.expand(-1, group_size).reshape(-1) + eps)
    if scale == "batch":
        return centred / (total.std() + eps)
    raise ValueError(f"scale must be group, batch or none, got {scale!r}")
