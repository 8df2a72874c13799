"""Argilla on PostgreSQL for a team: push → annotate → pull on the session's server (bound to
0.0.0.0, on the session's PostgreSQL cluster), and ``annotate backup``/``restore`` with pg_dump while
annotators submit, restored into a fresh database that a second server pulls byte-identically.

Skipped when the argilla-server venv, redis-server or PostgreSQL is missing (make setup installs them).
"""
from __future__ import annotations

import json
import threading

import pytest

from smolforge.annotate.records import build_record, review_schema
from smolforge.annotate.server import ArgillaServer, connect
from smolforge.cli import main

from conftest import argilla_missing

rg = pytest.importorskip("argilla")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(argilla_missing(postgres=True) is not None,
                                                  reason=str(argilla_missing(postgres=True)))]

SAMPLING = {"temperature": 0.7}


@pytest.fixture(scope="module")
def server(argilla_server):
    assert argilla_server.database_url.startswith("postgresql+asyncpg://127.0.0.1") or \
        argilla_server.database_url.startswith("postgresql+asyncpg://smolforge@127.0.0.1")
    assert not (argilla_server.home / "argilla.db").exists()            # nothing went to SQLite
    return argilla_server


def push(server, dataset: str, n: int) -> list[dict]:
    """``n`` two-response records pushed as ``annotate push`` pushes them; the SDK's view of them back."""
    from smolforge.annotate.push import push_records
    from smolforge.annotate.scripted import records_to_answer

    items = [build_record(f"What is {i} plus {i}?", [f"It is {2 * i}.", f"It is {2 * i + 1}."], ["run-a", "run-b"],
                          SAMPLING) for i in range(n)]
    summary = push_records(connect(server.url, server.api_key), dataset, "argilla", review_schema(2, sampling=SAMPLING),
                           items)
    assert summary["new"] == n
    return sorted(records_to_answer(server.url, server.api_key, dataset, "argilla"), key=lambda r: r["id"])


def the_correct_one(username, record):
    """Both annotators prefer the right sum (the even one; the push shuffles the two responses) —
    except on the sums of multiples of 3, where the second annotator picks the wrong one."""
    numbers = [int(text.split()[2].rstrip(".")) for text in record["responses"]]
    right = next(slot for slot, n in enumerate(numbers, start=1) if n % 2 == 0)
    if username.endswith("-2") and (numbers[right - 1] // 2) % 3 == 0:
        right = 3 - right
    return f"response_{right}", "submitted"


def pull(runs_root, home, dataset: str, name: str) -> bytes:
    args = ["--runs-dir", str(runs_root), "annotate", "pull", "--set", f"home={home}", "--set", f"dataset={dataset}",
            "--set", f"name={name}", "--set", "annotators=2"]
    assert main(args) == 0
    return (runs_root / name / "data" / "prefs" / "part-00000.jsonl").read_bytes()


def test_push_annotate_pull_on_postgresql(server, tmp_path):
    from smolforge.annotate.scripted import answer_all, scripted_users

    records = push(server, "pg-loop", 9)
    for _, key in scripted_users(server.url, server.api_key, "argilla", 2):
        counts = answer_all(server.url, key, records, the_correct_one)
        assert counts["submitted"] == 9
    rows = [json.loads(line) for line in pull(tmp_path / "runs", server.home, "pg-loop", "prefs-pg").splitlines()]
    report = json.loads((tmp_path / "runs" / "prefs-pg" / "annotations.json").read_text())
    assert report["counts"]["used"] == 6 and report["counts"]["disagreed"] == 3       # sums 0, 3, 6 disagreed
    assert rows and all(row["chosen"] == f"It is {2 * int(row['prompt'].split()[2])}." for row in rows)


def test_backup_while_annotators_submit_and_restore_into_a_fresh_database_pull_identically(server, postgres, tmp_path):
    from smolforge.annotate.scripted import answer_all, scripted_users

    def responses(database: str) -> int:
        return int(postgres.run("psql", "-d", database, "-tAc", "select count(*) from responses").stdout)

    earlier = responses(server.database_url.rsplit("/", 1)[1])    # the answers of the server's other tests
    records = push(server, "pg-backup", 16)
    (_, key_1), (_, key_2) = scripted_users(server.url, server.api_key, "argilla", 2)
    submitting = threading.Thread(target=answer_all, args=(server.url, key_1, records, the_correct_one))
    submitting.start()
    during = tmp_path / "during.dump"
    try:
        assert main(["annotate", "backup", str(during), "--home", str(server.home),
                     "--database", server.database_url]) == 0
    finally:
        submitting.join(timeout=300)
    answer_all(server.url, key_2, records, the_correct_one)

    # the dump taken mid-submission restores cleanly and holds whole responses only
    mid = postgres.create_database("argilla_mid")
    assert main(["annotate", "restore", str(during), "--home", str(tmp_path / "mid-home"), "--database", mid]) == 0
    assert earlier <= responses("argilla_mid") <= earlier + 16    # plus at most the first annotator's 16
    assert postgres.run("psql", "-d", "argilla_mid", "-tAc",
                        "select count(*) from responses where \"values\" is null or user_id is null").stdout.strip() == "0"

    after = tmp_path / "after.dump"
    assert main(["annotate", "backup", str(after), "--home", str(server.home), "--database", server.database_url]) == 0
    assert main(["annotate", "backup", str(after), "--home", str(server.home), "--database", server.database_url]) == 2
    copy = postgres.create_database("argilla_copy")
    assert main(["annotate", "restore", str(after), "--home", str(tmp_path / "fresh-home"), "--database", copy]) == 0
    original = pull(tmp_path / "runs", server.home, "pg-backup", "prefs-original")
    with ArgillaServer(tmp_path / "fresh-home", database_url=copy) as restored:
        assert restored.database_url.endswith("/argilla_copy")
        assert pull(tmp_path / "runs", restored.home, "pg-backup", "prefs-restored") == original
    assert len(original.splitlines()) == 16 - 6      # 6 of the 16 sums are multiples of 3: disagreed
