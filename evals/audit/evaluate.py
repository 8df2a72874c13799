"""Which eval tasks can judge an ablation? Statistics over a series of checkpoints and seeds.

    smolforge eval audit pretrain-s0 pretrain-s1 pretrain-s2 --suite embedded --limit 50

The playbook chooses eval tasks for ablations by four properties: monotonic (improves with
training), low noise (stable across seeds), above random (beats chance) and ranking-consistent
(orders models the same way across checkpoints). Given several runs of one recipe that differ
only in their seed, :func:`audit` scores every checkpoint of every run on a suite's tasks and
measures the four properties per task (as HF's FineTasks study did), then marks the tasks fit
for ablations.

**Checkpoints.** A run's points are its ``checkpoints/step-N/`` (pretraining: DeepSpeed engine
state, turned into a temporary HF model folder by :func:`export_checkpoint` with the
architecture and tokenizer of the run's ``model/``; ZeRO-0/1/2 states hold the full weights,
ZeRO-3 shards are consolidated with DeepSpeed's ``zero_to_fp32``), its ``checkpoints/checkpoint-N/``
(HF Trainer folders, loadable as they are) and its final ``model/`` at step ``train/steps`` of
run.json (it replaces a checkpoint of the same step). A checkpoint that fails its checksum
manifest is skipped with a note. Pretraining keeps only ``checkpoint.keep`` checkpoints (3 by
default), so set ``keep`` high enough for the series you want to audit. Scores are cached in
``<run>/eval/audit/<step>.json`` per suite and ``limit``; a cached step stays in the audit after
its checkpoint was pruned, and a second audit re-scores nothing.

This module scores the checkpoints and assembles the result; the parts live beside it in the package,
and every name below is importable from :mod:`smolforge.evals.audit`:

- :mod:`~smolforge.evals.audit.stats`: the statistics per task (monotonicity, noise, margin,
  signal-to-noise, ranking consistency; formulas in its docstring), the verdict, the result;
- :mod:`~smolforge.evals.audit.checkpoints`: a run's scorable points, DeepSpeed state exported to HF;
- :mod:`~smolforge.evals.audit.cache`: the scores cached per run, step, suite and limit;
- :mod:`~smolforge.evals.audit.report`: the result as a text table and as JSON.

    >>> from smolforge.evals.audit import task_statistics
    >>> table = {"s0": {100: 0.30, 200: 0.45, 300: 0.60}, "s1": {100: 0.32, 200: 0.44, 300: 0.62}}
    >>> stats = task_statistics(table, random_baseline=0.25)
    >>> stats["verdict"], stats["monotonicity"], round(stats["noise"], 4)
    ('fit', 1.0, 0.0118)
"""
from __future__ import annotations

import difflib
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError, RunError
from smolforge.runs import Run, Runs

from ..suite import Suite, load_suite
from .cache import AUDIT_DIR, cache_key, cached_steps, store_scores
from .checkpoints import Checkpoint, export_checkpoint, find_checkpoints
from .stats import Thresholds, summarize

log = logging.getLogger(__name__)

__all__ = ["audit"]


@dataclass(frozen=True)
class _Request:
    """What to score: which tasks of which suite, on how many examples, and how."""
    suite: Suite
    tasks: list[str]
    limit: int | None        # examples per task; None: all
    batch_size: int
    device: str              # "auto", "cpu", "cuda", …

    @property
    def cache_key(self) -> str:
        return cache_key(self.suite.name, self.limit)


@dataclass
class _Series:
    """One run's steps to audit and what its cache holds for them."""
    run: Run
    points: dict[int, Checkpoint | None]   # None: the checkpoint is gone, only cached scores remain
    cached: dict[int, dict]                # step → cache entry for this suite and limit


