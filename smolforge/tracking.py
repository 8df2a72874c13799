"""Send per-step training scalars to the standard trackers, next to metrics.jsonl.

    >>> import tempfile
    >>> from pathlib import Path
    >>> run_dir = Path(tempfile.mkdtemp())
    >>> with Tracker(run_dir, "pretrain-demo", {"lr": 3e-3}, report_to=["tensorboard"]) as tracker:
    ...     tracker.log(1, {"loss": 2.5, "lr": 3e-3, "phase": "warmup"})   # strings are skipped
    ...     tracker.event(1, "spike", loss=9.1, threshold=4.0)
    >>> tracker.active, (run_dir / "tensorboard").is_dir()
    ([], True)

``metrics.jsonl`` (``Run.log``) stays the source of truth; a Tracker only mirrors the numbers to
whatever the recipe's ``tracking.report_to`` asks for. Every training stage takes the same
``tracking:`` section (:class:`TrackingSpec`): pretraining calls the Tracker from its loop, the TRL
stages through a TrainerCallback (``alignment/common.py``), so both report to the same places:

- ``"tensorboard"``: ``torch.utils.tensorboard.SummaryWriter`` writing ``<run>/tensorboard``.
- ``"wandb"``: ``wandb.init(project="smolforge", dir=<run>, mode=$WANDB_MODE or "offline")``.
- ``"trackio"``: a local trackio run in project ``smolforge`` (under ``$TRACKIO_DIR``, default
  ``~/.cache/huggingface/trackio``; ``trackio show`` opens it). **Only when listed by name, never
  under "auto"**: trackio cannot be made strictly local through its API. ``trackio.init`` asks
  huggingface.co who you are (``whoami``) whenever a Hugging Face token is configured and
  ``HF_HUB_OFFLINE`` is not set, and ``TRACKIO_SPACE_ID`` / ``TRACKIO_SERVER_URL`` silently send
  the metrics to a Space or server. smolforge refuses those two variables, passes ``embed=False``
  (no dashboard, no browser) and turns trackio's own CPU/GPU sampling off; set
  ``HF_HUB_OFFLINE=1`` to keep it on this machine.
- ``"auto"``: tensorboard when installed (wandb and trackio only when named); ``"none"``: nothing.

A reporter that fails (full disk, broken install, dead service) is disabled with one warning and
training goes on. Create the Tracker on one process only (rank 0); other ranks pass ``["none"]``.
"""
from __future__ import annotations

import contextlib
import difflib
import importlib.util
import io
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from smolforge.errors import RecipeError
from smolforge.runs import RunLayout

from .prometheus import MetricsServer, number

__all__ = [
    "TrackingSpec",
    "REPORTERS",
    "AUTO_REPORTERS",
    "Tracker",
    "is_installed",
    "installed_reporters",
    "resolve_report_to",
    "scalars",
]

PROJECT = "smolforge"
REPORTERS = ("tensorboard", "trackio", "wandb")
AUTO_REPORTERS = ("tensorboard",)  # wandb and trackio only when named: "auto" never sends data off this machine
_MODULES = {"tensorboard": ("torch", "tensorboard"), "trackio": ("trackio",), "wandb": ("wandb",)}
_REMOTE_TRACKIO_ENV = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL")
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")

logger = logging.getLogger(__name__)


@dataclass
class TrackingSpec:
    """A training recipe's ``tracking:`` section (pretraining's default ``auto``; the TRL stages' ``none``)."""

    report_to: list = field(default_factory=lambda: ["auto"])  # tensorboard | trackio | wandb | none | auto
    prometheus_port: int | None = None  # serve live metrics on 127.0.0.1:PORT (0 = any free port)


# -- choosing reporters

def is_installed(reporter: str) -> bool:
    """Whether the packages ``reporter`` needs can be imported (without importing them).

    >>> is_installed("tensorboard"), is_installed("no-such-reporter")
    (True, False)
    """
    modules = _MODULES.get(reporter)
    return bool(modules) and all(importlib.util.find_spec(m) is not None for m in modules)


def installed_reporters() -> list[str]:
    """The reporters whose packages are installed, in :data:`REPORTERS` order.

    >>> "tensorboard" in installed_reporters()
    True
    """
    return [name for name in REPORTERS if is_installed(name)]


def resolve_report_to(report_to: Sequence[str] | str | None) -> list[str]:
    """The reporters a ``report_to`` list asks for; RecipeError if one is unknown or missing.

    >>> resolve_report_to(["none"]), resolve_report_to("tensorboard")
    ([], ['tensorboard'])
    >>> resolve_report_to(["tensorbord"])
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: report_to: unknown reporter 'tensorbord' (did you mean 'tensorboard'?); expected tensorboard, trackio, wandb, none or auto
    """
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    for name in names:
        _check_known(name)
    if "none" in names and len(names) > 1:
        raise RecipeError(f"report_to: 'none' cannot be combined with other reporters (got {names})")
    chosen: list[str] = []
    for name in names:
        if name == "auto":
            chosen += [r for r in AUTO_REPORTERS if is_installed(r)]
        elif name != "none":
            _check_installed(name)
            chosen.append(name)
    return list(dict.fromkeys(chosen))


