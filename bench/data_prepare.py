"""`smolforge data prepare` end to end on a Parquet corpus with known duplicates: 1 vs N workers.

    .venv/bin/python bench/data_prepare.py                     # 100k docs + 5k exact + 5k near copies
    .venv/bin/python bench/data_prepare.py --unique 20000 --workers 2

Writes the corpus of ``bench/dedup.py`` as Parquet shards in a foreign layout (column ``body``,
an ``id`` column that rides along), then runs the data stage on it (read → validate → Gopher
filters → exact + MinHash-LSH dedup → decontamination → shards → tokenizer → packed rows → card)
once with one worker and once with ``--workers`` (alternating, after a small warm-up run). Prints
rows/s, the pass times, and the dedup figures against the known copies; ends with one JSON line
whose ``ratio`` is N-worker rows/s ÷ 1-worker rows/s.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from smolforge.data.synthetic import duplicate_corpus
from smolforge.recipe import build_stage_recipe, load_recipe
from smolforge.registry import load_stage
from smolforge.runs import Runs
from smolforge.table import render_table

ROOT = Path(__file__).resolve().parents[1]


def write_corpus(folder: Path, texts: list[str], shards: int = 4) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(texts) // shards)
    for i in range(shards):
        part = texts[i * per:(i + 1) * per]
        pq.write_table(pa.table({"id": list(range(i * per, i * per + len(part))), "body": part}),
                       folder / f"part-{i}.parquet", row_group_size=10_000)
    return str(folder / "*.parquet")


def prepare(runs: Runs, name: str, pattern: str, workers: int) -> tuple[float, dict, set[int]]:
    stage = load_stage("data")
    _, data = load_recipe(ROOT / "recipes" / "demo" / "data.yaml")
    # Gopher's defaults, except the stop-word rule: the corpus is random syllables, not English
    data.update(name=name, progress=False, filters={"min_words": 3, "min_stop_words": None},
                sources={"pretrain": [{"path": pattern, "columns": {"text": "body"}, "domain": "web"}]})
    data["dedup"] = {**data["dedup"], "workers": workers}
    recipe = build_stage_recipe(stage, data, source="bench")
    started = time.perf_counter()
    stage.validate(recipe, runs)
    run = stage.run(recipe, runs, overwrite=True)
    seconds = time.perf_counter() - started
    card = json.loads((run.path / "data_card.json").read_text())
    kept = {json.loads(line)["id"] for p in sorted((run.path / "data" / "pretrain").glob("part-*.jsonl"))
            for line in p.read_text().splitlines()}
    return seconds, card, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unique", type=int, default=100_000)
    parser.add_argument("--exact", type=int, default=5_000)
    parser.add_argument("--near", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-data-"))
    runs = Runs(workdir / "runs")
    texts, exact, near = duplicate_corpus(args.unique, args.exact, args.near, seed=11)
    pattern = write_corpus(workdir / "raw", texts)
    prepare(runs, "warmup", write_corpus(workdir / "warm", texts[:2000], shards=1), 1)

    timings = {}
    for workers in (1, args.workers):
        seconds, card, kept = prepare(runs, f"bench-{workers}w", pattern, workers)
        timings[workers] = (seconds, card, kept)
        print(f"{workers} worker(s): {len(texts) / seconds:,.0f} rows/s end to end ({seconds:.1f} s)", flush=True)

    seconds, card, kept = timings[args.workers]
    removed = set(range(len(texts))) - kept
    originals = set(exact.values()) | set(near.values())
    pre = card["kinds"]["pretrain"]
    figures = {
        "rows": len(texts), "rows_kept": pre["rows_out"],
        "filters_removed": sum(pre["filters"]["removed"].values()),
        "exact_removed": pre["dedup"]["exact_removed"], "near_removed": pre["dedup"]["near_removed"],
        "near_recall": round(sum(1 for c, s in near.items() if c in removed or s in removed) / len(near), 4),
        "false_removal_rate": round(len(removed - set(exact) - set(near) - originals) / args.unique, 5),
        "duplicate_rate_before": pre["dedup"]["duplicate_rate_before"],
        "duplicate_rate_after_measured": pre["dedup"].get("duplicate_rate_after"),
        "duplicate_rate_after_true": round(sum(1 for c, s in near.items() if c in kept and s in kept) / len(kept), 5),
        "pretrain_tokens": card["tokens"]["pretrain"], "packed_rows": card["packed"]["rows"],
        "pass_seconds_pretrain": pre["seconds"],
        "rows_per_s_1_worker": round(len(texts) / timings[1][0], 1),
        f"rows_per_s_{args.workers}_workers": round(len(texts) / seconds, 1),
    }
    figures["ratio"] = round(timings[1][0] / seconds, 3)
    print(render_table(["figure", "value"], [[k, v] for k, v in figures.items()]))
    print(json.dumps({"bench": "data_prepare", "workers": args.workers, **figures}))


if __name__ == "__main__":
    main()
