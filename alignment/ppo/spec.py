"""The ``ppo:`` section of a PPO recipe: the loop's settings, read by the stage and by one step.

Its own module so that :mod:`.stage` (the recipe, ``validate``, ``run``), :mod:`.models` and
:mod:`.step` all import it from below instead of from each other.

    >>> spec = PPOSpec(batch_size=8, mini_batch_size=4)
    >>> spec.batch_size // spec.mini_batch_size, spec.precision in PRECISIONS
    (2, True)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from smolforge.recipe import FRACTION

PRECISIONS = ("auto", "fp32", "bf16")   # ppo.precision


@dataclass
class PPOSpec:
    steps: int = 100                  # PPO iterations (one rollout batch + its updates each)
    batch_size: int = 64              # prompts per rollout batch (per process), one completion each
    mini_batch_size: int = 16         # rollouts per optimizer step; must divide batch_size
    ppo_epochs: int = 4               # passes over each rollout batch
    learning_rate: float = 1.0e-5     # policy AdamW learning rate (constant)
    value_learning_rate: float | None = None  # value model's learning rate (None: learning_rate x 10)
    max_grad_norm: float = 1.0        # gradient-norm clip, applied to policy and value model separately
    kl_coef: float = 0.05             # β: weight of the per-token KL penalty against the reference
    kl_estimator: str = "k1"          # per-token KL: k1 (log π − log π_ref) or k3 (Schulman's, ≥ 0)
    target_kl: float | None = None    # adaptive β towards this per-sequence KL (None: fixed β)
    kl_horizon: int = 10000           # samples over which the adaptive β moves by up to 20 %
    gamma: float = 1.0                # discount of GAE
    lam: float = field(default=0.95, metadata=FRACTION)                # λ of GAE
    cliprange: float = 0.2            # ε of the clipped policy ratio
    cliprange_value: float = 0.2      # ε of the clipped value update
    whiten_rewards: bool = False      # scale per-token rewards to unit variance per batch
    missing_eos_penalty: float | None = 1.0  # subtracted from the score of completions without eos
    max_new_tokens: int = 24          # completion length cap during rollouts
    temperature: float = 1.0          # sampling temperature of rollouts (log-probs use it too)
    seed: int = 0                     # prompt order, sampling, and the held-out split (as GRPO's trainer.seed)
    precision: str = "auto"           # auto (bf16 on a CUDA GPU, fp32 on CPU), fp32 or bf16 (mixed precision)
    deepspeed: str | None = None      # DeepSpeed JSON (recipes/smollm3-3b/zero3.json), used when the launcher gave none
    gradient_checkpointing: bool = False  # recompute the policy's and value model's activations in backward
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata=FRACTION) # share of the card the rollout vLLM server reserves when it shares
    #                                           the GPU with training (vLLM alone would take 0.9)
