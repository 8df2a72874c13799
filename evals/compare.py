"""Stage-vs-stage comparison: primary eval scores (± stderr) and key training figures, per run.

    smolforge compare pretrain-demo sft-demo dpo-demo
    smolforge compare sft-demo dpo-demo --json

A task's primary metric is the one the eval stage wrote a random baseline for
(``<task>/<metric>/random`` in run.json), so the table needs nothing but run.json and
metrics.jsonl. One column per run, one row per figure; a figure no run has is left out.

A seeds run (``--seeds``, :mod:`smolforge.seeds`) shows each score as ``mean ± sd (n=…)`` over its
seeds, and every run after the first gets a row ``<score> Δ vs <first>``: the difference of the
means ± its standard error (``sqrt(sd²/n + sd'²/n')``; a single run is given the other side's sd),
wherever one side has seeds.

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> with runs.start("sft", "sft-a", recipe={}) as a:
    ...     a.log(step=1, loss=2.0); a.log(step=2, loss=1.5)
    ...     a.finish(metrics={"facts/acc": 0.5, "facts/acc/stderr": 0.05, "facts/acc/random": 0.125})
    >>> print(compare_table(runs, ["sft-a"]))  # doctest: +ELLIPSIS
    figure                    sft-a
    ------------------------  -------------
    stage                     sft
    status                    done
    facts/acc (random 0.125)  0.500 ± 0.050
    final loss                1.5
    steps                     2
    wall s                    ...
"""
from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

from smolforge.errors import RunError
from smolforge.runs import Run, Runs, wall_seconds
from smolforge.seeds import compare_spreads, metric_spread, spread_cell
from smolforge.table import render_table

__all__ = ["read_metrics", "primary_scores", "training_figures", "compare_data", "compare_table",
           "score_cell"]

# run.json keys shown as training figures when present: (label, key)
RUN_FIGURES = (
    ("tokens", "train/tokens"),
    ("rl/heldout_reward_before", "rl/heldout_reward_before"),
    ("rl/heldout_reward_after", "rl/heldout_reward_after"),
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_metrics(run: Run) -> list[dict]:
    """The records of the run's metrics.jsonl (empty if there is none; unreadable lines skipped).

    >>> import tempfile
    >>> with Runs(tempfile.mkdtemp()).start("sft", "x", recipe={}) as run:
    ...     run.log(step=3, loss=1.25)
    >>> [(r["step"], r["loss"]) for r in read_metrics(run)]
    [(3, 1.25)]
    """
    path = Path(run.metrics_path)
    if not path.is_file():
        return []
    records = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if isinstance(record, dict):
                records.append(record)
    return records


def primary_scores(metrics: dict) -> dict[str, dict]:
    """``{"task/metric": {"value", "stderr", "random"}}`` for each task's primary metric.

    >>> primary_scores({"facts/acc": 0.5, "facts/acc/stderr": 0.1, "facts/acc/random": 0.125,
    ...                 "prefs/margin": 3.0, "train/loss": 1.0})
    {'facts/acc': {'value': 0.5, 'stderr': 0.1, 'random': 0.125}}
    """
    out = {}
    for key in metrics:
        if not str(key).endswith("/random"):
            continue
        base = str(key)[: -len("/random")]
        value = _number(metrics.get(base))
        if value is None or base.count("/") < 1:
            continue
        out[base] = {"value": value, "stderr": _number(metrics.get(f"{base}/stderr")),
                     "random": _number(metrics.get(key))}
    return out


def score_cell(score: dict | None) -> str | None:
    """``0.729 ± 0.046`` (or ``0.729`` without a stderr; None without a score); on a seeds run
    ``0.729 ± 0.020 (n=3)``: mean ± sd over the seeds.

    >>> score_cell({"value": 0.729, "stderr": 0.0456}), score_cell({"value": 1.0, "stderr": None})
    ('0.729 ± 0.046', '1.000')
    >>> score_cell({"value": 0.729, "stderr": 0.0456, "sd": 0.02, "n": 3})
    '0.729 ± 0.020 (n=3)'
    """
    if not score:
        return None
    if score.get("n"):
        return spread_cell({"mean": score["value"], "sd": score.get("sd"), "n": score["n"]})
    text = f"{score['value']:.3f}"
    if score.get("stderr") is not None:
        text += f" ± {score['stderr']:.3f}"
    return text


def training_figures(run: Run, records: list[dict] | None = None) -> dict[str, float | None]:
    """Final loss, steps, wall seconds, tokens and RL held-out rewards of a run (None when absent).

    Final loss: ``train/last_loss``, else ``train/loss``, else the last ``loss`` logged.
    Steps: ``train/steps``, else the last logged step.

    >>> import tempfile
    >>> with Runs(tempfile.mkdtemp()).start("sft", "x", recipe={}) as run:
    ...     run.log(step=5, loss=0.75)
    >>> f = training_figures(run); f["final loss"], f["steps"]
    (0.75, 5)
    """
    metrics = run.metrics
    records = read_metrics(run) if records is None else records
    loss = _number(metrics.get("train/last_loss"))
    if loss is None:
        loss = _number(metrics.get("train/loss"))
    if loss is None:
        logged = [_number(r.get("loss")) for r in records]
        logged = [x for x in logged if x is not None]
        loss = logged[-1] if logged else None
    steps = metrics.get("train/steps")
    if _number(steps) is None:
        stepped = [r["step"] for r in records if isinstance(r.get("step"), int)]
        steps = max(stepped) if stepped else None
    figures: dict[str, float | None] = {"final loss": loss, "steps": steps, "wall s": wall_seconds(run.info)}
    for label, key in RUN_FIGURES:
        figures[label] = _number(metrics.get(key))
    return figures


def _find(runs: Runs, names: list[str]) -> list[Run]:
    found, unknown = [], []
    for name in names:
        try:
            found.append(runs.get(name, require_done=False))
        except RunError as exc:
            unknown.append((name, str(exc)))
    if unknown:
        known = [r.name for r in runs.list()]
        parts = []
        for name, why in unknown:
            close = difflib.get_close_matches(str(name), known, n=3)
            if close:
                parts.append(f"'{name}' (did you mean {', '.join(repr(c) for c in close)}?)")
            elif "not found" in why:
                parts.append(f"'{name}'")
            else:
                parts.append(f"'{name}' ({why})")
        listing = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "") if known else "none"
        raise RunError(f"unknown run{'s' if len(parts) > 1 else ''} {', '.join(parts)} under "
                       f"{runs.root}/ (known runs: {listing})")
    return found


