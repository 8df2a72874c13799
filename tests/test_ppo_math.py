"""PPO's arithmetic, checked against numbers worked by hand (alignment/ppo/math.py)."""
from __future__ import annotations

import math

import pytest
import torch

from smolforge.alignment.ppo.math import (KLController, gae, masked_mean, masked_whiten, per_token_kl, policy_loss,
                                    token_rewards, value_loss)


def close(tensor, expected, tol=1e-5):
    return torch.allclose(tensor.float(), torch.tensor(expected, dtype=torch.float32), atol=tol)


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    # rewards 0.1, 0.2, 1.0 (score on the last token), values 0.5, 0.4, 0.3:
    # reward-to-go = 1.3, 1.2, 1.0  →  advantages = 1.3-0.5, 1.2-0.4, 1.0-0.3 = 0.8, 0.8, 0.7
    # returns = advantages + values = reward-to-go = 1.3, 1.2, 1.0
    rewards = torch.tensor([[0.1, 0.2, 1.0]])
    values = torch.tensor([[0.5, 0.4, 0.3]])
    advantages, returns = gae(rewards, values, torch.ones(1, 3, dtype=torch.bool), gamma=1.0, lam=1.0)
    assert close(advantages, [[0.8, 0.8, 0.7]])
    assert close(returns, [[1.3, 1.2, 1.0]])


def test_gae_by_hand_with_discount_and_lambda():
    # gamma = 0.9, lam = 0.95, so gamma*lam = 0.855; rewards r = [0, 0, 1], values V = [0.5, 0.6, 0.7],
    # and V after the last token is 0 (the episode ends there):
    #   delta_2 = 1   + 0.9*0   - 0.7 = 0.3                    A_2 = 0.3
    #   delta_1 = 0   + 0.9*0.7 - 0.6 = 0.03                   A_1 = 0.03 + 0.855*0.3     = 0.2865
    #   delta_0 = 0   + 0.9*0.6 - 0.5 = 0.04                   A_0 = 0.04 + 0.855*0.2865  = 0.2849575
    # returns R_t = A_t + V_t = 0.7849575, 0.8865, 1.0
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    advantages, returns = gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.95)
    assert close(advantages, [[0.2849575, 0.2865, 0.3]])
    assert close(returns, [[0.7849575, 0.8865, 1.0]])


def test_gae_ignores_padding_and_bootstraps_zero_after_the_last_token():
    # Row 0 is the 3-token example above followed by one pad, whose reward (5) and value (9) are
    # garbage; row 1 is 4 valid tokens. The padded row must give the same numbers as unpadded.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0], [0.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.95)
    assert close(advantages[0], [0.2849575, 0.2865, 0.3, 0.0])
    assert close(returns[0], [0.7849575, 0.8865, 1.0, 0.0])
    # row 1, values 0: A_t = (gamma*lam)^(3-t) * 2 = 2*0.855^3, 2*0.855^2, 2*0.855, 2
    assert close(advantages[1], [2 * 0.855 ** 3, 2 * 0.855 ** 2, 2 * 0.855, 2.0])


def test_whitening_uses_only_the_masked_positions():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -50.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    out = masked_whiten(x, mask)
    valid = out[mask]
    assert abs(valid.mean().item()) < 1e-6
    assert abs(valid.std().item() - 1.0) < 1e-4       # torch.std is Bessel-corrected, like masked_var
    assert (out[~mask] == 0).all()                     # the padded 100 / -50 / nan never leak in
    # shift_mean=False keeps the mean: (x - mu)/sigma + mu
    kept = masked_whiten(x, mask, shift_mean=False)[mask]
    assert abs(kept.mean().item() - x[mask].mean().item()) < 1e-5
    assert masked_mean(x, mask).item() == pytest.approx(3.0)


def test_kl_estimators_by_hand_and_k3_is_never_negative():
    logprobs = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    # k1 = logp - logp_ref
    assert close(per_token_kl(logprobs, ref, "k1"), [0.5, -1.0, 0.0])
    # k3 = exp(r) - 1 - r, r = logp_ref - logp = -0.5, 1.0, 0
    expected = [math.exp(-0.5) - 1 + 0.5, math.e - 1 - 1, 0.0]
    assert close(per_token_kl(logprobs, ref, "k3"), expected)
    random_lp, random_ref = torch.randn(1000) * 3, torch.randn(1000) * 3
    assert (per_token_kl(random_lp, random_ref, "k3") >= 0).all()
    with pytest.raises(ValueError, match="k2"):
        per_token_kl(logprobs, ref, "k2")


