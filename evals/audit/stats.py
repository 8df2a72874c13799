"""The eval audit's statistics: is a task monotonic, low-noise, above random and ranking-consistent?

Pure functions of score tables; :func:`~smolforge.evals.audit.evaluate.audit` fills the tables by scoring
checkpoints, :func:`summarize` turns them into the audit result.

**Statistics** for one task, on its primary metric. ``s[r][t]`` is run ``r``'s score at step ``t``;
``R`` the runs (seeds); ``C`` the steps every run has (common steps), ``t_0 < … < t_m``;
``mean_t = (1/|R|) Σ_r s[r][t]``.

- *monotonicity* ``= (1/|R'|) Σ_{r∈R'} ρ_r`` where ``ρ_r`` is Spearman's rank correlation of
  ``(t, s[r][t])`` over all steps of run ``r`` (Pearson correlation of average ranks, so ties
  share a rank), and ``R'`` the runs with at least 3 steps (n/a when there is none). A run whose
  score never changes has ``ρ_r = 0`` (no trend).
- *noise* ``= (1/|C|) Σ_{t∈C} std_r(s[r][t])``, the sample standard deviation across seeds
  (``ddof = 1``); n/a with fewer than 2 runs.
- *margin* above random ``= mean_{t_m} − random``: the final mean score minus the task's
  random baseline (``SuiteTask.random_baseline``).
- *signal-to-noise* ``= (mean_{t_m} − mean_{t_0}) / noise``: the improvement over the audited
  span in units of seed noise (``inf`` when noise is 0 and the score rose, 0 when it did not;
  n/a without noise or with a single common step).
- *ranking consistency* ``= (1/|P|) Σ_{(t_i, t_{i+1})∈P} τ_b(s[·][t_i], s[·][t_{i+1}])``: Kendall's
  τ_b between the orderings of the runs at each pair of consecutive common steps, averaged over
  the pairs ``P`` where τ_b is defined (a step at which every run scores the same has no
  ordering). 1: the runs keep their order from checkpoint to checkpoint; 0: it is reshuffled.
  It needs 2 runs and 2 common steps. For seeds of one recipe it says whether the differences
  between seeds persist; for ablation arms (different recipes) it is the playbook's property.

**Verdict** (:class:`Thresholds`; the playbook gives no numbers, these defaults are the ones
the audit was specified with): a task is *fit* for ablations when monotonicity ≥ 0.5, margin >
2 × noise and signal-to-noise ≥ 1 (and, only when ``min_ranking_consistency`` is set, ranking
consistency ≥ it; off by default because seeds of one recipe have no true order). A failed
criterion makes the task *unfit* and is named in ``reasons``; a criterion that could not be
checked (n/a) makes it *undecided* unless another failed. Without noise (one run) the margin
must still be > 0.

    >>> table = {"s0": {100: 0.30, 200: 0.45, 300: 0.60}, "s1": {100: 0.32, 200: 0.44, 300: 0.62}}
    >>> stats = task_statistics(table, random_baseline=0.25)
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Thresholds", "spearman", "kendall_tau", "task_statistics", "summarize"]


@dataclass
class Thresholds:
    """When a task is fit for ablations (see the module docstring for the statistics).

    >>> Thresholds().min_monotonicity, Thresholds(min_snr=2.0).min_snr
    (0.5, 2.0)
    """
    min_monotonicity: float = 0.5           # mean Spearman ρ of score vs step
    margin_noise_factor: float = 2.0        # final mean − random must exceed this × noise
    min_snr: float = 1.0                    # (final − first mean) / noise
    min_ranking_consistency: float | None = None  # mean Kendall τ_b across consecutive steps; None = report only


# -- rank statistics ---------------------------------------------------------------------------
def _average_ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's ρ: Pearson correlation of average ranks (ties share a rank).

    None with fewer than 3 points; 0.0 when either side is constant (no trend).

    >>> spearman([1, 2, 3, 4], [0.1, 0.2, 0.2, 0.5])
    0.9487
    >>> spearman([1, 2, 3], [0.5, 0.5, 0.5]), spearman([1, 2], [0.1, 0.2])
    (0.0, None)
    """
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} x values but {len(y)} y values")
    if len(x) < 3:
        return None
    rx, ry = _average_ranks(list(x)), _average_ranks(list(y))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return 0.0
    return round(sxy / math.sqrt(sxx * syy), 4)


