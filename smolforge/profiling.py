"""Record a torch.profiler trace of a few training steps into the run, and say where the time went.

A training recipe's ``profile:`` section (:class:`ProfileSpec`) names a range of optimizer steps;
the stage's loop calls :meth:`StepProfiler.step` once per optimizer step (pretraining directly,
the TRL stages through a TrainerCallback). When the range is recorded, every rank writes

- ``profile/trace-rank{N}.json``: a Chrome trace (open it at https://ui.perfetto.dev or chrome://tracing);
- ``profile/summary-rank{N}.json``: the top operators and the compute/communication split;

and the main process prints both as tables (on stderr: stdout may carry ``--json``) and keeps
``profile/*`` figures for run.json (:attr:`StepProfiler.metrics`).

The split is of the recorded steps' wall time on the host. *Communication* is time inside a
collective (c10d, gloo, NCCL, … on any thread, see :func:`is_communication`); *compute* is time
inside any other operator and not inside a collective; *other* is time no operator ran anywhere
(Python, data loading, waits outside an operator). With CUDA the device's kernel time is split the
same way (device *idle* is the rest of the wall time). Overlapped compute and communication counts
as communication.

    >>> [is_communication(name) for name in ("c10d::allreduce_", "ncclDevKernel_AllReduce_Sum_f32", "aten::mm")]
    [True, True, False]
    >>> split = time_split(steps=[(0, 100)], ops=[(10, 40), (30, 60)], comm=[(50, 70)])  # microseconds
    >>> split["compute_share"], split["communication_share"], split["other_share"]
    (0.4, 0.2, 0.4)
"""
from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from smolforge.errors import RecipeError
from smolforge.runs import RunLayout

__all__ = ["ProfileSpec", "StepProfiler", "check_profile", "is_communication", "union_length", "time_split",
           "profile_window", "top_operators", "summarize", "print_summary"]

Interval = tuple[float, float]

# Collective operators and kernels: c10d's dispatcher ops, the backends' own records (gloo:all_reduce,
# nccl:all_reduce, NCCL kernels), record_param_comms, and a collective's name as a word of another
# library's op (deepspeed::inference_all_reduce_). aten:: ops are never collectives (aten::broadcast_to).
_COMM = re.compile(r"^(c10d::|gloo:|record_param_comms$|(one)?ccl[:_]|mpi:|ucc:)|nccl"
                   r"|(^|[:_. ])(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|barrier)",
                   re.IGNORECASE)


@dataclass
class ProfileSpec:
    """A training recipe's ``profile:`` section (off by default)."""

    start: int = 0                    # first optimizer step recorded (1 = the first step); 0 = profiling off
    steps: int = 3                    # optimizer steps recorded from ``start``
    warmup: int = 1                   # steps before ``start`` run under the profiler but discarded (start-up cost)
    record_shapes: bool = False       # record operator input shapes (in the trace; larger files)
    profile_memory: bool = False      # record tensor allocations (memory timeline in the trace)
    with_stack: bool = False          # record the Python stack of every operator (slow; larger files)
    top: int = 15                     # operators in the printed table and the summary


def check_profile(spec: ProfileSpec, max_steps: int | None = None) -> None:
    """RecipeError naming the ``profile.*`` field that cannot work (``max_steps``: the stage's, when known).

    >>> check_profile(ProfileSpec(start=2, steps=3), max_steps=10)
    >>> check_profile(ProfileSpec(start=2, steps=-1))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: profile.steps must be >= 1, got -1
    """
    for name, low in (("start", 0), ("steps", 1), ("warmup", 0), ("top", 1)):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise RecipeError(f"profile.{name} must be >= {low}, got {value!r}")
    last = spec.start + spec.steps - 1
    if spec.start and max_steps is not None and max_steps > 0 and last > max_steps:
        raise RecipeError(f"profile.start {spec.start} + profile.steps {spec.steps} ends at step {last}, past the "
                          f"run's {max_steps} steps; lower profile.start or profile.steps")


# -- the arithmetic (plain functions)