def test_clipped_surrogate_with_positive_and_negative_advantages():
    eps = 0.2
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1]])
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]])
    old = torch.zeros(1, 5)
    # per token: max(-A*r, -A*clip(r, 0.8, 1.2))
    #   r=1.5, A=+1: max(-1.5, -1.2) = -1.2   clipped (no push past 1+eps)
    #   r=0.5, A=+1: max(-0.5, -0.8) = -0.5   not clipped (still gets the gradient up)
    #   r=1.5, A=-1: max( 1.5,  1.2) =  1.5   not clipped (pulled back down)
    #   r=0.5, A=-1: max( 0.5,  0.8) =  0.8   clipped (no push below 1-eps)
    #   r=1.1, A=+1: max(-1.1, -1.1) = -1.1   inside the range
    # mean = (-1.2 - 0.5 + 1.5 + 0.8 - 1.1) / 5 = -0.1; clipfrac = 2/5
    loss, clipfrac, approx_kl = policy_loss(torch.log(ratios), old, advantages, torch.ones(1, 5), eps)
    assert loss.item() == pytest.approx(-0.1, abs=1e-6)
    assert clipfrac.item() == pytest.approx(0.4)
    assert approx_kl.item() == pytest.approx(0.5 * (torch.log(ratios) ** 2).mean().item())
    # padding: a masked token with a huge ratio changes neither the loss nor clipfrac
    padded_ratios = torch.cat([ratios, torch.tensor([[50.0]])], dim=1)
    padded_adv = torch.cat([advantages, torch.tensor([[3.0]])], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    loss2, clipfrac2, _ = policy_loss(torch.log(padded_ratios), torch.zeros(1, 6), padded_adv, mask, eps)
    assert loss2.item() == pytest.approx(-0.1, abs=1e-6) and clipfrac2.item() == pytest.approx(0.4)


def test_policy_loss_gradient_is_cut_only_where_clipped():
    log_ratio = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_()
    loss, _, _ = policy_loss(log_ratio, torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), 0.2)
    loss.backward()
    # clipped token (ratio 1.5, A>0): no gradient; unclipped one: d/dlogr of -r/2 = -r/2 = -0.25
    assert close(log_ratio.grad, [[0.0, -0.25]])


def test_value_loss_clips_around_the_old_value():
    eps = 0.2
    values = torch.tensor([[1.0, 0.1, -1.0]])
    old = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    # token 0: v moved +1 towards R=2: clipped v = 0.2, errors (1-2)^2=1 vs (0.2-2)^2=3.24 → 3.24, clipped
    # token 1: v moved +0.1 (inside eps): both errors (0.1-1)^2 = 0.81, not clipped
    # token 2: v moved -1 away from R=0: clipped v = -0.2, errors 1 vs 0.04 → 1, not clipped
    # loss = 0.5 * (3.24 + 0.81 + 1) / 3 = 0.841666...; clipfrac = 1/3
    loss, clipfrac = value_loss(values, old, returns, torch.ones(1, 3), eps)
    assert loss.item() == pytest.approx(0.5 * (3.24 + 0.81 + 1.0) / 3, abs=1e-6)
    assert clipfrac.item() == pytest.approx(1 / 3)


