"""`smolforge data prepare` end to end on a Parquet corpus with known duplicates: inline 1 vs N workers vs datatrove.

    .venv/bin/python bench/data_prepare.py                     # 100k docs + 5k exact + 5k near copies
    .venv/bin/python bench/data_prepare.py --unique 20000 --workers 2

Writes the corpus of ``bench/dedup.py`` as Parquet shards in a foreign layout (column ``body``,
an ``id`` column that rides along), then runs the data stage on it (read → validate → Gopher
filters → exact + MinHash-LSH dedup → decontamination → shards → tokenizer → packed rows → card)
with ``executor: inline`` on one worker and on ``--workers``, and with ``executor: local``
(datatrove: ``--workers`` tasks on ``--workers`` processes), one after the other after a small
warm-up of each. Prints rows/s and, per path, the dedup figures against the known copies; ends
with one JSON line whose ``ratio`` is datatrove rows/s ÷ inline N-worker rows/s
(``ratio_inline_workers``: inline N-worker ÷ 1-worker, the figure this bench reported before).
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


def prepare(runs: Runs, name: str, pattern: str, workers: int, executor: str = "inline") -> tuple[float, dict, set[int]]:
    stage = load_stage("data")
    _, data = load_recipe(ROOT / "recipes" / "demo" / "data.yaml")
    # Gopher's defaults, except the stop-word rule: the corpus is random syllables, not English
    data.update(name=name, progress=False, filters={"min_words": 3, "min_stop_words": None},
                sources={"pretrain": [{"path": pattern, "columns": {"text": "body"}, "domain": "web"}]})
    data["dedup"] = {**data["dedup"], "workers": workers}
    if executor != "inline":
        data.update(executor=executor, tasks=workers, workers=workers)
    recipe = build_stage_recipe(stage, data, source="bench")
    started = time.perf_counter()
    stage.validate(recipe, runs)
    run = stage.run(recipe, runs, overwrite=True)
    seconds = time.perf_counter() - started
    card = json.loads(run.data_card_path.read_text())
    kept = {json.loads(line)["id"] for p in sorted(run.data_shard_dir("pretrain").glob("part-*.jsonl"))
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
    warm = write_corpus(workdir / "warm", texts[:2000], shards=1)
    paths = {"inline_1w": (1, "inline"), f"inline_{args.workers}w": (args.workers, "inline"),
             "datatrove": (args.workers, "local")}
    for name, (workers, executor) in paths.items():
        prepare(runs, f"warm-{name}", warm, workers, executor)

    timings = {}
    for name, (workers, executor) in paths.items():
        seconds, card, kept = prepare(runs, f"bench-{name}", pattern, workers, executor)
        timings[name] = (seconds, card, kept)
        print(f"{name}: {len(texts) / seconds:,.0f} rows/s end to end ({seconds:.1f} s)", flush=True)

    originals = set(exact.values()) | set(near.values())

    def quality(name: str) -> dict:
        seconds, card, kept = timings[name]
        removed = set(range(len(texts))) - kept
        pre = card["kinds"]["pretrain"]
        return {
            "rows_kept": pre["rows_out"], "filters_removed": sum(pre["filters"]["removed"].values()),
            "exact_removed": pre["dedup"]["exact_removed"], "near_removed": pre["dedup"]["near_removed"],
            "near_recall": round(sum(1 for c, s in near.items() if c in removed or s in removed) / len(near), 4),
            "false_removal_rate": round(len(removed - set(exact) - set(near) - originals) / args.unique, 5),
            "duplicate_rate_before": pre["dedup"]["duplicate_rate_before"],
            "duplicate_rate_after_measured": pre["dedup"].get("duplicate_rate_after"),
            "duplicate_rate_after_true": round(sum(1 for c, s in near.items() if c in kept and s in kept) / len(kept), 5),
            "pretrain_tokens": card["tokens"]["pretrain"], "packed_rows": card["packed"]["rows"],
            "pass_seconds_pretrain": pre["seconds"], "seconds": round(seconds, 2),
            "rows_per_s": round(len(texts) / seconds, 1),
        }

    inline_n, dt = quality(f"inline_{args.workers}w"), quality("datatrove")
    print(render_table(["figure", f"inline, {args.workers} workers", f"datatrove local, {args.workers} tasks"],
                       [[k, inline_n[k], dt[k]] for k in inline_n]))
    figures = {"rows": len(texts), **{k: v for k, v in inline_n.items() if k not in ("seconds", "rows_per_s")},
               "rows_per_s_1_worker": round(len(texts) / timings["inline_1w"][0], 1),
               f"rows_per_s_{args.workers}_workers": inline_n["rows_per_s"],
               **{f"{k}_datatrove": v for k, v in dt.items()},
               "ratio_inline_workers": round(timings["inline_1w"][0] / timings[f"inline_{args.workers}w"][0], 3),
               "ratio": round(dt["rows_per_s"] / inline_n["rows_per_s"], 3)}
    print(json.dumps({"bench": "data_prepare", "workers": args.workers, **figures}))


if __name__ == "__main__":
    main()