def audit(runs: Runs, run_names: list[str], suite: str = "embedded", tasks: list[str] | None = None,
          limit: int | None = None, *, batch_size: int = 32, device: str = "auto",
          thresholds: Thresholds | None = None, refresh: bool = False, final_only: bool = False) -> dict[str, Any]:
    """Score every checkpoint of ``run_names`` on ``suite`` and return :func:`summarize`'s result.

    Each (run, step) is scored once per suite and ``limit`` and cached in
    ``<run>/eval/audit/<step>.json`` (``refresh`` re-scores). The result adds ``sources``
    (which folder each step was scored from), ``evaluated`` and ``cached`` (counts of (run, step)
    points) and ``seconds``. ``final_only`` scores each run's final model/ alone (an ablation's
    variants: their scores, no series to judge). Raises RunError for an unknown run (with close matches), a run
    given twice, or a run with no checkpoint to score; RecipeError for an unknown task.

    >>> import tempfile
    >>> audit(Runs(tempfile.mkdtemp()), ["pretrain-s0"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: run 'pretrain-s0' not found under ... (no runs yet)
    """
    started = time.perf_counter()
    _check_arguments(run_names, limit)
    targets = [runs.get(name) for name in run_names]
    the_suite = load_suite(suite)
    request = _Request(the_suite, _selected_tasks(the_suite, tasks), limit, batch_size, device)
    notes: list[str] = []
    all_series = [_series(run, request.cache_key, refresh, notes, final_only) for run in targets]
    evaluated = _score_missing(all_series, request, notes)
    scores, sources = _primary_scores(all_series, request, notes)

    result = summarize(scores, {t: the_suite.tasks[t].random_baseline for t in request.tasks}, thresholds,
                       suite=the_suite.name, limit=limit,
                       metrics={t: the_suite.tasks[t].primary for t in request.tasks})
    result["notes"] = notes + result["notes"]
    result.update(sources=sources, evaluated=evaluated,
                  cached=sum(len(s) for s in scores.values()) - evaluated,
                  seconds=round(time.perf_counter() - started, 1))
    return result


# -- before any scoring ------------------------------------------------------------------------
def _check_arguments(run_names: list[str], limit: int | None) -> None:
    if not run_names:
        raise RunError("audit needs at least one run (better: 2 or more runs of one recipe with different seeds)")
    repeated = sorted({n for n in run_names if run_names.count(n) > 1})
    if repeated:
        raise RunError(f"run {', '.join(repeated)} given more than once; give each seed's run once")
    if limit is not None and limit < 1:
        raise RecipeError(f"limit must be >= 1 or None, got {limit}")


def _selected_tasks(suite: Suite, tasks: list[str] | None) -> list[str]:
    unknown = [t for t in tasks or [] if t not in suite.tasks]
    if unknown:
        hints = [f"'{t}'" + (f" (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(t, suite.tasks, 1))
                             else "") for t in unknown]
        raise RecipeError(f"suite '{suite.name}' has no task {', '.join(hints)}; "
                          f"its tasks: {', '.join(sorted(suite.tasks))}")
    return list(dict.fromkeys(tasks)) if tasks else sorted(suite.tasks)


def _series(run: Run, key: str, refresh: bool, notes: list[str], final_only: bool = False) -> _Series:
    """The steps of ``run`` to audit: its usable checkpoints and the steps only its cache still has
    (``final_only``: its final model/ alone)."""
    points = _usable_points(run, notes)
    cached = {} if refresh else cached_steps(run, key)
    final = [s for s, p in points.items() if p.kind == "model"]
    if final_only:
        if not final:
            raise RunError(f"run '{run.name}' has no final model/ at a known step (train/steps in run.json) to score")
        return _Series(run, {final[0]: points[final[0]]}, {s: e for s, e in cached.items() if s == final[0]})
    steps: dict[int, Checkpoint | None] = {s: None for s in cached}
    steps.update(points)
    if not final and (run.model_dir / "config.json").is_file():
        notes.append(f"run {run.name}: its final model/ is left out (run.json has no train/steps to place it)")
    if not [s for s in steps if s not in final]:
        raise RunError(f"run '{run.name}' has no checkpoints to audit under {run.checkpoints_dir} "
                       f"(only {'its final model/' if steps else 'nothing'}); train it with "
                       "checkpoint.every_steps > 0 and checkpoint.keep high enough to keep the series")
    return _Series(run, steps, cached)


def _usable_points(run: Run, notes: list[str]) -> dict[int, Checkpoint]:
    """The run's checkpoints by step, less DeepSpeed ones that have no model/ to take a shape from."""
    has_model = (run.model_dir / "config.json").is_file()
    points = {}
    for point in find_checkpoints(run):
        if point.kind == "deepspeed" and not has_model:
            notes.append(f"run {run.name}: {point.label} skipped (a DeepSpeed checkpoint needs the run's "
                         "model/ for its architecture and tokenizer)")
            continue
        points[point.step] = point
    return points


