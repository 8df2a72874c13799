"""Online RL on the demo, over several seeds: the held-out verifier reward before and after, mean and spread.

    .venv/bin/python bench/rl_seeds.py                          # GRPO, seeds 0 1 2, from runs/sft-demo
    .venv/bin/python bench/rl_seeds.py --stages grpo rloo ppo --seeds 0 1 2 3
    .venv/bin/python bench/rl_seeds.py --runs-dir /tmp/bench-runs  # builds data → pretrain → long context → SFT there if missing
    .venv/bin/python bench/rl_seeds.py --losses dapo dr_grpo       # GRPO with two losses of its family, same seeds

Each (stage, seed) runs the stage's demo recipe (recipes/demo/<stage>.yaml) from the demo SFT
model as its own process, ``smolforge <stage> --config … --set trainer.seed=S`` (PPO:
``ppo.seed``), exactly as ``make demo`` runs GRPO except for the seed. The seed moves the held-out
split, the prompt order and the sampling, so the "before" figure moves too. A single run's
figure is one draw: the README quotes the mean and the spread printed here. The SFT parent
(``sft-demo``, with ``data-demo``) is taken from ``--runs-dir``, or built there with the demo
recipes when missing (a few minutes).

Prints one row per run and a summary per stage (mean ± sample standard deviation, min–max),
then ONE line holding a JSON object; ``ratio`` is the mean reward after ÷ the mean before
(> 1: RL raised the held-out reward), with both raw figures. ``--losses`` runs GRPO once per
``trainer.loss_type`` (rows ``grpo[dapo]``, ``grpo[dr_grpo]`` …; ``dr_grpo`` with ``scale_rewards:
none``, as its paper has it) on the same seeds, so two losses are compared on the same draws.
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

from smolforge.runs import Runs
from smolforge.table import render_table

DEMO = Path(__file__).resolve().parents[1] / "recipes" / "demo"
SEED_KEY = {"grpo": "trainer.seed", "rloo": "trainer.seed", "ppo": "ppo.seed"}


def smolforge(runs_dir: Path, *args: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "smolforge", "--runs-dir", str(runs_dir), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")


def ensure_parent(runs_dir: Path) -> None:
    runs = Runs(runs_dir)
    if {r.name for r in runs.list() if r.status == "done"} >= {"data-demo", "sft-demo"}:
        return
    print(f"building data-demo → pretrain-demo → longctx-demo → sft-demo in {runs_dir} (demo recipes) …", flush=True)
    smolforge(runs_dir, "data", "prepare", str(DEMO / "data.yaml"), "--overwrite")
    # sft.yaml's parent is the long-context extension (longctx.yaml, a pretrain recipe), as in `make demo`
    for stage, recipe in (("pretrain", "pretrain"), ("pretrain", "longctx"), ("sft", "sft")):
        smolforge(runs_dir, stage, "--config", str(DEMO / f"{recipe}.yaml"), "--overwrite")


def loss_sets(loss: str | None) -> list[str]:
    """``--set`` arguments for one GRPO loss (none: the recipe's own)."""
    if loss is None:
        return []
    return ["--set", f"trainer.loss_type={loss}"] + (["--set", "trainer.scale_rewards=none"] if loss == "dr_grpo" else []) \
        + (["--set", "trainer.epsilon_high=5.0"] if loss == "cispo" else [])


def run_seed(runs_dir: Path, stage: str, seed: int, loss: str | None = None) -> dict:
    label = f"{stage}[{loss}]" if loss else stage
    name = f"{stage}-{loss}-seed{seed}" if loss else f"{stage}-seed{seed}"
    started = time.perf_counter()
    smolforge(runs_dir, stage, "--config", str(DEMO / f"{stage}.yaml"), "--set", f"name={name}",
              "--set", f"{SEED_KEY[stage]}={seed}", *loss_sets(loss), "--overwrite")
    metrics = Runs(runs_dir).get(name).metrics
    return {"stage": label, "seed": seed, "before": metrics["rl/heldout_reward_before"],
            "after": metrics["rl/heldout_reward_after"], "prompts": metrics["rl/heldout_prompts"],
            "generation": metrics.get("rl/generation"), "seconds": round(time.perf_counter() - started, 1)}


def spread(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4),
            "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", default="runs", help="where sft-demo lives (built there if missing)")
    parser.add_argument("--stages", nargs="+", default=["grpo"], choices=sorted(SEED_KEY))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--losses", nargs="+", help="GRPO once per trainer.loss_type (e.g. dapo dr_grpo), "
                                                    "instead of --stages")
    args = parser.parse_args()
    if len(args.seeds) < 3:
        parser.error("give at least 3 seeds: one run's figure is one draw")
    runs_dir = Path(args.runs_dir).resolve()
    ensure_parent(runs_dir)
    rows = []
    variants = [("grpo", loss) for loss in args.losses] if args.losses else [(stage, None) for stage in args.stages]
    for stage, loss in variants:
        for seed in args.seeds:
            rows.append(run_seed(runs_dir, stage, seed, loss))
            last = rows[-1]
            print(f"{last['stage']} seed {seed}: {last['before']:.3f} → {last['after']:.3f} ({last['seconds']} s)",
                  flush=True)
    labels = [f"{stage}[{loss}]" if loss else stage for stage, loss in variants]
    print(render_table(["stage", "seed", "held-out before", "after", "prompts", "generation", "seconds"],
                       [[r["stage"], r["seed"], f"{r['before']:.3f}", f"{r['after']:.3f}", r["prompts"],
                         r["generation"], r["seconds"]] for r in rows]))
    figures: dict = {"seeds": args.seeds, "runs": rows}
    summary_rows = []
    for stage in labels:
        before = spread([r["before"] for r in rows if r["stage"] == stage])
        after = spread([r["after"] for r in rows if r["stage"] == stage])
        figures[stage] = {"before": before, "after": after, "ratio": round(after["mean"] / before["mean"], 4),
                          "baseline_before_mean": before["mean"], "ours_after_mean": after["mean"]}
        summary_rows.append([stage, len(args.seeds), f"{before['mean']:.3f} ± {before['std']:.3f}",
                             f"{after['mean']:.3f} ± {after['std']:.3f}",
                             f"{after['min']:.3f}–{after['max']:.3f}", f"{figures[stage]['ratio']:.3f}"])
    print(render_table(["stage", "seeds", "before (mean ± sd)", "after (mean ± sd)", "after min–max", "ratio"],
                       summary_rows))
    first = labels[0]
    figures["ratio"] = figures[first]["ratio"]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
