"""Train/inference log-prob parity: the gap between what the inference engine (vLLM) says it sampled
with and what the trainer's policy gives the same tokens, measured on every rollout batch.

Online RL samples from an engine and trains a separate copy of the policy. When the two disagree
(a skipped weight sync, a kernel or dtype difference, top-p truncation) the samples are off-policy
and the importance ratio π_train/π_engine strays from 1: TRL issues #4772 and #6789 report such
blow-ups. Each rollout batch here yields the per-token |log π_train − log π_engine| on the sampled
tokens (mean, p99, max) and the spread of the ratio exp(log π_train − log π_engine); a
:class:`ParityWatch` logs them per step (``parity/…`` in metrics.jsonl, run.json, the Prometheus
exporter) and stops the run, or warns, when the mean gap passes ``max_gap``.

Where TRL drives vLLM itself (``use_vllm``: colocate or server mode on a GPU) TRL measures the same
gap and logs it as ``sampling/sampling_logp_difference/…`` and ``sampling/importance_sampling_ratio/…``;
:func:`parity_callback` reads those logs into the same ``parity/…`` figures, history and limit.

Both sides are log-probs at the sampling temperature: the engine's are vLLM's ``processed_logprobs``
(the rollout server runs so, as TRL's), the trainer's come from logits / temperature, as TRL and PPO
compute theirs. Top-p < 1 adds its truncation to the gap: the trainer does not truncate.

    >>> stats = gap_stats([[-1.0, -2.0]], [[-1.0, -2.5]])
    >>> stats["parity/logprob_gap_mean"], stats["parity/logprob_gap_max"]
    (0.25, 0.5)
    >>> round(stats["parity/is_ratio_max"], 4)                       # exp(0.5)
    1.6487
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smolforge.errors import RecipeError, RunError

__all__ = ["ParitySpec", "ParityWatch", "gap_stats", "policy_logprobs", "from_trl_logs", "parity_callback"]

log = logging.getLogger(__name__)

ACTIONS = ("stop", "warn")


@dataclass
class ParitySpec:
    """The recipe's ``parity:`` block (online RL with vLLM rollouts)."""

    max_gap: float = 0.05             # mean |log π_train − log π_engine| per token above which a step is flagged
    on_breach: str = "stop"           # stop: the run fails at that step, naming the gap; warn: logged only

    def check(self) -> None:
        if not (isinstance(self.max_gap, (int, float)) and self.max_gap > 0):
            raise RecipeError(f"parity.max_gap must be a positive number (nats per token), got {self.max_gap!r}")
        if self.on_breach not in ACTIONS:
            raise RecipeError(f"parity.on_breach must be one of {', '.join(ACTIONS)}, got {self.on_breach!r}")


def gap_stats(trainer_logprobs: Sequence[Sequence[float]], engine_logprobs: Sequence[Sequence[float]]) -> dict:
    """Per-token gap and importance-ratio figures over every sampled token both sides scored
    (tokens the engine gave no log-prob for, NaN, are left out)."""
    gaps: list[float] = []
    log_ratios: list[float] = []
    for ours, theirs in zip(trainer_logprobs, engine_logprobs):
        for a, b in zip(ours, theirs):
            if math.isnan(a) or math.isnan(b):
                continue
            gaps.append(abs(a - b))
            log_ratios.append(a - b)
    if not gaps:
        return {}
    ordered = sorted(gaps)
    ratios = [math.exp(min(r, 50.0)) for r in log_ratios]
    mean_ratio = sum(ratios) / len(ratios)
    return {"parity/logprob_gap_mean": sum(gaps) / len(gaps),
            "parity/logprob_gap_p99": ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)],
            "parity/logprob_gap_max": ordered[-1], "parity/is_ratio_min": min(ratios),
            "parity/is_ratio_max": max(ratios),
            "parity/is_ratio_std": math.sqrt(sum((r - mean_ratio) ** 2 for r in ratios) / len(ratios)),
            "parity/tokens": len(gaps)}


