"""Many annotators at once: threads that submit through the HTTP call the UI makes on submit.

``bench/annotate_load.py`` measures a server under a crowd; the fault tests kill its processes
under one. Each annotator posts ``POST /api/v1/records/{id}/responses`` (what Argilla's UI posts when
a person submits a first answer) with its own API key, walking the records in its own seeded order.

A response counts as *acknowledged* when the server answers 201, or answers 409 "already exists" to
a retry (an earlier try was stored but its reply was lost). Any other answer, or no answer, is an
error the client sees: it is counted, and the annotator waits and submits the same record again,
as a person would, until ``deadline``. :func:`audit` then reads every response back and counts the
acknowledged ones that are missing or differ (*lost*) and the (user, record) pairs stored twice
(*duplicated*); both must be 0.

    records = records_to_answer(url, owner_key, "review", "argilla")       # annotate.scripted
    log = submit_concurrently(url, scripted_users(url, owner_key, "argilla", 20), records, decide)
    audit(url, owner_key, "review", "argilla", log)      # {"lost": 0, "duplicated": 0, ...}

    >>> log = CrowdLog(planned=3, latencies=[0.1, 0.2, 0.3, 0.4])
    >>> {k: log.summary()[k] for k in ("p50_s", "p95_s", "unfinished")}
    {'p50_s': 0.25, 'p95_s': 0.385, 'unfinished': 3}
"""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CrowdLog", "submit_concurrently", "audit"]

Decide = Callable[[str, Mapping], "tuple[Any, str] | None"]


@dataclass
class CrowdLog:
    """What the clients saw: acknowledged answers, errors, latencies of the acknowledged submits."""
    acknowledged: dict[tuple[str, str], tuple[Any, str]] = field(default_factory=dict)  # (user id, record) → answer
    planned: int = 0
    errors: Counter = field(default_factory=Counter)          # "HTTP 500", "ConnectError", …
    conflicts: int = 0                                         # retries answered 409: stored on an earlier try
    latencies: list[float] = field(default_factory=list)       # seconds, per 201
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def unfinished(self) -> int:
        return self.planned - len(self.acknowledged)

    def summary(self) -> dict:
        """``{"responses", "responses_per_s", "p50_s", "p95_s", "errors", ...}`` for reports."""
        done = len(self.acknowledged)
        return {"responses": done, "planned": self.planned, "seconds": round(self.seconds, 2),
                "responses_per_s": round(done / self.seconds, 1) if self.seconds else None,
                "p50_s": _percentile(self.latencies, 50), "p95_s": _percentile(self.latencies, 95),
                "client_errors": sum(self.errors.values()), "error_kinds": dict(self.errors),
                "acknowledged_on_retry": self.conflicts, "unfinished": self.unfinished}


def _percentile(values: Sequence[float], q: float) -> float | None:
    import numpy as np

    return round(float(np.percentile(values, q)), 4) if values else None


def submit_concurrently(url: str, annotators: Sequence[tuple[str, str]], records: Sequence[Mapping], decide: Decide,
                        *, question: str = "preference", deadline_s: float = 600.0, retry_wait_s: float = 0.2,
                        timeout_s: float = 30.0, seed: int = 0,
                        on_acknowledged: Callable[[int], None] | None = None) -> CrowdLog:
    """Every annotator (``[(username, api_key)]``) answers every record ``decide`` gives an answer for,
    one thread each, until all are acknowledged or ``deadline_s`` passes. ``on_acknowledged(count)``
    is called (from the annotators' threads) after each acknowledgement: fault tests kill a process there.
    """
    import httpx

    log = CrowdLog()
    plans = []
    for name, key in annotators:
        order = list(records)
        random.Random(f"{seed}:{name}").shuffle(order)
        plan = [(record, answer) for record in order if (answer := decide(name, record)) is not None]
        plans.append((name, key, plan))
        log.planned += len(plan)
    started = time.perf_counter()
    stop_at = started + deadline_s

    def annotate(name: str, key: str, plan: list) -> None:
        with httpx.Client(base_url=url, headers={"X-Argilla-Api-Key": key}, timeout=timeout_s) as client:
            user_id = _me(client, stop_at, log, retry_wait_s)
            for record, (value, status) in plan:
                body = {"values": {question: {"value": value}}, "status": status}
                while time.perf_counter() < stop_at:
                    sent = time.perf_counter()
                    try:
                        reply = client.post(f"/api/v1/records/{record['server_id']}/responses", json=body)
                    except httpx.HTTPError as err:
                        outcome = type(err).__name__
                    else:
                        outcome = reply.status_code
                    if outcome in (201, 409):
                        with log.lock:
                            if outcome == 201:
                                log.latencies.append(time.perf_counter() - sent)
                            else:
                                log.conflicts += 1
                            log.acknowledged[(user_id, str(record["id"]))] = (value, status)
                            count = len(log.acknowledged)
                        if on_acknowledged is not None:
                            on_acknowledged(count)
                        break
                    with log.lock:
                        log.errors[outcome if isinstance(outcome, str) else f"HTTP {outcome}"] += 1
                    time.sleep(retry_wait_s)

    threads = [threading.Thread(target=annotate, args=plan, name=f"annotator-{plan[0]}", daemon=True) for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, stop_at - time.perf_counter()) + timeout_s + 5)
    log.seconds = time.perf_counter() - started
    return log


def _me(client, stop_at: float, log: CrowdLog, wait_s: float) -> str:
    """This key's user id (``GET /api/v1/me``), retried like a submit."""
    import httpx

    while True:
        try:
            reply = client.get("/api/v1/me")
            if reply.status_code == 200:
                return str(reply.json()["id"])
            outcome = f"HTTP {reply.status_code}"
        except httpx.HTTPError as err:
            outcome = type(err).__name__
        with log.lock:
            log.errors[outcome] += 1
        if time.perf_counter() >= stop_at:
            raise TimeoutError(f"annotator could not reach {client.base_url}/api/v1/me ({outcome})")
        time.sleep(wait_s)


def audit(url: str, owner_key: str, dataset: str, workspace: str, log: CrowdLog, question: str = "preference") -> dict:
    """Read every response back (owner's key) and compare with what the clients were told.

    ``{"stored", "lost", "duplicated", "stored_unacknowledged"}``: *lost* counts acknowledged answers
    missing or stored with another value or status, *duplicated* (user, record) pairs stored more than once,
    *stored_unacknowledged* answers stored whose client never got an acknowledgement (a reply lost in a fault).
    """
    from .push import open_dataset

    stored: Counter = Counter()
    values: dict[tuple[str, str], tuple[Any, str]] = {}
    for record in open_dataset(url, owner_key, dataset, workspace).records(with_responses=True):
        for response in record.responses:
            if response.question_name != question:
                continue
            pair = (str(response.user_id), str(record.id))
            stored[pair] += 1
            values[pair] = (response.value, getattr(response.status, "value", response.status))
    lost = sum(1 for pair, answer in log.acknowledged.items() if values.get(pair) != tuple(answer))
    return {"stored": len(values), "lost": lost, "duplicated": sum(1 for n in stored.values() if n > 1),
            "stored_unacknowledged": len(set(values) - set(log.acknowledged))}

