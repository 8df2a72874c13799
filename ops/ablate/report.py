"""An ablation's result as a table, one plot per task, and the run ``ablate-<name>`` that keeps them.

    >>> rows = [{"variant": "learning_rate=0.001", "task": "facts", "metric": "acc", "audit": "fit",
    ...          "audit_reasons": [], "baseline_mean": 0.52, "baseline_sd": 0.01,
    ...          "variant_mean": 0.44, "variant_sd": 0.02, "difference": -0.08, "noise": 0.013, "ratio": 6.2,
    ...          "verdict": "worse", "n_baseline": 3, "n_variant": 3}]
    >>> print(format_rows(rows, {"facts": "fit"}))  # doctest: +NORMALIZE_WHITESPACE
    task   audit  variant              baseline        variant         difference  noise  verdict
    facts  fit    learning_rate=0.001  0.520 ± 0.010   0.440 ± 0.020   -0.080      0.013  worse
"""
from __future__ import annotations

import math
from typing import Any, TextIO

from smolforge.runs import Runs, atomic_writer, write_json_atomic
from smolforge.svg_plot import Column, Layout, strip_chart

from .stats import NOISE_FACTOR, RULE, mean, stdev

__all__ = ["format_rows", "format_result", "svg_task_plot", "write_result"]

LAYOUT = Layout(width=640, height=330, left=64, right=20, top=44, bottom=70, kind="ablation", standalone=True)


def _pm(mean: float, sd: float | None) -> str:
    return f"{mean:.3f} ± {sd:.3f}" if sd is not None else f"{mean:.3f}"


def format_rows(rows: list[dict[str, Any]], audit: dict[str, str]) -> str:
    """The comparison table: one line per variant and task; a ``*`` marks a task that failed the audit."""
    head = ["task", "audit", "variant", "baseline", "variant", "difference", "noise", "verdict"]
    lines = [head]
    for row in rows:
        mark = "" if audit.get(row["task"]) == "fit" else "*"
        noise = "n/a" if row["noise"] is None else f"{row['noise']:.3f}"
        lines.append([row["task"] + mark, audit.get(row["task"], "?"), row["variant"],
                      _pm(row["baseline_mean"], row["baseline_sd"]), _pm(row["variant_mean"], row["variant_sd"]),
                      f"{row['difference']:+.3f}",
                      noise, row["verdict"]])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def format_result(result: dict[str, Any]) -> str:
    """The whole text report: what ran, the table, the audit's reasons, the rule."""
    mode = "from scratch" if result["mode"] == "scratch" else f"annealing from {result['from']}"
    if result.get("from_step"):
        mode += f" at step {result['from_step']}"
    audit = {t: a["verdict"] for t, a in result["audit"].items()}
    lines = [f"ablation {result['ablation']}: {result['stage']} {mode}, {len(result['seeds'])} seeds "
             f"({', '.join(map(str, result['seeds']))}), suite {result['suite']}"
             + (f", limit {result['limit']}" if result["limit"] else ""),
             "arms: " + "; ".join(f"{v['label']} ({', '.join(v['runs'])})" for v in result["variants"]), "",
             format_rows(result["rows"], audit), ""]
    unfit = {t: a for t, a in result["audit"].items() if a["verdict"] != "fit"}
    steps = ", ".join(map(str, result.get("audit_steps") or []))
    if unfit:
        lines.append(f"* failed the eval-task audit on the baseline's seeds (checkpoints {steps}); "
                     "its verdicts do not judge the change:")
        lines += [f"    {t} ({a['verdict']}): {'; '.join(a['reasons'] + (a.get('unchecked') or [])) or 'n/a'}"
                  for t, a in unfit.items()]
    else:
        lines.append(f"every task passed the eval-task audit on the baseline's seeds (checkpoints {steps})")
    lines.append("verdict: " + RULE.format(factor=NOISE_FACTOR))
    return "\n".join(lines)


def svg_task_plot(task: str, metric: str | None, arms: list[tuple[str, list[float], str]], audit: str,
                  higher_is_better: bool = True) -> str:
    """One task's plot: per arm (label, seed scores, verdict) a dot per seed, the mean and ± one sd.

    >>> svg = svg_task_plot("facts", "acc", [("baseline", [0.5, 0.52], ""), ("lr=1e-3", [0.4, 0.41], "worse")], "fit")
    >>> svg.startswith("<svg") and svg.count('class="seed"') == 4 and svg.count('class="mean"') == 2
    True
    """
    columns = [Column(label, scores, mean(scores) if scores else None, stdev(scores), verdict)
               for label, scores, verdict in arms]
    direction = "higher is better" if higher_is_better else "lower is better"
    return strip_chart(f"{task} ({metric or 'score'}, {direction}); audit: {audit}", columns, LAYOUT)


def write_result(result: dict[str, Any], ablation: Any, runs: Runs, out: TextIO) -> dict[str, Any]:
    """Write the run ``ablate-<name>`` (replacing an earlier analysis), print the table, return ``result``
    with ``run``, ``table`` and ``plots`` added."""
    parents = [runs.get(name) for v in result["variants"] for name in v["runs"]]
    text = format_result(result)
    with runs.start("ablate", ablation.result_name, {"ablation": result["ablation"], "source": result["source"]},
                    parents=parents, overwrite=True) as run:
        plots = {}
        for task in result["tasks"]:
            rows = {r["variant"]: r for r in result["rows"] if r["task"] == task}
            arms = [(v["label"], [result["scores"][v["label"]][n][task] for n in v["runs"]],
                     rows[v["label"]]["verdict"] if v["label"] in rows else "") for v in result["variants"]]
            higher = next((r["higher_is_better"] for r in rows.values()), True)
            path = run.plot_path(task)
            path.parent.mkdir(exist_ok=True)
            with atomic_writer(path) as fh:
                fh.write(svg_task_plot(task, result["audit"][task].get("metric") or None, arms,
                                       result["audit"][task]["verdict"], higher))
            plots[task] = str(path)
        with atomic_writer(run.table_path) as fh:
            fh.write(text + "\n")
        result = {**result, "run": run.name, "table": str(run.table_path), "plots": plots}
        write_json_atomic(run.ablation_path, _json_safe(result))
        counts = {verdict: sum(r["verdict"] == verdict for r in result["rows"]) for verdict in ("better", "worse")}
        run.finish(metrics={"ablation/runs": len(parents), "ablation/better": counts["better"],
                            "ablation/worse": counts["worse"],
                            "ablation/fit_tasks": sum(a["verdict"] == "fit" for a in result["audit"].values())})
    print(text, file=out)
    print(f"\nwrote {run.path}/ (ablation.json, table.txt, plots/<task>.svg)", file=out)
    return result


def _json_safe(value: Any) -> Any:
    """``value`` with infinities as the string "inf" (strict JSON has no Infinity).

    >>> _json_safe({"ratio": float("inf"), "rows": [1.5, None]})
    {'ratio': 'inf', 'rows': [1.5, None]}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
