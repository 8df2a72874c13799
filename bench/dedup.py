"""Deduplication at scale: today's datasketch LSH against datatrove's MinHash stages, same corpus, same run.

    .venv/bin/python bench/dedup.py                      # 100k unique docs + 5k exact + 5k near copies
    .venv/bin/python bench/dedup.py --unique 20000 --workers 2 --tasks 2 --repeats 2

Near copies have 2–5 % of their ~100 words replaced. Both paths use word 5-shingles, 25 bands x
5 rows. Today's path is :func:`smolforge.data.dedup.deduplicate` (in memory, ``--workers``
hashing processes); the datatrove path is the data stage's (:mod:`smolforge.data.datatrove_pipeline`:
rows spooled to ``--tasks`` parts → MinhashDedupSignature → Buckets → Cluster → Filter on the
local executor with ``--dt-workers`` processes → shards), timed end to end including its file
I/O. They run alternately after a small warm-up of each. Prints, per path, the recall of injected
near duplicates, the share of distinct documents wrongly removed, the residual duplicate rate
and docs/s; ends with one JSON line whose ``ratio`` is datatrove docs/s ÷ today's docs/s
(targets: recall >= 95 %, false removals <= 1 %, residual duplicates < 1 %, ratio >= 1.5).
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from smolforge.data.dedup import DedupSpec, deduplicate
from smolforge.data.synthetic import duplicate_corpus
from smolforge.table import render_table


def today(texts: list[str], spec: DedupSpec, _folder: Path) -> set[int]:
    return set(deduplicate(texts, spec).keep)


def with_datatrove(texts: list[str], spec: DedupSpec, folder: Path, tasks: int, workers: int) -> set[int]:
    from smolforge.data.datatrove_pipeline import Settings, process
    from smolforge.data.shards import kind_files, read_files

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    settings = Settings(executor="local", tasks=tasks, workers=workers, filters=None, dedup=spec, index=None)
    rows = [("pretrain", ((f"doc {i}", {"text": t, "id": i}) for i, t in enumerate(texts)))]
    process(rows, folder, settings, verify=False)
    return {row["id"] for _, row in read_files(kind_files(folder, "pretrain"))}


def figures(name: str, texts, exact, near, kept: set[int], seconds: float, n_unique: int) -> dict:
    removed = set(range(len(texts))) - kept
    originals = set(exact.values()) | set(near.values())
    return {
        "path": name, "kept": len(kept),
        "exact_pairs_deduped": round(sum(1 for c, s in exact.items() if c in removed or s in removed) / len(exact), 4)
        if exact else None,
        "near_recall": round(sum(1 for c, s in near.items() if c in removed or s in removed) / len(near), 4),
        "false_removal_rate": round(len(removed - set(exact) - set(near) - originals) / n_unique, 5),
        "duplicate_rate_before": round((len(exact) + len(near)) / len(texts), 4),
        "duplicate_rate_after": round(sum(1 for c, s in near.items() if c in kept and s in kept) / len(kept), 5),
        "seconds": round(seconds, 2), "docs_per_s": round(len(texts) / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unique", type=int, default=100_000)
    parser.add_argument("--exact", type=int, default=5_000)
    parser.add_argument("--near", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=1, help="today's path: MinHash processes")
    parser.add_argument("--tasks", type=int, default=2, help="datatrove path: tasks (input parts)")
    parser.add_argument("--dt-workers", type=int, default=2, help="datatrove path: tasks at once")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each path (best kept)")
    args = parser.parse_args()

    texts, exact, near = duplicate_corpus(args.unique, args.exact, args.near, seed=11)
    spec = DedupSpec(workers=args.workers)
    work = Path(tempfile.mkdtemp(prefix="bench-dedup-"))
    paths = {"today": lambda t, f: today(t, spec, f),
             "datatrove": lambda t, f: with_datatrove(t, spec, f, args.tasks, args.dt_workers)}
    for name, fn in paths.items():       # warm-up: imports, worker start-up, caches
        fn(texts[:2000], work / f"warm-{name}")
    best: dict[str, tuple[float, set[int]]] = {}
    for _ in range(args.repeats):
        for name, fn in paths.items():
            started = time.perf_counter()
            kept = fn(texts, work / name)
            seconds = time.perf_counter() - started
            print(f"{name}: {len(texts) / seconds:,.0f} docs/s ({seconds:.1f} s)", flush=True)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, kept)
    shutil.rmtree(work, ignore_errors=True)

    rows = {name: figures(name, texts, exact, near, kept, seconds, args.unique)
            for name, (seconds, kept) in best.items()}
    keys = [k for k in rows["today"] if k != "path"]
    print(render_table(["figure", "today (datasketch)", "datatrove"], [[k, rows["today"][k], rows["datatrove"][k]]
                                                                      for k in keys]))
    half_spec = spec.bands, spec.rows
    result = {"bench": "dedup", "docs": len(texts), "bands": half_spec[0], "rows": half_spec[1],
              "workers_today": args.workers, "tasks_datatrove": args.tasks, "workers_datatrove": args.dt_workers,
              **{f"{k}_today": v for k, v in rows["today"].items() if k != "path"},
              **{f"{k}_datatrove": v for k, v in rows["datatrove"].items() if k != "path"},
              "ratio": round(rows["datatrove"]["docs_per_s"] / rows["today"]["docs_per_s"], 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
