"""The eval audit's result as text (one row per task, the scores per run and step) and as JSON.

    print(format_audit(result))       # smolforge eval audit
    print(audit_json(result))         # smolforge eval audit --json
    write_audit(result, "audit.json")

``result`` is what :func:`~smolforge.evals.audit.evaluate.audit` (or
:func:`~smolforge.evals.audit.stats.summarize`) returns.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from smolforge.runs import write_json_atomic
from smolforge.table import render_table

__all__ = ["format_audit", "audit_json", "write_audit"]


def _cell(value: float | str | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str) or math.isinf(value):
        return str(value) if isinstance(value, str) else "inf"
    return f"{value:.{digits}f}"


def _task_table(tasks: dict[str, dict]) -> str:
    """One row per task: its statistics, verdict and why (failed criteria; n/a ones unless unfit)."""
    rows = []
    for name, s in tasks.items():
        why = "; ".join(s["reasons"] + (s["unchecked"] if s["verdict"] != "unfit" else []))
        rows.append([name, s.get("metric") or "-", _cell(s["random"]), _cell(s["first"]), _cell(s["final"]),
                     _cell(s["margin"]), _cell(s["noise"]), _cell(s["monotonicity"]), _cell(s["snr"]),
                     _cell(s["ranking_consistency"]), s["verdict"], why])
    return render_table(["task", "metric", "random", "first", "final", "margin", "noise", "monoton.",
                         "SNR", "rank cons.", "verdict", "why"], rows)


def format_audit(result: dict[str, Any]) -> str:
    """The audit as text: one row per task with its statistics and verdict, the scores per
    (run, step), and the notes.

    >>> from smolforge.evals.audit.stats import summarize
    >>> scores = {"s0": {1: {"a": 0.30, "b": 0.5}, 2: {"a": 0.50, "b": 0.4}, 3: {"a": 0.70, "b": 0.5}},
    ...           "s1": {1: {"a": 0.32, "b": 0.4}, 2: {"a": 0.52, "b": 0.6}, 3: {"a": 0.71, "b": 0.5}}}
    >>> print(format_audit(summarize(scores, {"a": 0.25, "b": 0.5}, suite="demo",
    ...                              metrics={"a": "acc", "b": "acc"})))  # doctest: +NORMALIZE_WHITESPACE
    eval audit of 2 runs (s0, s1) on suite demo, limit all: 1 of 2 tasks fit for ablations
    task  metric  random  first  final  margin  noise  monoton.     SNR  rank cons.  verdict  why
    ----  ------  ------  -----  -----  ------  -----  --------  ------  ----------  -------  ---------------------------------------------------------------------------------------------------------------
    a     acc      0.250  0.310  0.705   0.455  0.012     1.000  33.517       1.000  fit
    b     acc      0.500  0.450  0.500   0.000  0.071     0.250   0.707      -1.000  unfit    monotonicity 0.250 < 0.5; margin 0.000 <= 2 x noise 0.071 (not clearly above random); signal-to-noise 0.707 < 1
    <BLANKLINE>
    run  step      a      b
    ---  ----  -----  -----
    s0      1  0.300  0.500
    s0      2  0.500  0.400
    s0      3  0.700  0.500
    s1      1  0.320  0.400
    s1      2  0.520  0.600
    s1      3  0.710  0.500
    """
    tasks = result["tasks"]
    limit = "all" if result.get("limit") is None else result["limit"]
    head = (f"eval audit of {len(result['runs'])} run{'s' if len(result['runs']) != 1 else ''} "
            f"({', '.join(result['runs'])}) on suite {result['suite'] or '?'}, limit {limit}: "
            f"{len(result['fit'])} of {len(tasks)} tasks fit for ablations")
    out = [head, _task_table(tasks)]
    score_rows = [[run, int(step), *(_cell(values.get(t)) for t in tasks)]
                  for run, steps in result["scores"].items() for step, values in steps.items()]
    if score_rows:
        out += ["", render_table(["run", "step", *tasks], score_rows)]
    if result.get("sources"):
        used = sorted({src for steps in result["sources"].values() for src in steps.values()})
        out += ["", f"scored {result.get('evaluated', 0)} checkpoint(s), {result.get('cached', 0)} from cache "
                    f"({result.get('seconds', '?')} s); sources: {', '.join(used)}"]
    out += [f"note: {n}" for n in result["notes"]]
    return "\n".join(out)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and math.isinf(obj):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def audit_json(result: dict[str, Any]) -> str:
    """The audit result as one JSON object (for ``--json``); an infinite signal-to-noise (noise 0,
    score rose) is written as the string ``"inf"``, since JSON has no infinity.

    >>> from smolforge.evals.audit.stats import summarize
    >>> same = {"s0": {1: {"a": 0.3}, 2: {"a": 0.6}}, "s1": {1: {"a": 0.3}, 2: {"a": 0.6}}}
    >>> json.loads(audit_json(summarize(same, {"a": 0.25})))["tasks"]["a"]["snr"]
    'inf'
    """
    return json.dumps(_finite(result), indent=2)


def write_audit(result: dict[str, Any], path: str | Path) -> Path:
    """Write the audit result as JSON (atomically, as :func:`audit_json`); returns the path.

    >>> import tempfile
    >>> from smolforge.evals.audit.stats import summarize
    >>> p = write_audit(summarize({"s0": {1: {"a": 0.3}}}, {"a": 0.25}), Path(tempfile.mkdtemp()) / "audit.json")
    >>> json.loads(p.read_text())["tasks"]["a"]["margin"]
    0.05
    """
    path = Path(path)
    write_json_atomic(path, _finite(result))
    return path
