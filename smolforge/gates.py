"""Promotion gates: pure comparisons of a run's metrics (run.json) against rules.

A gate names one metric and one or more rules::

    {metric: instruct/exact_match, against: parent, max_drop: 0.01}   # may fall at most 0.01
    {metric: redteam/jailbreak/attack_success, max: 0.2}              # absolute ceiling
    {metric: facts/acc, min: 0.5}                                      # absolute floor
    {metric: redteam/jailbreak/attack_success, against: sft-demo, max_rise: 0.05}

``against`` is ``parent`` (the nearest ancestor that has the metric, walking up the lineage
breadth-first in parent order) or a run name / folder. With ``against`` and neither ``max_drop``
nor ``max_rise``, the metric may not drop at all (``max_drop: 0``).

**Paired, noise-aware.** Where both runs have the metric's per-item scores (every scorer writes them
into ``eval/``, :mod:`smolforge.item_scores`), an ``against`` rule compares the runs item by item
(:mod:`smolforge.paired`): the change, its standard error by paired bootstrap, and a verdict at
``confidence`` (0.95 unless given): *pass* (within the tolerance with that confidence), *fail* (worse
beyond it with that confidence) or *inconclusive* (the suite cannot tell at its size), which counts as
``inconclusive: fail`` (the default), ``pass`` or ``rerun``: in a pipeline, where either run was
scored on fewer items than its suite holds (the eval recipe's ``limit``), both are scored on every item
and the gate decides again (:func:`rerun_with_more_items`); still inconclusive, or with no items to
add, it counts as fail. Without per-item scores (runs scored before they were
written, a metric no suite scores per item) the rule compares the two values, as before, and says so.

**Seeds.** Where a run is a seeds run (``--seeds``, a pipeline step's ``seeds:``; :mod:`smolforge.seeds`),
its value is the mean over the seeds and the spread decides instead: an ``against`` rule judges the
difference of the means with its standard error (a single run on the other side is given the seeds'
sd), ``min``/``max`` judge the mean's own interval, each at ``confidence`` with the same pass / fail /
inconclusive verdicts. Gates sit on pipeline steps
(see :mod:`smolforge.pipeline`); a failing gate fails the step. A metric the run does not have
is a failing gate whose message lists the metrics that do exist.

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> with runs.start("sft", "sft-a", recipe={}) as a:
    ...     a.finish(metrics={"instruct/exact_match": 0.708})
    >>> with runs.start("dpo", "dpo-a", recipe={}, parents=[a]) as b:
    ...     b.finish(metrics={"instruct/exact_match": 0.65})
    >>> gates = parse_gates([{"metric": "instruct/exact_match", "against": "parent", "max_drop": 0.01}])
    >>> [r.message for r in check_gates(b, runs, gates)]
    ['gate failed: instruct/exact_match 0.650 < parent sft-a 0.708 - 0.010 (unpaired)']
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError, RunError
from smolforge.item_scores import item_scores, scored_by
from smolforge.paired import compare
from smolforge.recipe import check_keys
from smolforge.runs import Run, Runs
from smolforge.seeds import check_bound, compare_seed_pairs, compare_spreads, metric_spread, read_seeds, seed_pairs

__all__ = ["GATE_KEYS", "Gate", "GateResult", "parse_gates", "check_gates", "failures", "rerun_with_more_items"]

GATE_KEYS = ("metric", "against", "max_drop", "max_rise", "min", "max", "confidence", "inconclusive")
INCONCLUSIVE = ("fail", "pass", "rerun")
_EPS = 1e-9  # float slack so 0.698 passes ">= 0.708 - 0.010"


@dataclasses.dataclass(frozen=True)
class Gate:
    """One gate: a metric and its rules (at least one of against/min/max)."""

    metric: str
    against: str | None = None       # "parent" or a run name/folder
    max_drop: float | None = None    # with against: value >= reference - max_drop
    max_rise: float | None = None    # with against: value <= reference + max_rise
    min: float | None = None         # value >= min
    max: float | None = None         # value <= max
    confidence: float | None = None  # paired and seed verdicts' confidence (0.95 when unset)
    inconclusive: str | None = None  # what a paired or seed "inconclusive" counts as: fail (unset) | pass |
                                     # rerun (a pipeline scores both runs on every item, then decides; else fail)

    def describe(self) -> str:
        """The rule in words.

        >>> Gate("facts/acc", against="parent", max_drop=0.01, min=0.3).describe()
        'facts/acc >= parent - 0.01, >= 0.3'
        """
        parts = []
        if self.against is not None:
            if self.max_drop is not None:
                parts.append(f">= {self.against} - {self.max_drop:g}")
            if self.max_rise is not None:
                parts.append(f"<= {self.against} + {self.max_rise:g}")
        if self.min is not None:
            parts.append(f">= {self.min:g}")
        if self.max is not None:
            parts.append(f"<= {self.max:g}")
        return f"{self.metric} " + ", ".join(parts)

    def to_dict(self) -> dict:
        """The spec with unset rules left out (the YAML form).

        >>> Gate("x/acc", max=0.2).to_dict()
        {'metric': 'x/acc', 'max': 0.2}
        """
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass
class GateResult:
    """The verdict of one gate on one run."""

    gate: Gate
    passed: bool
    message: str                         # "gate passed: ..." / "gate failed: ..."
    value: float | None = None           # the run's value of the metric (None if missing)
    reference: float | None = None       # the compared run's value (gates with against)
    reference_run: str | None = None     # the compared run's name
    paired: list = dataclasses.field(default_factory=list)   # PairedResult.to_dict() of each paired rule

    def to_dict(self) -> dict:
        """JSON-ready form (for the pipeline summary and gates.json).

        >>> GateResult(Gate("a/acc", max=1.0), True, "gate passed: a/acc 0.5 <= max 1.000", 0.5).to_dict()["passed"]
        True
        """
        return {"gate": self.gate.to_dict(), "rule": self.gate.describe(), "passed": self.passed,
                "message": self.message, "value": self.value, "reference": self.reference,
                "reference_run": self.reference_run, "paired": self.paired}


# --------------------------------------------------------------------------- parsing


def _number(spec: dict, key: str, where: str) -> float | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecipeError(f"{where}: '{key}' must be a number, got {spec.get(key)!r}")
    return float(value)


def _parse_one(spec: Any, where: str) -> Gate:
    if not isinstance(spec, dict):
        raise RecipeError(
            f"{where} must be a mapping like {{metric: task/metric, against: parent, max_drop: 0.01}}, "
            f"got {spec!r}"
        )
    check_keys(spec, GATE_KEYS, where, f"a gate takes: {', '.join(GATE_KEYS)}")
    metric = spec.get("metric")
    if not isinstance(metric, str) or not metric.strip():
        raise RecipeError(f"{where}: 'metric' must name a run.json metric, e.g. instruct/exact_match")
    against = spec.get("against")
    if against is not None and (not isinstance(against, str) or not against.strip()):
        raise RecipeError(f"{where}: 'against' must be 'parent' or a run name, got {against!r}")
    nums = {k: _number(spec, k, where) for k in ("max_drop", "max_rise", "min", "max")}
    for key in ("max_drop", "max_rise"):
        if nums[key] is not None:
            if against is None:
                raise RecipeError(f"{where}: '{key}' needs 'against' (parent or a run name)")
            if nums[key] < 0:
                raise RecipeError(f"{where}: '{key}' must be >= 0, got {nums[key]:g}")
    if against is None and nums["min"] is None and nums["max"] is None:
        raise RecipeError(f"{where}: gate on '{metric}' has no rule; give against (+ max_drop), min or max")
    if nums["min"] is not None and nums["max"] is not None and nums["min"] > nums["max"]:
        raise RecipeError(f"{where}: min {nums['min']:g} is above max {nums['max']:g}")
    if against is not None and nums["max_drop"] is None and nums["max_rise"] is None:
        nums["max_drop"] = 0.0
    confidence = _number(spec, "confidence", where)
    if confidence is not None and not 0.5 < confidence < 1:
        raise RecipeError(f"{where}: 'confidence' must be between 0.5 and 1 (e.g. 0.95), got {confidence:g}")
    inconclusive = spec.get("inconclusive")
    if inconclusive is not None and inconclusive not in INCONCLUSIVE:
        raise RecipeError(f"{where}: 'inconclusive' must be one of {', '.join(INCONCLUSIVE)}, got {inconclusive!r}")
    return Gate(metric=metric.strip(), against=None if against is None else against.strip(), **nums,
                confidence=confidence, inconclusive=inconclusive)


def parse_gates(specs: Any, source: str = "gates") -> list[Gate]:
    """Validate a list of gate specs (dicts, as in YAML) into :class:`Gate` objects.

    Raises RecipeError naming the gate and the key for anything that cannot work.

    >>> parse_gates([{"metric": "facts/acc", "min": 0.5}])
    [Gate(metric='facts/acc', against=None, max_drop=None, max_rise=None, min=0.5, max=None, confidence=None, inconclusive=None)]
    >>> parse_gates([{"metric": "facts/acc", "max_dorp": 0.1}])
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: gates[1]: unknown key 'max_dorp' (did you mean 'max_drop'?)
    """
    if specs is None:
        return []
    if isinstance(specs, dict):
        specs = [specs]
    if not isinstance(specs, list):
        raise RecipeError(f"{source}: 'gates' must be a list of gates, got {specs!r}")
    return [_parse_one(spec, f"{source}[{n}]") for n, spec in enumerate(specs, start=1)]


# --------------------------------------------------------------------------- checking


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parents(run: Run) -> list[Run]:
    found = []
    for ref in run.parents:
        path = Path(ref).expanduser()
        path = path if path.is_absolute() else run.path.parent / ref
        try:
            found.append(Run(path))
        except RunError:
            continue  # a parent that is gone cannot be compared against
    return found


def _seeds_run_of(seed_run: Run, runs: Runs) -> Run | None:
    """The seeds run ``NAME`` that ``seed_run`` (``NAME-seedS``) is one seed of, or None."""
    match = re.fullmatch(r"(.+)-seed\d+", seed_run.name)
    if match is None or not runs.exists(match[1]):
        return None
    candidate = runs.get(match[1], require_done=False)
    record = read_seeds(candidate)
    return candidate if record and seed_run.name in record.get("runs", []) else None


def _nearest_with(run: Run, metric: str) -> tuple[Run | None, list[str]]:
    """Breadth-first up the lineage: the nearest ancestor holding ``metric``, and who was looked at.
    A seeds run's parents are its own seed runs: the walk starts above them."""
    seen = {run.path.resolve()}
    looked: list[str] = []
    frontier = [run]
    if read_seeds(run) is not None:
        frontier = _parents(run)
        seen |= {seed.path.resolve() for seed in frontier}
    while frontier:
        nxt = []
        for node in frontier:
            for parent in _parents(node):
                key = parent.path.resolve()
                if key in seen:
                    continue
                seen.add(key)
                looked.append(parent.name)
                if _is_number(parent.metrics.get(metric)):
                    return parent, looked
                nxt.append(parent)
        frontier = nxt
    return None, looked


