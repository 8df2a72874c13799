"""The divergences of knowledge distillation, on logits: what ``smolforge distill`` measures on held-out text.

With the student's distribution ``p_s`` and the teacher's ``p_t`` at each position (softmax of the logits
over ``temperature``), the generalized Jensen-Shannon divergence of Agarwal et al. (2024, "On-Policy
Distillation of Language Models", Eq. 1), in the convention TRL's DistillationTrainer trains with:

    m      = (1 - beta) * p_s + beta * p_t
    JSD_b  = beta * KL(p_t || m) + (1 - beta) * KL(p_s || m)

``beta = 0`` is the forward KL(p_t || p_s) (the student covers the teacher's mass), ``beta = 1`` the
reverse KL(p_s || p_t) (the student seeks the teacher's modes); in between a bounded mixture, 0.5 the
standard JSD. All three are 0 exactly where the two distributions agree.

    >>> import torch
    >>> same = torch.tensor([[[2.0, 0.0, -1.0]]])
    >>> [round(float(generalized_jsd(same, same, b).sum()), 6) for b in (0.0, 0.5, 1.0)]
    [0.0, 0.0, 0.0]
    >>> DIVERGENCES["forward_kl"], DIVERGENCES["jsd"], DIVERGENCES["reverse_kl"]
    (0.0, 0.5, 1.0)
"""
from __future__ import annotations

import math

import torch

__all__ = ["DIVERGENCES", "generalized_jsd", "masked_mean"]

DIVERGENCES = {"forward_kl": 0.0, "jsd": 0.5, "reverse_kl": 1.0}   # recipe name → beta


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per position, from log-probabilities over the last dimension."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                    temperature: float = 1.0) -> torch.Tensor:
    """``JSD_beta`` per position (shape of the logits without the vocabulary dimension), in nats."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be within [0, 1], got {beta}")
    log_s = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0.0:
        return _kl(log_t, log_s)
    if beta == 1.0:
        return _kl(log_s, log_t)
    log_m = torch.logaddexp(log_s + math.log(1.0 - beta), log_t + math.log(beta))
    return beta * _kl(log_t, log_m) + (1.0 - beta) * _kl(log_s, log_m)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``values`` where ``mask`` is 1 (0.0 when nothing is masked in).

    >>> masked_mean(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1, 1, 0]]))
    2.0
    """
    mask = mask.to(values.dtype)
    total = mask.sum()
    return float((values * mask).sum() / total) if total > 0 else 0.0