def test_token_rewards_put_the_score_on_the_last_valid_token():
    score = torch.tensor([1.0, -2.0, 3.0])
    kl = torch.tensor([[0.2, 0.4, 0.6, 0.8], [1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    rewards = token_rewards(score, kl, mask, kl_coef=0.5)
    # row 0: -0.5*KL on tokens 0,1; the score 1.0 lands on token 1 (the last valid), pads get 0
    assert close(rewards[0], [-0.1, -0.2 + 1.0, 0.0, 0.0])
    assert close(rewards[1], [-0.5, -0.5, -0.5, -0.5 - 2.0])
    assert close(rewards[2], [0.0, 0.0, 0.0, 0.0])     # an empty response gets nothing
    assert close(token_rewards(score, kl, mask, kl_coef=0.0)[0], [0.0, 1.0, 0.0, 0.0])


def test_adaptive_kl_controller_moves_towards_the_target():
    ctl = KLController(0.1, target=1.0, horizon=100)
    ctl.update(10.0, n_samples=50)                      # far above target: error clipped to +0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 50 / 100))
    ctl.update(0.0, n_samples=50)                       # below target: error -0.2
    assert ctl.value == pytest.approx(0.11 * (1 - 0.2 * 50 / 100))


NAN, INF = float("nan"), float("inf")


def test_gae_is_unchanged_by_nan_or_inf_in_padded_slots():
    # The hand-worked row of test_gae_by_hand_with_discount_and_lambda plus one pad holding garbage:
    # a NaN reward and an inf value (row 0), an inf reward and a NaN value (row 1). Padded slots are
    # not part of the episode, so both rows give A = 0.2849575, 0.2865, 0.3 and R = A + V, 0 on the pad.
    rewards = torch.tensor([[0.0, 0.0, 1.0, NAN], [0.0, 0.0, 1.0, INF]])
    values = torch.tensor([[0.5, 0.6, 0.7, INF], [0.5, 0.6, 0.7, NAN]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.95)
    for row in range(2):
        assert close(advantages[row], [0.2849575, 0.2865, 0.3, 0.0])
        assert close(returns[row], [0.7849575, 0.8865, 1.0, 0.0])


def test_token_rewards_are_zero_on_padded_slots_even_when_the_kl_there_is_nan_or_inf():
    # beta = 0.5, score 1 on the last valid token (token 1): -0.5*0.2 = -0.1, -0.5*0.4 + 1 = 0.8; pads 0
    kl = torch.tensor([[0.2, 0.4, NAN, INF], [0.2, 0.4, -INF, NAN]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    rewards = token_rewards(torch.tensor([1.0, 1.0]), kl, mask, kl_coef=0.5)
    assert close(rewards, [[-0.1, 0.8, 0.0, 0.0], [-0.1, 0.8, 0.0, 0.0]])


def test_losses_and_their_gradients_ignore_nan_and_inf_in_padded_slots():
    # test_clipped_surrogate's five tokens (loss -0.1, clipfrac 0.4) plus a pad whose log-prob is
    # inf or NaN and whose advantage is NaN. Forward and backward must not see the pad: the loss
    # is -0.1 and d loss / d log-prob = -A*r/5 where unclipped (-0.1, 0.3, -0.22 at tokens 1, 2, 4;
    # token 4 sits on the clip edge's inside, both branches agree), 0 where clipped (tokens 0, 3) and on the pad.
    ratios = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1])
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, NAN]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    for pad in (INF, NAN):
        logprobs = torch.cat([torch.log(ratios), torch.tensor([pad])])[None].requires_grad_()
        loss, clipfrac, approx_kl = policy_loss(logprobs, torch.zeros(1, 6), advantages, mask, 0.2)
        loss.backward()
        assert loss.item() == pytest.approx(-0.1, abs=1e-6) and clipfrac.item() == pytest.approx(0.4)
        assert math.isfinite(approx_kl.item())
        assert close(logprobs.grad, [[0.0, -0.5 / 5, 1.5 / 5, 0.0, -1.1 / 5, 0.0]])
    # test_value_loss's three tokens (loss 0.841666…) plus a pad with an inf / NaN value and return.
    # Gradient: 0.5 * 2 * (V - R) / 3 where unclipped (token 1: -0.3,
    # token 2: -1/3), 0 where clipped (token 0) and on the pad.
    for pad in (INF, NAN):
        values = torch.tensor([[1.0, 0.1, -1.0, pad]], requires_grad=True)
        loss, clipfrac = value_loss(values, torch.zeros(1, 4), torch.tensor([[2.0, 1.0, 0.0, pad]]),
                                    torch.tensor([[1, 1, 1, 0]]), 0.2)
        loss.backward()
        assert loss.item() == pytest.approx(0.5 * (3.24 + 0.81 + 1.0) / 3, abs=1e-6)
        assert clipfrac.item() == pytest.approx(1 / 3)
        assert close(values.grad, [[0.0, -0.9 / 3, -1.0 / 3, 0.0]])


def test_whitening_gradient_ignores_nan_in_padded_slots():
    # whiten [1, 2, 3 | pad]: mean 2, var 1 → (-1, 0, 1); d Σ w·c / d x with c = (1, 0, 0) is
    # (1 - 1/3 - (-1)·(-1)/2, -1/3 - (-1)·0/2, -1/3 - (-1)·1/2) = (1/6, -1/3, 1/6), 0 on the pad
    x = torch.tensor([[1.0, 2.0, 3.0, NAN]], requires_grad=True)
    whitened = masked_whiten(x, torch.tensor([[1, 1, 1, 0]], dtype=torch.bool), eps=0.0)
    assert close(whitened, [[-1.0, 0.0, 1.0, 0.0]])
    (whitened * torch.tensor([[1.0, 0.0, 0.0, 0.0]])).sum().backward()
    assert close(x.grad, [[1 / 6, -1 / 3, 1 / 6, 0.0]])
