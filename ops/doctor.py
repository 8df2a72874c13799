"""``smolforge doctor RUN``: the playbook's troubleshooting table, applied to a run's metrics.

    smolforge doctor pretrain-demo
    smolforge doctor pretrain-big --device-memory 80 --json
    smolforge doctor pretrain-big --strict        # CI: exit 1 when anything is found

Reads ``metrics.jsonl`` (the logged figures, and events such as ``{"event": "spike"}``) and
``run.json`` (recipe, status, error, realised mixture) of any training run, pretraining or a TRL
stage, and runs six checks. Each is a small pure function over the logged rows that returns
:class:`Finding` objects naming the steps, the values, the likely cause and the fix:

============ ============================================== ===================== ==========================
check        symptom (thresholds)                           likely cause          what to do
============ ============================================== ===================== ==========================
divergence   a NaN/inf loss or grad norm, or a failed run   numerical instability clip, loss scale, lower
             whose error says nan/inf/diverged                                    LR, longer warmup
memory       ``memory_gb`` above 90 % of the device, or a   activations / batch   activation checkpointing,
             failed run whose error says out of memory                            smaller micro-batch,
                                                                                  ZeRO-3, offload
throughput   tokens/s below 0.5x its running median for     data loading          loader workers, prefetch
             >= 2 logged windows; ``data_share`` (the wait  (confirmed, or ruled
             for batches) says whether the loader did it    out, by the data wait)
loss_noise   the loss >= 5x its step-to-step noise (and     a shift in the data   inspect that phase's
             >= 5 %) above its running median, at >= 2      (the mixture phase    batches, filter
             logged steps close together (1: a spike)       active is named)
grad_norm    the grad norm >= 3x its running median (the    a bad batch or an     check those batches,
             playbook's alert), or spike-guard events       unstable update       clip, rewind
utilisation  median MFU below 10 % (``--min-mfu``)          communication waits   gradient sync, micro-batch
             while the wait for data is small               (several processes)   size
============ ============================================== ===================== ==========================

A check that lacks its inputs (no MFU logged, no device memory known) or does not apply (low MFU
on one process: no communication to wait on) says why instead of passing in silence. The
command prints a table, or one JSON object with ``--json``; it exits 0 whatever it finds (a
diagnosis is a report), 1 with ``--strict`` when there are findings (CI), 2 on a RunError. A
healthy run has no findings:

    >>> rows = [{"step": s, "loss": round(3.0 - 0.1 * s, 3), "grad_norm": 1.0, "tokens_per_s": 1000.0}
    ...         for s in range(1, 13)]
    >>> diagnose(rows, {"stage": "pretrain", "status": "done"}).findings
    []
    >>> rows[9]["grad_norm"] = 5.0
    >>> [(f.check, f.steps, f.evidence) for f in diagnose(rows, {"status": "done"}).findings]
    [('grad_norm', (10, 10), 'grad norm 5 at step 10 (5x its running median 1)')]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import textwrap
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from smolforge.errors import RunError

__all__ = ["Finding", "Diagnosis", "NotChecked", "CHECKS", "diagnose", "diagnose_run", "read_records", "settings_of",
           "divergence", "memory", "throughput", "loss_noise", "grad_norm", "utilisation", "logprob_parity",
           "render_report", "as_json", "add_arguments", "command"]

# -- thresholds (each check's defaults) --------------------------------------------------------
MEMORY_LIMIT = 0.9          # the playbook: memory < 90 % of the device
THROUGHPUT_DROP = 0.5       # tokens/s below this fraction of its running median...
SLOW_WINDOWS = 2            # ...for at least this many logged windows in a row
DATA_EXPLAINS = 0.5         # the data wait explains at least this share of the slowdown: the loader did it
LOSS_WINDOW = 5             # logged losses in the running median (short: it lags behind a falling loss)
LOSS_HISTORY = 5            # logged losses before a loss can be judged
LOSS_FACTOR = 5.0           # loud: above the running median by this many typical deviations...
LOSS_FLOOR = 0.05           # ...and by at least 5 %
GRAD_FACTOR = 3.0           # the playbook's alert: the grad norm jumps >= 3x
GRAD_WINDOW = 20
GRAD_HISTORY = 5
MIN_MFU = 0.10              # SmolLM3 ran at ~26-31 % MFU; below 10 % the device mostly waits
DATA_BOUND = 0.2            # a data wait above this share of the time is not "small"
MEDIAN_WINDOW = 10          # logged windows in the throughput running median
RL_STAGES = ("grpo", "rloo", "ppo")
MAX_LOGPROB_GAP = 0.05      # online RL: mean |log π_train − log π_engine| per sampled token (recipe's parity.max_gap)
WIDTH = 110                 # the report's text lines


class NotChecked(Exception):
    """A check could not run: its inputs are missing (the message says which)."""


@dataclass
class Finding:
    check: str                          # the rule that found it (one of CHECKS)
    symptom: str                        # what the metrics show, in the playbook's words
    steps: tuple[int, int] | None       # first and last step of the evidence
    evidence: str                       # the values behind it
    cause: str                          # the likely cause
    fix: str                            # what to do
    figures: dict = field(default_factory=dict)  # the numbers, for --json


@dataclass
class Diagnosis:
    run: str
    stage: str | None
    status: str | None
    steps: tuple[int, int] | None       # first and last logged step
    findings: list[Finding]
    not_checked: dict[str, str]         # check -> why it could not run

    @property
    def healthy(self) -> bool:
        return not self.findings


# -- reading a run ------------------------------------------------------------------------------
def read_records(path: Path) -> list[dict]:
    """The JSON objects of a metrics.jsonl (none when it is missing). A last line cut short by a
    running writer is skipped; any other bad line is an error naming the file and line."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            if number == len(lines):
                break
            raise RunError(f"{path} line {number}: not a JSON object ({exc})") from None
        if isinstance(record, dict):
            records.append(record)
    return records


