"""Evaluation while training: score checkpoints in a separate process and stop on a breached gate.

A training stage's recipe takes ``eval_while_training:`` (:class:`EvalWhileTraining`)::

    eval_while_training:
      every: 50                    # the checkpoint of every 50th step is scored (0 = off)
      suites: [redteam]            # red-team, lm-eval or tool suites, by name or folder
      limit: 8                     # items per red-team category / documents per task
      stop_on:                     # promotion-gate rules (min / max) on those scores
        - {metric: redteam/attack_success, max: 0.3}
      max_lag: 50                  # training waits when it runs this many steps past a checkpoint still being scored

At every ``every``-th step the trainer saves a checkpoint and :class:`EvalWatch` scores it in a
background process (``python -m smolforge.evals.while_training serve``, the eval stage itself, kept for
the next checkpoints so its imports are paid once) while training goes on: at most one evaluation
runs and one waits; a newer checkpoint replaces the waiting one (the newest wins; the replaced step is
counted as skipped). The checkpoint is first snapshotted as
a run-shaped folder, ``<run>/eval/while_training/step-N/`` (its model files hard-linked, so the
Trainer's checkpoint rotation cannot delete them under the evaluation); the scores land in that
folder's run.json and ``eval/`` as ``smolforge eval`` writes them, the hard links are dropped after.

Each result is appended to the run's metrics.jsonl as ``{"step": N, "eval/<metric>": value, ...}``
(``N``: the checkpoint's step), which the report draws as curves. A ``stop_on`` rule the scores break
stops training at the next step end; the run then ends **failed** (its model/ is not written: a
model that broke a safety gate must not become anyone's parent; checkpoints/ stay), with the error
naming the breach and ``stopped_by: {metric, value, rule, threshold, step, stopped_at, message}`` in
run.json. At the end of training the evaluations still running or waiting are waited for (at most
``final_wait`` seconds; a breach there fails the run too), then whatever is left is stopped by PID.

The spine holds the queue and the processes; the TRL stages attach it as a TrainerCallback
(:mod:`smolforge.alignment.eval_watch`). Nothing here imports an ML library.

    >>> spec = EvalWhileTraining(every=10, stop_on=[{"metric": "redteam/attack_success", "max": 0.3}])
    >>> breach_of(spec.gates(), {"redteam/attack_success": 0.5}, step=20)["message"]
    'redteam/attack_success 0.500 > max 0.300 at step 20'
    >>> breach_of(spec.gates(), {"redteam/attack_success": 0.25}, step=20) is None
    True
"""
from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from smolforge.errors import RecipeError, RunError
from smolforge.gates import Gate, parse_gates
from smolforge.processes import stop_group
from smolforge.run_layout import RunLayout
from smolforge.runs import Run, utc_now, write_json_atomic

__all__ = ["EVAL_MODULE", "EvalWhileTraining", "EvalWatch", "breach_of", "check_spec", "check_metrics", "record_stop",
           "snapshot_checkpoint", "suite_metrics"]

log = logging.getLogger(__name__)

EVAL_MODULE = "smolforge.evals.while_training"   # the process that scores one snapshot (a dotted name, as the registry's)
DEVICES = ("auto", "cpu", "cuda")
# what a Trainer checkpoint holds besides the model: not linked into a snapshot
TRAINING_STATE = ("optimizer", "scheduler", "rng_state", "trainer_state", "training_args", "scaler")
# the launcher's variables: an evaluation process is no rank of the training's process group
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                    "MASTER_ADDR", "MASTER_PORT")
LAUNCH_PREFIXES = ("TORCHELASTIC_", "ACCELERATE_", "OMPI_", "PMI_")