def _check_known(name: object) -> None:
    known = (*REPORTERS, "none", "auto")
    if name in known:
        return
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise RecipeError(f"report_to: unknown reporter {name!r}{hint}; "
                      f"expected {', '.join(known[:-1])} or {known[-1]}")


def _check_installed(name: str) -> None:
    if not is_installed(name):
        have = ", ".join(installed_reporters()) or "none"
        raise RecipeError(f"report_to: '{name}' is not installed (pip install {name}), "
                          f"installed reporters: {have}")


def scalars(values: dict) -> dict[str, float]:
    """The numeric entries of ``values`` as floats; None and everything non-numeric dropped.

    >>> scalars({"loss": 2, "lr": 1e-3, "phase": "warmup", "grad_norm": None})
    {'loss': 2.0, 'lr': 0.001}
    """
    out = {}
    for key, value in values.items():
        num = number(value)
        if num is not None:
            out[str(key)] = num
    return out


# -- reporters: one small class each, same three methods

class Reporter(Protocol):
    name: str
    where: str

    def log(self, step: int, values: dict[str, float]) -> None: ...
    def event(self, step: int, kind: str, details: dict) -> None: ...
    def close(self) -> None: ...


class TensorBoardReporter:
    """Scalars into ``<run_dir>/tensorboard``; events as ``events/<kind>`` = 1 plus a text note."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, run_name: str, config: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.where = str(RunLayout(run_dir).tensorboard_dir)
        self._writer = SummaryWriter(log_dir=self.where)
        if config:
            self._writer.add_text("config", _as_text(config), global_step=0)

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)

    def event(self, step: int, kind: str, details: dict) -> None:
        self._writer.add_scalar(f"events/{kind}", 1.0, global_step=step)
        self._writer.add_text(f"events/{kind}", _as_text(details), global_step=step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class TrackioReporter:
    """A local trackio run (see the module doc for why it is never chosen by "auto")."""

    name = "trackio"

    @staticmethod
    def preflight() -> None:
        """RecipeError when trackio's environment would send metrics off this machine."""
        for var in _REMOTE_TRACKIO_ENV:
            if os.environ.get(var):
                raise RecipeError(f"report_to: 'trackio' logs locally only; unset {var} "
                                  "(it would send the metrics to a remote Space or server)")

    def __init__(self, run_dir: Path, run_name: str, config: dict) -> None:
        import trackio

        if _hub_may_be_called():
            logger.info("tracking: a Hugging Face token is set, so trackio will ask huggingface.co "
                        "for your user name; HF_HUB_OFFLINE=1 keeps it on this machine")
        with _quiet_stdout():
            self._run = trackio.init(project=PROJECT, name=run_name, config=config,
                                     space_id=None, server_url=None, embed=False,
                                     auto_log_gpu=False, auto_log_cpu=False)
        self.where = str(getattr(getattr(trackio, "utils", None), "TRACKIO_DIR", "trackio dir"))

    def log(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def event(self, step: int, kind: str, details: dict) -> None:
        self._run.log({f"events/{kind}": 1.0}, step=step)

    def close(self) -> None:
        import trackio

        current = getattr(getattr(trackio, "context_vars", None), "current_run", None)
        with _quiet_stdout():
            if current is not None and current.get() is self._run:
                trackio.finish()          # also clears trackio's current run (no atexit re-finish)
            else:
                self._run.finish()


class WandbReporter:
    """A wandb run in ``<run_dir>/wandb``, offline unless ``WANDB_MODE`` says otherwise."""

    name = "wandb"

    def __init__(self, run_dir: Path, run_name: str, config: dict) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")
        self._run = wandb.init(project=PROJECT, name=run_name, dir=str(run_dir), config=config,
                               mode=mode)
        self.where = f"{RunLayout(run_dir).wandb_dir} ({mode})"

    def log(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def event(self, step: int, kind: str, details: dict) -> None:
        self._run.log({f"events/{kind}": 1.0}, step=step)

    def close(self) -> None:
        self._run.finish()


class PrometheusReporter:
    """Latest values as gauges on a :class:`MetricsServer`; events counted by kind."""

    name = "prometheus"

    def __init__(self, port: int, run_name: str) -> None:
        self.server = MetricsServer(port, run=run_name).start()
        self.where = self.server.url

    def log(self, step: int, values: dict[str, float]) -> None:
        self.server.update({"step": step, **values})

    def event(self, step: int, kind: str, details: dict) -> None:
        self.server.count_event(kind)

    def close(self) -> None:
        self.server.stop()


REPORTER_CLASSES: dict[str, type] = {
    "tensorboard": TensorBoardReporter,
    "trackio": TrackioReporter,
    "wandb": WandbReporter,
}


# -- the fan-out

class Tracker:
    """Mirror per-step scalars to the reporters ``report_to`` names (and Prometheus if a port).

    >>> import tempfile
    >>> from pathlib import Path
    >>> tracker = Tracker(Path(tempfile.mkdtemp()), "demo", {}, report_to=["none"], prometheus_port=0)
    >>> tracker.active
    ['prometheus']
    >>> tracker.log(10, {"loss": 1.25}); tracker.close(); tracker.active
    []

    Raises RecipeError at construction when ``report_to`` names an unknown or missing reporter;
    after that it never raises: a reporter that fails is disabled with one warning.
    """

    def __init__(
        self,
        run_dir: str | Path,
        run_name: str,
        config: dict | None = None,
        report_to: Sequence[str] | str = ("auto",),
        prometheus_port: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_name = run_name
        names = resolve_report_to(report_to)
        for name in names:
            getattr(REPORTER_CLASSES[name], "preflight", lambda: None)()
        self._reporters: list[Reporter] = []
        self._broken: list[Reporter] = []
        for name in names:
            self._open(name, REPORTER_CLASSES[name], self.run_dir, run_name, dict(config or {}))
        if prometheus_port is not None:
            self._open("prometheus", PrometheusReporter, prometheus_port, run_name)
        self._announce()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def active(self) -> list[str]:
        """Names of the reporters still receiving metrics."""
        return [r.name for r in self._reporters]

    def log(self, step: int, values: dict) -> None:
        """Send the numeric entries of ``values`` at ``step``; the rest is skipped silently."""
        numeric = scalars(values)
        if numeric:
            self._each("log", int(step), numeric)

    def event(self, step: int, kind: str, /, **details: Any) -> None:
        """Record an event (``spike``, ``skip``, ``rollback``...) with free-form details."""
        self._each("event", int(step), str(kind), details)

    def close(self) -> None:
        """Flush and close every reporter (safe to call twice)."""
        self._each("close")
        for reporter in self._broken:  # release what a failed reporter still holds, quietly
            with contextlib.suppress(Exception):
                reporter.close()
        self._reporters, self._broken = [], []

    def _open(self, name: str, make: type, *args: Any) -> None:
        try:
            self._reporters.append(make(*args))
        except RecipeError:
            raise
        except Exception as exc:  # noqa: BLE001 - a tracker never stops training
            self._warn(name, "start", exc)

    def _each(self, method: str, *args: Any) -> None:
        for reporter in list(self._reporters):
            try:
                getattr(reporter, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a tracker never stops training
                self._reporters.remove(reporter)
                if method != "close":
                    self._broken.append(reporter)
                self._warn(reporter.name, method, exc)

    def _warn(self, name: str, method: str, exc: Exception) -> None:
        logger.warning("tracking: %s failed in %s (%s); it is disabled for the rest of this run "
                       "(metrics.jsonl is unaffected)", name, method,
                       _redact(f"{type(exc).__name__}: {exc}"))

    def _announce(self) -> None:
        if self._reporters:
            logger.info("tracking: reporting to %s",
                        ", ".join(f"{r.name} ({r.where})" for r in self._reporters))
        else:
            logger.info("tracking: no reporters (metrics.jsonl only)")


# -- small helpers

def _as_text(details: dict) -> str:
    return json.dumps(details, default=str, sort_keys=True) if details else "{}"


def _hub_may_be_called() -> bool:
    """Whether a Hugging Face token is set while the Hub is not in offline mode (never logs it)."""
    try:
        from huggingface_hub import constants, get_token
    except ImportError:
        return False
    return not constants.HF_HUB_OFFLINE and get_token() is not None


@contextlib.contextmanager
def _quiet_stdout():
    """Route a library's chatty prints to the debug log instead of the training output."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        if buffer.getvalue().strip():
            logger.debug("%s", buffer.getvalue().rstrip())


def _redact(text: str, environ: dict | None = None) -> str:
    """``text`` with the value of every secret-looking environment variable masked.

    >>> _redact("bad key abcdef123456", {"WANDB_API_KEY": "abcdef123456"})
    'bad key ***'
    """
    for var, value in (os.environ if environ is None else environ).items():
        if len(value) >= 8 and any(m in var.upper() for m in _SECRET_MARKERS):
            text = text.replace(value, "***")
    return text
