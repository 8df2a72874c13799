"""The human-readable report of a run: one self-contained ``<run>/report.html``.

    smolforge report dpo-demo          # writes runs/dpo-demo/report.html

The page needs no network and no JavaScript: plots are inline SVG (``smolforge.svg_plot``). It shows the
run's header (stage, status, parents, wall time, abbreviated data fingerprints), promotion gate
verdicts (``gates.json``, written by the pipeline), the eval scores of each task's primary metric
with ±1 stderr error bars against the random baseline, the same scores along the lineage (this run
and every ancestor that has them: a grouped bar chart and a table), the training curves of
metrics.jsonl (loss, learning rate, reward, KL, ... whichever numeric series exist, grouped), the
scores of checkpoints evaluated while training (``eval_while_training:``, with its ``stop_on`` rules and
where a breach stopped the run) and the run's summary metrics and recipe. A missing piece (no
metrics.jsonl, no evals, no scored ancestor) is a short note, not an error.

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> with runs.start("sft", "sft-a", recipe={"lr": 1e-3}) as run:
    ...     run.log(step=1, loss=2.0, lr=1e-3); run.log(step=2, loss=1.5, lr=5e-4)
    ...     run.finish(metrics={"facts/acc": 0.5, "facts/acc/stderr": 0.05, "facts/acc/random": 0.125})
    >>> path = write_report(run, runs)
    >>> path.name, path.read_text().count("<svg") >= 3, "0.500 ± 0.050" in path.read_text()
    ('report.html', True, True)
"""
from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smolforge.errors import RunError
from smolforge.pipeline import score_columns
from smolforge.runs import Run, RunLayout, Runs, atomic_writer, utc_now, wall_seconds
from smolforge.svg_plot import Layout, Mark, Series, bar_chart
from smolforge.svg_plot import line_chart as draw_lines

from .compare import primary_scores, read_metrics, score_cell, training_figures

__all__ = ["write_report", "render_report", "lineage_runs", "curve_groups", "watch_groups", "line_chart", "bar_chart"]

MAX_SERIES_PER_PLOT = 8
WATCH_PREFIX = "eval/"   # metrics.jsonl keys of checkpoints scored while training (smolforge.eval_watch): own section

# metrics.jsonl keys that are counters or end-of-training summaries, not curves
_NOT_CURVES = {"step", "time", "epoch", "num_tokens", "num_input_tokens_seen", "tokens", "train_runtime",
               "train_loss", "total_flos", "train_samples_per_second", "train_steps_per_second",
               "train_tokens_per_second"}

# (group title, test on the lower-cased key); first match wins
_GROUPS: tuple[tuple[str, Any], ...] = (
    ("Learning rate", lambda k: k in ("lr", "learning_rate") or k.endswith(("/lr", "learning_rate"))),
    ("Loss", lambda k: "loss" in k),
    ("KL", lambda k: re.search(r"(?:^|[/_])kl(?:$|[/_])", k) is not None),
    ("Accuracy", lambda k: "accurac" in k or k.endswith("/acc")),
    ("Reward", lambda k: "reward" in k),
    ("Gradient norm", lambda k: "grad_norm" in k),
    ("Throughput", lambda k: k.endswith(("tokens_per_s", "tokens_per_second", "samples_per_second")) or k == "mfu"),
    ("Memory", lambda k: "memory" in k),
    ("Seconds", lambda k: k.endswith("_s") or k.endswith("_seconds")),
)


# --------------------------------------------------------------------------- small helpers


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _short_hash(value: Any) -> str:
    text = str(value)
    algo, sep, digest = text.partition(":")
    if sep and len(digest) > 12:
        return f"{algo}:{digest[:12]}…"
    return text if len(text) <= 24 else text[:24] + "…"


# --------------------------------------------------------------------------- SVG charts


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str = "step",
               width: int = 560, height: int = 300) -> str:
    """An inline SVG line chart of ``{name: [(x, y)]}`` (markers on short series, legend below);
    ``bar_chart`` is :func:`smolforge.svg_plot.bar_chart`.

    >>> svg = line_chart("Loss", {"loss": [(1, 2.0), (2, 1.5)], "eval_loss": [(2, 1.7)]})
    >>> svg.startswith("<svg") and svg.count('class="series"') == 2 and "eval_loss" in svg
    True
    """
    return draw_lines(title, [Series(name, points) for name, points in series.items()], xlabel=xlabel,
                      layout=Layout(width=width, height=height))