def _value(record: dict, key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def series(rows: Sequence[dict], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every row with a finite number under ``key``.

    >>> series([{"step": 1, "loss": 2.0}, {"step": 2, "loss": float("nan")}, {"step": 3}], "loss")
    [(1, 2.0)]
    """
    out = []
    for row in rows:
        value = _value(row, key)
        if value is not None and math.isfinite(value) and "step" in row:
            out.append((int(row["step"]), value))
    return out


def settings_of(info: dict) -> dict[str, tuple[str, Any]]:
    """The recipe values the fixes cite, as ``{what: (recipe key, value)}``, for a pretraining
    recipe (``train.*``) or a TRL stage's (``trainer.*``); what the recipe lacks is left out.

    >>> settings_of({"recipe": {"train": {"learning_rate": 0.003, "grad_clip": 1.0}}})["lr"]
    ('train.learning_rate', 0.003)
    >>> settings_of({"recipe": {"trainer": {"learning_rate": 1e-05, "max_grad_norm": 1.0}}})["clip"]
    ('trainer.max_grad_norm', 1.0)
    """
    recipe = info.get("recipe") or {}
    names = {"lr": "learning_rate", "warmup": "warmup_steps", "clip": "grad_clip", "micro_batch": "micro_batch_size",
             "grad_accum": "grad_accum", "zero_stage": "zero_stage", "checkpointing": "activation_checkpointing",
             "offload": "offload_optimizer", "precision": "precision", "max_steps": "max_steps"}
    section = "train"
    if not isinstance(recipe.get("train"), dict) and isinstance(recipe.get("trainer"), dict):
        section = "trainer"
        names = {"lr": "learning_rate", "warmup": "warmup_steps", "warmup_ratio": "warmup_ratio",
                 "clip": "max_grad_norm", "micro_batch": "per_device_train_batch_size",
                 "grad_accum": "gradient_accumulation_steps", "checkpointing": "gradient_checkpointing",
                 "max_steps": "max_steps"}
    values = recipe.get(section) or {}
    out = {what: (f"{section}.{key}", values[key]) for what, key in names.items() if key in values}
    if section == "trainer":
        precision = "bf16" if values.get("bf16") else "fp16" if values.get("fp16") else None
        if precision:
            out["precision"] = ("trainer.bf16" if precision == "bf16" else "trainer.fp16", precision)
    return out


# -- small helpers ------------------------------------------------------------------------------
def _span(steps: Sequence[int]) -> tuple[int, int]:
    return (min(steps), max(steps))


def steps_text(span: tuple[int, int] | None) -> str:
    """``12`` or ``12-20`` (``-`` without steps)."""
    if span is None:
        return "-"
    return str(span[0]) if span[0] == span[1] else f"{span[0]}-{span[1]}"


def _g(value: float) -> str:
    """3 significant digits; thousands in full: ``0.0123``, ``4.5``, ``10,055``, ``4.97e+06``."""
    if abs(value) >= 1e6:
        return f"{value:.3g}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _ratio(value: float) -> str:
    return f"{value:.2g}x" if value < 10 else f"{value:.0f}x"


def _pct(value: float) -> str:
    return f"{value * 100:.0f} %" if value >= 0.01 or value == 0 else f"{value * 100:.1g} %"


def _cite(settings: dict, what: str) -> str:
    key, value = settings.get(what, (None, None))
    return f"{key} {json.dumps(value)}" if key else ""


def _groups(steps: Sequence[int], gap: int) -> list[list[int]]:
    """Sorted steps split where two neighbours are more than ``gap`` apart."""
    groups: list[list[int]] = []
    for step in sorted(set(steps)):
        if groups and step - groups[-1][-1] <= gap:
            groups[-1].append(step)
        else:
            groups.append([step])
    return groups


def _interval(points: Sequence[tuple[int, float]]) -> int:
    """The usual number of steps between two logged points (``log_every``)."""
    gaps = [b[0] - a[0] for a, b in zip(points, points[1:]) if b[0] > a[0]]
    return int(statistics.median(gaps)) if gaps else 1


def _spike_events(events: Sequence[dict], what: str) -> list[dict]:
    """The spike guard's events whose reason starts with ``what`` ("loss" or "grad norm")."""
    return [e for e in events if e.get("event") == "spike" and str(e.get("reason", "")).startswith(what)]


# -- the checks ---------------------------------------------------------------------------------
def divergence(rows: Sequence[dict], events: Sequence[dict], info: dict) -> list[Finding]:
    """A NaN/inf loss or grad norm, a spike-guard event for one, or a failed run whose error says
    nan, inf or diverged: numerical instability.

    >>> info = {"status": "failed", "error": "loss became nan at step 3: lower train.learning_rate",
    ...         "recipe": {"train": {"learning_rate": 1.0, "warmup_steps": 2, "grad_clip": 1.0}}}
    >>> [finding] = divergence([{"step": 1, "loss": 5.0}, {"step": 2, "loss": 80.0}], [], info)
    >>> finding.steps, finding.evidence
    ((3, 3), 'last finite loss 80 at step 2; the run failed: loss became nan at step 3: lower train.learning_rate')
    """
    bad = [(int(r["step"]), key, value) for r in rows if "step" in r
           for key, value in ((k, _value(r, k)) for k in r if "loss" in k or k == "grad_norm")
           if value is not None and not math.isfinite(value)]
    guard = [e for e in _spike_events(events, "loss") + _spike_events(events, "grad norm")
             if re.search(r" is (nan|-?inf)", str(e.get("reason", "")))]
    error = str(info.get("error") or "") if info.get("status") == "failed" else ""
    says = re.search(r"\bnan\b|\binf\b|diverg|non-finite", error, re.IGNORECASE)
    if not bad and not guard and not says:
        return []
    steps = [s for s, _, _ in bad] + [int(e["step"]) for e in guard]
    at = re.search(r"at step (\d+)", error) if says else None
    if at:
        steps.append(int(at.group(1)))
    parts = []
    if bad:
        step, key, value = min(bad, key=lambda b: (b[0], b[1] != "loss"))  # the loss first
        parts.append(f"{key.replace('_', ' ')} {value} at step {step} (first non-finite value)")
    if guard:
        parts.append(f"the spike guard saw non-finite values at step(s) {', '.join(str(e['step']) for e in guard[:5])}")
    finite = series(rows, "loss")
    first_bad = min(steps) if steps else None
    before = [(s, v) for s, v in finite if first_bad is None or s < first_bad]
    if before and not bad:
        parts.insert(0, f"last finite loss {_g(before[-1][1])} at step {before[-1][0]}")
    if says:
        parts.append(f"the run failed: {error.strip().splitlines()[-1][:200]}")
    settings = settings_of(info)
    return [Finding("divergence", "training crashed / NaN", _span(steps) if steps else None, "; ".join(parts),
                    "numerical instability", _stability_fix(settings),
                    {"non_finite": [[s, k, str(v)] for s, k, v in bad], "error": error or None,
                     **{what: value for what, (_, value) in settings.items()}})]


def _stability_fix(settings: dict) -> str:
    fixes = []
    clip = settings.get("clip")
    value = clip[1] if clip else None
    if clip is None or not isinstance(value, (int, float)):
        fixes.append("clip gradients at norm 1.0")
    elif value <= 0:
        fixes.append(f"clip gradients: {clip[0]} is off (0); set 1.0")
    elif value > 1:
        fixes.append(f"clip gradients harder ({_cite(settings, 'clip')}; the playbook: 1.0)")
    else:
        fixes.append(f"keep gradient clipping on ({_cite(settings, 'clip')})")
    precision = settings.get("precision", (None, None))[1]
    fixes.append({"fp16": "check the fp16 loss scale (dynamic scaling), or train in bf16",
                  "bf16": "check the loss scale: bf16 needs none, keep softmax and reductions in fp32",
                  "fp32": "the loss scale is not it (fp32 uses none)"}.get(precision, "check the loss scale"))
    lr = settings.get("lr")
    fixes.append(f"lower the LR ({_cite(settings, 'lr')}; try {_g(lr[1] / 4)} or run an LR range test)"
                 if lr and isinstance(lr[1], (int, float)) else "lower the LR")
    warmup = settings.get("warmup")
    fixes.append(f"longer warmup ({_cite(settings, 'warmup')}; the playbook: >= 1k steps at scale)"
                 if warmup else "longer warmup")
    return ", ".join(fixes)


def memory(rows: Sequence[dict], info: dict, device_memory_gb: float | None = None,
           limit: float = MEMORY_LIMIT) -> list[Finding]:
    """``memory_gb`` above ``limit`` of the device's memory (``device_memory_gb``, else what the run
    recorded as ``train/device_memory_gb``), or a failed run whose error says out of memory.

    >>> rows = [{"step": s, "memory_gb": gb} for s, gb in [(10, 60.0), (20, 74.0), (30, 75.5)]]
    >>> [f.evidence for f in memory(rows, {}, device_memory_gb=80)]
    ['memory_gb up to 75.5 of 80 GB (94 %) at steps 20-30 (2 of 3 logged windows above 90 %)']
    """
    total = device_memory_gb or _value(info.get("metrics") or {}, "train/device_memory_gb")
    error = str(info.get("error") or "") if info.get("status") == "failed" else ""
    oom = re.search(r"out of memory|\bOOM\b|CUBLAS_STATUS_ALLOC_FAILED", error, re.IGNORECASE)
    points = series(rows, "memory_gb")
    if not total and not oom:
        raise NotChecked("the device's memory is unknown (the run did not record train/device_memory_gb): "
                         "pass --device-memory GB")
    if not points and not oom:
        raise NotChecked("no memory_gb logged")
    over = [(s, v) for s, v in points if total and v > limit * total]
    if not over and not oom:
        return []
    parts, steps = [], [s for s, _ in over]
    if over:
        peak = max(v for _, v in over)
        parts.append(f"memory_gb up to {_g(peak)} of {_g(total)} GB ({_pct(peak / total)}) at steps "
                     f"{steps_text(_span(steps))} ({len(over)} of {len(points)} logged windows above {_pct(limit)})")
        minutes = _minutes(rows, steps)
        if minutes is not None and minutes >= 5:
            parts.append(f"above {_pct(limit)} for {minutes:.0f} min (the playbook alerts at 5)")
    if oom:
        parts.append(f"the run failed: {error.strip().splitlines()[-1][:200]}")
    settings = settings_of(info)
    return [Finding("memory", "out of memory" if oom else f"memory above {_pct(limit)} of the device",
                    _span(steps) if steps else None, "; ".join(parts), "activations / batch",
                    _memory_fix(settings),
                    {"device_memory_gb": total, "peak_gb": max((v for _, v in points), default=None),
                     "over_limit_steps": steps, "error": error or None})]


def _minutes(rows: Sequence[dict], steps: Sequence[int]) -> float | None:
    times = [_value(r, "time") for r in rows if r.get("step") in set(steps) and _value(r, "time") is not None]
    return (max(times) - min(times)) / 60 if len(times) >= 2 else None


def _memory_fix(settings: dict) -> str:
    fixes = []
    if not settings.get("checkpointing", (None, False))[1]:
        key = settings.get("checkpointing", ("train.activation_checkpointing", None))[0]
        fixes.append(f"activation checkpointing ({key}: true; ~30 % less memory for ~10 % more compute)")
    micro, accum = settings.get("micro_batch"), settings.get("grad_accum")
    if micro and isinstance(micro[1], int) and micro[1] > 1:
        half = micro[1] // 2
        keep = f" and {accum[0]} {accum[1]} -> {accum[1] * 2} to keep the batch" if accum else ""
        fixes.append(f"a smaller micro-batch ({micro[0]} {micro[1]} -> {half}{keep})")
    else:
        fixes.append("a smaller micro-batch")
    zero = settings.get("zero_stage")
    if zero is None or zero[1] != 3:
        fixes.append(f"ZeRO-3 ({zero[0]} 3; now {zero[1]})" if zero else "ZeRO-3")
    offload = settings.get("offload")
    if not (offload and offload[1]):
        fixes.append(f"offload ({offload[0]}: true)" if offload else "offload (optimizer states to CPU memory)")
    return ", ".join(fixes)


def throughput(rows: Sequence[dict], drop: float = THROUGHPUT_DROP, min_windows: int = SLOW_WINDOWS) -> list[Finding]:
    """tokens/s below ``drop`` x its running median (the last 10 normal windows, the first window
    left out: it holds the start-up) for ``min_windows`` logged windows in a row. With
    ``data_share`` logged, the share of the slowdown the wait for batches explains says whether
    the loader did it.

    >>> rows = [{"step": s, "tokens_per_s": 1000.0, "data_share": 0.02} for s in range(1, 9)]
    >>> for row in rows[4:6]:
    ...     row.update(tokens_per_s=250.0, data_share=0.75)
    >>> [finding] = throughput(rows)
    >>> finding.steps, finding.cause
    ((5, 6), 'data loading bottleneck (confirmed by the data wait)')
    >>> finding.evidence.split("; ")[1]
    'waiting for batches 75 % of the time against 2 % before, which explains 99 % of the slowdown'
    """
    logged = series(rows, "tokens_per_s")
    points = logged[1:]
    if len(points) < 4:
        raise NotChecked(f"{len(logged)} tokens/s values logged; needs 5 or more" if logged else
                         "no tokens/s logged (pretraining logs tokens_per_s; TRL stages do not)")
    shares = dict(series(rows, "data_share"))
    normal: list[tuple[int, float]] = []          # windows at the usual speed (a slow one never joins)
    found: list[tuple[list, list]] = []           # (slow stretch, the normal windows before it)
    stretch: list[tuple[int, float]] = []
    before: list[tuple[int, float]] = []
    for step, tps in points + [(-1, math.inf)]:   # the sentinel closes a stretch that runs to the end
        history = [v for _, v in normal[-MEDIAN_WINDOW:]]
        if len(history) >= 3 and tps < drop * statistics.median(history):
            before = before if stretch else normal[-MEDIAN_WINDOW:]
            stretch.append((step, tps))
            continue
        if len(stretch) >= min_windows:
            found.append((stretch, before))
        stretch = []
        normal.append((step, tps))
    findings = []
    for slow, normal_before in found:
        for part in _by_cause(slow, normal_before, shares, min_windows):
            at = slow.index(part[0])
            since = slow[at - 1][0] if at else normal_before[-1][0]    # the window before it: its wall time
            findings.append(_slowdown(part, normal_before, shares, rows, drop, since))
    return findings


def _by_cause(stretch, before, shares: dict, min_windows: int) -> list[list]:
    """``stretch`` cut where its windows' cause changes: a loader stall that runs straight into a slowdown
    of another kind (a neighbour's job, a checkpoint write) is two findings, each with its own cause,
    not one whose data wait explains half of it. Each window's cause is whether its own wait for
    batches explains :data:`DATA_EXPLAINS` of its own slowdown; the stretch stays whole where the wait
    is not logged, or where no part of it is ``min_windows`` long."""
    if not all(s in shares for s, _ in stretch) or not any(s in shares for s, _ in before):
        return [stretch]
    tps_b = statistics.median(v for _, v in before)
    share_b = statistics.median(shares[s] for s, _ in before if s in shares)

    def loader(step: int, tps: float) -> bool:
        extra = 1 / tps - 1 / tps_b
        return extra > 0 and (shares[step] / tps - share_b / tps_b) / extra >= DATA_EXPLAINS

    parts: list[list] = []
    for window in stretch:
        if parts and loader(*parts[-1][-1]) == loader(*window):
            parts[-1].append(window)
        else:
            parts.append([window])
    long_enough = [part for part in parts if len(part) >= min_windows]
    return long_enough if len(parts) > 1 and long_enough else [stretch]


def _slowdown(stretch, before, shares: dict, rows: Sequence[dict], drop: float, since: int) -> Finding:
    steps = [s for s, _ in stretch]
    tps_d = statistics.median(v for _, v in stretch)
    tps_b = statistics.median(v for _, v in before)
    evidence = (f"tokens/s {_g(tps_d)} over steps {steps_text(_span(steps))} against {_g(tps_b)} before "
                f"({_ratio(tps_d / tps_b)}, below {drop:g}x for {len(stretch)} logged windows)")
    figures: dict[str, Any] = {"tokens_per_s": tps_d, "tokens_per_s_before": tps_b}
    wall = _minutes(rows, [since] + steps)
    if wall is not None:
        evidence += f", {wall * 60:.0f} s of wall time"
        first = next(_value(r, "time") for r in rows if r.get("step") == steps[0] and _value(r, "time"))
        figures["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first))
    loader_fix = ("more loader workers, prefetch (read the next batches ahead), a local NVMe copy of the packed "
                  f"data; check the storage the batches of steps {steps_text(_span(steps))} came from")
    if not all(s in shares for s in steps) or not any(s in shares for s, _ in before):
        evidence += "; the run does not log its wait for batches (data_share), so the cause is not confirmed"
        return Finding("throughput", "throughput dropped suddenly", _span(steps), evidence,
                       "data loading bottleneck (likely)", loader_fix, figures)
    share_d = statistics.median(shares[s] for s in steps)
    share_b = statistics.median(shares[s] for s, _ in before if s in shares)
    explained = (share_d / tps_d - share_b / tps_b) / (1 / tps_d - 1 / tps_b)
    explained = min(max(explained, 0.0), 1.0)
    evidence += (f"; waiting for batches {_pct(share_d)} of the time against {_pct(share_b)} before, which explains "
                 f"{_pct(explained)} of the slowdown")
    figures.update(data_share=round(share_d, 4), data_share_before=round(share_b, 4), data_explains=round(explained, 3))
    if explained >= DATA_EXPLAINS:
        return Finding("throughput", "throughput dropped suddenly", _span(steps), evidence,
                       "data loading bottleneck (confirmed by the data wait)", loader_fix, figures)
    return Finding("throughput", "throughput dropped suddenly", _span(steps), evidence,
                   "not the data loader: compute or communication slowed", "check what else ran on the machine then "
                   "(another job, a checkpoint write), a straggling rank or a slow interconnect, thermal throttling; "
                   "compare per-rank step times", figures)


def loss_noise(rows: Sequence[dict], events: Sequence[dict], info: dict, factor: float = LOSS_FACTOR,
               floor: float = LOSS_FLOOR) -> list[Finding]:
    """Steps whose loss sits above its running median (the last 5 normal losses) by ``factor`` x
    the run's typical relative noise (the median of each loss against the mean of its neighbours)
    and by at least ``floor``. The running median lags behind a falling loss, so a loss that falls
    never counts; the noise estimate cancels a trend. Loud steps close together
    (within 5 logged windows) form one range: a noisier loss when there are two or more, a loss
    spike when one. The spike guard's loss events count as loud steps. The range is matched to
    the recipe's mixture phases, so the finding names the data to inspect.

    >>> rows = [{"step": s, "loss": 1.0 + 0.01 * (s % 3)} for s in range(1, 21)]
    >>> for s, loss in [(13, 2.4), (14, 1.0), (15, 3.1), (16, 1.9)]:
    ...     rows[s - 1]["loss"] = loss
    >>> info = {"recipe": {"train": {"max_steps": 20}, "mixture": [{"until": 0.6, "weights": {"web": 1.0}},
    ...         {"until": 1.0, "weights": {"web": 0.5, "noise": 0.5}}]}}
    >>> [finding] = loss_noise(rows, [], info)
    >>> finding.symptom, finding.steps
    ('loss curve got noisier', (13, 16))
    >>> print(finding.fix.split(";")[0])
    inspect the batches of steps 13-16: mixture phase 1 (steps 13-20, weights web 0.5, noise 0.5), which begins at ...
    """
    if info.get("stage") in RL_STAGES:
        raise NotChecked(f"a {info['stage']} loss is a policy-gradient objective, not a loss that falls with training")
    points = series(rows, "loss")
    if len(points) < LOSS_HISTORY + 3:
        raise NotChecked(f"{len(points)} losses logged; needs {LOSS_HISTORY + 3} or more")
    # the step-to-step noise: each loss against the mean of its two neighbours (a trend cancels out)
    losses = [v for _, v in points]
    typical = statistics.median(abs(b - (a + c) / 2) / max(abs(b), 1e-8)
                                for a, b, c in zip(losses, losses[1:], losses[2:]))
    bar = max(factor * typical, floor)
    normal: list[float] = []
    loud: dict[int, tuple[float, float]] = {}   # step -> (loss, running median)
    for i, (step, value) in enumerate(points):
        if i >= LOSS_HISTORY:
            median = statistics.median(normal[-LOSS_WINDOW:])
            if _relative(value, normal[-LOSS_WINDOW:]) > bar:
                loud[step] = (value, median)
                continue
        normal.append(value)
    guard = _spike_events(events, "loss")
    every = _interval(points)
    groups = _groups(list(loud) + [int(e["step"]) for e in guard], gap=LOSS_WINDOW * every)
    return [_noisy(group, loud, guard, points, typical, bar, info) for group in groups]


def _relative(value: float, history: Sequence[float]) -> float:
    median = statistics.median(history)
    return (value - median) / max(abs(median), 1e-8)


def _noisy(group: list[int], loud: dict, guard: list[dict], points, typical: float, bar: float, info: dict) -> Finding:
    span = _span(group)
    in_range = [v for s, v in points if span[0] <= s <= span[1]]
    before = [v for s, v in points if s < span[0]][-LOSS_WINDOW:]
    parts = []
    hits = [s for s in group if s in loud]
    if hits:
        worst = max(hits, key=lambda s: loud[s][0] / max(loud[s][1], 1e-8))
        value, median = loud[worst]
        parts.append(f"loss above its running median by more than {_pct(bar)} at {len(hits)} of "
                     f"{len(in_range)} logged steps in {steps_text(span)} (worst: {_g(value)} against {_g(median)} at "
                     f"step {worst}); typical step-to-step noise {_pct(typical)}")
    if len(in_range) >= 2 and len(before) >= 2:
        parts.append(f"std {_g(statistics.pstdev(in_range))} over the range against {_g(statistics.pstdev(before))} "
                     "over the steps before")
    skipped = [e for e in guard if span[0] <= int(e["step"]) <= span[1]]
    if skipped:
        parts.append(f"the spike guard flagged the loss at step(s) {', '.join(str(e['step']) for e in skipped[:8])} "
                     f"(action: {skipped[0].get('action')})")
    phases = phases_over(info, span)
    where = f"inspect the batches of steps {steps_text(span)}"
    if phases:
        where += ": " + "; ".join(phases)
    data = (info.get("recipe") or {}).get("data")
    if isinstance(data, str):
        where += f" (data run '{data}')"
    symptom = "loss curve got noisier" if len(group) >= 2 else "loss spike"
    fix = f"{where}; filter or reweight what they hold"
    if "spike" in (info.get("recipe") or {}):
        fix += "; the spike guard (spike.action skip or rewind) drops single bad batches"
    return Finding("loss_noise", symptom, span, "; ".join(parts), "a shift in the data (its quality or its mix)",
                   fix, {"loud_steps": hits, "typical_deviation": typical, "threshold": bar,
                         "guard_steps": [int(e["step"]) for e in skipped], "phases": phases})


def phases_over(info: dict, span: tuple[int, int]) -> list[str]:
    """The recipe's mixture phases active over ``span``, with their steps, weights and (from run.json)
    realised shares, and where a phase begins inside the span.

    >>> info = {"recipe": {"train": {"max_steps": 10}, "mixture": [{"until": 0.5, "weights": {"a": 1.0}},
    ...         {"until": 1.0, "weights": {"b": 1.0}}]}, "metrics": {"train/mix/phase1/b": 1.0}}
    >>> phases_over(info, (6, 8))
    ['mixture phase 1 (steps 6-10, weights b 1; realised b 100 %), which begins at step 6']
    """
    recipe = info.get("recipe") or {}
    mixture, train = recipe.get("mixture") or [], recipe.get("train") or {}
    total = train.get("max_steps")
    if not mixture or not isinstance(total, int) or total < 1:
        return []

    # as pretrain.mixture.MixtureSampler.phase_index: step s is in the first phase with s / total <= until
    ends = [total if i == len(mixture) - 1 else min(total, math.floor((float(p.get("until", 1.0)) + 1e-12) * total))
            for i, p in enumerate(mixture)]
    metrics = info.get("metrics") or {}
    out = []
    for index, phase in enumerate(mixture):
        first, last = (ends[index - 1] if index else 0) + 1, ends[index]
        if first > last or last < span[0] or first > span[1]:
            continue
        weights = ", ".join(f"{d} {w:g}" for d, w in (phase.get("weights") or {}).items()
                            if isinstance(w, (int, float)) and w > 0)
        realised = ", ".join(f"{k.rsplit('/', 1)[1]} {_pct(v)}" for k, v in sorted(metrics.items())
                             if k.startswith(f"train/mix/phase{index}/") and isinstance(v, (int, float)))
        text = f"mixture phase {index} (steps {steps_text((first, last))}, weights {weights}"
        text += f"; realised {realised})" if realised else ")"
        if index > 0 and span[0] <= first <= span[1]:
            text += f", which begins at step {first}"
        out.append(text)
    return out


def grad_norm(rows: Sequence[dict], events: Sequence[dict], info: dict, factor: float = GRAD_FACTOR) -> list[Finding]:
    """Grad norms at or above ``factor`` x the running median of the last 20 normal ones (the
    playbook's alert), and the spike guard's grad-norm events (which see every step, also those
    between two logged windows).

    >>> rows = [{"step": s, "grad_norm": 0.5} for s in range(1, 11)]
    >>> rows[7]["grad_norm"] = 2.0
    >>> spike = {"step": 6, "event": "spike", "reason": "grad norm 1.9 > 3.0x rolling median 0.5", "action": "logged"}
    >>> [finding] = grad_norm(rows, [spike], {})
    >>> finding.steps
    (6, 8)
    >>> for part in finding.evidence.split("; "):
    ...     print(part)
    grad norm 2 at step 8 (4x its running median 0.5)
    the spike guard logged grad-norm spikes at step(s) 6 (action: logged)
    """
    points = series(rows, "grad_norm")
    normal: list[float] = []
    jumps: list[tuple[int, float, float]] = []
    for step, value in points:
        history = normal[-GRAD_WINDOW:]
        if len(history) >= GRAD_HISTORY and statistics.median(history) > 0 \
                and value >= factor * statistics.median(history):
            jumps.append((step, value, statistics.median(history)))
            continue
        normal.append(value)
    guard = [e for e in _spike_events(events, "grad norm") if not re.search(r" is (nan|-?inf)", str(e.get("reason")))]
    if not jumps and not guard:
        if len(points) < GRAD_HISTORY + 1:
            raise NotChecked(f"{len(points)} grad norms logged; needs {GRAD_HISTORY + 1} or more")
        return []
    parts = []
    if jumps:
        listed = [f"{_g(v)} at step {s} ({_ratio(v / m)} its running median {_g(m)})" for s, v, m in jumps[:5]]
        more = f" and {len(jumps) - 5} more" if len(jumps) > 5 else ""
        parts.append("grad norm " + ", ".join(listed) + more)
    if guard:
        shown = ", ".join(str(e["step"]) for e in guard[:8]) + (f" and {len(guard) - 8} more" if len(guard) > 8 else "")
        parts.append(f"the spike guard logged grad-norm spikes at step(s) {shown} (action: {guard[0].get('action')})")
    steps = [s for s, _, _ in jumps] + [int(e["step"]) for e in guard]
    settings = settings_of(info)
    clip = "clip gradients at 1.0"
    if settings.get("clip", (0, 0))[1]:
        clip = f"keep clipping on ({_cite(settings, 'clip')})"
    named = sorted(set(steps))
    fix = (f"check the batches of step{'s' if len(named) > 1 else ''} {', '.join(str(s) for s in named[:8])}; {clip}; "
           "if jumps recur, "
           "lower the LR or lengthen warmup")
    if "spike" in (info.get("recipe") or {}):
        fix += "; spike.action rewind undoes a step the guard could only log"
    return [Finding("grad_norm", f"grad norm jumped >= {factor:g}x", _span(steps), "; ".join(parts),
                    "a bad batch or an unstable update", fix,
                    {"jumps": [[s, v, m] for s, v, m in jumps], "guard_steps": [int(e["step"]) for e in guard]})]


def utilisation(rows: Sequence[dict], info: dict, min_mfu: float = MIN_MFU) -> list[Finding]:
    """Median MFU (the first window, which holds the start-up, left out) below ``min_mfu``: with a
    small wait for data and several processes, communication waits; with a large data wait, the
    loader. One process with a small data wait has no communication to wait on: not checked (the
    reason says the MFU).

    >>> rows = [{"step": s, "mfu": 0.04, "data_share": 0.01} for s in range(1, 6)]
    >>> [finding] = utilisation(rows, {"metrics": {"train/processes": 8}})
    >>> finding.cause, finding.evidence.split("; ")[1:]
    ('communication waits', ['SmolLM3 ran at ~26-31 %)', 'waiting for batches 1 % of the time', '8 processes'])
    """
    points = series(rows, "mfu")[1:]
    if not points:
        raise NotChecked("no MFU logged (pretraining logs it where the device's peak is known; TRL stages do not)")
    mfu = statistics.median(v for _, v in points)
    if mfu >= min_mfu:
        return []
    shares = [v for _, v in series(rows, "data_share")[1:]]
    share = statistics.median(shares) if shares else None
    processes = int(_value(info.get("metrics") or {}, "train/processes") or 1)
    span = _span([s for s, _ in points])
    evidence = f"median MFU {mfu * 100:.2g} % over steps {steps_text(span)} (below {_pct(min_mfu)}; SmolLM3 ran at ~26-31 %)"
    evidence += (f"; waiting for batches {_pct(share)} of the time" if share is not None else
                 "; the run does not log its wait for batches (data_share)")
    settings = settings_of(info)
    micro = _cite(settings, "micro_batch") or "the micro-batch"
    if share is not None and share >= DATA_BOUND:
        cause, fix = ("data loading bottleneck", "more loader workers, prefetch, a local NVMe copy of the packed data")
    elif processes > 1:
        evidence += f"; {processes} processes"
        cause = "communication waits"
        zero = _cite(settings, "zero_stage") or "the ZeRO stage"
        fix = (f"tune gradient sync (overlap it with backward, bucket sizes, {zero}: the lowest stage that fits), "
               f"a larger micro-batch ({micro}) so each sync carries more compute, fewer syncs through gradient "
               f"accumulation ({_cite(settings, 'grad_accum') or 'grad_accum'})")
    else:
        raise NotChecked(f"median MFU {mfu * 100:.2g} % with one process and a small wait for data: no communication to "
                         f"wait on (the playbook's cause); a larger micro-batch ({micro}) fills the device better")
    return [Finding("utilisation", "low accelerator utilisation", span, evidence, cause, fix,
                    {"mfu": mfu, "data_share": share, "processes": processes, "min_mfu": min_mfu})]


CHECKS = ("divergence", "memory", "throughput", "loss_noise", "grad_norm", "utilisation", "logprob_parity")


def logprob_parity(rows: Sequence[dict], info: dict) -> list[Finding]:
    """Online-RL steps whose rollouts the engine sampled off the policy: the mean engine-vs-trainer
    log-prob gap on the sampled tokens above the recipe's ``parity.max_gap`` (else 0.05).

    >>> rows = [{"step": 1, "parity/logprob_gap_mean": 1e-7}, {"step": 2, "parity/logprob_gap_mean": 0.09}]
    >>> [finding] = logprob_parity(rows, {})
    >>> finding.steps, finding.evidence
    ((2, 2), 'mean log-prob gap 0.09 at step 2 (limit 0.05); 1e-07 at the first measured step')
    """
    points = series(rows, "parity/logprob_gap_mean") or series(rows, "sampling/sampling_logp_difference/mean")
    if not points and info.get("stage") not in RL_STAGES:
        return []                   # no engine samples for the trainer: nothing to compare
    if not points:
        raise NotChecked("no parity/logprob_gap_mean logged: the rollouts came from HF generate (the policy "
                         "itself), or a run older than this check")
    limit = ((info.get("recipe") or {}).get("parity") or {}).get("max_gap") or MAX_LOGPROB_GAP
    over = [(s, v) for s, v in points if v > limit]
    if not over:
        return []
    listed = ", ".join(f"{_g(v)} at step {s}" for s, v in over[:5]) + (f" and {len(over) - 5} more" if len(over) > 5 else "")
    evidence = f"mean log-prob gap {listed} (limit {_g(limit)}); {_g(points[0][1])} at the first measured step"
    return [Finding("logprob_parity", "the inference engine samples off the policy being trained",
                    _span([s for s, _ in over]), evidence,
                    "a weight sync that did not happen, or the engine's dtype or kernels differ from the trainer's",
                    "check the rollout server's log for the reloads; serve in the trainer's dtype; keep TRL's "
                    "importance-sampling correction on (rl/is_correction in run.json)",
                    {"over": [[s, v] for s, v in over], "limit": limit})]


def _is_training(record: dict) -> bool:
    """A row of training figures: a loss (``loss``, PPO's ``policy_loss``…) or a grad norm."""
    return any("loss" in key or key == "grad_norm" for key in record) and "event" not in record


def diagnose_run(run: Any, *, device_memory_gb: float | None = None, min_mfu: float | None = None) -> Diagnosis:
    """:func:`diagnose` over a :class:`~smolforge.runs.Run`'s metrics.jsonl and run.json; a run that
    logged no loss (and did not fail) is not a training run: RunError."""
    records = read_records(run.metrics_path)
    if not any(_is_training(r) for r in records) and run.status != "failed":
        raise RunError(f"run '{run.name}' (stage {run.stage}, {run.status}) logged no training loss in "
                       f"{run.metrics_path}: doctor reads training runs (pretrain, sft, dpo, ...)")
    return diagnose(records, {"name": run.name, **run.info}, device_memory_gb=device_memory_gb,
                    min_mfu=MIN_MFU if min_mfu is None else min_mfu)


def diagnose(records: Sequence[dict], info: dict, *, device_memory_gb: float | None = None,
             min_mfu: float = MIN_MFU) -> Diagnosis:
    """Every check over a run's metrics.jsonl records (figures and events) and its run.json ``info``."""
    rows = [r for r in records if "event" not in r]
    events = [r for r in records if "event" in r]
    calls = {
        "divergence": lambda: divergence(rows, events, info),
        "memory": lambda: memory(rows, info, device_memory_gb),
        "throughput": lambda: throughput(rows),
        "loss_noise": lambda: loss_noise(rows, events, info),
        "grad_norm": lambda: grad_norm(rows, events, info),
        "utilisation": lambda: utilisation(rows, info, min_mfu),
        "logprob_parity": lambda: logprob_parity(rows, info),
    }
    findings: list[Finding] = []
    not_checked: dict[str, str] = {}
    for name in CHECKS:
        try:
            findings += calls[name]()
        except NotChecked as why:
            not_checked[name] = str(why)
    steps = [int(r["step"]) for r in rows if isinstance(r.get("step"), int)]
    return Diagnosis(str(info.get("name") or ""), info.get("stage"), info.get("status"),
                     _span(steps) if steps else None, findings, not_checked)


# -- output -------------------------------------------------------------------------------------
def as_json(diagnosis: Diagnosis) -> dict:
    """One JSON object: the run, ``healthy``, the findings and the checks that could not run.

    >>> as_json(Diagnosis("r", "pretrain", "done", (1, 4), [], {}))["healthy"]
    True
    """
    return {"run": diagnosis.run, "stage": diagnosis.stage, "status": diagnosis.status,
            "steps": list(diagnosis.steps) if diagnosis.steps else None, "healthy": diagnosis.healthy,
            "findings": [{**asdict(f), "steps": list(f.steps) if f.steps else None} for f in diagnosis.findings],
            "checked": [c for c in CHECKS if c not in diagnosis.not_checked],
            "not_checked": diagnosis.not_checked}


def render_report(diagnosis: Diagnosis) -> tuple[str, list[str], list[list[Any]], str]:
    """The report as (heading, table headers, table rows, text after the table).

    >>> heading, headers, rows, after = render_report(Diagnosis("r", "pretrain", "done", (1, 4), [], {}))
    >>> heading, rows
    ('r: pretrain run, done, steps 1-4: healthy, no findings', [])
    """
    d = diagnosis
    where = f"{d.run}: {d.stage or 'unknown'} run, {d.status or 'unknown status'}, steps {steps_text(d.steps)}"
    heading = f"{where}: healthy, no findings" if d.healthy else \
        f"{where}: {len(d.findings)} finding{'s' if len(d.findings) > 1 else ''}"
    rows = [[i, f.symptom, steps_text(f.steps), f.cause] for i, f in enumerate(d.findings, 1)]
    lines = []
    for i, f in enumerate(d.findings, 1):
        where = "" if f.steps is None else f", step{'s' if f.steps[0] != f.steps[1] else ''} {steps_text(f.steps)}"
        lines += [""] + _wrapped(f"{i}. {f.symptom} ({f.check}{where})", "")
        lines += _wrapped(f"evidence: {f.evidence}", "   ") + _wrapped(f"what to do: {f.fix}", "   ")
    checked = [c for c in CHECKS if c not in d.not_checked]
    lines += [""] + _wrapped(f"checked: {', '.join(checked) or 'nothing'}", "")
    for name, why in d.not_checked.items():
        lines += _wrapped(f"not checked: {name}: {why}", "")
    return heading, ["#", "symptom", "steps", "likely cause"], rows, "\n".join(lines if rows else lines[1:])


def _wrapped(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, width=WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [indent]


# -- the command --------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """``smolforge doctor``'s arguments."""
    p.add_argument("run", metavar="RUN", help="a training run's name or folder (pretraining or a TRL stage)")
    p.add_argument("--device-memory", type=float, metavar="GB", help="memory of one device in GB, for the "
                   "memory check (default: what the run recorded, train/device_memory_gb)")
    p.add_argument("--min-mfu", type=float, default=MIN_MFU, metavar="F",
                   help=f"median MFU below this is low utilisation (default {MIN_MFU:g})")
    p.add_argument("--strict", action="store_true", help="exit 1 when there are findings (for CI); without it "
                   "the exit code is 0 whatever is found")


def command(args: argparse.Namespace, ctx: Any) -> int:
    """Diagnose ``args.run``; print the report (a table) or, with --json, one JSON object."""
    from smolforge.table import print_table

    diagnosis = diagnose_run(ctx.runs.get(args.run, require_done=False), device_memory_gb=args.device_memory,
                             min_mfu=args.min_mfu)
    if ctx.json:
        print(json.dumps(as_json(diagnosis), indent=2, default=str))
    else:
        heading, headers, rows, after = render_report(diagnosis)
        print(heading)
        if rows:
            print_table(headers, rows)
        print(after)
    return 1 if args.strict and not diagnosis.healthy else 0
