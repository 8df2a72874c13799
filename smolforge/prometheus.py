"""An optional Prometheus endpoint exposing a run's latest training metrics.

    >>> from smolforge.processes import http_text
    >>> with MetricsServer(port=0, run="pretrain-demo") as server:   # port 0: any free port
    ...     server.update({"loss": 1.5, "rewards/margins": 0.25, "note": "skipped"})
    ...     page = http_text(f"http://127.0.0.1:{server.port}/metrics")
    >>> 'smolforge_train_loss{run="pretrain-demo"} 1.5' in page
    True
    >>> 'smolforge_train_rewards_margins{run="pretrain-demo"} 0.25' in page
    True

Each metric name becomes a gauge ``smolforge_train_<name>`` (anything but letters, digits and
``_`` turns into ``_``), labelled with ``run``. Each server has its own registry, so several can
live in one process (tests, notebooks). It binds 127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import logging
import numbers
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

__all__ = ["METRIC_PREFIX", "MetricsServer", "metric_name", "alert_rules_path", "dashboard_path"]

METRIC_PREFIX = "smolforge_train_"
logger = logging.getLogger(__name__)


def alert_rules_path() -> Path:
    """The shipped Prometheus alert rules (the playbook's thresholds; ``promtool check rules`` it).

    >>> alert_rules_path().name, alert_rules_path().is_file()
    ('rules.yml', True)
    """
    return Path(__file__).with_name("alerting") / "rules.yml"


def dashboard_path() -> Path:
    """The shipped Grafana dashboard (import it; its data source is the Prometheus that scrapes the runs)."""
    return Path(__file__).with_name("alerting") / "grafana-dashboard.json"


def metric_name(name: str) -> str:
    """The Prometheus gauge name of a smolforge metric.

    >>> metric_name("rewards/margins"), metric_name("lr"), metric_name("eval/acc@1")
    ('smolforge_train_rewards_margins', 'smolforge_train_lr', 'smolforge_train_eval_acc_1')
    """
    return METRIC_PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", str(name))


def number(value: Any) -> float | None:
    """``value`` as a float if it is a real number (also 0-d tensors / numpy scalars), else None.

    >>> number(2), number(1.5), number(True), number(None), number("3")
    (2.0, 1.5, 1.0, None, None)
    """
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (str, bytes)):
        try:
            value = item()
        except Exception:  # noqa: BLE001 - multi-element tensors, odd objects: not a scalar
            return None
        if isinstance(value, numbers.Real):
            return float(value)
    return None


class MetricsServer:
    """Serve ``/metrics`` for one run from a private ``CollectorRegistry``.

    >>> server = MetricsServer(port=0, run="demo").start()
    >>> server.port > 0
    True
    >>> server.update({"loss": 2.0}); server.count_event("spike"); server.stop()

    ``port=0`` picks a free port; after :meth:`start`, ``port`` holds the real one.
    """

    def __init__(self, port: int, host: str = "127.0.0.1", run: str = "default") -> None:
        self.port = int(port)
        self.host = host
        self.run = run
        self.registry = CollectorRegistry()
        self._gauges: dict[str, Gauge | None] = {}
        self._events = Counter("smolforge_events", "Training events (spike guard, ...) by kind",
                               ["run", "kind"], registry=self.registry)
        self._server: Any = None
        self._thread: Any = None

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Where the metrics page is (meaningful once started)."""
        return f"http://{self.host}:{self.port}/metrics"

    def start(self) -> MetricsServer:
        """Start the HTTP server in a daemon thread; returns self."""
        if self._server is None:
            self._server, self._thread = start_http_server(self.port, addr=self.host,
                                                           registry=self.registry)
            self.port = int(self._server.server_port)
        return self

    def stop(self) -> None:
        """Shut the server down and free its port (safe to call twice)."""
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def update(self, values: dict) -> None:
        """Set one gauge per numeric value; None and non-numeric values are skipped."""
        for name, value in values.items():
            number_ = number(value)
            gauge = self._gauge(name) if number_ is not None else None
            if gauge is not None:
                gauge.labels(run=self.run).set(number_)

    def count_event(self, kind: str) -> None:
        """Add one to ``smolforge_events_total{run, kind}``."""
        self._events.labels(run=self.run, kind=str(kind)).inc()

    def _gauge(self, name: str) -> Gauge | None:
        key = metric_name(name)
        if key not in self._gauges:
            try:
                self._gauges[key] = Gauge(key, f"smolforge metric {name!r}", ["run"],
                                          registry=self.registry)
            except ValueError as exc:  # a name prometheus_client refuses: skip that metric only
                logger.warning("prometheus: cannot export metric %r (%s); skipping it", name, exc)
                self._gauges[key] = None
        return self._gauges[key]