# --------------------------------------------------------------------------- the data


def curve_groups(records: list[dict]) -> list[tuple[str, dict[str, list[tuple[float, float]]]]]:
    """Numeric series of metrics.jsonl grouped into plots: ``[(title, {key: [(step, value)]})]``.

    >>> [(t, sorted(s)) for t, s in curve_groups([{"step": 1, "loss": 2.0, "eval_loss": 2.1, "lr": 1e-3,
    ...                                            "reward": 0.5, "kl": 0.01, "time": 5.0}])]
    [('Learning rate', ['lr']), ('Loss', ['eval_loss', 'loss']), ('KL', ['kl']), ('Reward', ['reward'])]
    """
    series: dict[str, list[tuple[float, float]]] = {}
    for i, record in enumerate(records):
        step = _num(record.get("step"))
        x = float(i) if step is None else step
        for key, value in record.items():
            if key in _NOT_CURVES or str(key).startswith(WATCH_PREFIX) or _num(value) is None:
                continue
            series.setdefault(str(key), []).append((x, float(value)))
    grouped: dict[str, dict[str, list[tuple[float, float]]]] = {}
    order = [title for title, _ in _GROUPS]
    for key, points in series.items():
        low = key.lower()
        title = next((t for t, test in _GROUPS if test(low)), None)
        if title is None:
            title = key.split("/", 1)[0] if "/" in key else "Other"
            if title not in order:
                order.append(title)
        grouped.setdefault(title, {})[key] = points
    if "Other" in order:
        order.remove("Other")
        order.append("Other")
    out = []
    for title in order:
        if title not in grouped:
            continue
        items = list(grouped[title].items())
        chunks = _by_scale(items) if title == "Other" else [items]
        chunks = [c[i:i + MAX_SERIES_PER_PLOT] for c in chunks for i in range(0, len(c), MAX_SERIES_PER_PLOT)]
        for n, chunk in enumerate(chunks, start=1):
            out.append((title if len(chunks) == 1 else f"{title} ({n}/{len(chunks)})", dict(chunk)))
    return out


def _by_scale(items: list[tuple[str, list[tuple[float, float]]]]) -> list[list]:
    """Split unrelated series into chunks whose largest values are within 20x of each other."""
    def size(points: list[tuple[float, float]]) -> float:
        return max(abs(y) for _, y in points) or 1e-12

    chunks: list[list] = []
    for item in sorted(items, key=lambda kv: size(kv[1])):
        if chunks and size(item[1]) <= 20 * size(chunks[-1][0][1]):
            chunks[-1].append(item)
        else:
            chunks.append([item])
    return chunks


def lineage_runs(run: Run, runs: Runs) -> list[Run]:
    """This run's ancestors (every readable one up the parent links) oldest first, then the run.

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> with runs.start("data", "d", recipe={}) as d: pass
    >>> with runs.start("sft", "s", recipe={}, parents=[d]) as s: pass
    >>> [r.name for r in lineage_runs(s, runs)]
    ['d', 's']
    """
    try:
        tree = runs.lineage(str(run.path.resolve()))
    except RunError:
        return [run]
    found: dict[Path, Run] = {}
    stack = list(tree.get("parents") or [])
    while stack:
        node = stack.pop()
        if node.get("status") in ("missing", "cycle"):
            continue
        path = Path(node["path"]).resolve()
        if path not in found and path != run.path.resolve():
            try:
                found[path] = Run(path)
            except RunError:
                continue
        stack.extend(node.get("parents") or [])
    ancestors = sorted(found.values(), key=lambda r: (str(r.info.get("started_at") or ""), r.name))
    return [*ancestors, run]


