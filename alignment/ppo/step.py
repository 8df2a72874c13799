"""One PPO iteration: rollout → score → advantages → update → metrics (steps 1-8 of the ppo stage).

:func:`step` reads as the algorithm; each phase is its own function:

- :func:`sample` (1): one completion per prompt from the policy (HF, or the vLLM server synced first);
- :func:`~smolforge.alignment.ppo.scoring.score` (2): rewards, minus the missing-eos penalty;
- :func:`make_rollout` + :func:`forward_rollout` (3): the batch as tensors, with the old and
  reference log-probs and the values, no gradients;
- :func:`advantages` (4-6): per-token rewards, optional reward scaling, GAE, whitened advantages;
- :func:`update` (7): ``ppo_epochs`` passes of :func:`minibatch_update`;
- :func:`step_metrics` (8): the numbers logged for the step, averaged over processes.

Imports torch at the top; :mod:`smolforge.alignment.ppo.stage` imports it inside its functions only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from smolforge.generation import prompts
from smolforge.generation.sampler import Sample

from . import math as pm
from .models import Models
from .scoring import Scores, score
from .spec import PPOSpec

__all__ = ["Rollout", "make_rollout", "token_logprobs", "sample", "forward_rollout", "advantages", "update",
           "minibatch_update", "step_metrics", "step"]


@dataclass
class Rollout:
    """One batch of sampled completions with everything the update needs, ``[B, R]`` tensors."""

    input_ids: Any                    # [B, Q+R] left-padded prompt + right-padded response
    attention_mask: Any
    position_ids: Any
    response_mask: Any                # [B, R] bool: response tokens up to and including eos
    response_ids: Any                 # [B, R]
    logprobs: Any = None              # of the sampled tokens under the policy that sampled them
    ref_logprobs: Any = None          # ... under the reference
    values: Any = None                # value of the state before each response token
    kl: Any = None                    # per-token KL estimate against the reference
    advantages: Any = None            # whitened GAE advantages
    returns: Any = None               # advantages + values (before whitening): the value targets

    @property
    def response_length(self) -> int:
        return int(self.response_ids.shape[1])

    def rows(self, index):
        return self.input_ids[index], self.attention_mask[index], self.position_ids[index]


def make_rollout(query_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int, device) -> Rollout:
    """Tensors for prompts (left-padded to a common start of the response) + completions (right-padded).

    >>> r = make_rollout([[5, 6], [7]], [[8, 2], [9]], pad_id=0, device="cpu")
    >>> r.input_ids.tolist(), r.response_mask.tolist(), r.position_ids.tolist()
    ([[5, 6, 8, 2], [0, 7, 9, 0]], [[True, True], [True, False]], [[0, 1, 2, 3], [0, 0, 1, 1]])
    """
    queries, query_mask = prompts.left_pad(query_ids, pad_id)
    width = max(1, max(len(c) for c in completion_ids))
    responses = torch.full((len(completion_ids), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(completion_ids), width), dtype=torch.bool)
    for i, ids in enumerate(completion_ids):
        if ids:
            responses[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_mask[i, :len(ids)] = True
    input_ids = torch.cat([queries, responses], dim=1)
    attention_mask = torch.cat([query_mask, response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return Rollout(input_ids.to(device), attention_mask.to(device), position_ids.to(device),
                   response_mask.to(device), responses.to(device))


def token_logprobs(logits, response_ids, temperature: float):
    """Log-probs of ``response_ids`` under ``logits / temperature`` (TRL's memory-light kernel)."""
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(logits, response_ids, temperature=temperature)


def sample(models: Models, spec: PPOSpec, rows: list[dict], rollouts=None) -> list[Sample]:
    """Step 1: one completion per prompt row; from the vLLM server (synced to the policy first) or HF."""
    from trl.models.utils import unwrap_model_for_generation

    from smolforge.generation.hf import HFSampler
    from smolforge.generation.rollouts import ServerSampler

    with unwrap_model_for_generation(models.model, models.accelerator) as unwrapped:
        if rollouts is not None:
            rollouts.sync(unwrapped.policy)
            sampler = ServerSampler(rollouts, models.tokenizer)
        else:
            sampler = HFSampler(unwrapped.policy, models.tokenizer)
        return sampler.sample([row["prompt"] for row in rows], max_new_tokens=spec.max_new_tokens,
                              temperature=spec.temperature)


def forward_rollout(models: Models, rollout: Rollout, spec: PPOSpec) -> None:
    """Step 3: old log-probs, reference log-probs and values into ``rollout``; no gradients, a minibatch at a time."""
    logprobs, ref_logprobs, values = [], [], []
    models.model.eval()
    with torch.no_grad():
        for start in range(0, rollout.input_ids.shape[0], spec.mini_batch_size):
            index = slice(start, start + spec.mini_batch_size)
            ids, mask, pos = rollout.rows(index)
            logits, value = models.model(ids, mask, pos, rollout.response_length)
            logprobs.append(token_logprobs(logits, rollout.response_ids[index], spec.temperature))
            values.append(value.float())
            ref_logits = models.ref(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                                    logits_to_keep=rollout.response_length + 1).logits[:, :-1]
            ref_logprobs.append(token_logprobs(ref_logits, rollout.response_ids[index], spec.temperature))
    models.model.train()
    rollout.logprobs, rollout.ref_logprobs = torch.cat(logprobs), torch.cat(ref_logprobs)
    rollout.values = torch.cat(values)


def advantages(rollout: Rollout, total: torch.Tensor, spec: PPOSpec, kl_coef: float) -> torch.Tensor:
    """Steps 4-6: KL, per-token rewards, GAE; sets ``rollout.kl/advantages/returns``, returns the raw advantages.

    Rewards are −β·KL_t per token plus the completion's score (``total``, ``[B]``) on the last
    one, optionally scaled to unit variance; advantages are whitened over the batch's valid
    tokens (the raw ones are logged).
    """
    mask = rollout.response_mask
    rollout.kl = pm.per_token_kl(rollout.logprobs, rollout.ref_logprobs, spec.kl_estimator)
    rewards = pm.token_rewards(total, rollout.kl, mask, kl_coef)
    if spec.whiten_rewards:
        rewards = pm.masked_whiten(rewards, mask, shift_mean=False)
    raw, rollout.returns = pm.gae(rewards, rollout.values, mask, spec.gamma, spec.lam)
    rollout.advantages = pm.masked_whiten(raw, mask)
    return raw


def minibatch_update(models: Models, rollout: Rollout, index, spec: PPOSpec) -> dict[str, float]:
    """One optimizer step on the rollouts at ``index``: clipped surrogate + clipped value loss; its numbers."""
    from trl.trainer.utils import entropy_from_logits

    accelerator = models.accelerator
    ids, attn, pos = rollout.rows(index)
    logits, values = models.model(ids, attn, pos, rollout.response_length)
    logprobs = token_logprobs(logits, rollout.response_ids[index], spec.temperature)
    mask = rollout.response_mask[index]
    pg_loss, clipfrac, approx_kl = pm.policy_loss(logprobs, rollout.logprobs[index], rollout.advantages[index],
                                                  mask, spec.cliprange)
    vf_loss, vf_clipfrac = pm.value_loss(values.float(), rollout.values[index], rollout.returns[index], mask,
                                         spec.cliprange_value)
    accelerator.backward(pg_loss + vf_loss)
    if accelerator.sync_gradients:  # policy and value model clipped separately
        unwrapped = accelerator.unwrap_model(models.model)
        accelerator.clip_grad_norm_(unwrapped.policy.parameters(), spec.max_grad_norm)
        accelerator.clip_grad_norm_(unwrapped.value_model.parameters(), spec.max_grad_norm)
    models.optimizer.step()
    models.optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        entropy = pm.masked_mean(entropy_from_logits(logits.detach() / spec.temperature), mask)
    return {key: float(value.detach()) for key, value in (
        ("policy_loss", pg_loss), ("value_loss", vf_loss), ("clipfrac", clipfrac),
        ("value_clipfrac", vf_clipfrac), ("approx_kl", approx_kl), ("entropy", entropy))}


def update(models: Models, rollout: Rollout, spec: PPOSpec, generator=None) -> dict[str, float]:
    """Step 7: ``ppo_epochs`` passes over shuffled minibatches; the mean of each loss and diagnostic."""
    totals: dict[str, float] = {}
    n_updates = 0
    batch = rollout.input_ids.shape[0]
    for _ in range(spec.ppo_epochs):
        order = torch.randperm(batch, generator=generator).to(models.accelerator.device)
        for start in range(0, batch, spec.mini_batch_size):
            for key, value in minibatch_update(models, rollout, order[start:start + spec.mini_batch_size],
                                               spec).items():
                totals[key] = totals.get(key, 0.0) + value
            n_updates += 1
    return {key: value / n_updates for key, value in totals.items()}


def step_metrics(accelerator, rollout: Rollout, scores: Scores, raw_advantages, losses: dict[str, float],
                 kl_coef: float) -> dict[str, float]:
    """Step 8: reward, KL, lengths, values and the update's numbers, averaged over processes."""
    mask = rollout.response_mask
    total = torch.tensor(scores.total, dtype=torch.float32)
    kl_per_sequence = torch.where(mask, rollout.kl, torch.zeros_like(rollout.kl)).sum(1)
    local = {
        "reward": total.mean(), "reward_std": total.std() if len(total) > 1 else torch.tensor(0.0),
        "kl": kl_per_sequence.mean(), "non_score_reward": -kl_coef * kl_per_sequence.mean(),
        "completion_length": mask.sum(1).float().mean(), "eos_frac": torch.tensor(scores.ended).float().mean(),
        "value_mean": pm.masked_mean(rollout.values, mask), "advantage_raw_mean": pm.masked_mean(raw_advantages, mask),
        **{key: torch.tensor(value) for key, value in losses.items()},
        **{f"rewards/{name}": torch.tensor(value) for name, value in scores.means.items()},
    }
    keys = list(local)
    stacked = torch.stack([torch.as_tensor(local[k], dtype=torch.float32).to(accelerator.device) for k in keys])
    reduced = accelerator.reduce(stacked, reduction="mean")
    metrics = {k: round(float(v), 6) for k, v in zip(keys, reduced.tolist())}
    metrics["kl_coef"] = kl_coef
    return metrics


def step(models: Models, spec: PPOSpec, rows: list[dict], reward_fns: list, kl_ctl,
         weights: list | None = None, rollouts=None, generator=None, *, watch=None, number: int = 0) -> dict:
    """One PPO iteration on ``rows`` (prompt rows): rollout → score → advantages → update; its metrics.

    ``spec`` is the recipe's :class:`~smolforge.alignment.ppo.spec.PPOSpec`; ``kl_ctl`` the β
    (:class:`~smolforge.alignment.ppo.math.KLController`), moved by this step's KL afterwards.
    ``watch`` (a :class:`~smolforge.alignment.logprob_parity.ParityWatch`, vLLM rollouts) compares the
    engine's log-probs of the sampled tokens with the policy's old log-probs of step ``number``.
    """
    accelerator, tokenizer = models.accelerator, models.tokenizer
    started = time.perf_counter()
    samples = sample(models, spec, rows, rollouts)
    generated = time.perf_counter()
    completion_ids = [s.token_ids for s in samples]
    scores = score(rows, [s.text for s in samples], completion_ids, reward_fns, weights, tokenizer,
                   models.policy, spec.missing_eos_penalty)
    total = torch.tensor(scores.total, dtype=torch.float32, device=accelerator.device)
    rollout = make_rollout(prompts.encode_prompts(tokenizer, [row["prompt"] for row in rows]), completion_ids,
                           prompts.pad_id(tokenizer), accelerator.device)
    forward_rollout(models, rollout, spec)
    parity = {}
    if watch is not None and samples and samples[0].logprobs is not None:
        from ..logprob_parity import gap_stats

        ours = [rollout.logprobs[i, :len(ids)].tolist() for i, ids in enumerate(completion_ids)]
        parity = watch.record(number, gap_stats(ours, [s.logprobs for s in samples]))
    raw_advantages = advantages(rollout, total, spec, kl_ctl.value)
    losses = update(models, rollout, spec, generator)
    metrics = step_metrics(accelerator, rollout, scores, raw_advantages, losses, kl_ctl.value)
    kl_ctl.update(metrics["kl"], len(rows) * accelerator.num_processes)
    metrics.update({key: float(f"{value:.4g}") for key, value in parity.items()})   # gaps of 1e-7 stay readable
    metrics["generate_s"] = round(generated - started, 3)
    metrics["step_s"] = round(time.perf_counter() - started, 3)
    return metrics
