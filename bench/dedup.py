"""Deduplication at scale: documents/s and detection figures on a corpus with known duplicates.

    .venv/bin/python bench/dedup.py                      # 100k unique docs + 5k exact + 5k near copies
    .venv/bin/python bench/dedup.py --unique 20000 --workers 2

Near copies have 2–5 % of their ~100 words replaced. Prints the recall of injected near
duplicates, the share of distinct documents wrongly removed, the residual duplicate rate, the
detection curve of the banding, and throughput; ends with one JSON line of the figures. There is
no baseline to divide by (no ``ratio``): the targets are absolute (recall >= 95 %, false removals
<= 1 %, residual duplicates < 1 %).
"""
from __future__ import annotations

import argparse
import json
import time

from smolforge.data.dedup import DedupSpec, deduplicate
from smolforge.data.synthetic import duplicate_corpus
from smolforge.table import render_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unique", type=int, default=100_000)
    parser.add_argument("--exact", type=int, default=5_000)
    parser.add_argument("--near", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    texts, exact, near = duplicate_corpus(args.unique, args.exact, args.near, seed=11)
    spec = DedupSpec(workers=args.workers)
    started = time.perf_counter()
    report = deduplicate(texts, spec)
    seconds = time.perf_counter() - started

    removed = set(range(len(texts))) - set(report.keep)
    originals = set(exact.values()) | set(near.values())
    recall = sum(1 for c, s in near.items() if c in removed or s in removed) / len(near)
    false_rate = len(removed - set(exact) - set(near) - originals) / args.unique
    before = (len(exact) + len(near)) / len(texts)
    residual = sum(1 for c, s in near.items() if c not in removed and s not in removed) / len(report.keep)
    figures = {**report.as_dict(spec, len(texts)), "near_recall": round(recall, 4),
               "false_removal_rate": round(false_rate, 5), "duplicate_rate_before": round(before, 4),
               "duplicate_rate_after": round(residual, 5), "seconds": round(seconds, 1),
               "docs_per_s": round(len(texts) / seconds, 1), "workers": args.workers}
    print(render_table(["figure", "value"], [[k, v] for k, v in figures.items()]))
    print(json.dumps({"bench": "dedup", **figures}))


if __name__ == "__main__":
    main()