@dataclass
class EvalWhileTraining:
    """``eval_while_training:`` of a training stage's recipe (off unless ``every`` > 0)."""

    every: int = 0                    # score the checkpoint of every N-th optimizer step in a separate process (0 = off)
    suites: list = field(default_factory=lambda: ["redteam"])   # eval suites (names or folders) scored each time
    limit: int | None = 8             # items per red-team category / documents per lm-eval task (null = all)
    max_new_tokens: int = 32          # reply length (red-team suites)
    batch_size: int = 8               # evaluation batch size
    device: str = "auto"              # auto | cpu | cuda: where the evaluation process scores
    stop_on: list = field(default_factory=list)   # gate rules on the scores, e.g. [{metric: redteam/attack_success,
                                      #   max: 0.3}]: a breach stops training and fails the run (run.json stopped_by)
    max_lag: int | None = None        # steps training may run past a checkpoint still being scored before it waits
                                      #   for that score (null: never waits; a breach then stops it when it arrives)
    timeout: float = 1800.0           # seconds one evaluation may take; then it is stopped and counted failed
    final_wait: float = 600.0         # seconds the end of training waits for the evaluations still running or queued

    @property
    def on(self) -> bool:
        return self.every > 0

    def gates(self) -> list[Gate]:
        """``stop_on`` parsed as promotion gates (min / max rules only)."""
        gates = parse_gates(self.stop_on or [], "eval_while_training.stop_on")
        for n, gate in enumerate(gates, start=1):
            if gate.against is not None:
                raise RecipeError(f"eval_while_training.stop_on[{n}]: 'against' compares finished runs; a rule "
                                  f"checked while training takes min or max (e.g. {{metric: {gate.metric}, max: 0.3}})")
        return gates


def check_spec(spec: EvalWhileTraining | None, *, max_steps: int | None = None, lora: bool = False,
               load_suites: bool = True) -> None:
    """RecipeError, before any run exists, for an ``eval_while_training:`` that cannot work.

    ``load_suites`` loads the suites in the evaluation module's own process (``check``: the spine
    imports no evaluation code) and checks that each ``stop_on`` metric is one they give.

    >>> check_spec(EvalWhileTraining(stop_on=[{"metric": "redteam/attack_success", "max": 0.3}]))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: eval_while_training.stop_on needs eval_while_training.every > 0 (the steps whose checkpoints are scored)
    >>> check_spec(EvalWhileTraining(every=20), max_steps=10, load_suites=False)
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: eval_while_training.every is 20 but trainer.max_steps is 10: no checkpoint would be scored
    """
    if spec is None:
        return
    where = "eval_while_training"
    if spec.every < 0:
        raise RecipeError(f"{where}.every must be >= 0 (0 = off), got {spec.every}")
    gates = spec.gates()
    if not spec.on:
        if gates:
            raise RecipeError(f"{where}.stop_on needs {where}.every > 0 (the steps whose checkpoints are scored)")
        return
    suites = spec.suites
    if not isinstance(suites, list) or not suites or not all(isinstance(s, str) and s.strip() for s in suites):
        raise RecipeError(f"{where}.suites must be a non-empty list of suite names or folders, got {suites!r}")
    if len(set(suites)) != len(suites):
        raise RecipeError(f"{where}.suites names a suite twice: {suites!r}")
    for key in ("limit", "max_new_tokens", "batch_size", "max_lag"):
        value = getattr(spec, key)
        if value is not None and value < 1:
            raise RecipeError(f"{where}.{key} must be >= 1{' or null' if key in ('limit', 'max_lag') else ''}, "
                              f"got {value}")
    if spec.device not in DEVICES:
        raise RecipeError(f"{where}.device must be one of {', '.join(DEVICES)}, got {spec.device!r}")
    if spec.timeout <= 0:
        raise RecipeError(f"{where}.timeout must be > 0 seconds, got {spec.timeout}")
    if max_steps is not None and 0 < max_steps < spec.every:
        raise RecipeError(f"{where}.every is {spec.every} but trainer.max_steps is {max_steps}: "
                          "no checkpoint would be scored")
    if lora:
        raise RecipeError(f"{where}: with lora: a checkpoint holds the adapter only, not a model folder the "
                          "evaluation can load; train without lora: or score the merged model/ after the run")
    if load_suites:
        check_metrics(gates, suite_metrics(suites))