def is_communication(name: str) -> bool:
    """Whether an operator or kernel name is a collective (communication) rather than compute.

    >>> [is_communication(n) for n in ("gloo:all_reduce", "record_param_comms", "nccl:all_gather",
    ...                                "ncclKernel_ReduceScatter_RING", "c10d::broadcast_", "c10d::barrier")]
    [True, True, True, True, True, True]
    >>> [is_communication(n) for n in ("aten::addmm", "aten::broadcast_tensors", "ProfilerStep#3",
    ...                                "autograd::engine::evaluate_function: MmBackward0")]
    [False, False, False, False]
    """
    return not name.startswith("aten::") and bool(_COMM.search(name))


def union_length(intervals: Iterable[Interval]) -> float:
    """Total length covered by ``intervals`` (overlaps counted once).

    >>> union_length([(0, 10), (5, 15), (20, 25)]), union_length([])
    (20, 0)
    """
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total, end = total + hi - lo, hi
        elif hi > end:
            total, end = total + hi - end, hi
    return total


def _clip(intervals: Iterable[Interval], windows: Sequence[Interval]) -> list[Interval]:
    """The parts of ``intervals`` inside ``windows``."""
    return [(max(lo, w0), min(hi, w1)) for lo, hi in intervals for w0, w1 in windows if lo < w1 and hi > w0]


def time_split(steps: Sequence[Interval], ops: Iterable[Interval], comm: Iterable[Interval],
               busy_name: str = "compute", idle_name: str = "other") -> dict[str, float]:
    """Seconds and shares of the ``steps``' wall time spent in communication, in other ops and in neither.

    ``steps``: the recorded steps' spans; ``ops``: spans of every compute operator; ``comm``: spans of
    collectives; all in microseconds, on any thread (overlaps count once; overlapping compute and
    communication counts as communication). Times outside ``steps`` are left out.

    >>> split = time_split(steps=[(0, 100), (100, 200)], ops=[(10, 90), (120, 150)], comm=[(80, 100), (250, 300)])
    >>> split["total_s"], split["compute_s"], split["communication_s"], split["other_s"]
    (0.0002, 0.0001, 2e-05, 8e-05)
    >>> split["compute_share"] + split["communication_share"] + split["other_share"]
    1.0
    """
    steps = list(steps)
    comm = _clip(comm, steps)
    total = union_length(steps)
    communication = union_length(comm)
    compute = union_length(_clip(ops, steps) + comm) - communication
    other = max(0.0, total - compute - communication)
    split = {"total_s": total, busy_name + "_s": compute, "communication_s": communication, idle_name + "_s": other}
    split = {k: round(v / 1e6, 6) for k, v in split.items()}
    for name, value in ((busy_name, compute), ("communication", communication), (idle_name, other)):
        split[name + "_share"] = round(value / total, 4) if total else 0.0
    return split


def top_operators(averages: Iterable[Any], n: int, by: str = "self_cpu_time_total") -> list[dict]:
    """The ``n`` operators with the most ``by`` time from ``prof.key_averages()`` rows (step markers and
    ``record_function`` annotations left out), each with its share of all operators' ``by`` time.

    >>> from types import SimpleNamespace as Row
    >>> rows = [Row(key="aten::mm", count=4, self_cpu_time_total=3000, self_device_time_total=0),
    ...         Row(key="ProfilerStep*", count=2, self_cpu_time_total=9000, self_device_time_total=0),
    ...         Row(key="aten::add", count=8, self_cpu_time_total=1000, self_device_time_total=0)]
    >>> top_operators(rows, 1)
    [{'name': 'aten::mm', 'calls': 4, 'self_cpu_ms': 3.0, 'self_device_ms': 0.0, 'share': 0.75, 'communication': False}]
    """
    kept = [row for row in averages if not row.key.startswith("ProfilerStep")
            and not getattr(row, "is_user_annotation", False) and _time(row, by) > 0]
    everything = sum(_time(row, by) for row in kept)
    kept.sort(key=lambda row: _time(row, by), reverse=True)
    return [{"name": row.key, "calls": int(row.count),
             "self_cpu_ms": round(_time(row, "self_cpu_time_total") / 1e3, 3),
             "self_device_ms": round(_time(row, "self_device_time_total") / 1e3, 3),
             "share": round(_time(row, by) / everything, 4), "communication": is_communication(row.key)}
            for row in kept[:n]]


