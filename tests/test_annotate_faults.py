"""Faults while annotators submit, under an Argilla on PostgreSQL: SIGKILL of its Redis and of
PostgreSQL itself (argilla-server's own SIGKILL under load is in test_annotate_loop, where the
supervisor of ``annotate serve`` brings it back).

A crowd of annotators (annotate/crowd.py, tests/crowd_faults.py) submits through the call the UI
makes. Once a third of the answers are acknowledged, one process gets SIGKILL and is brought back
a moment later: Redis as ``annotate serve`` does (``ArgillaServer.restart_exited``), PostgreSQL by the
test, as its own service manager would. Meanwhile the annotators see errors and submit again. Then
every response is read back: each acknowledged one is stored with its value (lost 0), none twice
(duplicated 0), and every planned answer got in.

Skipped when the argilla-server venv, redis-server or PostgreSQL is missing (make setup installs them).
"""
from __future__ import annotations

import signal
import time

import pytest

from smolforge.annotate.server import ArgillaServer

from conftest import argilla_missing
from crowd_faults import assert_nothing_lost, crowd_under_fault
from postgres_cluster import postgres_cluster

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
def server(cluster, tmp_path_factory):
    """An embedded Argilla on ``cluster``, on loopback."""
    argilla = ArgillaServer(tmp_path_factory.mktemp("faults-pg"), database_url=cluster.create_database("argilla_faults"))
    try:
        yield argilla.start()
    finally:
        argilla.stop()


def kill_redis(server: ArgillaServer) -> None:
    server.procs["redis"].send_signal(signal.SIGKILL)
    server.procs["redis"].wait(timeout=30)
    time.sleep(DOWN_S)
    assert "redis" in server.restart_exited()          # what `annotate serve` does


@pytest.mark.parametrize("killed", ["redis", "postgresql"])
def test_no_acknowledged_response_is_lost_when_a_process_is_killed(server, cluster, killed):
    def kill_postgres() -> None:
        cluster.kill()
        time.sleep(DOWN_S)
        cluster.start()

    fault = {"redis": lambda: kill_redis(server), "postgresql": kill_postgres}[killed]
    summary, checked = crowd_under_fault(server.url, server.api_key, f"fault-{killed}", fault,
                                         annotators=ANNOTATORS, records=RECORDS)
    print(f"\nSIGKILL {killed}: {summary['responses']} acknowledged, {summary['client_errors']} client errors "
          f"{summary['error_kinds']}, {summary['acknowledged_on_retry']} acknowledged on retry; {checked}")
    # Redis carries only the job queue: a submit never touches it, so the clients see nothing
    assert_nothing_lost(summary, checked, ANNOTATORS * RECORDS, errors_seen=killed == "postgresql")
    assert server.healthy()
    server.check_alive()                         # redis, server and worker all running again


def test_a_crash_loop_stops_the_supervision_with_the_log(server):
    """Past the restart limit ``restart_exited`` gives up with the dead process's log instead of restarting."""
    from smolforge.errors import ServiceError

    server.procs["worker"].send_signal(signal.SIGKILL)
    server.procs["worker"].wait(timeout=30)
    with pytest.raises(ServiceError, match=r"Argilla's worker process exited with code -9; end of .*worker\.log"):
        server.restart_exited(limit=len(server.restarts))
    assert server.procs["worker"].poll() is not None              # not started again
    server.restarts.clear()
    assert server.restart_exited() == {"worker": -9} and server.healthy()
