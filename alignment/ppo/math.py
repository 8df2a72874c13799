"""The arithmetic of PPO for language models, in plain torch: masks, whitening, KL, GAE, losses.

Every tensor is ``[B, T]`` over *response* tokens, right-padded; ``mask`` (bool or 0/1) marks the
valid ones, which are contiguous from position 0. Positions outside the mask may hold anything
(NaN and inf included): every function overwrites them with 0 before any arithmetic (never
multiplies by the mask, as NaN·0 is NaN), so they reach neither the values nor the gradients.
Nothing here knows about models or tokenizers, so each piece is tested alone
(tests/test_ppo_math.py) and :mod:`smolforge.alignment.ppo.step` only wires them.

    >>> import torch
    >>> mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    >>> score, kl = torch.tensor([1.0]), torch.zeros(1, 4)
    >>> rewards = token_rewards(score, kl, mask, kl_coef=0.1)
    >>> rewards.tolist()
    [[0.0, 0.0, 1.0, 0.0]]
    >>> advantages, returns = gae(rewards, torch.zeros(1, 4), mask, gamma=1.0, lam=1.0)
    >>> advantages.tolist()
    [[1.0, 1.0, 1.0, 0.0]]
"""
from __future__ import annotations

import math

import torch

__all__ = ["masked_mean", "masked_var", "masked_whiten", "gae", "per_token_kl", "token_rewards",
           "policy_loss", "value_loss", "KLController"]

KL_ESTIMATORS = ("k1", "k3")


def _mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(dtype=like.dtype, device=like.device)


def _valid(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with every position outside ``mask`` overwritten by 0 (its gradient there is 0 too).

    >>> _valid(torch.tensor([1.0, float("nan"), float("inf")]), torch.tensor([1, 0, 0])).tolist()
    [1.0, 0.0, 0.0]
    """
    return torch.where(mask.to(device=x.device, dtype=torch.bool), x, torch.zeros_like(x))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set: Σ x·m / Σ m (over ``dim``, or all).

    Positions outside the mask never contribute, even when they hold NaN or inf.

    >>> x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, 5.0, 7.0]])
    >>> m = torch.tensor([[1, 1, 0], [1, 1, 1]])
    >>> round(masked_mean(x, m).item(), 4), masked_mean(x, m, dim=1).tolist()
    (3.6, [1.5, 5.0])
    """
    m, x = _mask(mask, x), _valid(x, mask)
    if dim is None:
        return x.sum() / m.sum().clamp(min=1.0)
    return x.sum(dim) / m.sum(dim).clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over the mask: Σ (x − μ)²·m / (Σ m − 1) (Bessel-corrected, as ``torch.var``).

    >>> masked_var(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0])).item()
    2.0
    """
    centered = _valid(x - masked_mean(x, mask), mask)
    count = _mask(mask, x).sum()
    var = (centered ** 2).sum() / count.clamp(min=1.0)
    if unbiased and count > 1:
        var = var * count / (count - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x − μ) / sqrt(σ² + eps) with μ, σ² over the mask only; 0 outside the mask.

    With ``shift_mean=False`` the mean is added back: (x − μ)/σ + μ, i.e. only the scale is
    normalised (what PPO does to rewards, so their sign survives; advantages are fully whitened).

    >>> w = masked_whiten(torch.tensor([[1.0, 2.0, 3.0, 9.0]]), torch.tensor([[1, 1, 1, 0]]))
    >>> [round(v, 4) for v in w[0].tolist()]
    [-1.0, 0.0, 1.0, 0.0]
    """
    x = _valid(x, mask)  # before any arithmetic: a NaN pad would give NaN gradients through var
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return _valid(whitened, mask)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over token sequences: ``(advantages, returns)``, ``[B, T]``.

        δ_t = r_t + γ·V_{t+1} − V_t,   A_t = δ_t + γλ·A_{t+1},   R_t = A_t + V_t

    with V_{t+1} = A_{t+1} = 0 after the last valid token (the episode ends there: bootstrap 0).
    Rewards and values outside the mask are ignored; advantages and returns are 0 there. With
    γ = λ = 1, A_t = Σ_{k≥t} r_k − V_t (reward-to-go minus value).

    >>> r = torch.tensor([[0.0, 0.0, 1.0]]); v = torch.tensor([[0.5, 0.5, 0.5]])
    >>> a, ret = gae(r, v, torch.ones(1, 3), gamma=1.0, lam=1.0)
    >>> a.tolist(), ret.tolist()
    ([[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]])
    """
    rewards, values = _valid(rewards, mask), _valid(values.to(rewards.dtype), mask)
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    next_advantage = torch.zeros_like(next_value)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = _valid(delta + gamma * lam * next_advantage, mask[:, t])
        advantages[:, t] = advantage
        # a padded position passes zeros back, so the last valid token bootstraps from 0
        next_value, next_advantage = values[:, t], advantage
    return advantages, _valid(advantages + values, mask)


def per_token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from the log-probs of the sampled tokens.

    - ``k1`` = log π − log π_ref: unbiased, can be negative per token (what TRL's PPOTrainer used);
    - ``k3`` = exp(ρ) − 1 − ρ with ρ = log π_ref − log π (Schulman's estimator): unbiased, ≥ 0,
      lower variance when the policies are close.

    >>> lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    >>> per_token_kl(lp, ref, "k1").tolist()
    [0.5, -1.0]
    >>> [round(v, 4) for v in per_token_kl(lp, ref, "k3").tolist()]
    [0.1065, 0.7183]
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k3":
        ratio = ref_logprobs - logprobs
        return torch.expm1(ratio) - ratio
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {', '.join(KL_ESTIMATORS)}")


def last_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid position of each row (−1 for an empty row).

    >>> last_index(torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])).tolist()
    [1, 2, -1]
    """
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values