def _suites(run: Run) -> list[dict]:
    out = []
    if run.eval_dir.is_dir():
        for path in sorted(run.eval_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and isinstance(data.get("tasks"), dict):
                out.append(data)
    return out


def _gates(run: Run) -> dict | None:
    path = run.gates_path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------- the page

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 12px}
h1{font-size:24px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:6px 0 12px} th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f5f5f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#777;font-style:italic} .status-done{color:#2ca02c} .status-failed{color:#d62728} .status-running{color:#ff7f0e}
.pass{color:#2ca02c;font-weight:600} .fail{color:#d62728;font-weight:600} .up{color:#2ca02c} .down{color:#d62728}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:12px}
svg.plot{background:#fff;max-width:100%;height:auto}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px} pre{background:#f7f7f7;padding:8px;overflow:auto}
"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, tuple):  # (html, css class): already escaped
                cells.append(f'<td class="{cell[1]}">{cell[0]}</td>')
            elif isinstance(cell, (int, float)) and not isinstance(cell, bool):
                cells.append(f'<td class="num">{_esc(f"{cell:.4g}" if isinstance(cell, float) else cell)}</td>')
            else:
                cells.append(f"<td>{'-' if cell is None else _esc(cell)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _trend(delta: float) -> str:
    return "num up" if delta > 5e-4 else "num down" if delta < -5e-4 else "num"


def _note(text: str) -> str:
    return f'<p class="note">{_esc(text)}</p>'


def _header(run: Run, runs: Runs) -> str:
    info = run.info
    wall = wall_seconds(info)
    if wall is None:
        wall_text = f"not finished (started {info.get('started_at') or '?'})"
    else:
        wall_text = f"{wall:.1f} s" + (f" ({wall / 60:.1f} min)" if wall >= 120 else "")
    parents = []
    for ref in run.parents:
        sibling = run.path.parent / ref
        report = RunLayout(sibling).report_path
        link = f"../{ref}/{report.name}" if report.is_file() and "/" not in ref else None
        parents.append(f'<a href="{_esc(link)}">{_esc(ref)}</a>' if link else _esc(ref))
    status = str(run.status)
    rows = [
        ("stage", _esc(run.stage)),
        ("status", f'<span class="status-{_esc(status)}">{_esc(status)}</span>'),
        ("parents", ", ".join(parents) or "none (a root run)"),
        ("started", _esc(info.get("started_at") or "-")),
        ("ended", _esc(info.get("ended_at") or "-")),
        ("wall time", _esc(wall_text)),
        ("git commit", _esc((info.get("git_commit") or "-")[:12])),
        ("versions", _esc(", ".join(f"{k} {v}" for k, v in (info.get("versions") or {}).items()) or "-")),
        ("folder", f"<code>{_esc(run.path)}</code>"),
    ]
    if info.get("error"):
        rows.insert(2, ("error", f'<span class="fail">{_esc(info["error"])}</span>'))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    parts = [f"<h1>{_esc(run.name)}</h1>", f'<table class="header">{body}</table>']
    fps = info.get("data_fingerprints") or {}
    if fps:
        parts.append("<details><summary>data fingerprints "
                     f"({len(fps)})</summary>" + _table(["data", "fingerprint"],
                                                        [[k, _short_hash(v)] for k, v in fps.items()],
                                                        "fingerprints") + "</details>")
    return "".join(parts)


def _gates_section(run: Run) -> str:
    data = _gates(run)
    if not data:
        return ""
    rows = []
    for result in data.get("results") or []:
        ok = bool(result.get("passed"))
        rows.append([(("pass" if ok else "FAIL"), "pass" if ok else "fail"), result.get("rule"),
                     result.get("message")])
    verdict = "all passed" if data.get("passed") else "FAILED"
    return (f"<h2>Promotion gates: {_esc(verdict)}</h2>"
            + _table(["verdict", "rule", "detail"], rows, "gates")
            + _note(f"checked {data.get('checked_at', '?')} by the pipeline ({data.get('step', '?')})"))


def _eval_section(run: Run) -> str:
    metrics = run.metrics
    scores = primary_scores(metrics)
    parts = ["<h2>Eval scores</h2>"]
    if not scores:
        parts.append(_note(f"No eval scores in this run (run: smolforge eval --set run={run.name})."))
        return "".join(parts)
    documents: dict[str, Any] = {}
    suite_rows = []
    for suite in _suites(run):
        suite_rows.append([suite.get("suite"), ", ".join(sorted(suite["tasks"])), suite.get("limit"),
                           suite.get("seconds"), suite.get("backend")])
        for task, spec in suite["tasks"].items():
            documents[task] = spec.get("documents")
    groups = list(scores)
    parts.append(bar_chart(f"{run.name}: primary metric per task", groups, [(run.name, [scores[g] for g in groups])]))
    rows = []
    for key in score_columns([metrics]):
        task, _, metric = key.partition("/")
        value = _num(metrics.get(key))
        if value is None:
            continue
        stderr = _num(metrics.get(f"{key}/stderr"))
        random = _num(metrics.get(f"{key}/random"))
        delta = None if random is None else value - random
        delta_cell = None if delta is None else (f"{delta:+.3f}", _trend(delta))
        rows.append([task, metric + (" (primary)" if key in scores else ""), (f"{value:.3f}", "num"),
                     (f"± {stderr:.3f}", "num") if stderr is not None else None,
                     (f"{random:.3f}", "num") if random is not None else None, delta_cell,
                     documents.get(task)])
    parts.append(_table(["task", "metric", "score", "stderr", "random", "vs random", "documents"], rows, "scores"))
    if suite_rows:
        parts.append(_table(["suite", "tasks", "limit", "seconds", "backend"], suite_rows, "suites"))
    return "".join(parts)


def _lineage_section(run: Run, runs: Runs) -> str:
    chain = [r for r in lineage_runs(run, runs) if primary_scores(r.metrics)]
    parts = ["<h2>Along the lineage</h2>"]
    if not any(r is not run for r in chain):
        parts.append(_note("No ancestor of this run has eval scores to compare with."))
        return "".join(parts)
    keys: dict[str, float | None] = {}
    per_run = {r.name: primary_scores(r.metrics) for r in chain}
    for scores in per_run.values():
        for key, score in scores.items():
            if keys.get(key) is None:
                keys[key] = score.get("random")
    groups = list(keys)
    bars = [(f"{r.name} ({r.stage})", [per_run[r.name].get(g) for g in groups]) for r in chain]
    parts.append(bar_chart("primary metric per task, by stage", groups, bars, width=1000))
    rows = []
    for key in groups:
        cells: list[Any] = [key, (f"{keys[key]:.3f}", "num") if keys[key] is not None else None]
        cells += [(_esc(score_cell(per_run[r.name].get(key)) or "-"), "num") for r in chain]
        mine = per_run[run.name].get(key) if run in chain else None
        prev = next((per_run[r.name][key] for r in reversed(chain[:-1]) if key in per_run[r.name]), None)
        if mine and prev and run in chain:
            d = mine["value"] - prev["value"]
            cells.append((f"{d:+.3f}", _trend(d)))
        else:
            cells.append(None)
        rows.append(cells)
    heads = ["task/metric", "random", *(f"{r.name} ({r.stage})" for r in chain), "change vs nearest ancestor"]
    parts.append(_table(heads, rows, "lineage"))
    return "".join(parts)


def _curves_section(run: Run, records: list[dict]) -> str:
    parts = ["<h2>Training curves</h2>"]
    if not run.metrics_path.is_file():
        parts.append(_note("No metrics.jsonl in this run: nothing was logged per step."))
        return "".join(parts)
    groups = curve_groups(records)
    if not groups:
        parts.append(_note("metrics.jsonl holds no numeric series to plot."))
        return "".join(parts)
    parts.append(f'<p class="note">{len(records)} logged records from metrics.jsonl.</p>')
    parts.append('<div class="plots">' + "".join(line_chart(t, s) for t, s in groups) + "</div>")
    return "".join(parts)


def watch_groups(records: list[dict]) -> list[tuple[str, dict[str, list[tuple[float, float]]]]]:
    """The scores of the checkpoints scored while training (``eval/<metric>`` rows of metrics.jsonl,
    :mod:`smolforge.eval_watch`), one plot per suite or task: ``[(title, {metric: [(step, value)]})]``;
    stderr, random baselines and timings left out.

    >>> watch_groups([{"step": 10, "eval/redteam/attack_success": 0.0, "eval/redteam/attack_success/stderr": 0.0},
    ...               {"step": 12, "loss": 1.0}, {"step": 20, "eval/redteam/attack_success": 0.5,
    ...                                            "eval/redteam/seconds": 3.1, "eval/returned_at_step": 24}])
    [('redteam', {'redteam/attack_success': [(10.0, 0.0), (20.0, 0.5)]})]
    """
    grouped: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for record in records:
        step = _num(record.get("step"))
        for key, value in record.items():
            name = str(key)
            if (step is None or not name.startswith(WATCH_PREFIX) or name.endswith(("/stderr", "/random", "seconds"))
                    or name == "eval/returned_at_step" or _num(value) is None):
                continue
            metric = name[len(WATCH_PREFIX):]
            grouped.setdefault(metric.split("/", 1)[0], {}).setdefault(metric, []).append((step, float(value)))
    return list(grouped.items())


def _stop_rules(run: Run) -> list:
    """The recipe's ``eval_while_training.stop_on`` rules (none when unreadable)."""
    from smolforge.errors import RecipeError
    from smolforge.gates import parse_gates

    spec = (run.info.get("recipe") or {}).get("eval_while_training") or {}
    try:
        return parse_gates(spec.get("stop_on") or [], "stop_on") if isinstance(spec, dict) else []
    except RecipeError:
        return []


def _watch_section(run: Run, records: list[dict]) -> str:
    groups = watch_groups(records)
    stopped = run.info.get("stopped_by")
    stopped = stopped if isinstance(stopped, dict) else None
    if not groups and stopped is None:
        return ""
    parts = ["<h2>Evaluation while training</h2>",
             _note("Checkpoints scored in a separate process while training went on (eval_while_training:); "
                   "x is the step of the checkpoint scored, red lines are the stop_on rules.")]
    if stopped is not None:
        parts.append(f'<p class="fail">stopped at step {_esc(stopped.get("stopped_at"))}: '
                     f'{_esc(stopped.get("message"))}</p>')
    rules = _stop_rules(run)
    charts = []
    for title, series in groups:
        lines = [Series(name, points) for name, points in list(series.items())[:MAX_SERIES_PER_PLOT]]
        xs = [x for points in series.values() for x, _ in points]
        lo, hi = min(xs), max(xs + ([float(stopped["stopped_at"])] if stopped and _num(stopped.get("stopped_at"))
                                      is not None else []))
        hi = hi if hi > lo else lo + 1
        for gate in rules:
            for rule in ("max", "min"):
                threshold = getattr(gate, rule)
                if gate.metric in series and threshold is not None:
                    lines.append(Series(f"stop_on {gate.metric} {rule} {threshold:g}", [(lo, threshold), (hi, threshold)],
                                        color="#d62728", width=1.0, markers=False))
        marks = [Mark(f"stopped at step {stopped['stopped_at']}", float(stopped["stopped_at"]), "#d62728")] \
            if stopped is not None and _num(stopped.get("stopped_at")) is not None else []
        charts.append(draw_lines(f"{title} (while training)", lines, xlabel="checkpoint step", x_range=(lo, hi),
                                 marks=marks))
    if charts:
        parts.append('<div class="plots">' + "".join(charts) + "</div>")
    return "".join(parts)


def _summary_section(run: Run, records: list[dict]) -> str:
    figures = training_figures(run, records)
    scored = set(score_columns([run.metrics]))
    shown = {"final loss": True, "wall s": True, "steps": "train/steps" not in run.metrics}
    rows = [[k, v] for k, v in figures.items() if v is not None and shown.get(k)]
    rows += [[k, v] for k, v in run.metrics.items()
             if k not in scored and not str(k).endswith(("/stderr", "/random")) and _num(v) is not None]
    if not rows:
        return ""
    return "<h2>Summary metrics</h2>" + _table(["figure", "value"], rows, "summary")


def render_report(run: Run, runs: Runs) -> str:
    """The report page of ``run`` as one HTML string (see :func:`write_report`).

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> with runs.start("data", "d", recipe={}) as run: pass
    >>> page = render_report(run, runs)
    >>> "No metrics.jsonl" in page and "No eval scores" in page and "<script" not in page
    True
    """
    records = read_metrics(run)
    recipe = json.dumps(run.info.get("recipe") or {}, indent=2, default=str)
    body = [
        _header(run, runs),
        _gates_section(run),
        _eval_section(run),
        _lineage_section(run, runs),
        _curves_section(run, records),
        _watch_section(run, records),
        _summary_section(run, records),
        f"<h2>Recipe</h2><details><summary>resolved recipe</summary><pre>{_esc(recipe)}</pre></details>",
        f'<p class="note">generated {_esc(utc_now())} by smolforge</p>',
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(run.name)}: smolforge report</title><style>{_CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def write_report(run: Run, runs: Runs) -> Path:
    """Write ``<run>/report.html`` atomically (self-contained: inline SVG and CSS, no network).

    Returns the path of the page; see the module docstring for an example.
    """
    page = render_report(run, runs)
    path = run.report_path
    with atomic_writer(path) as fh:
        fh.write(page)
    return path

