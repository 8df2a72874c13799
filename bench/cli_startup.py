"""Start-up time of the ``smolforge`` command vs ``python -c "import torch"`` (what the CLI avoids importing).

    .venv/bin/python bench/cli_startup.py                # 5 timed rounds
    .venv/bin/python bench/cli_startup.py --repeats 10

Times, each as a fresh subprocess, wall clock from spawn to exit:

* ``smolforge --help`` (the venv's console script);
* ``smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11T --gpus 384 --days 24 --json``
  (loads the recipe and counts SmolLM3-3B's parameters on the meta device, so it imports torch);
* ``python -c "import torch"``: the baseline, the import ``--help`` must not pay for.

They alternate (help, plan, torch, help, …) after one untimed warm-up round that fills the OS
page cache. Then, in this process, ``measure_cpu_peak_flops()`` (the matmul probe behind
``--gpu cpu``) with its cache cleared before each call. Prints a table (median, min, max seconds)
and ends with one JSON line; ``ratio`` = ``import torch`` ÷ ``smolforge --help`` median seconds
(> 1: ``--help`` starts faster than torch alone imports).
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

from smolforge.table import render_table

REPO = Path(__file__).resolve().parents[1]
PLAN_ARGS = ["plan", "recipes/smollm3-3b/pretrain.yaml", "--tokens", "11T", "--gpus", "384", "--days", "24",
             "--json"]


def smolforge_command() -> list[str]:
    """The console script beside this Python, else ``python -m smolforge``."""
    script = Path(sys.executable).with_name("smolforge")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "smolforge"]


def commands() -> dict[str, list[str]]:
    cli = smolforge_command()
    return {"help": [*cli, "--help"], "plan": [*cli, *PLAN_ARGS],
            "import_torch": [sys.executable, "-c", "import torch"]}


def run_once(argv: list[str]) -> float:
    """Seconds from spawn to exit; a failing command stops the bench with its stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds


def cpu_peak_probe_seconds(repeats: int) -> list[float]:
    from smolforge.pretrain.flops import measure_cpu_peak_flops

    measure_cpu_peak_flops()  # warm-up: imports torch, starts its thread pool
    times = []
    for _ in range(repeats):
        measure_cpu_peak_flops.cache_clear()
        started = time.perf_counter()
        measure_cpu_peak_flops()
        times.append(time.perf_counter() - started)
    return times


def row(label: str, times: list[float]) -> list:
    return [label, f"{statistics.median(times):.3f}", f"{min(times):.3f}", f"{max(times):.3f}", len(times)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    argvs = commands()
    for argv in argvs.values():
        run_once(argv)
    times: dict[str, list[float]] = {name: [] for name in argvs}
    for round_ in range(args.repeats):
        for name, argv in argvs.items():
            times[name].append(run_once(argv))
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {t[-1]:.2f} s" for name, t in times.items()), flush=True)
    times["cpu_peak_probe"] = cpu_peak_probe_seconds(args.repeats)

    labels = {"help": "smolforge --help", "plan": "smolforge plan smollm3-3b --json",
              "import_torch": 'python -c "import torch"', "cpu_peak_probe": "measure_cpu_peak_flops() in-process"}
    print(render_table(["command", "median s", "min s", "max s", "runs"],
                       [row(labels[name], t) for name, t in times.items()]))
    medians = {name: round(statistics.median(t), 4) for name, t in times.items()}
    print(json.dumps({"bench": "cli_startup", "help_s": medians["help"], "plan_s": medians["plan"],
                      "import_torch_s": medians["import_torch"], "cpu_peak_probe_s": medians["cpu_peak_probe"],
                      "ratio": round(medians["import_torch"] / medians["help"], 3), "repeats": args.repeats,
                      "smolforge": " ".join(smolforge_command()),
                      "raw_s": {name: [round(x, 4) for x in t] for name, t in times.items()}}))


if __name__ == "__main__":
    main()