def token_rewards(score: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Per-token rewards: r_t = −β·KL_t on every response token, plus the sequence score on the last.

        r_t = −β·KL_t + [t = last valid] · score

    ``score`` is ``[B]`` (the reward functions' total for each completion). Positions outside
    the mask get 0; a row with no valid token gets nothing.

    >>> token_rewards(torch.tensor([2.0]), torch.tensor([[1.0, 1.0, 5.0]]),
    ...               torch.tensor([[1, 1, 0]]), kl_coef=0.5).tolist()
    [[-0.5, 1.5, 0.0]]
    """
    rewards = 0.0 - kl_coef * _valid(kl, mask)  # (0 − x, not −x: no −0.0 in the output)
    last = last_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] += score.to(rewards.dtype)[rows]
    return rewards


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, clip_range: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, token-averaged: ``(loss, clipfrac, approx_kl)``.

        ρ_t = exp(log π_t − log π_old,t)
        L = mean_t max(−A_t·ρ_t, −A_t·clip(ρ_t, 1 − ε, 1 + ε))

    ``clipfrac`` is the share of valid tokens where the clipped term is the larger (the gradient
    is cut there); ``approx_kl`` = mean ½(log ρ)², the diagnostic TRL logged.

    >>> lp = torch.log(torch.tensor([[1.5, 0.5]])); old = torch.zeros(1, 2)
    >>> loss, clipfrac, _ = policy_loss(lp, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), 0.2)
    >>> round(loss.item(), 4), clipfrac.item()
    (-0.2, 1.0)
    """
    log_ratio = _valid(logprobs - old_logprobs, mask)  # a pad's ratio is 1 and its gradient 0
    advantages = _valid(advantages, mask)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = masked_mean(torch.max(unclipped, clipped), mask)
    clipfrac = masked_mean((clipped > unclipped).float(), mask)
    approx_kl = 0.5 * masked_mean(log_ratio.detach() ** 2, mask)
    return loss, clipfrac.detach(), approx_kl


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip_range_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss, token-averaged: ``(loss, clipfrac)``.

        V_clip = V_old + clip(V − V_old, −ε, ε)
        L = ½ · mean_t max((V − R)², (V_clip − R)²)

    ``clipfrac`` is the share of valid tokens where the clipped error is the larger.

    >>> v, old, ret = torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]])
    >>> loss, clipfrac = value_loss(v, old, ret, torch.ones(1, 1), 0.2)
    >>> round(loss.item(), 4), clipfrac.item()
    (1.62, 1.0)
    """
    values, old_values, returns = _valid(values, mask), _valid(old_values, mask), _valid(returns, mask)
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range_value, clip_range_value)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(unclipped_error, clipped_error), mask)
    clipfrac = masked_mean((clipped_error > unclipped_error).float(), mask)
    return loss, clipfrac.detach()


class KLController:
    """The KL coefficient β: fixed, or adaptive towards ``target`` (Ziegler et al. 2019).

        e = clip(KL / target − 1, −0.2, 0.2),   β ← β · (1 + e · n / horizon)

    where KL is the measured per-sequence KL of the last batch and ``n`` the samples it held.

    >>> ctl = KLController(0.1, target=6.0, horizon=100)
    >>> ctl.update(12.0, n_samples=10); round(ctl.value, 4)
    0.102
    >>> fixed = KLController(0.1); fixed.update(50.0, 10); fixed.value
    0.1
    """

    def __init__(self, init: float, target: float | None = None, horizon: int = 10000) -> None:
        self.value = float(init)
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_samples: int) -> None:
        if self.target is None or not math.isfinite(current_kl):
            return
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_samples / self.horizon