def suite_metrics(suites: list[str]) -> dict:
    """``{"metrics": [...], "tasks": [...]}`` the suites give (their evaluation process loads them);
    RecipeError with its message when one does not load."""
    cmd = [sys.executable, "-m", EVAL_MODULE, "check", *[arg for s in suites for arg in ("--suite", s)]]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_child_env(), check=False)
    except subprocess.TimeoutExpired:
        raise RecipeError(f"eval_while_training.suites: loading {', '.join(suites)} took over 300 s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        message = lines[-1] if lines else f"exit {done.returncode}"
        message = message.split(": ", 1)[1] if message.split(": ", 1)[0].endswith("Error") else message
        raise RecipeError(f"eval_while_training.suites: {message}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_metrics(gates: list[Gate], given: dict) -> None:
    """RecipeError when a ``stop_on`` metric is none the suites give (an lm-eval task's metric under a
    filter it names itself passes).

    >>> check_metrics([Gate("redteam/atack_success", max=0.3)], {"metrics": ["redteam/attack_success"], "tasks": []})
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: eval_while_training.stop_on: the suites give no metric 'redteam/atack_success' (did you mean 'redteam/attack_success'?)
    """
    names, tasks = given.get("metrics", []), set(given.get("tasks", []))
    for gate in gates:
        if gate.metric in names or gate.metric.split("/", 1)[0] in tasks:
            continue
        close = difflib.get_close_matches(gate.metric, names, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else "they give: " + ", ".join(
            n for n in names if not n.endswith(("/stderr", "/random")))
        raise RecipeError(f"eval_while_training.stop_on: the suites give no metric '{gate.metric}' ({hint})")


def breach_of(gates: list[Gate], metrics: dict, step: int) -> dict | None:
    """The first rule the scores of checkpoint ``step`` break, as run.json's ``stopped_by``; None when all hold.

    A metric missing from the scores breaks its rule (a gate that cannot be checked does not pass).

    >>> breach_of([Gate("a/acc", min=0.5)], {"b/acc": 1.0}, step=3)["message"]
    'a/acc is not among the scores of step 3 (they are: b/acc)'
    """
    for gate in gates:
        value = metrics.get(gate.metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            shown = ", ".join(sorted(k for k in metrics if not k.endswith("/stderr"))) or "none"
            return {"metric": gate.metric, "value": None, "rule": None, "threshold": None, "step": step,
                    "message": f"{gate.metric} is not among the scores of step {step} (they are: {shown})"}
        for rule, threshold, broken, sign in (("max", gate.max, lambda v, t: v > t, ">"),
                                              ("min", gate.min, lambda v, t: v < t, "<")):
            if threshold is not None and broken(float(value), threshold):
                return {"metric": gate.metric, "value": float(value), "rule": rule, "threshold": threshold,
                        "step": step, "message": f"{gate.metric} {value:.3f} {sign} {rule} {threshold:.3f} at step {step}"}
    return None


def snapshot_checkpoint(checkpoint: Path, folder: Path, *, run: Run, step: int) -> Path:
    """``folder`` as a run (status done) whose ``model/`` holds ``checkpoint``'s model files, hard-linked
    (copied where links cannot be made), without the training state; returns ``folder``."""
    layout = RunLayout(folder)
    shutil.rmtree(folder, ignore_errors=True)
    layout.model_dir.mkdir(parents=True)
    for path in sorted(checkpoint.iterdir()):
        if not path.is_file() or path.name.startswith(TRAINING_STATE):
            continue
        try:
            os.link(path, layout.model_dir / path.name)
        except OSError:
            shutil.copy2(path, layout.model_dir / path.name)
    now = utc_now()
    write_json_atomic(layout.json_path, {
        "name": f"{run.name}@step-{step}", "stage": "checkpoint", "status": "done",
        "parents": [str(run.path.resolve())], "recipe": {"checkpoint": str(checkpoint), "step": step},
        "data_fingerprints": {}, "versions": {}, "git_commit": None, "started_at": now, "ended_at": now,
        "metrics": {}, "error": None})
    return folder


def _child_env() -> dict:
    """This process's environment without the launcher's rank variables, output unbuffered."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith(LAUNCH_PREFIXES)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class _Job:
    step: int
    folder: Path
    started: float = 0.0


class EvalWatch:
    """The queue of checkpoint evaluations of one training run (on its main process).

    :meth:`submit` a saved checkpoint; :meth:`poll` (at every step end) collects a finished evaluation,
    logs its scores, checks ``stop_on`` and starts the waiting one; :attr:`breach` is set once a rule
    breaks; :meth:`wait_for_lag` holds training back under ``max_lag``; :meth:`close` waits for what is
    left (at most ``final_wait`` seconds) and stops the evaluation process by PID.

    The evaluations run in one background process (``python -m smolforge.evals.while_training serve``),
    started at the first checkpoint and kept for the next ones (its imports, seconds, are paid once): it
    reads one job a line on stdin, ``{"folder", "log"}``, scores it with its output in ``log``, and answers
    ``{"folder", "code"}`` on stdout. A process that dies, or is stopped past ``timeout``, fails its job
    and is started anew for the next. ``worker`` gives another command line for that process.
    """

    def __init__(self, spec: EvalWhileTraining, run: Run, *, worker: list[str] | None = None) -> None:
        self.spec, self.run = spec, run
        self.gates = spec.gates()
        self.worker_command = worker or self._serve_command()
        self.worker: subprocess.Popen | None = None
        self._replies = b""
        self.running: _Job | None = None
        self.pending: _Job | None = None
        self.breach: dict | None = None
        self.scored: list[int] = []
        self.skipped: list[int] = []
        self.failed: list[int] = []
        self.waited = 0.0
        self.step = 0               # the newest training step seen (for the rows' returned_at)

    @property
    def folder(self) -> Path:
        return self.run.eval_watch_dir

    def _serve_command(self) -> list[str]:
        spec = self.spec
        cmd = [sys.executable, "-m", EVAL_MODULE, "serve", "--max-new-tokens", str(spec.max_new_tokens),
               "--batch-size", str(spec.batch_size), "--device", spec.device]
        cmd += [arg for s in spec.suites for arg in ("--suite", s)]
        return cmd + (["--limit", str(spec.limit)] if spec.limit is not None else [])

    # -- the queue ------------------------------------------------------------------------
    def submit(self, step: int, checkpoint: Path) -> None:
        """Queue checkpoint ``step`` (its snapshot is taken now); a waiting older one is dropped."""
        self.step = max(self.step, step)
        if self.breach is not None:
            return
        folder = snapshot_checkpoint(Path(checkpoint), self.folder / f"step-{step}", run=self.run, step=step)
        if self.pending is not None:
            log.info("eval_while_training: step %d replaces step %d in the queue (the newest wins)", step,
                     self.pending.step)
            self.skipped.append(self.pending.step)
            shutil.rmtree(self.pending.folder, ignore_errors=True)
        self.pending = _Job(step, folder)
        self.poll()

    def poll(self, step: int | None = None) -> None:
        """Collect a finished (or timed-out) evaluation, then start the waiting one; cheap when nothing changed."""
        if step is not None:
            self.step = max(self.step, step)
        job = self.running
        if job is not None:
            code = self._reply(job)
            if code is None and self.worker.poll() is not None:
                code = self._reply(job)          # it may have answered just before it exited
                if code is None:
                    self._failed(job, f"the evaluation process exited ({self.worker.returncode})")
                    self.worker = None
                    self.running = None
            if code is None and self.running is not None and time.monotonic() - job.started > self.spec.timeout:
                self._stop_worker()
                self._failed(job, f"took over {self.spec.timeout:g} s; stopped")
                self.running = None
            elif code is not None:
                self.running = None
                self._collect(job, code)
        if self.running is None and self.pending is not None and self.breach is None:
            self._start(self.pending)
            self.pending = None

    def _reply(self, job: _Job) -> int | None:
        """The exit code the evaluation process answered for ``job``, or None while it works on it."""
        import select

        out = self.worker.stdout
        while select.select([out], [], [], 0)[0]:
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                break
            self._replies += chunk
        while b"\n" in self._replies:
            line, self._replies = self._replies.split(b"\n", 1)
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if reply.get("folder") == str(job.folder.resolve()):
                return int(reply.get("code", 1))
        return None

    def _start(self, job: _Job) -> None:
        if self.worker is None or self.worker.poll() is not None:
            with open(self.folder / "worker.log", "a", encoding="utf-8") as err:
                self.worker = subprocess.Popen(self.worker_command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=err, env=_child_env(), start_new_session=True)
            self._replies = b""
            log.info("eval_while_training: evaluation process started (pid %d)", self.worker.pid)
        log_path = self.folder / f"step-{job.step}.log"
        request = json.dumps({"folder": str(job.folder.resolve()), "log": str(log_path.resolve())}) + "\n"
        job.started = time.monotonic()
        self.running = job
        try:
            self.worker.stdin.write(request.encode())
            self.worker.stdin.flush()
        except OSError:                           # it died meanwhile: poll() fails the job and starts anew
            pass
        log.info("eval_while_training: scoring checkpoint %d (log %s)", job.step, log_path)

    def _stop_worker(self) -> None:
        if self.worker is not None:
            stop_group(self.worker, grace=5)
            self.worker = None

    def _collect(self, job: _Job, code: int) -> None:
        seconds = round(time.monotonic() - job.started, 2)
        layout = RunLayout(job.folder)
        try:
            metrics = json.loads(layout.json_path.read_text(encoding="utf-8")).get("metrics") or {}
        except (OSError, ValueError):
            metrics = {}
        shutil.rmtree(layout.model_dir, ignore_errors=True)
        if code != 0 or not metrics:
            self._failed(job, f"exit {code}")
            return
        numbers = {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.run.log(job.step, **numbers, **{"eval/result_seconds": seconds, "eval/returned_at_step": self.step})
        self.scored.append(job.step)
        breach = breach_of(self.gates, metrics, job.step)
        if breach is not None and self.breach is None:
            self.breach = breach
            log.warning("eval_while_training: stop_on breached: %s", breach["message"])
            if self.pending is not None:
                shutil.rmtree(self.pending.folder, ignore_errors=True)
                self.skipped.append(self.pending.step)
                self.pending = None

    def _failed(self, job: _Job, why: str) -> None:
        shutil.rmtree(RunLayout(job.folder).model_dir, ignore_errors=True)
        self.failed.append(job.step)
        log.warning("eval_while_training: scoring checkpoint %d failed (%s); see %s", job.step, why,
                    self.folder / f"step-{job.step}.log")

    # -- waiting ----------------------------------------------------------------------------
    def outstanding(self) -> list[int]:
        """Steps being scored or waiting, oldest first."""
        return [job.step for job in (self.running, self.pending) if job is not None]

    def wait_for_lag(self, step: int) -> None:
        """Hold training at ``step`` while a checkpoint ``max_lag`` or more steps older is still unscored."""
        self.poll(step)
        lag = self.spec.max_lag
        if lag is None:
            return
        started = time.monotonic()
        while self.breach is None and (waiting := self.outstanding()) and step - waiting[0] >= lag:
            time.sleep(0.05)
            self.poll(step)
        self.waited += time.monotonic() - started

    def close(self, wait: bool = True) -> None:
        """Wait (``wait``: at most ``final_wait`` seconds) for the evaluations left, then stop the process."""
        deadline = time.monotonic() + (self.spec.final_wait if wait else 0.0)
        while wait and self.outstanding() and self.breach is None and time.monotonic() < deadline:
            time.sleep(0.05)
            self.poll()
        if self.running is not None:
            self.poll()
        if self.running is not None:
            self._stop_worker()
            self._failed(self.running, "still running at the end of training; stopped")
            self.running = None
        if self.pending is not None:
            self.skipped.append(self.pending.step)
            shutil.rmtree(self.pending.folder, ignore_errors=True)
            self.pending = None
        if self.worker is not None:               # idle: end of input lets it exit, else it is stopped
            with contextlib.suppress(OSError):
                self.worker.stdin.close()
            try:
                self.worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self._stop_worker()

    def summary(self) -> dict:
        """``eval_watch/*`` figures for run.json (counts of checkpoints scored, skipped, failed; seconds waited)."""
        return {"eval_watch/scored": len(self.scored), "eval_watch/skipped": len(self.skipped),
                "eval_watch/failed": len(self.failed), "eval_watch/wait_s": round(self.waited, 2)}

    def stop_record(self, stopped_at: int) -> dict | None:
        """run.json's ``stopped_by`` (None without a breach)."""
        if self.breach is None:
            return None
        return {**self.breach, "stopped_at": stopped_at}

    def __enter__(self) -> EvalWatch:
        self.folder.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(wait=exc_type is None)


def record_stop(run: Run, record: dict, metrics: dict) -> RunError:
    """Write ``stopped_by`` and ``metrics`` into run.json; the RunError that fails the run with the breach."""
    run.info["stopped_by"] = record
    run.info.setdefault("metrics", {}).update(metrics)
    run._write()
    return RunError(f"stopped by eval_while_training.stop_on at step {record['stopped_at']}: {record['message']} "
                    f"(scores per step in metrics.jsonl; checkpoints kept in {run.checkpoints_dir})")