def kendall_tau(x: list[float], y: list[float]) -> float | None:
    """Kendall's τ_b between two orderings of the same items (ties corrected).

    None when it is undefined: fewer than 2 items, or every item tied on one side.

    >>> kendall_tau([0.1, 0.2, 0.3], [0.2, 0.4, 0.9]), kendall_tau([0.1, 0.2, 0.3], [0.3, 0.2, 0.1])
    (1.0, -1.0)
    >>> kendall_tau([0.5, 0.5], [0.1, 0.2]) is None
    True
    """
    if len(x) != len(y):
        raise ValueError(f"kendall_tau: {len(x)} x values but {len(y)} y values")
    concordant = discordant = tied_x = tied_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                tied_x += 1
                tied_y += 1
            elif dx == 0:
                tied_x += 1
            elif dy == 0:
                tied_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    if denominator == 0:
        return None
    return round((concordant - discordant) / denominator, 4)


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


# -- one task ----------------------------------------------------------------------------------
@dataclass
class _Measures:
    """One task's numbers before the verdict (None where n/a)."""
    common: list[int]                          # steps every run has, sorted
    per_run: dict[str, float | None]           # Spearman ρ of each run
    monotonicity: float | None
    first: float | None                        # mean score at the first common step
    final: float | None                        # mean score at the last common step
    margin: float | None
    noise: float | None
    snr: float | None
    ranking: float | None


def _measure(scores: dict[str, dict[int, float]], random_baseline: float) -> _Measures:
    run_names = list(scores)
    common = sorted(set.intersection(*(set(s) for s in scores.values())))
    per_run = {r: spearman(sorted(s), [s[t] for t in sorted(s)]) for r, s in scores.items()}
    rhos = [rho for rho in per_run.values() if rho is not None]
    monotonicity = round(_mean(rhos), 4) if rhos else None
    means = [_mean([scores[r][t] for r in run_names]) for t in common]
    first = means[0] if means else None
    final = means[-1] if means else None
    margin = None if final is None else final - random_baseline
    noise = (_mean([_std([scores[r][t] for r in run_names]) for t in common])
             if len(run_names) >= 2 and common else None)
    snr = None
    if noise is not None and len(common) >= 2:
        rise = final - first
        snr = rise / noise if noise > 0 else (math.inf if rise > 0 else 0.0)
    taus = [kendall_tau([scores[r][a] for r in run_names], [scores[r][b] for r in run_names])
            for a, b in zip(common, common[1:])] if len(run_names) >= 2 else []
    defined = [tau for tau in taus if tau is not None]
    ranking = round(_mean(defined), 4) if defined else None
    return _Measures(common, per_run, monotonicity, first, final, margin, noise, snr, ranking)


def _judge(m: _Measures, th: Thresholds) -> tuple[list[str], list[str]]:
    """(failed criteria, criteria that could not be checked), in the order of the docstring."""
    reasons: list[str] = []
    unchecked: list[str] = []
    if m.monotonicity is None:
        unchecked.append("monotonicity n/a (fewer than 3 checkpoints per run)")
    elif m.monotonicity < th.min_monotonicity:
        reasons.append(f"monotonicity {m.monotonicity:.3f} < {th.min_monotonicity:g}")
    if m.margin is None:
        unchecked.append("margin n/a (the runs share no step)")
    elif m.noise is None:
        if m.margin <= 0:
            reasons.append(f"margin {m.margin:.3f} <= 0 (not above random)")
        unchecked.append("noise n/a (fewer than 2 runs): margin checked against 0 only")
    elif m.margin <= th.margin_noise_factor * m.noise:
        reasons.append(f"margin {m.margin:.3f} <= {th.margin_noise_factor:g} x noise {m.noise:.3f} "
                       f"(not clearly above random)")
    if m.snr is None:
        if m.noise is not None:
            unchecked.append("signal-to-noise n/a (the runs share fewer than 2 steps)")
        else:
            unchecked.append("signal-to-noise n/a (no noise estimate)")
    elif m.snr < th.min_snr:
        reasons.append(f"signal-to-noise {m.snr:.3f} < {th.min_snr:g}")
    if th.min_ranking_consistency is not None:
        if m.ranking is None:
            unchecked.append("ranking consistency n/a (needs 2 runs, 2 common steps, a defined order)")
        elif m.ranking < th.min_ranking_consistency:
            reasons.append(f"ranking consistency {m.ranking:.3f} < {th.min_ranking_consistency:g}")
    return reasons, unchecked


