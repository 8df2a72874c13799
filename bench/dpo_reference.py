"""DPO steps/s with precomputed reference log-probs vs a live reference model, same model and data.

    .venv/bin/python bench/dpo_reference.py                      # builds a short demo chain in a temp folder
    .venv/bin/python bench/dpo_reference.py --runs-dir runs      # reuses runs/sft-demo and runs/data-demo
    .venv/bin/python bench/dpo_reference.py --steps 60 --warmup 5 --rounds 3

Both run the ``dpo`` stage with the demo recipe (recipes/demo/dpo.yaml: batch 16, [sigmoid, sft]
loss) on the demo SFT model and the demo preference pairs; the only difference is
``trainer.precompute_ref_log_probs``. Live: every step runs the frozen reference forward on the
batch. Precomputed: TRL runs the reference once over the whole training set before step 1 (its
time is measured separately, from the stage's own call of ``DPOTrainer._precompute_ref_logps``)
and steps read the log-probs from dataset columns. They alternate (live, precomputed, live, …);
the first ``--warmup`` steps of each run are excluded. The precompute pass is also amortised over
``--amortise-steps`` training steps (default: the demo recipe's ``max_steps``). Ends with one JSON
line; ``ratio`` = precomputed ÷ live steady-state steps/s (> 1: precomputing is faster).

The DPO runs go into a temporary runs folder; ``--runs-dir`` is only read. On CPUs shared with
other jobs, ``--threads 1`` keeps the figures steady (two threads per process swung 0.5-10 steps/s).
Measured on the demo (runs/sft-demo, 2 shared cores, ``--runs-dir runs --threads 1``): live 5.42,
precomputed 7.18 steps/s (ratio 1.33); the pass over 393 pairs took 1.2 s (6.7 live steps), so
amortised over the demo's 150 steps the ratio is 1.25.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

from smolforge.recipe import build_stage_recipe, deep_merge, load_recipe
from smolforge.registry import load_stage
from smolforge.runs import Runs
from smolforge.table import render_table

DEMO = Path(__file__).resolve().parents[1] / "recipes" / "demo"
PRECOMPUTE_SECONDS: list[float] = []


def recipe(stage: str, **changes):
    _, data = load_recipe(DEMO / f"{stage}.yaml")
    return build_stage_recipe(load_stage(stage), deep_merge(data, changes), source=f"bench {stage}")


def short_chain(runs: Runs, pretrain_steps: int, sft_steps: int) -> tuple[str, str]:
    """data → pretrain → sft with the demo recipes (the demo model's shape), trained briefly."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        data = load_stage("data").run(recipe("data", progress=False), runs)
        load_stage("pretrain").run(recipe("pretrain", train={"max_steps": pretrain_steps, "log_every": 10},
                                          checkpoint={"every_steps": 0}, tracking={"report_to": ["none"]}), runs)
        sft = load_stage("sft").run(recipe("sft", trainer={"max_steps": sft_steps}), runs)
    return str(sft.path), str(data.path)


def time_precompute() -> None:
    """Record the wall time of each call of TRL's precompute pass (the stage calls it in __init__)."""
    from trl import DPOTrainer

    original = DPOTrainer._precompute_ref_logps

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        PRECOMPUTE_SECONDS.append(time.perf_counter() - start)
        return out

    DPOTrainer._precompute_ref_logps = timed


def dpo(runs: Runs, parent: str, data: str, name: str, steps: int, warmup: int, precompute: bool) -> tuple[float, float]:
    """(steady-state steps/s from the stage's per-step log, wall seconds of the whole stage)."""
    stage = load_stage("dpo")
    r = recipe("dpo", name=name, parent=parent, data=data,
               trainer={"max_steps": steps, "logging_steps": 1, "precompute_ref_log_probs": precompute})
    stage.validate(r, runs)
    start = time.perf_counter()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # Trainer prints every log line
        run = stage.run(r, runs, overwrite=True)
    wall = time.perf_counter() - start
    times = [json.loads(line)["time"] for line in run.metrics_path.read_text().splitlines()
             if "loss" in json.loads(line)]
    return (len(times) - 1 - warmup) / (times[-1] - times[warmup]), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", help="folder holding done sft-demo and data-demo runs (default: build a "
                                           "short demo chain in a temp folder)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--amortise-steps", type=int, default=None,
                        help="training steps the precompute pass is spread over (default: the demo recipe's)")
    parser.add_argument("--pretrain-steps", type=int, default=40, help="short chain only")
    parser.add_argument("--sft-steps", type=int, default=30, help="short chain only")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args()

    import datasets
    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    workdir = Path(tempfile.mkdtemp(prefix="bench-dpo-"))
    try:
        measure(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def measure(args, workdir: Path) -> None:
    import torch

    runs = Runs(workdir / "runs")
    if args.runs_dir:
        source = Runs(args.runs_dir)
        parent, data = str(source.get("sft-demo").path.resolve()), str(source.get("data-demo").path.resolve())
    else:
        parent, data = short_chain(runs, args.pretrain_steps, args.sft_steps)
    amortise = args.amortise_steps or recipe("dpo").trainer.max_steps
    time_precompute()

    live, pre, live_wall, pre_wall = [], [], [], []
    for round_ in range(args.rounds):
        sps, wall = dpo(runs, parent, data, f"bench-live-{round_}", args.steps, args.warmup, precompute=False)
        live.append(sps), live_wall.append(wall)
        sps, wall = dpo(runs, parent, data, f"bench-pre-{round_}", args.steps, args.warmup, precompute=True)
        pre.append(sps), pre_wall.append(wall)
        print(f"round {round_ + 1}: live reference {live[-1]:.2f} steps/s, precomputed {pre[-1]:.2f} steps/s "
              f"(precompute pass {PRECOMPUTE_SECONDS[-1]:.2f} s)", flush=True)

    live_sps, pre_sps = statistics.median(live), statistics.median(pre)
    pass_s = statistics.median(PRECOMPUTE_SECONDS)
    pre_amortised = amortise / (amortise / pre_sps + pass_s)
    pairs = sum(1 for f in Path(data, "data", "prefs").glob("part-*.jsonl") for line in f.open() if line.strip()) \
        if Path(data, "data", "prefs").is_dir() else None
    print(render_table(["reference", "steps/s (median)", "stage wall s (median)", "rounds"],
                       [["live model", round(live_sps, 3), round(statistics.median(live_wall), 1), len(live)],
                        ["precomputed log-probs", round(pre_sps, 3), round(statistics.median(pre_wall), 1), len(pre)],
                        [f"precomputed, pass amortised over {amortise} steps", round(pre_amortised, 3), None, None]]))
    print(render_table(["precompute pass", "value"],
                       [["seconds (median)", round(pass_s, 2)], ["pairs", pairs],
                        ["= live steps", round(pass_s * live_sps, 1)]]))
    print(json.dumps({"bench": "dpo_reference", "precomputed_steps_per_s": round(pre_sps, 3),
                      "live_steps_per_s": round(live_sps, 3), "ratio": round(pre_sps / live_sps, 3),
                      "precompute_pass_s": round(pass_s, 3), "amortise_steps": amortise,
                      "precomputed_amortised_steps_per_s": round(pre_amortised, 3),
                      "amortised_ratio": round(pre_amortised / live_sps, 3),
                      "live_stage_wall_s": round(statistics.median(live_wall), 2),
                      "precomputed_stage_wall_s": round(statistics.median(pre_wall), 2),
                      "pairs": pairs, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
                      "batch_size": recipe("dpo").trainer.per_device_train_batch_size,
                      "torch_threads": torch.get_num_threads(), "parent": parent}))


if __name__ == "__main__":
    main()
