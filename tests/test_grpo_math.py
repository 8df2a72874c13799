"""The GRPO loss family and reward aggregation (alignment/grpo_math.py): worked numbers by hand, then
TRL's GRPOTrainer loss (what smolforge's GRPO stage runs) held to the same formulas on hand-built tensors."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from smolforge.alignment.grpo_math import LOSS_TYPES, advantages, importance_ratio, policy_loss


def test_the_clipped_surrogate_by_hand():
    # one sequence, two tokens; r = e^0.5 ≈ 1.6487 and e^-0.5 ≈ 0.6065, A = +1:
    #   token 0: min(1.6487·1, clip→1.2·1) = 1.2 ; token 1: min(0.6065, clip→0.8) = 0.6065
    #   grpo: −(1.2 + 0.6065)/2 = −0.90327
    logps, old = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.5]])
    loss = policy_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 2), "grpo")
    assert loss.item() == pytest.approx(-(1.2 + math.exp(-0.5)) / 2, abs=1e-6)
    # A = −1: min(−1.6487, −1.2) = −1.6487 ; min(−0.6065, −0.8) = −0.8 → loss (1.6487 + 0.8)/2
    loss = policy_loss(logps, old, torch.tensor([-1.0]), torch.ones(1, 2), "grpo")
    assert loss.item() == pytest.approx((math.exp(0.5) + 0.8) / 2, abs=1e-6)


def test_the_aggregations_weigh_long_and_short_answers_differently():
    # two sequences at r = 1 (loss −A per token): lengths 1 and 3, advantages +1 and −1
    logps = torch.zeros(2, 4)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    by = {t: policy_loss(logps, logps, adv, mask, t, max_completion_length=4, batch_tokens=8).item() for t in LOSS_TYPES}
    assert by["grpo"] == pytest.approx((-1 + 1) / 2)          # each sequence's mean, then the mean: length-blind
    assert by["bnpo"] == pytest.approx((-1 + 3) / 4)          # every token counts once
    assert by["dr_grpo"] == pytest.approx((-1 + 3) / (2 * 4))  # a constant: B · max_completion_length
    assert by["dapo"] == pytest.approx((-1 + 3) / 8)          # the whole batch's tokens
    assert by["cispo"] == pytest.approx(0.0)                 # −sg(r)·A·log π with log π = 0


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    logps, old = torch.tensor([[0.0, -1.0, 5.0]]), torch.tensor([[0.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert importance_ratio(logps, old, mask, "sequence").item() == pytest.approx(math.exp(0.5))
    loss = policy_loss(logps, old, torch.tensor([1.0]), mask, "grpo", level="sequence")
    assert loss.item() == pytest.approx(-1.2)                 # e^0.5 > 1.2: clipped, for every token alike


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    """CISPO clips the weight, not the update: a token with r far above 1+ε still moves log π (the clipped
    surrogate gives it no gradient at all)."""
    logps = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-3.0]])                               # r = e^3 ≫ 1.2
    policy_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 1), "cispo", epsilon_high=5.0).backward()
    assert logps.grad.item() == pytest.approx(-5.0)           # −min(e^3, 5)·A
    logps.grad = None
    policy_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 1), "grpo").backward()
    assert logps.grad.item() == 0.0


def test_rewards_normalised_per_function_are_not_drowned_by_a_large_one():
    # 2 prompts × 3 answers; correctness 0/1 and a length penalty on a scale 100× larger
    rewards = torch.tensor([[1.0, -300.0], [0.0, -100.0], [0.0, -200.0],
                            [1.0, -150.0], [1.0, -50.0], [0.0, -250.0]])
    weights = torch.ones(2)
    summed = advantages(rewards, weights, 3, aggregation="sum_then_normalize")
    per_function = advantages(rewards, weights, 3, aggregation="normalize_then_sum")
    # summed first, the length penalty alone orders group 1: the only correct answer gets the lowest advantage
    assert summed[0] == summed[:3].min()
    # normalised first, correctness counts as much as length: the correct answer is no longer last
    assert per_function[0] > per_function[:3].min()
    # by hand for group 1, normalize_then_sum: correctness (1,0,0) → (2,−1,−1)/3 / std; std = 0.57735
    r = torch.tensor([1.0, 0.0, 0.0])
    norm = (r - r.mean()) / (r.std() + 1e-4)
    assert norm.tolist() == pytest.approx([1.1545, -0.5773, -0.5773], abs=1e-3)
    # Dr. GRPO's scale none: totals −299, −100, −200 minus their mean −199.667, not divided
    assert advantages(rewards, weights, 3, scale="none")[:3].tolist() == pytest.approx([-99.3333, 99.6667, -0.3333],
                                                                                        abs=1e-3)


# ------------------------------------------------------------------------- TRL's loss held to the formulas


def trl_loss(loss_type: str, logps, old, adv, mask, *, level: str = "token", epsilon_high: float = 0.2,
             max_completion_length: int = 4, batch_tokens: float | None = None) -> float:
    """TRL's ``GRPOTrainer._compute_loss`` on hand-built log-probs: the trainer's own code, with a stand-in
    ``self`` holding the settings a GRPOConfig gives it and a policy forward that returns ``logps``."""
    from trl import GRPOTrainer

    identity = lambda x, **_: x  # noqa: E731 - one process: gather and reduce return their input
    accelerator = SimpleNamespace(gather=identity, reduce=identity, gather_for_metrics=identity, num_processes=1,
                                  sync_gradients=True)
    args = SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1)
    metrics = {"train": __import__("collections").defaultdict(list)}
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=0.0, args=args, loss_type=loss_type, epsilon_low=0.2,
        epsilon_high=epsilon_high, use_vllm=False, vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=max_completion_length, accelerator=accelerator, _entropy_bonus_enabled=False,
        _metrics=metrics)
    count = mask.sum() if batch_tokens is None else torch.tensor(float(batch_tokens))
    inputs = {"prompt_ids": torch.zeros(logps.shape[0], 1, dtype=torch.long),
              "prompt_mask": torch.ones(logps.shape[0], 1, dtype=torch.long),
              "completion_ids": torch.zeros_like(mask, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": count}
    return GRPOTrainer._compute_loss(stand_in, None, inputs).item()


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_trls_grpo_loss_is_the_formula(loss_type, level):
    generator = torch.Generator().manual_seed(7)
    logps = -torch.rand(4, 5, generator=generator) * 3
    old = logps + (torch.rand(4, 5, generator=generator) - 0.5)          # ratios between e^-0.5 and e^0.5
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    adv = torch.tensor([1.5, -0.5, 0.7, -1.2])
    cap = 1.1 if loss_type == "cispo" else 0.28              # CISPO's ε_max; DAPO's raised upper clip otherwise
    ours = policy_loss(logps, old, adv, mask, loss_type, epsilon_high=cap, level=level, max_completion_length=6,
                       batch_tokens=17)
    theirs = trl_loss(loss_type, logps, old, adv, mask, level=level, epsilon_high=cap, max_completion_length=6,
                      batch_tokens=17)
    assert theirs == pytest.approx(ours.item(), abs=1e-6)
    assert abs(ours.item()) > 1e-3                           # a real figure, not two zeros agreeing
