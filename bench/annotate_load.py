"""Many annotators at once on the embedded Argilla server, on SQLite and on PostgreSQL.

    .venv/bin/python bench/annotate_load.py                          # 20 annotators × 100 records, both databases
    .venv/bin/python bench/annotate_load.py --annotators 40 --records 250 --databases postgresql
    .venv/bin/python bench/annotate_load.py --database-url postgresql://team@db.lan:5432/argilla_bench

For each database, on a fresh home (private Redis; SQLite in the home, or a private PostgreSQL
cluster on 127.0.0.1 started here, or ``--database-url``'s empty database):

1. push ``--records`` A/B review records (min 2 submitted answers each, as a team would set it);
2. baseline: one annotator answers a second dataset of the same size alone;
3. load: ``--annotators`` annotator accounts (created through the API, each with its own key)
   submit at once, each walking every record in its own order, through the call the UI makes on
   submit (``POST /api/v1/records/{id}/responses``; annotate/crowd.py);
4. audit: every response is read back and compared with what the clients were acknowledged.

Reported per database: responses/s, p50/p95 submit latency (seconds), client errors, and the count
of acknowledged responses lost and of responses duplicated (both must be 0; the exit code is 1
otherwise). ``ratio`` = responses/s of the crowd ÷ of the lone annotator (how the server scales
with concurrent users). The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def items(count: int, tag: str) -> list[dict]:
    from smolforge.annotate.records import build_record

    return [build_record(f"{tag}: what is {i} times 3?", [f"It is {3 * i}.", f"It is {3 * i + 1}."], ["run-a", "run-b"],
                         {"temperature": 0.7}) for i in range(count)]


def correct_sum(username: str, record: dict) -> tuple[str, str]:
    """The response stating the right product (a multiple of 3); every 7th record a tie."""
    numbers = [int(text.split()[2].rstrip(".")) for text in record["responses"]]
    if numbers[0] % 7 == 0:
        return "tie", "submitted"
    return f"response_{1 + [n % 3 for n in numbers].index(0)}", "submitted"


@contextlib.contextmanager
def database(kind: str, url: str | None):
    """None (SQLite) or a PostgreSQL URL: ``url`` when given, else a private cluster for the run."""
    if kind == "sqlite":
        yield None
    elif url:
        yield url
    else:
        sys.path.insert(0, str(REPO / "tests"))
        from postgres_cluster import postgres_available, postgres_cluster

        missing = postgres_available()
        if missing:
            raise SystemExit(f"annotate_load: {missing}; or pass --database-url")
        with postgres_cluster() as cluster:
            yield cluster.create_database("argilla_bench")


def measure(kind: str, args: argparse.Namespace) -> dict:
    from smolforge.annotate.crowd import audit, submit_concurrently
    from smolforge.annotate.push import push_records
    from smolforge.annotate.records import review_schema
    from smolforge.annotate.scripted import records_to_answer, scripted_users
    from smolforge.annotate.server import ArgillaServer, connect

    schema = review_schema(2, sampling={"temperature": 0.7}, min_submitted=2)
    with database(kind, args.database_url) as url, ArgillaServer(Path(tempfile.mkdtemp(prefix=f"bench-load-{kind}-")),
                                                                 database_url=url) as server:
        client = connect(server.url, server.api_key)
        for name in ("alone", "crowd"):
            push_records(client, name, "argilla", schema, items(args.records, name))
        users = scripted_users(server.url, server.api_key, "argilla", args.annotators)
        figures: dict = {"database": kind, "cold_start_s": round(server.ready_s, 1)}
        for name, annotators in (("alone", users[:1]), ("crowd", users)):
            records = records_to_answer(server.url, server.api_key, name, "argilla")
            log = submit_concurrently(server.url, annotators, records, correct_sum, deadline_s=args.deadline)
            checked = audit(server.url, server.api_key, name, "argilla", log)
            figures[name] = log.summary() | checked
            print(f"{kind:10s} {name:5s} {len(annotators):3d} annotators: {figures[name]['responses']} responses in "
                  f"{log.seconds:.1f} s ({figures[name]['responses_per_s']}/s), p50 {figures[name]['p50_s']} s, "
                  f"p95 {figures[name]['p95_s']} s, lost {checked['lost']}, duplicated {checked['duplicated']}",
                  flush=True)
    figures["ratio"] = round(figures["crowd"]["responses_per_s"] / figures["alone"]["responses_per_s"], 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--records", type=int, default=100, help="records per dataset; each annotator answers all")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--database-url", help="an empty PostgreSQL database instead of a private cluster")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds the crowd may take")
    args = parser.parse_args()
    logging.getLogger("argilla.sdk").setLevel(logging.WARNING)

    result = {"annotators": args.annotators, "records": args.records}
    for kind in args.databases.split(","):
        if kind not in ("sqlite", "postgresql"):
            raise SystemExit(f"annotate_load: --databases takes sqlite and/or postgresql, not {kind!r}")
        result[kind] = measure(kind, args)
    bad = [kind for kind in args.databases.split(",") for part in ("alone", "crowd")
           if result[kind][part]["lost"] or result[kind][part]["duplicated"] or result[kind][part]["unfinished"]]
    print(f"{'database':10s} {'responses/s':>12s} {'alone/s':>8s} {'ratio':>6s} {'p50 s':>7s} {'p95 s':>7s} "
          f"{'errors':>6s} {'lost':>4s} {'dup':>4s}")
    for kind in args.databases.split(","):
        crowd, alone = result[kind]["crowd"], result[kind]["alone"]
        print(f"{kind:10s} {crowd['responses_per_s']:12} {alone['responses_per_s']:8} {result[kind]['ratio']:6} "
              f"{crowd['p50_s']:7} {crowd['p95_s']:7} {crowd['client_errors']:6} {crowd['lost']:4} {crowd['duplicated']:4}")
    print(json.dumps(result))
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