def policy_logprobs(model: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                    *, temperature: float = 1.0, batch_size: int = 32) -> list[list[float]]:
    """log π(token) of each completion token under ``model``'s logits / ``temperature`` (no gradient)."""
    import torch

    device = next(model.parameters()).device
    out: list[list[float]] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(prompt_ids), batch_size):
            rows = [list(p) + list(c) for p, c in zip(prompt_ids[start:start + batch_size],
                                                       completion_ids[start:start + batch_size])]
            width = max(len(r) for r in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
            mask = torch.zeros_like(ids)
            for i, row in enumerate(rows):
                ids[i, :len(row)] = torch.tensor(row, device=device)
                mask[i, :len(row)] = 1
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=mask).logits.float() / max(temperature, 1e-6)
            logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            for i, (p, c) in enumerate(zip(prompt_ids[start:start + batch_size], completion_ids[start:start + batch_size])):
                first = len(p) - 1          # the logit at position t predicts token t + 1
                out.append(logps[i, first:first + len(c)].tolist())
    finally:
        model.train(was_training)
    return out


class ParityWatch:
    """Measures each rollout batch and acts on a breach; ``history`` keeps one entry per measured step."""

    def __init__(self, spec: ParitySpec, stage: str) -> None:
        self.spec = spec
        self.stage = stage
        self.history: list[dict] = []

    def measure(self, step: int, model: Any, prompt_ids: Sequence[Sequence[int]],
                completion_ids: Sequence[Sequence[int]], engine_logprobs: Sequence[Sequence[float]], *,
                temperature: float = 1.0) -> dict:
        """The gap of one rollout batch, the policy's log-probs computed here."""
        return self.record(step, gap_stats(policy_logprobs(model, prompt_ids, completion_ids, temperature=temperature),
                                           engine_logprobs))

    def record(self, step: int, stats: dict) -> dict:
        """Keep ``stats`` (:func:`gap_stats`) of ``step`` and act on a breach."""
        if not stats:
            return stats
        self.history.append({"step": step, **stats})
        gap = stats["parity/logprob_gap_mean"]
        if gap > self.spec.max_gap:
            message = (f"{self.stage} step {step}: the inference engine and the trainer disagree on the sampled tokens "
                       f"by {gap:.4f} nats per token on average (max {stats.get('parity/logprob_gap_max', gap):.3f}; "
                       f"parity.max_gap {self.spec.max_gap}): the engine is not sampling from the policy being "
                       f"trained (a missed weight sync, or a dtype/kernel mismatch)")
            if self.spec.on_breach == "stop":
                raise RunError(message)
            log.warning("%s", message)
        return stats

    def summary(self) -> dict:
        """run.json figures: the worst and the last step's mean gap, and how many steps breached."""
        if not self.history:
            return {}
        gaps = [h["parity/logprob_gap_mean"] for h in self.history]
        def figure(value: float) -> float:
            return float(f"{value:.4g}")       # four significant figures: a gap of 1e-7 is not rounded to 0

        return {"parity/logprob_gap_mean_last": figure(gaps[-1]), "parity/logprob_gap_mean_worst": figure(max(gaps)),
                "parity/logprob_gap_p99_worst": figure(max(h["parity/logprob_gap_p99"] for h in self.history)),
                "parity/steps_measured": len(gaps),
                "parity/steps_over_max_gap": sum(g > self.spec.max_gap for g in gaps)}


TRL_KEYS = {"sampling/sampling_logp_difference/mean": "parity/logprob_gap_mean",
            "sampling/sampling_logp_difference/max": "parity/logprob_gap_max",
            "sampling/importance_sampling_ratio/min": "parity/is_ratio_min",
            "sampling/importance_sampling_ratio/max": "parity/is_ratio_max"}


def from_trl_logs(logs: dict) -> dict:
    """TRL's own gap figures of a logged step as ``parity/…`` ones (TRL logs no p99: its max stands in).

    >>> from_trl_logs({"sampling/sampling_logp_difference/mean": 0.02, "sampling/sampling_logp_difference/max": 0.4})
    {'parity/logprob_gap_mean': 0.02, 'parity/logprob_gap_max': 0.4, 'parity/logprob_gap_p99': 0.4}
    >>> from_trl_logs({"loss": 0.1})
    {}
    """
    stats = {ours: float(logs[theirs]) for theirs, ours in TRL_KEYS.items() if theirs in logs}
    if "parity/logprob_gap_mean" not in stats:
        return {}
    stats.setdefault("parity/logprob_gap_p99", stats.get("parity/logprob_gap_max", stats["parity/logprob_gap_mean"]))
    return stats


def parity_callback(watch: ParityWatch):
    """A TrainerCallback feeding TRL's logged gap (its vLLM modes) to ``watch``: kept in the history,
    and a breach stops the run or is logged, as for smolforge's own rollouts."""
    from transformers import TrainerCallback

    class ParityFromTRL(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            stats = from_trl_logs(logs or {})
            if stats:
                watch.record(state.global_step, stats)

    return ParityFromTRL()
