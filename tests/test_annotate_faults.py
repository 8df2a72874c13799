"""Faults while annotators submit: SIGKILL of argilla-server (on SQLite and on PostgreSQL), of its
Redis, and of PostgreSQL.

A crowd of annotators (annotate/crowd.py) submits through the call the UI makes. Once a third of
the answers are acknowledged, one process gets SIGKILL and is brought back a moment later, as
``annotate serve`` does (``ArgillaServer.restart_exited``; PostgreSQL by the test, as its own
service manager would); meanwhile the annotators see errors and submit again. Then every
response is read back: each acknowledged one is stored with its value (lost 0), none twice
(duplicated 0), every planned answer got in, and the clients did see the outage as errors.

Skipped when the argilla-server venv, redis-server or PostgreSQL is missing (make setup installs them).
"""
from __future__ import annotations

import signal
import threading
import time

import pytest

from smolforge.annotate.records import build_record, review_schema
from smolforge.annotate.server import ArgillaServer, connect

from conftest import argilla_missing
from postgres_cluster import postgres_cluster

rg = pytest.importorskip("argilla")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(argilla_missing(postgres=True) is not None,
                                                  reason=str(argilla_missing(postgres=True)))]

ANNOTATORS, RECORDS = 4, 12
DOWN_S = 1.0            # how long the killed process stays dead before it is brought back


@pytest.fixture(scope="module")
def cluster():
    """A private PostgreSQL cluster of this module's own: its postmaster gets killed here."""
    with postgres_cluster() as pg:
        yield pg


@pytest.fixture(scope="module")
def servers(cluster, tmp_path_factory):
    """``{"sqlite": server, "postgresql": server}``, both on loopback."""
    started = {}
    try:
        started["sqlite"] = ArgillaServer(tmp_path_factory.mktemp("faults-sqlite")).start()
        started["postgresql"] = ArgillaServer(tmp_path_factory.mktemp("faults-pg"),
                                              database_url=cluster.create_database("argilla_faults")).start()
        yield started
    finally:
        for server in started.values():
            server.stop()


def answer(username: str, record: dict) -> tuple[str, str]:
    """The response that states the right product."""
    numbers = [int(text.split()[2].rstrip(".")) for text in record["responses"]]
    return f"response_{1 + [n % 5 for n in numbers].index(0)}", "submitted"


def crowd_under_fault(server, dataset: str, fault) -> tuple[dict, dict]:
    """Push a dataset, let the crowd submit, call ``fault()`` once a third is acknowledged; (summary, audit)."""
    from smolforge.annotate.crowd import audit, submit_concurrently
    from smolforge.annotate.push import push_records
    from smolforge.annotate.scripted import records_to_answer, scripted_users

    items = [build_record(f"What is {i} times 5?", [f"It is {5 * i}.", f"It is {5 * i + 2}."], ["run-a", "run-b"],
                          {"temperature": 0.7}) for i in range(RECORDS)]
    push_records(connect(server.url, server.api_key), dataset, "argilla",
                 review_schema(2, sampling={"temperature": 0.7}, min_submitted=2), items)
    records = records_to_answer(server.url, server.api_key, dataset, "argilla")
    annotators = scripted_users(server.url, server.api_key, "argilla", ANNOTATORS)
    third = threading.Event()
    result = {}
    crowd = threading.Thread(target=lambda: result.update(log=submit_concurrently(
        server.url, annotators, records, answer, deadline_s=240, retry_wait_s=0.3, timeout_s=20,
        on_acknowledged=lambda n: n >= ANNOTATORS * RECORDS // 3 and third.set())))
    crowd.start()
    try:
        assert third.wait(timeout=120), "the crowd never got a third of its answers in"
        fault()
    finally:
        crowd.join(timeout=300)
    assert not crowd.is_alive()
    log = result["log"]
    return log.summary(), audit(server.url, server.api_key, dataset, "argilla", log)


def restarted(server: ArgillaServer, name: str) -> None:
    """What ``annotate serve`` does when a process dies: start it again (on the same home and port)."""
    time.sleep(DOWN_S)
    assert name in server.restart_exited()


def kill_server(server: ArgillaServer) -> None:
    server.procs["server"].send_signal(signal.SIGKILL)
    server.procs["server"].wait(timeout=30)
    restarted(server, "server")


def kill_redis(server: ArgillaServer) -> None:
    server.procs["redis"].send_signal(signal.SIGKILL)
    server.procs["redis"].wait(timeout=30)
    restarted(server, "redis")


@pytest.mark.parametrize("database,killed", [("sqlite", "server"), ("postgresql", "server"), ("postgresql", "redis"),
                                             ("postgresql", "postgresql")])
def test_no_acknowledged_response_is_lost_when_a_process_is_killed(servers, cluster, database, killed):
    server = servers[database]

    def kill_postgres() -> None:
        cluster.kill()
        time.sleep(DOWN_S)
        cluster.start()

    fault = {"server": lambda: kill_server(server), "redis": lambda: kill_redis(server),
             "postgresql": kill_postgres}[killed]
    summary, checked = crowd_under_fault(server, f"fault-{killed}", fault)
    print(f"\nSIGKILL {killed} ({database}): {summary['responses']} acknowledged, {summary['client_errors']} client "
          f"errors {summary['error_kinds']}, {summary['acknowledged_on_retry']} acknowledged on retry; {checked}")
    assert checked["lost"] == 0 and checked["duplicated"] == 0, checked
    assert summary["unfinished"] == 0 and checked["stored"] == summary["planned"] == ANNOTATORS * RECORDS, summary
    if killed != "redis":                        # the database and the API are down a while: clients saw it
        assert summary["client_errors"] > 0, summary
    assert server.healthy()
    server.check_alive()                         # redis, server and worker all running again


def test_a_crash_loop_stops_the_supervision_with_the_log(servers):
    """Past the restart limit ``restart_exited`` gives up with the dead process's log instead of restarting."""
    from smolforge.errors import ServiceError

    server = servers["sqlite"]
    server.procs["worker"].send_signal(signal.SIGKILL)
    server.procs["worker"].wait(timeout=30)
    with pytest.raises(ServiceError, match=r"Argilla's worker process exited with code -9; end of .*worker\.log"):
        server.restart_exited(limit=len(server.restarts))
    assert server.procs["worker"].poll() is not None              # not started again
    server.restarts.clear()
    assert server.restart_exited() == ["worker"] and server.healthy()