def task_statistics(scores: dict[str, dict[int, float]], random_baseline: float,
                    thresholds: Thresholds | None = None) -> dict[str, Any]:
    """The audit's statistics and verdict for one task from ``{run: {step: score}}``.

    Returns ``first``, ``final`` (mean scores at the first and last common step), ``margin``,
    ``noise``, ``snr``, ``monotonicity`` (and ``monotonicity_per_run``), ``ranking_consistency``
    (None where n/a), ``common_steps``, ``verdict`` (``fit`` / ``unfit`` / ``undecided``),
    ``fit`` (True / False / None), ``reasons`` (failed criteria) and ``unchecked`` (n/a ones).

    >>> flat = {"s0": {1: 0.40, 2: 0.30, 3: 0.35}, "s1": {1: 0.30, 2: 0.42, 3: 0.33}}
    >>> stats = task_statistics(flat, random_baseline=0.25)
    >>> stats["verdict"], stats["monotonicity_per_run"]
    ('unfit', {'s0': -0.5, 's1': 0.5})
    >>> for reason in stats["reasons"]: print(reason)
    monotonicity 0.000 < 0.5
    margin 0.090 <= 2 x noise 0.057 (not clearly above random)
    signal-to-noise -0.177 < 1
    """
    th = thresholds or Thresholds()
    if not scores or not all(scores.values()):
        raise ValueError("task_statistics needs at least one run with at least one scored step")
    m = _measure(scores, random_baseline)
    reasons, unchecked = _judge(m, th)
    verdict = "unfit" if reasons else ("undecided" if unchecked else "fit")
    return {"first": _round(m.first), "final": _round(m.final), "random": random_baseline,
            "margin": _round(m.margin), "noise": _round(m.noise),
            "snr": m.snr if m.snr is None or math.isinf(m.snr) else round(m.snr, 6),
            "monotonicity": m.monotonicity, "monotonicity_per_run": m.per_run,
            "ranking_consistency": m.ranking, "common_steps": m.common, "verdict": verdict,
            "fit": {"fit": True, "unfit": False}.get(verdict), "reasons": reasons, "unchecked": unchecked}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


# -- all tasks ---------------------------------------------------------------------------------
def _coverage_notes(scores: dict[str, dict[int, dict[str, float]]], common: list[int]) -> list[str]:
    """What the runs lack for a full audit: a second seed, 3 steps per run, shared steps."""
    notes: list[str] = []
    if len(scores) < 2:
        notes.append(f"{len(scores)} run: noise, signal-to-noise and ranking consistency are n/a; "
                     "audit at least 2 runs of the recipe with different seeds")
    for run, steps in scores.items():
        if len(steps) < 3:
            notes.append(f"run {run} has {len(steps)} scored step(s): its monotonicity is n/a "
                         "(needs 3; checkpoint more often or keep more checkpoints)")
    if len(scores) >= 2 and len(common) < max(len(s) for s in scores.values()):
        notes.append(f"the runs share {len(common)} step(s) ({', '.join(map(str, common)) or 'none'}): "
                     "noise, margin, signal-to-noise and ranking use those only")
    return notes


def summarize(scores: dict[str, dict[int, dict[str, float]]], random_baselines: dict[str, float],
              thresholds: Thresholds | None = None, *, suite: str = "", limit: int | None = None,
              metrics: dict[str, str] | None = None) -> dict[str, Any]:
    """The audit result from scores already at hand: ``{run: {step: {task: score}}}``.

    :func:`~smolforge.evals.audit.evaluate.audit` calls this after scoring;
    :func:`~smolforge.evals.audit.report.format_audit` prints what it returns.

    >>> scores = {"s0": {1: {"a": 0.3}, 2: {"a": 0.5}, 3: {"a": 0.7}}}
    >>> result = summarize(scores, {"a": 0.25}, suite="demo")
    >>> result["tasks"]["a"]["verdict"], result["fit"], result["notes"][0][:40]
    ('undecided', [], '1 run: noise, signal-to-noise and rankin')
    """
    th = thresholds or Thresholds()
    tasks = sorted(random_baselines)
    common = sorted(set.intersection(*(set(s) for s in scores.values()))) if scores else []
    per_task = {}
    for task in tasks:
        table = {run: {step: values[task] for step, values in steps.items() if task in values}
                 for run, steps in scores.items()}
        per_task[task] = {"metric": (metrics or {}).get(task),
                          **task_statistics(table, random_baselines[task], th)}
    return {"suite": suite, "limit": limit, "runs": list(scores), "thresholds": asdict(th),
            "steps": {run: sorted(steps) for run, steps in scores.items()}, "common_steps": common,
            "scores": {run: {str(step): dict(steps[step]) for step in sorted(steps)}
                       for run, steps in scores.items()},
            "tasks": per_task, "fit": [t for t in tasks if per_task[t]["verdict"] == "fit"],
            "notes": _coverage_notes(scores, common)}