def compare_data(runs: Runs, names: list[str]) -> dict:
    """The comparison as one JSON-ready object (what ``compare --json`` prints).

    ``{"runs": [{"name", "stage", "status", "parents", "scores": {key: {value, stderr, random}},
    "figures": {label: value}}]}``; unknown names raise RunError with close matches.

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> with runs.start("sft", "sft-a", recipe={}) as a:
    ...     a.finish(metrics={"train/steps": 10})
    >>> compare_data(runs, ["sft-b"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: unknown run 'sft-b' (did you mean 'sft-a'?) under ... (known runs: sft-a)
    """
    if not names:
        raise RunError("compare needs at least one run name")
    items = []
    for run in _find(runs, list(names)):
        scores = primary_scores(run.metrics)
        for key, score in scores.items():
            stats = metric_spread(run, key)
            if stats:   # a seeds run: the spread over its seeds
                score.update(sd=stats["sd"], n=stats["n"])
        items.append({"name": run.name, "stage": run.stage, "status": run.status,
                      "parents": run.parents, "scores": scores, "figures": training_figures(run)})
    first = items[0]
    for item in items[1:]:
        for key, score in item["scores"].items():
            base = first["scores"].get(key)
            if base is not None and (score.get("n") or base.get("n")):
                result = compare_spreads(_side(score), _side(base), tolerance=0.0, higher_is_better=True)
                score["vs_first"] = {"run": first["name"], "difference": result.difference,
                                     "stderr": result.stderr}
    return {"root": str(runs.root), "runs": items}


def _side(score: dict) -> dict:
    return {"mean": score["value"], "sd": score.get("sd"), "n": score.get("n") or 1}


def compare_table(runs: Runs, names: list[str]) -> str:
    """A text table: one column per run; stage, status, primary eval scores (± stderr, with the
    task's random baseline in the row label), final loss, steps, wall seconds, tokens and RL
    held-out rewards. Rows that no run has are left out. See the module docstring for an example.
    """
    data = compare_data(runs, names)
    items = data["runs"]
    keys: dict[str, float | None] = {}
    for item in items:
        for key, score in item["scores"].items():
            if keys.get(key) is None:
                keys[key] = score.get("random")
    rows: list[list[Any]] = [["stage", *(i["stage"] for i in items)],
                             ["status", *(i["status"] for i in items)]]
    for key, random in keys.items():
        label = key if random is None else f"{key} (random {random:.3f})"
        rows.append([label, *(score_cell(i["scores"].get(key)) for i in items)])
        moves = [(i["scores"].get(key) or {}).get("vs_first") for i in items]
        if any(moves):   # seeds on a side: the difference of the means from the first run, ± its stderr
            rows.append([f"{key} Δ vs {items[0]['name']}",
                         *(None if m is None else f"{m['difference']:+.3f} ± {m['stderr']:.3f}" for m in moves)])
    for label in items[0]["figures"]:
        values = [i["figures"].get(label) for i in items]
        if any(v is not None for v in values):
            rows.append([label, *values])
    return render_table(["figure", *(i["name"] for i in items)], rows)
