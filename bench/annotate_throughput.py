"""The embedded Argilla server: cold and warm start, push / answer / pull throughput for N records.

    .venv/bin/python bench/annotate_throughput.py                  # 1,000 records, two annotators
    .venv/bin/python bench/annotate_throughput.py --records 5000 --annotators 3

Steps, on a fresh home folder (private Redis, SQLite, the smolforge-sql search engine):

1. cold start (database migration and owner creation included);
2. push N records (A/B review schema, chat prompts, two responses, run ids and sampling as
   metadata) into a new dataset, then push the same N again (the update path: no duplicates);
3. each annotator answers every record through the SDK's record-response call (what the UI posts);
4. pull: fetch every record with its responses and resolve them into preference rows;
5. warm start (SIGTERM, then start on the same home) and pull again: the rows must be identical.

Responses are synthetic texts (no model), so the figures are the server's and the SDK's, not
generation's. The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def synthetic_items(count: int, sampling: dict) -> list[dict]:
    from smolforge.annotate.records import build_record

    questions = [json.loads(line)["question"] for line in open(REPO / "evals/suites/embedded/instruct.jsonl")]
    items = []
    for i in range(count):
        prompt = [{"role": "user", "content": f"{questions[i % len(questions)]} (variant {i})"}]
        items.append(build_record(prompt, [f"Answer {i}: the first try.", f"Answer {i}: another one."],
                                  ["run-a", "run-b"], sampling))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--annotators", type=int, default=2)
    args = parser.parse_args()

    import logging

    logging.getLogger("argilla.sdk").setLevel(logging.WARNING)
    from smolforge.annotate.pull import resolve
    from smolforge.annotate.push import push_records
    from smolforge.annotate.records import review_schema
    from smolforge.annotate.scripted import answer_all, records_to_answer, scripted_users, verifier
    from smolforge.annotate.server import ArgillaServer, connect
    from smolforge.annotate.stage import Recipe, fetch

    sampling = {"temperature": 0.8, "seed": 0}
    schema = review_schema(2, conversational=True, sampling=sampling, min_submitted=args.annotators)
    items = synthetic_items(args.records, sampling)
    # the reference the scripted annotators judge by: one slot or the other, so verdicts vary
    answers = {item["id"]: item["fields"][f"response_{1 + i % 2}"] for i, item in enumerate(items)}
    figures: dict = {"records": args.records, "annotators": args.annotators}
    home = Path(tempfile.mkdtemp(prefix="bench-argilla-"))

    server = ArgillaServer(home).start()
    try:
        figures["cold_start_s"] = round(server.ready_s, 2)
        client = connect(server.url, server.api_key)
        first = push_records(client, "bench", "argilla", schema, items)
        again = push_records(client, "bench", "argilla", schema, items)
        assert (first["new"], again["new"], again["total"]) == (args.records, 0, args.records), (first, again)
        figures |= {"push_records_per_s": first["records_per_s"], "repush_records_per_s": again["records_per_s"]}

        records = records_to_answer(server.url, server.api_key, "bench", "argilla")
        started = time.perf_counter()
        for _, key in scripted_users(server.url, server.api_key, "argilla", args.annotators):
            counts = answer_all(server.url, key, records, verifier(answers, noise=0.1))
            assert counts["submitted"] == args.records, counts
        seconds = time.perf_counter() - started
        figures["answer_responses_per_s"] = round(args.records * args.annotators / seconds, 1)

        recipe = Recipe(dataset="bench")
        started = time.perf_counter()
        rows, report = resolve(fetch(recipe, server.url, server.api_key), min_votes=args.annotators)
        seconds = time.perf_counter() - started
        figures |= {"pull_records_per_s": round(args.records / seconds, 1), "pull_rows": len(rows),
                    "agreement": round(report["agreement"]["value"], 3), "counts": report["counts"]}
        server.stop()
        server = ArgillaServer(home).start()
        figures["warm_start_s"] = round(server.ready_s, 2)
        rows_after, report_after = resolve(fetch(recipe, server.url, server.api_key), min_votes=args.annotators)
        figures["pull_after_restart_identical"] = rows_after == rows and report_after == report
    finally:
        server.stop()
    for key, value in figures.items():
        print(f"{key:32s} {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
