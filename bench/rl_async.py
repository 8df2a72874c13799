"""GRPO on the demo with synchronous vs asynchronous rollouts (vLLM server): steps/s and held-out reward,
same step budget, same seed, in one run.

    .venv/bin/python bench/rl_async.py                              # sync vs async max_staleness 1, 40 steps, 2 rounds
    .venv/bin/python bench/rl_async.py --staleness 1 2 --split      # N = 1, 2; also with server and trainer on own cores
    .venv/bin/python bench/rl_async.py --runs-dir /tmp/bench-runs   # builds data → pretrain → SFT there if missing

Each variant is the demo GRPO recipe (recipes/demo/grpo.yaml) from the demo SFT model, run as its own
process (``smolforge grpo --config … --set trainer.max_steps=S --set trainer.logging_steps=1``), the
asynchronous ones with ``--set async.max_staleness=N`` (smolforge.alignment.async_rollouts); the
baseline is the synchronous path (no ``async``). Every variant must roll out through the vLLM server
(``rl/generation: vllm-server``), or the comparison says nothing. Rounds alternate the order. A
missing ``sft-demo`` is built in ``--runs-dir`` from the demo recipes, its SFT step starting from
``pretrain-demo`` (the tests' chain, without the long-context step).

``--split`` runs every variant a second time with the vLLM server's OpenMP threads bound to the last
core and the trainer's on the others (``VLLM_CPU_OMP_THREADS_BIND``, ``OMP_NUM_THREADS``): on a small
CPU the overlap has no idle core to use otherwise, and the two sides slow each other down.

steps/s is measured from metrics.jsonl's step times after ``--warmup`` steps (the server's start and
the first batches left out); the whole-run figure (``rl/steps_per_s``) is printed too. The held-out
verifier reward before → after is the stage's own (greedy, the held-out split of the seed). For the
asynchronous runs: the mean and max staleness the steps trained at, the mean overlap (share of the
generation time hidden behind training) and the seconds the trainer waited.

Prints one row per run and ONE line holding a JSON object; ``ratio`` is the steps/s of the first
asynchronous variant ÷ the synchronous one (> 1: asynchronous is faster), with both raw figures;
with ``--split`` also ``ratio_split`` (both split) and ``ratio_split_vs_sync`` (async split ÷ sync as is).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_seeds import DEMO  # noqa: E402

from smolforge.runs import Runs  # noqa: E402
from smolforge.table import render_table  # noqa: E402


def ensure_parent(runs_dir: Path) -> None:
    """data-demo → pretrain-demo → sft-demo in ``runs_dir`` when missing (the demo recipes; the SFT step
    starts from pretrain-demo, skipping the demo's long-context step, as the tests' chain does)."""
    runs = Runs(runs_dir)
    done = {r.name for r in runs.list() if r.status == "done"}
    if {"data-demo", "sft-demo"} <= done:
        return
    print(f"building data-demo → pretrain-demo → sft-demo in {runs_dir} (demo recipes) …", flush=True)
    if "data-demo" not in done:
        stage(runs_dir, {}, "data", "prepare", str(DEMO / "data.yaml"), "--overwrite")
    if "pretrain-demo" not in done:
        stage(runs_dir, {}, "pretrain", "--config", str(DEMO / "pretrain.yaml"), "--overwrite")
    stage(runs_dir, {}, "sft", "--config", str(DEMO / "sft.yaml"), "--set", "parent=pretrain-demo", "--overwrite")


def label(staleness: int | None, split: bool = False) -> str:
    return ("sync" if staleness is None else f"async-{staleness}") + (" split" if split else "")


def split_env() -> dict:
    """The vLLM server's OpenMP threads bound to the last core, the trainer's threads on the others."""
    cores = os.cpu_count() or 2
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cores - 1), "OMP_NUM_THREADS": str(max(cores - 1, 1))}


def stage(runs_dir: Path, extra_env: dict, *args: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1", **extra_env}
    cmd = [sys.executable, "-m", "smolforge", "--runs-dir", str(runs_dir), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")


def steps_per_s(metrics_path: Path, warmup: int) -> float:
    """Steps per second between the end of step ``warmup`` and the last step (metrics.jsonl's times)."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    times = {r["step"]: r["time"] for r in rows if "loss" in r and "time" in r}
    last = max(times)
    if last <= warmup:
        raise SystemExit(f"{metrics_path}: {last} steps logged, not more than --warmup {warmup}")
    return (last - warmup) / (times[last] - times[warmup])


def run_variant(runs_dir: Path, staleness: int | None, split: bool, steps: int, seed: int, warmup: int,
                round_: int) -> dict:
    name = f"grpo-{label(staleness, split).replace(' ', '-')}-r{round_}"
    sets = [f"name={name}", f"trainer.seed={seed}", f"trainer.max_steps={steps}", "trainer.logging_steps=1"]
    if staleness is not None:
        sets.append(f"async.max_staleness={staleness}")
    started = time.perf_counter()
    stage(runs_dir, split_env() if split else {}, "grpo", "--config", str(DEMO / "grpo.yaml"),
          *[a for s in sets for a in ("--set", s)], "--overwrite")
    wall = time.perf_counter() - started
    run = Runs(runs_dir).get(name)
    m = run.metrics
    if m.get("rl/generation") != "vllm-server":
        raise SystemExit(f"{name} generated with {m.get('rl/generation')}, not the vLLM server: nothing to compare")
    return {"variant": label(staleness, split), "round": round_, "steps": m["train/steps"],
            "steps_per_s": round(steps_per_s(run.metrics_path, warmup), 4),
            "steps_per_s_whole": m.get("rl/steps_per_s"),
            "before": m["rl/heldout_reward_before"], "after": m["rl/heldout_reward_after"],
            "staleness_mean": m.get("rl/async_staleness_mean"), "staleness_max": m.get("rl/async_staleness_max"),
            "overlap_mean": m.get("rl/async_overlap_mean"), "wait_s": m.get("rl/async_wait_s"),
            "generate_s": m.get("rl/async_generate_s"), "fallbacks": m.get("rl/async_fallbacks"),
            "is_correction": m.get("rl/is_correction"), "seconds": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", default="runs", help="where sft-demo lives (built there if missing)")
    parser.add_argument("--staleness", nargs="+", type=int, default=[1], help="async.max_staleness values")
    parser.add_argument("--steps", type=int, default=40, help="the step budget of every variant")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of steps/s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--split", action="store_true", help="also run every variant with the vLLM server on the "
                                                              "last core and the trainer on the others")
    args = parser.parse_args()
    runs_dir = Path(args.runs_dir).resolve()
    ensure_parent(runs_dir)
    variants: list[tuple[int | None, bool]] = [(s, split) for split in ([False, True] if args.split else [False])
                                               for s in (None, *args.staleness)]
    rows = []
    for round_ in range(args.rounds):
        for staleness, split in (variants if round_ % 2 == 0 else variants[::-1]):
            rows.append(run_variant(runs_dir, staleness, split, args.steps, args.seed, args.warmup, round_))
            r = rows[-1]
            print(f"{r['variant']} round {round_}: {r['steps_per_s']:.3f} steps/s, held-out {r['before']:.3f} → "
                  f"{r['after']:.3f} ({r['seconds']} s)", flush=True)

    def shown(value, spec=".3f"):
        return "–" if value is None else format(value, spec)

    print(render_table(["variant", "round", "steps/s", "whole run", "held-out before", "after", "staleness mean",
                        "max", "overlap", "waited s", "generated s", "fallbacks", "IS correction", "seconds"],
                       [[r["variant"], r["round"], shown(r["steps_per_s"]), shown(r["steps_per_s_whole"]),
                         shown(r["before"]), shown(r["after"]), shown(r["staleness_mean"], ".2f"),
                         shown(r["staleness_max"], "d"), shown(r["overlap_mean"], ".2f"), shown(r["wait_s"], ".1f"),
                         shown(r["generate_s"], ".1f"), shown(r["fallbacks"], "d"), r["is_correction"], r["seconds"]]
                        for r in rows]))
    figures: dict = {"steps": args.steps, "seed": args.seed, "warmup": args.warmup, "rounds": args.rounds, "runs": rows}
    for staleness, split in variants:
        mine = [r for r in rows if r["variant"] == label(staleness, split)]
        figures[label(staleness, split)] = {
            "steps_per_s": round(statistics.fmean(r["steps_per_s"] for r in mine), 4),
            "after": round(statistics.fmean(r["after"] for r in mine), 4),
            "before": round(statistics.fmean(r["before"] for r in mine), 4)}
    sync, first = figures["sync"], figures[label(args.staleness[0])]
    figures.update({"ratio": round(first["steps_per_s"] / sync["steps_per_s"], 4),
                    "baseline_steps_per_s": sync["steps_per_s"], "ours_steps_per_s": first["steps_per_s"],
                    "baseline_after": sync["after"], "ours_after": first["after"]})
    if args.split:
        split_async = figures[label(args.staleness[0], True)]["steps_per_s"]
        figures["ratio_split"] = round(split_async / figures[label(None, True)]["steps_per_s"], 4)
        figures["ratio_split_vs_sync"] = round(split_async / sync["steps_per_s"], 4)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
