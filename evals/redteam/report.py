"""A red-team result written into a run, and shown as a table.

    write_results(run, result)    # eval/<suite>.json, eval/<suite>-samples.jsonl, run.json metrics
    print(format_table(result))

``result`` is what :func:`~smolforge.evals.redteam.score_model` returns. Every figure is a failure
rate, so lower is better everywhere.

    >>> result = {"suite": "acme", "seconds": 2.0, "overall": {}, "categories": {"leaks": {
    ...     "kind": "attack", "metric": "attack_success_rate", "n": 4, "attack_success_rate": 0.25,
    ...     "stderr": 0.2165, "refusal_rate": 0.75, "judge": None}}}
    >>> metrics_for_run(result)
    {'acme/leaks/attack_success': 0.25, 'acme/leaks/attack_success/stderr': 0.2165, 'acme/seconds': 2.0}
    >>> print(format_table(result))  # doctest: +NORMALIZE_WHITESPACE
    category  kind    metric               n  rate  stderr  refused  judge agree
    --------  ------  -------------------  -  ----  ------  -------  -----------
    leaks     attack  attack_success_rate  4  0.25  0.2165     0.75            -
"""
from __future__ import annotations

import json
from typing import Any

from smolforge.runs import Run, atomic_writer, write_json_atomic
from smolforge.table import render_table

__all__ = ["metrics_for_run", "write_results", "format_table"]


def metrics_for_run(result: dict) -> dict:
    """Flat ``{"<suite>/<category>/<metric>": value}`` for run.json (lower is better for all of them).

    Attack categories give ``attack_success``, benign ones ``rate`` (the over-refusal rate), each
    with ``/stderr``; ``/judge_agreement`` when judged. Pooled figures: ``<suite>/attack_success``,
    ``<suite>/over_refusal`` (+ ``/stderr``), ``<suite>/judge_agreement``.

    >>> r = {"suite": "redteam", "seconds": 1.5, "categories": {
    ...     "jailbreak": {"kind": "attack", "attack_success_rate": 0.5, "stderr": 0.25, "judge": None},
    ...     "over_refusal": {"kind": "benign", "over_refusal_rate": 0.0, "stderr": 0.0, "judge": None}},
    ...     "overall": {"attack": {"attack_success_rate": 0.5, "stderr": 0.25},
    ...                 "benign": {"over_refusal_rate": 0.0, "stderr": 0.0}, "judge_agreement": None}}
    >>> sorted(metrics_for_run(r).items())[:4]
    [('redteam/attack_success', 0.5), ('redteam/attack_success/stderr', 0.25), ('redteam/jailbreak/attack_success', 0.5), ('redteam/jailbreak/attack_success/stderr', 0.25)]
    """
    name = result["suite"]
    flat: dict[str, Any] = {}
    for category, values in result["categories"].items():
        key, metric = ("rate", "over_refusal_rate") if values["kind"] == "benign" else ("attack_success",
                                                                                        "attack_success_rate")
        flat[f"{name}/{category}/{key}"] = values[metric]
        flat[f"{name}/{category}/{key}/stderr"] = values["stderr"]
        if values.get("judge"):
            flat[f"{name}/{category}/judge_agreement"] = values["judge"]["agreement"]
    overall = result["overall"]
    if overall.get("attack"):
        flat[f"{name}/attack_success"] = overall["attack"]["attack_success_rate"]
        flat[f"{name}/attack_success/stderr"] = overall["attack"]["stderr"]
    if overall.get("benign"):
        flat[f"{name}/over_refusal"] = overall["benign"]["over_refusal_rate"]
        flat[f"{name}/over_refusal/stderr"] = overall["benign"]["stderr"]
    if overall.get("judge_agreement") is not None:
        flat[f"{name}/judge_agreement"] = overall["judge_agreement"]
    flat[f"{name}/seconds"] = result.get("seconds")
    return flat


def write_results(run: Run, result: dict) -> dict:
    """Write ``eval/<suite>.json`` (everything but the items) and ``eval/<suite>-samples.jsonl`` (one
    line per item) atomically into ``run``, merge :func:`metrics_for_run` into its run.json; returns
    those metrics.

    >>> import tempfile
    >>> from smolforge.runs import Runs
    >>> from smolforge.evals.redteam import score_model
    >>> with Runs(tempfile.mkdtemp()).start("sft", "toy", recipe={}) as run:
    ...     pass
    >>> r = score_model(lambda c: ["I cannot help."] * len(c), "redteam", limit=1, progress=False)
    >>> metrics = write_results(run, r)
    >>> metrics["redteam/jailbreak/attack_success"], run.metrics["redteam/over_refusal/rate"]
    (0.0, 1.0)
    >>> sorted(p.name for p in run.eval_dir.iterdir())
    ['redteam-samples.jsonl', 'redteam.json']
    """
    name = result["suite"]
    run.eval_dir.mkdir(parents=True, exist_ok=True)
    samples = run.eval_dir / f"{name}-samples.jsonl"
    with atomic_writer(samples) as handle:
        handle.writelines(json.dumps(item, ensure_ascii=False, default=str) + "\n" for item in result["items"])
    summary = {key: value for key, value in result.items() if key != "items"}
    write_json_atomic(run.eval_dir / f"{name}.json", {**summary, "run": run.name, "samples": samples.name})
    metrics = metrics_for_run(result)
    run.update_metrics(metrics)
    return metrics


def format_table(result: dict) -> str:
    """A readable summary: one row per category and the pooled rows (lower is better everywhere).

    >>> from smolforge.evals.redteam import score_model
    >>> r = score_model(lambda c: ["Sure."] * len(c), "redteam", limit=2, progress=False,
    ...                 categories=["jailbreak", "injection", "canary", "over_refusal"])
    >>> print(format_table(r))  # doctest: +NORMALIZE_WHITESPACE
    category      kind    metric               n    rate  stderr  refused  judge agree
    ------------  ------  -------------------  -  ------  ------  -------  -----------
    jailbreak     attack  attack_success_rate  2       1       0        0            -
    injection     attack  attack_success_rate  2       0       0        0            -
    canary        attack  attack_success_rate  2       0       0        0            -
    over_refusal  benign  over_refusal_rate    2       0       0        0            -
    (all attack)  attack  attack_success_rate  6  0.3333  0.1925        -            -
    (all benign)  benign  over_refusal_rate    2       0       0        -            -
    """
    rows = []
    for name, c in result["categories"].items():
        judge = c["judge"]["agreement"] if c.get("judge") else None
        rows.append([name, c["kind"], c["metric"], c["n"], c[c["metric"]], c["stderr"], c["refusal_rate"], judge])
    for kind in ("attack", "benign"):
        pooled = result["overall"].get(kind)
        if pooled:
            metric = "over_refusal_rate" if kind == "benign" else "attack_success_rate"
            rows.append([f"(all {kind})", kind, metric, pooled["n"], pooled[metric], pooled["stderr"], None, None])
    return render_table(["category", "kind", "metric", "n", "rate", "stderr", "refused", "judge agree"], rows)
