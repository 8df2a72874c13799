"""Per-item scores behind a run.json metric, read from the run's ``eval/<suite>-samples.jsonl``.

A paired gate (:mod:`smolforge.paired`) needs, for one metric, each item's score in both runs. Every
scorer writes one line per item into ``eval/``; this module knows their three layouts:

- lm-eval suites (``evals/stage.py``): ``{"task", "doc_id", "scores": {metric: value}, "filter"?}``;
  metric ``<task>/<metric>`` (``instruct/exact_match``, ``instruct@no_think/exact_match``,
  ``gsm8k/exact_match,strict-match``);
- red-team suites (``evals/redteam``): ``{"id", "category", "failed"}`` with the categories' kinds in
  ``eval/<suite>.json``; metrics ``<suite>/attack_success`` (attack items), ``<suite>/<category>/attack_success``,
  ``<suite>/over_refusal`` and ``<suite>/<category>/rate`` (benign items), an item scoring 1 when it failed;
- tool suites (``evals/tool_use.py``): ``{"id", "correct", "calls", "valid_calls"}``; metrics
  ``<suite>/accuracy`` and ``<suite>/called``.

    >>> import json, tempfile
    >>> from smolforge.runs import Runs
    >>> with Runs(tempfile.mkdtemp()).start("eval", "r", recipe={}) as run:
    ...     run.eval_dir.mkdir()
    ...     rows = [{"task": "instruct", "doc_id": i, "scores": {"exact_match": float(i % 2)}} for i in range(3)]
    ...     _ = (run.eval_dir / "embedded-samples.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    >>> item_scores(run, "instruct/exact_match")
    {'instruct#0': 0.0, 'instruct#1': 1.0, 'instruct#2': 0.0}
    >>> item_scores(run, "facts/acc") is None
    True
"""
from __future__ import annotations

import json
from pathlib import Path

from smolforge.runs import Run

__all__ = ["item_scores", "scored_by"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _lm_eval(rows: list[dict], metric: str) -> dict[str, float] | None:
    tasks = {row.get("task") for row in rows}
    task = next((t for t in sorted(tasks, key=lambda t: -len(str(t))) if t and metric.startswith(f"{t}/")), None)
    if task is None:
        return None
    name, _, wanted_filter = metric[len(task) + 1:].partition(",")
    out = {}
    for row in rows:
        if row.get("task") != task or (wanted_filter and row.get("filter") != wanted_filter):
            continue
        value = (row.get("scores") or {}).get(name)
        if value is None:
            return None          # written before samples carried scores: no per-item figures
        out[f"{task}#{row.get('doc_id')}"] = float(value)
    return out or None


def _redteam(rows: list[dict], metric: str, suite: str, kinds: dict[str, str]) -> dict[str, float] | None:
    rest = metric[len(suite) + 1:]
    parts = rest.split("/")
    if parts == ["attack_success"]:
        chosen = {c for c, kind in kinds.items() if kind == "attack"}
    elif parts == ["over_refusal"]:
        chosen = {c for c, kind in kinds.items() if kind == "benign"}
    elif len(parts) == 2 and parts[0] in kinds and parts[1] in ("attack_success", "rate"):
        chosen = {parts[0]}
    else:
        return None
    out = {str(row["id"]): float(bool(row.get("failed"))) for row in rows if row.get("category") in chosen}
    return out or None


def _tools(rows: list[dict], metric: str, suite: str) -> dict[str, float] | None:
    name = metric[len(suite) + 1:]
    if name == "accuracy":
        return {str(row["id"]): float(bool(row.get("correct"))) for row in rows}
    if name == "called":
        return {str(row["id"]): float(row.get("calls", 0) > 0) for row in rows}
    return None


def _sources(run: Run):
    """``(suite, samples file, summary)`` of every scored suite in ``run``'s eval/."""
    folder = run.eval_dir
    if not folder.is_dir():
        return
    for samples in sorted(folder.glob("*-samples.jsonl")):
        suite = samples.name.removesuffix("-samples.jsonl")
        summary_path = folder / f"{suite}.json"
        yield suite, samples, json.loads(summary_path.read_text()) if summary_path.is_file() else {}


def _scores_in(samples: Path, suite: str, summary: dict, metric: str) -> dict[str, float] | None:
    if summary.get("kind") == "adversarial":
        if metric.startswith(f"{suite}/"):
            kinds = {name: c.get("kind") for name, c in (summary.get("categories") or {}).items()}
            return _redteam(_rows(samples), metric, suite, kinds)
        return None
    if metric.startswith(f"{suite}/") and "call_validity" in summary:
        return _tools(_rows(samples), metric, suite)
    if "tasks" in summary or not summary:
        return _lm_eval(_rows(samples), metric)
    return None


def item_scores(run: Run, metric: str) -> dict[str, float] | None:
    """``{item id: score}`` behind ``metric`` in ``run``, or None where the run has no per-item figures for it."""
    for suite, samples, summary in _sources(run):
        found = _scores_in(samples, suite, summary, metric)
        if found is not None or summary.get("kind") == "adversarial" and metric.startswith(f"{suite}/"):
            return found
    return None


def scored_by(run: Run, metric: str) -> tuple[str, int | None] | None:
    """The suite whose per-item scores hold ``metric`` in ``run`` and the ``limit`` it was scored with
    (None: every item of the suite); None where no suite in eval/ holds it.

    >>> import json, tempfile
    >>> from smolforge.runs import Runs
    >>> with Runs(tempfile.mkdtemp()).start("eval", "r", recipe={}) as run:
    ...     run.eval_dir.mkdir()
    ...     _ = (run.eval_dir / "embedded.json").write_text(json.dumps({"tasks": {}, "limit": 8}))
    ...     row = {"task": "instruct", "doc_id": 0, "scores": {"exact_match": 1.0}}
    ...     _ = (run.eval_dir / "embedded-samples.jsonl").write_text(json.dumps(row) + "\\n")
    >>> scored_by(run, "instruct/exact_match"), scored_by(run, "facts/acc")
    (('embedded', 8), None)
    """
    for suite, samples, summary in _sources(run):
        if _scores_in(samples, suite, summary, metric) is not None:
            limit = summary.get("limit", (summary.get("settings") or {}).get("limit"))
            return suite, limit
    return None