# -- scoring -----------------------------------------------------------------------------------
def _score_missing(all_series: list[_Series], request: _Request, notes: list[str]) -> int:
    """Score every checkpoint on the tasks its cache lacks and cache them; returns how many were scored."""
    from tqdm.auto import tqdm

    todo = [(series, step, point, missing) for series in all_series for step, point in sorted(series.points.items())
            if point is not None and (missing := _uncached_tasks(series, step, request))]
    device = _device(request.device)
    evaluated = 0
    for series, step, point, missing in tqdm(todo, desc="audit", unit="checkpoint", disable=not todo):
        run = series.run
        log.info("audit: scoring %s %s (step %d) on %s: %s", run.name, point.label, step, request.suite.name,
                 ", ".join(missing))
        try:
            fresh = _plain_scores(_score(run, point, request, missing, device))
        except RunError as exc:
            notes.append(f"run {run.name}: {point.label} skipped ({exc})")
            continue
        entry = {"suite": request.suite.name, "suite_path": str(request.suite.path), "limit": request.limit,
                 "source": point.label, "scores": {**series.cached.get(step, {}).get("scores", {}), **fresh}}
        store_scores(run, step, request.cache_key, entry)
        series.cached[step] = entry
        evaluated += 1
    return evaluated


def _uncached_tasks(series: _Series, step: int, request: _Request) -> list[str]:
    have = series.cached.get(step, {}).get("scores", {})
    return [t for t in request.tasks if t not in have]


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _score(run: Run, point: Checkpoint, request: _Request, tasks: list[str], device: str) -> dict[str, dict]:
    from .. import stage

    options = {"limit": request.limit, "batch_size": request.batch_size, "device": device}
    if point.kind != "deepspeed":
        scores, _ = stage.evaluate(point.path, request.suite, tasks, **options)
        return scores
    from smolforge.pretrain.checkpoint import verify

    problem = verify(point.path)
    if problem is not None:
        raise RunError(f"{point.path}: unusable checkpoint ({problem})")
    (run.eval_dir / AUDIT_DIR).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".model-step-{point.step}-", dir=run.eval_dir / AUDIT_DIR) as tmp:
        model_dir = export_checkpoint(point.path, run.model_dir, Path(tmp))
        scores, _ = stage.evaluate(model_dir, request.suite, tasks, **options)
    return scores


def _plain_scores(scores: dict[str, dict]) -> dict[str, dict]:
    return {task: {metric: float(v) for metric, v in values.items() if isinstance(v, (int, float))}
            for task, values in scores.items()}


# -- from the cache to the score tables --------------------------------------------------------
def _primary_scores(all_series: list[_Series], request: _Request,
                    notes: list[str]) -> tuple[dict[str, dict[int, dict[str, float]]], dict[str, dict[str, str]]]:
    """``{run: {step: {task: primary metric}}}`` and ``{run: {step: source folder}}`` from the cache."""
    scores: dict[str, dict[int, dict[str, float]]] = {}
    sources: dict[str, dict[str, str]] = {}
    for series in all_series:
        scores[series.run.name], sources[series.run.name] = _run_primary_scores(series, request, notes)
    return scores, sources


def _run_primary_scores(series: _Series, request: _Request,
                        notes: list[str]) -> tuple[dict[int, dict[str, float]], dict[str, str]]:
    scores: dict[int, dict[str, float]] = {}
    sources: dict[str, str] = {}
    for step in sorted(series.points):
        entry = series.cached.get(step)
        if entry is None or not set(request.tasks) <= set(entry.get("scores", {})):
            if series.points[step] is None:
                notes.append(f"run {series.run.name}: step {step} left out (its checkpoint is gone and its cached "
                             "scores lack some of the tasks)")
            continue
        scores[step] = _primary_metrics(entry, request)
        sources[str(step)] = entry.get("source", "?")
    if not scores:
        raise RunError(f"run '{series.run.name}': no checkpoint could be scored ({'; '.join(notes) or 'none found'})")
    return scores, sources


def _primary_metrics(entry: dict, request: _Request) -> dict[str, float]:
    """``{task: its primary metric}`` from a cache entry; RunError when lm-eval did not report one."""
    tasks = request.suite.tasks
    for t in request.tasks:
        if tasks[t].primary not in entry["scores"][t]:
            raise RunError(f"task {t}: lm-eval reported {', '.join(entry['scores'][t]) or 'no metric'} but not "
                           f"its primary metric '{tasks[t].primary}' (metadata.primary in its YAML)")
    return {t: entry["scores"][t][tasks[t].primary] for t in request.tasks}