def _missing_message(run: Run, metric: str, prefix: str = "gate failed: ") -> str:
    keys = sorted(run.metrics)
    close = difflib.get_close_matches(metric, keys, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?; " if close else ""
    shown = ", ".join(keys[:25]) + (", ..." if len(keys) > 25 else "") if keys else "none"
    return f"{prefix}run {run.name} has no metric '{metric}' ({hint}its metrics: {shown})"


def _check(run: Run, runs: Runs, gate: Gate) -> GateResult:
    value = run.metrics.get(gate.metric)
    if gate.metric not in run.metrics:
        return GateResult(gate, False, _missing_message(run, gate.metric))
    if not _is_number(value):
        return GateResult(gate, False, f"gate failed: {gate.metric} of run {run.name} is not a number ({value!r})")
    value = float(value)
    problems: list[str] = []
    passes: list[str] = []
    paired: list[dict] = []
    reference = ref_name = None
    spread = metric_spread(run, gate.metric)   # a seeds run: mean, sd and n over its seeds
    confidence = gate.confidence or 0.95

    def judged(result, what: str) -> None:   # a paired or seed verdict, as the gate counts it
        paired.append(result.to_dict())
        ok = result.verdict == "pass" or (result.verdict == "inconclusive" and gate.inconclusive == "pass")
        counted = {"pass": " (counted as pass)", "rerun": " (counted as fail until rerun on more items)"}.get(
            gate.inconclusive or "", " (counted as fail)") if result.verdict == "inconclusive" else ""
        (passes if ok else problems).append(f"{what}: {result.describe()}{counted}")

    if gate.against is not None:
        if gate.against == "parent":
            ref_run, looked = _nearest_with(run, gate.metric)
            if ref_run is not None and spread:   # seed chains: the parent of seed S is the seeds run's seed S
                ref_run = _seeds_run_of(ref_run, runs) or ref_run
            if ref_run is None:
                where = ", ".join(looked) if looked else "it has no parents"
                return GateResult(gate, False, f"gate failed: no ancestor of {run.name} has metric "
                                  f"'{gate.metric}' to compare against (looked at: {where})", value)
            label = f"parent {ref_run.name}"
        else:
            try:
                ref_run = runs.get(gate.against, require_done=False)
            except RunError as exc:
                return GateResult(gate, False, f"gate failed: {gate.metric}: {exc}", value)
            if not _is_number(ref_run.metrics.get(gate.metric)):
                prefix = f"gate failed: cannot compare against {ref_run.name}: "
                return GateResult(gate, False, _missing_message(ref_run, gate.metric, prefix),
                                  value, reference_run=ref_run.name)
            label = ref_run.name
        reference, ref_name = float(ref_run.metrics[gate.metric]), ref_run.name
        ref_spread = metric_spread(ref_run, gate.metric)
        pairs = None if spread or ref_spread else _pairs(run, ref_run, gate.metric)
        for key, higher_is_better, sign in (("max_drop", True, "-"), ("max_rise", False, "+")):
            tolerance = getattr(gate, key)
            if tolerance is None:
                continue
            what = f"{gate.metric} {value:.3f} against {label} {reference:.3f}"
            by_seed = seed_pairs(run, ref_run, gate.metric) if spread and ref_spread else None
            if by_seed is not None:    # seed-matched chains: the differences seed by seed
                judged(compare_seed_pairs(*by_seed, tolerance=tolerance, higher_is_better=higher_is_better,
                                          confidence=confidence), what)
                continue
            if spread or ref_spread:   # seeds on one side or both: the difference of means and its noise
                judged(compare_spreads(spread or {"mean": value, "sd": None, "n": 1},
                                       ref_spread or {"mean": reference, "sd": None, "n": 1}, tolerance=tolerance,
                                       higher_is_better=higher_is_better, confidence=confidence), what)
                continue
            if pairs is not None:
                judged(compare(pairs[0], pairs[1], tolerance=tolerance, higher_is_better=higher_is_better,
                               confidence=confidence), what)
                continue
            ok = value >= reference - tolerance - _EPS if higher_is_better else value <= reference + tolerance + _EPS
            relation = (">=" if ok else "<") if higher_is_better else ("<=" if ok else ">")
            (passes if ok else problems).append(
                f"{gate.metric} {value:.3f} {relation} {label} {reference:.3f} {sign} {tolerance:.3f} "
                "(unpaired)")
    for bound, at_least in ((gate.min, True), (gate.max, False)):
        if bound is not None and spread:
            judged(check_bound(spread, bound, at_least=at_least, confidence=confidence),
                   f"{gate.metric} {value:.3f} against {'min' if at_least else 'max'} {bound:.3f}")
    if gate.min is not None and not spread:
        ok = value >= gate.min - _EPS
        (passes if ok else problems).append(f"{gate.metric} {value:.3f} {'>=' if ok else '<'} min {gate.min:.3f}")
    if gate.max is not None and not spread:
        ok = value <= gate.max + _EPS
        (passes if ok else problems).append(f"{gate.metric} {value:.3f} {'<=' if ok else '>'} max {gate.max:.3f}")
    if problems:
        return GateResult(gate, False, "gate failed: " + "; ".join(problems), value, reference, ref_name, paired)
    return GateResult(gate, True, "gate passed: " + "; ".join(passes), value, reference, ref_name, paired)


def _pairs(run: Run, reference: Run, metric: str) -> tuple[list[float], list[float]] | None:
    """Both runs' per-item scores of ``metric`` on the items both answered, in one order; None without them."""
    new, old = item_scores(run, metric), item_scores(reference, metric)
    if not new or not old:
        return None
    common = sorted(set(new) & set(old))
    if not common:
        return None
    return [new[i] for i in common], [old[i] for i in common]


def check_gates(run: Run, runs: Runs, gates: Iterable[Gate | dict]) -> list[GateResult]:
    """One :class:`GateResult` per gate, in order; never raises for missing metrics or runs.

    Gates given as dicts are parsed first (a malformed one is a RecipeError).

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> with runs.start("eval", "r", recipe={}) as r:
    ...     r.finish(metrics={"redteam/jailbreak/attack_success": 0.35})
    >>> print(check_gates(r, runs, [{"metric": "redteam/jailbreak/attack_success", "max": 0.2}])[0].message)
    gate failed: redteam/jailbreak/attack_success 0.350 > max 0.200
    >>> print(check_gates(r, runs, [{"metric": "redteam/jailbrek/attack_success", "max": 0.2}])[0].message)
    gate failed: run r has no metric 'redteam/jailbrek/attack_success' (did you mean 'redteam/jailbreak/attack_success'?; its metrics: redteam/jailbreak/attack_success)
    """
    parsed = [g if isinstance(g, Gate) else parse_gates([g])[0] for g in gates]
    return [_check(run, runs, gate) for gate in parsed]


def failures(results: Iterable[GateResult]) -> list[str]:
    """Messages of the failing results (empty when every gate passed).

    >>> failures([GateResult(Gate("a", min=1.0), False, "gate failed: a 0.500 < min 1.000", 0.5)])
    ['gate failed: a 0.500 < min 1.000']
    """
    return [r.message for r in results if not r.passed]


def asks_rerun(result: GateResult) -> bool:
    """Whether ``result`` is an ``inconclusive: rerun`` gate whose paired verdict was inconclusive (the
    pipeline then scores both runs on every item and decides again).

    >>> asks_rerun(GateResult(Gate("a", min=1.0), False, "gate failed: a 0.500 < min 1.000", 0.5))
    False
    """
    return result.gate.inconclusive == "rerun" and any(p.get("verdict") == "inconclusive" for p in result.paired)


def rerun_with_more_items(run: Run, runs: Runs, results: list[GateResult],
                          evaluate: Callable[[list[tuple[str, str]]], object]) -> list[GateResult]:
    """``results`` with each ``inconclusive: rerun`` gate whose paired verdict was inconclusive decided again
    on every item: ``evaluate([(run_name, suite), ...])`` scores runs on whole suites (the pipeline runs its
    eval recipes with ``limit: null``, in one process), once for all such gates, for each run that was
    scored on fewer; where both runs of a gate already were, nothing can grow and the verdict stays
    inconclusive, counted as fail, and says so.
    """
    wanted: dict[tuple[str, str], None] = {}
    for result in results:
        if not asks_rerun(result):
            continue
        for name in [run.name] + ([result.reference_run] if result.reference_run else []):
            scored = scored_by(runs.get(name, require_done=False), result.gate.metric)
            if scored is not None and scored[1] is not None:
                wanted[(name, scored[0])] = None
    if wanted:
        evaluate(list(wanted))
    out = []
    for result in results:
        gate = result.gate
        if not asks_rerun(result):
            out.append(result)
            continue
        names = [run.name] + ([result.reference_run] if result.reference_run else [])
        limited = sorted(name for name in names if any(key[0] == name for key in wanted))
        if not limited:
            out.append(dataclasses.replace(result, message=f"{result.message}; rerun: both runs were already "
                                                          "scored on every item of the suite, none to add"))
            continue
        [again] = check_gates(runs.get(run.name, require_done=False), runs, [gate])
        out.append(dataclasses.replace(again, message=f"{again.message} (rerun on every item: "
                                                      f"{', '.join(limited)} had been scored on fewer)"))
    return out