def _time(row: Any, attribute: str) -> float:
    """A key_averages time in microseconds (device times were named ``*_cuda_*`` before torch 2.4)."""
    value = getattr(row, attribute, None)
    if value is None and "device" in attribute:
        value = getattr(row, attribute.replace("device", "cuda"), None)
    return float(value or 0)


def profile_window(start: int, steps: int, warmup: int, done: int) -> tuple[int, int, int] | None:
    """``(wait, warmup, active)`` profiler steps for recording optimizer steps ``start`` … ``start+steps-1``
    when ``done`` steps ran before the profiler began (a resumed run); None when nothing is left to record.

    >>> profile_window(start=3, steps=2, warmup=1, done=0)   # steps 1: wait, 2: warmup, 3-4: recorded
    (1, 1, 2)
    >>> profile_window(start=3, steps=2, warmup=1, done=3), profile_window(start=3, steps=2, warmup=1, done=4)
    ((0, 0, 1), None)
    """
    if start < 1:
        return None
    lead = start - done - 1
    if lead < 0:
        active = start + steps - 1 - done
        return (0, 0, active) if active > 0 else None
    return lead - min(warmup, lead), min(warmup, lead), steps


# -- the profiler

class StepProfiler:
    """``torch.profiler.profile`` over the :class:`ProfileSpec`'s steps; a no-op when profiling is off.

    ``with StepProfiler(spec, run_dir, rank, done=resumed_step) as profiler:`` around the training loop,
    ``profiler.step()`` after every optimizer step. ``main``: this process prints the tables (default
    rank 0). After the range: :attr:`summary` (this rank's) and :attr:`metrics` (``profile/*``, for run.json).
    """

    def __init__(self, spec: ProfileSpec, run_dir: str | Path, rank: int = 0, *, done: int = 0,
                 main: bool | None = None):
        self.spec, self.folder, self.rank = spec, RunLayout(run_dir).profile_dir, rank
        self.main = rank == 0 if main is None else main
        self.window = profile_window(spec.start, spec.steps, spec.warmup, done)
        self.first = max(spec.start, done + 1)   # the first optimizer step recorded
        self.summary: dict | None = None
        self.metrics: dict[str, float] = {}
        self._profile = None
        self._failed = False
        self._calls = 0   # step() calls: the optimizer steps finished under the profiler

    @property
    def trace_path(self) -> Path:
        return self.folder / f"trace-rank{self.rank}.json"

    def __enter__(self) -> StepProfiler:
        if self.window is None:
            return self
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        wait, warmup, active = self.window
        with warnings.catch_warnings():   # warmup 0 (start at step 1) is the user's choice: no warning
            warnings.simplefilter("ignore")
            plan = schedule(wait=wait, warmup=warmup, active=active, repeat=1)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profile = profile(activities=activities, schedule=plan, on_trace_ready=self._on_ready,
                                record_shapes=self.spec.record_shapes, profile_memory=self.spec.profile_memory,
                                with_stack=self.spec.with_stack)
        self._profile.__enter__()
        return self

    def step(self) -> None:
        """One optimizer step has finished."""
        if self._profile is not None:
            self._calls += 1
            self._profile.step()

    def __exit__(self, exc_type, exc, tb) -> None:
        """Stops the profiler; a range cut short by the end of training is still written, one cut
        short by an error is not."""
        if self._profile is not None:
            self._failed = exc_type is not None
            profile, self._profile = self._profile, None
            profile.__exit__(exc_type, exc, tb)

    def _on_ready(self, prof) -> None:
        if self._failed:
            return
        from smolforge.runs import write_json_atomic

        self.folder.mkdir(parents=True, exist_ok=True)
        staging = self.folder / f".{self.trace_path.name}.tmp-{os.getpid()}"
        prof.export_chrome_trace(str(staging))
        os.replace(staging, self.trace_path)   # a reader sees a whole trace or none
        self.summary = self._summarize(prof)
        write_json_atomic(self.folder / f"summary-rank{self.rank}.json", self.summary)
        self.metrics = {"profile/steps": self.summary["steps"], "profile/seconds": self.summary["host"]["total_s"],
                        **{f"profile/{k}_share": self.summary["host"][f"{k}_share"] for k in ("compute", "other")},
                        "profile/comm_share": self.summary["host"]["communication_share"]}
        if "device" in self.summary:
            device = self.summary["device"]
            self.metrics.update({"profile/device_compute_share": device["compute_share"],
                                 "profile/device_comm_share": device["communication_share"],
                                 "profile/device_idle_share": device["idle_share"]})
        if self.main:
            print_summary(self.summary, file=sys.stderr)

    def _summarize(self, prof) -> dict:
        wait, warmup, active = self.window
        finished = max(0, min(active, self._calls - wait - warmup))   # fewer when training ended inside the range
        summary = summarize(prof.events(), prof.key_averages(), self.spec.top, finished)
        return {"rank": self.rank, "first_step": self.first, "last_step": self.first + summary["steps"] - 1,
                "trace": self.trace_path.name, **summary}


