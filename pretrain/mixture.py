"""Staged data mixtures: which domain each packed row comes from, phase by phase.

A mixture is a list of phases, each covering training progress up to ``until`` (a fraction of
the steps) with weights over domains — the playbook's "broad data for 0–70 %, then raise
math/code". The sampler is deterministic in (seed, step) and its state is a few integers, so a
resumed run draws exactly the batches an uninterrupted one would. Every process builds the
same global batch and takes its own slice, so 1 process and N processes see the same data.

    >>> phases = [Phase(until=0.5, weights={"web": 1.0}), Phase(until=1.0, weights={"web": 0.5, "math": 0.5})]
    >>> sampler = MixtureSampler({"web": 10, "math": 4}, phases, total_steps=4, rows_per_step=2, seed=0)
    >>> [domain for domain, _ in sampler.next_batch(step=1)]
    ['web', 'web']
    >>> sorted(sampler.state_dict())
    ['cursors', 'epochs', 'realised']
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Phase:
    until: float = 1.0                                 # end of the phase, as a fraction of training steps
    weights: dict = field(default_factory=dict)        # domain → sampling weight (normalised)


def validate_phases(phases: list[Phase], domains: list[str]) -> list[str]:
    """Problems with a mixture, as messages (empty when it is usable)."""
    problems = []
    ends = [p.until for p in phases]
    if not phases:
        return ["mixture has no phases"]
    if ends != sorted(ends) or ends[-1] != 1.0 or any(e <= 0 for e in ends):
        problems.append(f"phase 'until' values must increase and end at 1.0, got {ends}")
    for i, phase in enumerate(phases):
        unknown = sorted(set(phase.weights) - set(domains))
        if unknown:
            problems.append(f"phase {i}: unknown domain(s) {', '.join(unknown)}; the data has {', '.join(sorted(domains))}")
        if any(w < 0 for w in phase.weights.values()) or sum(phase.weights.values()) <= 0:
            problems.append(f"phase {i}: weights must be >= 0 with a positive sum, got {phase.weights}")
    return problems


class MixtureSampler:
    """Draws ``rows_per_step`` (domain, row index) pairs per step.

    The domain of each row is drawn from the phase's weights with an RNG seeded by (seed, step),
    so it does not depend on history; within a domain rows are taken in a per-epoch seeded
    permutation, tracked by a cursor per domain (the only state).
    """

    def __init__(self, domain_sizes: dict[str, int], phases: list[Phase], total_steps: int,
                 rows_per_step: int, seed: int = 0) -> None:
        self.sizes = dict(domain_sizes)
        self.phases = phases
        self.total_steps = total_steps
        self.rows_per_step = rows_per_step
        self.seed = seed
        self.cursors = {d: 0 for d in self.sizes}
        self.epochs = {d: 0 for d in self.sizes}
        self.realised: dict[str, dict[str, int]] = {str(i): {} for i in range(len(phases))}
        self._orders: dict[str, tuple[int, np.ndarray]] = {}

    def phase_index(self, step: int) -> int:
        """Phase of 1-based ``step``: the first whose ``until`` covers step / total_steps."""
        progress = step / self.total_steps
        return next((i for i, p in enumerate(self.phases) if progress <= p.until + 1e-12), len(self.phases) - 1)

    def _order(self, domain: str) -> np.ndarray:
        epoch = self.epochs[domain]
        cached = self._orders.get(domain)
        if cached is None or cached[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch, sum(map(ord, domain))])
            cached = self._orders[domain] = (epoch, rng.permutation(self.sizes[domain]))
        return cached[1]

    def _take(self, domain: str) -> int:
        order = self._order(domain)
        index = int(order[self.cursors[domain]])
        self.cursors[domain] += 1
        if self.cursors[domain] == self.sizes[domain]:
            self.cursors[domain] = 0
            self.epochs[domain] += 1
        return index

    def next_batch(self, step: int) -> list[tuple[str, int]]:
        """The global batch of 1-based ``step``; advances the cursors."""
        phase = self.phase_index(step)
        weights = self.phases[phase].weights
        names = [d for d in weights if weights[d] > 0]
        probs = np.array([weights[d] for d in names], dtype=float)
        rng = np.random.default_rng([self.seed, step, 7])
        picks = rng.choice(len(names), size=self.rows_per_step, p=probs / probs.sum())
        counts = self.realised[str(phase)]
        batch = []
        for pick in picks:
            domain = names[int(pick)]
            counts[domain] = counts.get(domain, 0) + 1
            batch.append((domain, self._take(domain)))
        return batch

    def realised_mix(self) -> dict[str, dict[str, float]]:
        """Share of rows per domain actually drawn in each phase so far."""
        out = {}
        for phase, counts in self.realised.items():
            total = sum(counts.values())
            if total:
                out[phase] = {d: round(n / total, 4) for d, n in sorted(counts.items())}
        return out

    def state_dict(self) -> dict:
        return {"cursors": dict(self.cursors), "epochs": dict(self.epochs),
                "realised": {k: dict(v) for k, v in self.realised.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.cursors = dict(state["cursors"])
        self.epochs = dict(state["epochs"])
        self.realised = {k: dict(v) for k, v in state["realised"].items()}
        self._orders = {}