def summarize(events: Iterable[Any], averages: Iterable[Any], top: int, finished: int | None = None) -> dict:
    """The summary of one recorded range from torch.profiler's ``events()`` and ``key_averages()``:
    ``steps`` (recorded), ``host`` (:func:`time_split`), ``top_cpu`` (:func:`top_operators`) and,
    when device kernels were recorded, ``device`` and ``top_device``. ``finished``: the steps the loop
    completed; a step span it opened but never finished (training ended first) is left out."""
    from torch.autograd import DeviceType

    events, averages = list(events), list(averages)
    steps = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("ProfilerStep"))
    steps = steps[:finished] if finished is not None else steps
    if not steps and events:   # no step markers (not expected): the span of everything recorded
        steps = [(min(e.time_range.start for e in events), max(e.time_range.end for e in events))]
    host, device = {"ops": [], "comm": []}, {"ops": [], "comm": []}
    for e in events:
        if e.name.startswith("ProfilerStep"):
            continue
        side = host if e.device_type == DeviceType.CPU else device
        span = (e.time_range.start, e.time_range.end)
        if is_communication(e.name):
            side["comm"].append(span)
        elif not e.is_user_annotation:   # a record_function span covers Python too: not compute
            side["ops"].append(span)
    summary = {"steps": len(steps), "host": time_split(steps, host["ops"], host["comm"]),
               "top_cpu": top_operators(averages, top)}
    if device["ops"] or device["comm"]:
        summary["device"] = time_split(steps, device["ops"], device["comm"], idle_name="idle")
        summary["top_device"] = top_operators(averages, top, by="self_device_time_total")
    return summary


def print_summary(summary: dict, file: TextIO | None = None) -> None:
    """The tables a profiled run prints: top operators, then where the recorded steps' time went.

    >>> print_summary({"rank": 0, "first_step": 3, "last_step": 4, "steps": 2, "trace": "trace-rank0.json",
    ...     "host": time_split([(0, 2e6)], [(1e5, 1.2e6)], [(1.2e6, 1.5e6)]),
    ...     "top_cpu": [{"name": "aten::mm", "calls": 4, "self_cpu_ms": 880.0, "self_device_ms": 0.0,
    ...                  "share": 0.8, "communication": False}]}, file=sys.stdout)
    profile rank 0, steps 3-4: top operators by self CPU time
    operator  calls  self CPU ms  share %
    --------  -----  -----------  -------
    aten::mm      4          880       80
    time of the recorded steps (2.0 s)
    part           seconds  share %
    -------------  -------  -------
    compute            1.1       55
    communication      0.3       15
    other              0.6       30
    """
    from smolforge.table import print_table

    out = file or sys.stderr
    title = f"profile rank {summary['rank']}, steps {summary['first_step']}-{summary['last_step']}"
    tables = [("top_cpu", "self CPU", "self_cpu_ms"), ("top_device", "self device", "self_device_ms")]
    for key, what, column in tables:
        if key in summary:
            rows = [[op["name"], op["calls"], op[column], round(op["share"] * 100, 1)] for op in summary[key]]
            print_table(["operator", "calls", f"{what} ms", "share %"], rows,
                        title=f"{title}: top operators by {what} time", file=out)
    for side, where, idle in (("host", "", "other"), ("device", "device ", "idle")):
        if side in summary:
            split = summary[side]
            rows = [[part, split[f"{part}_s"], round(split[f"{part}_share"] * 100, 1)]
                    for part in ("compute", "communication", idle)]
            print_table(["part", "seconds", "share %"], rows,
                        title=f"{where}time of the recorded steps ({split['total_s']} s)", file=out)
