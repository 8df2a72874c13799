"""Peak memory of 2-process pretraining on the demo corpus vs the same corpus 50x larger.

    .venv/bin/python bench/data_memory.py                        # prepares the demo data run first
    .venv/bin/python bench/data_memory.py --data runs/data-demo --steps 25 --times 50

Pretraining reads the data run's ``packed/`` rows memory-mapped, each rank only its own rows, one
micro-batch at a time, so a rank's memory should not grow with the corpus. The bench copies the
demo data run and repeats its ``packed/*.bin`` files ``--times`` times (meta.json updated), then
runs the demo pretrain recipe under ``torchrun --nproc_per_node 2`` on each (small, large, in this
run), polling every rank's ``/proc/<pid>/status``: VmHWM is the rank's peak resident set (anonymous
plus mapped file pages), RssAnon and RssFile are sampled peaks of its two parts. Ends with one
JSON line; ``ratio`` = large ÷ small of the per-rank peak (max over ranks); target ≤ 1.10.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from smolforge.recipe import build_stage_recipe, load_recipe
from smolforge.registry import load_stage
from smolforge.runs import RunLayout, Runs, write_json_atomic
from smolforge.table import render_table

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "recipes" / "demo"
FIELDS = ("VmHWM", "RssAnon", "RssFile")


def demo_data_run(runs: Runs) -> Path:
    stage = load_stage("data")
    _, data = load_recipe(DEMO / "data.yaml")
    recipe = build_stage_recipe(stage, {**data, "progress": False}, source="bench data")
    stage.validate(recipe, runs)
    return stage.run(recipe, runs, overwrite=True).path


def repeated_copy(source: Path, target: Path, times: int) -> dict:
    """A copy of data run ``source`` whose packed rows are its own repeated ``times`` times."""
    shutil.copytree(source, target)
    layout = RunLayout(target)
    packed = layout.packed_dir
    meta = json.loads((packed / "meta.json").read_text())
    for name, stats in meta["domains"].items():
        for suffix in ("ids", "pos"):
            path = packed / f"{name}.{suffix}.bin"
            path.write_bytes(path.read_bytes() * times)
        meta["domains"][name] = {k: v * times for k, v in stats.items()}
    write_json_atomic(packed / "meta.json", meta)
    info = json.loads(layout.json_path.read_text())
    write_json_atomic(layout.json_path, {**info, "name": target.name})
    return meta


def rows_per_step() -> int:
    _, recipe = load_recipe(DEMO / "pretrain.yaml")
    return recipe["train"]["micro_batch_size"] * recipe["train"].get("grad_accum", 1) * 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status_kb(pid: int) -> dict[str, int]:
    """VmHWM / RssAnon / RssFile of a live process in kB ({} once it has gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    fields = (line.split(":", 1) for line in lines)
    return {k: int(v.split()[0]) for k, v in fields if k in FIELDS}


def pretrain_peaks(runs_dir: Path, data: Path, name: str, steps: int) -> dict[int, dict[str, int]]:
    """Run the demo pretrain recipe on 2 processes; ``{rank: {field: peak kB}}`` polled from /proc."""
    import psutil

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(free_port()), "-m", "smolforge", "--runs-dir", str(runs_dir),
               "pretrain", "--config", str(DEMO / "pretrain.yaml"), "--overwrite",
               "--set", f"name={name}", "--set", f"data={data}", "--set", f"train.max_steps={steps}",
               "--set", "checkpoint.every_steps=0", "--set", "tracking.report_to=[none]"]
    launcher = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, dict[str, int]] = {}
    ranks: dict[int, int] = {}  # pid → rank
    while launcher.poll() is None:
        try:
            children = psutil.Process(launcher.pid).children()  # the ranks (their own children are not ranks)
        except psutil.NoSuchProcess:
            break
        for child in children:
            if child.pid not in ranks:
                try:
                    rank = child.environ().get("RANK")
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if rank is None:
                    continue
                ranks[child.pid] = int(rank)
            now = status_kb(child.pid)
            seen = peaks.setdefault(ranks[child.pid], dict.fromkeys(FIELDS, 0))
            for k, v in now.items():
                seen[k] = max(seen[k], v)
        time.sleep(0.05)
    _, stderr = launcher.communicate()
    if launcher.returncode != 0:
        raise SystemExit(f"pretrain on {data.name} failed:\n{stderr[-3000:]}")
    return peaks


def mib(kb: int) -> float:
    return round(kb / 1024, 1)


def measure(runs: Runs, args: argparse.Namespace) -> tuple[dict[str, int], dict[str, dict[int, dict[str, int]]]]:
    """Packed tokens and per-rank peaks of the small corpus and its ``--times`` copy, small first."""
    small = args.data.resolve() if args.data else demo_data_run(runs)
    large = runs.root / "data-large"
    meta = repeated_copy(small, large, args.times)
    rows = sum(d["rows"] for d in meta["domains"].values())
    tokens = {"small": rows // args.times * meta["seq_len"], "large": rows * meta["seq_len"]}

    peaks, seconds = {}, {}
    for label, data in (("small", small), ("large", large)):
        started = time.perf_counter()
        peaks[label] = pretrain_peaks(runs.root, data, f"mem-{label}", args.steps)
        seconds[label] = time.perf_counter() - started
        top = max(p["VmHWM"] for p in peaks[label].values())
        print(f"{label}: {tokens[label]:,} packed tokens, peak RSS per rank {mib(top)} MiB ({seconds[label]:.0f} s)",
              flush=True)
    return tokens, peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="a prepared demo data run folder (default: prepare one in a temp folder)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--times", type=int, default=50, help="how many times larger the large corpus is")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-data-memory-") as workdir:
        tokens, peaks = measure(Runs(Path(workdir) / "runs"), args)

    rows = []
    for label in ("small", "large"):
        for rank, p in sorted(peaks[label].items()):
            rows.append([label, f"{tokens[label]:,}", rank, mib(p["VmHWM"]), mib(p["RssAnon"]), mib(p["RssFile"])])
    print(render_table(["corpus", "packed tokens", "rank", "peak RSS MiB (VmHWM)", "RssAnon MiB", "RssFile MiB"], rows))

    top = {label: max(p["VmHWM"] for p in peaks[label].values()) for label in peaks}
    anon = {label: max(p["RssAnon"] for p in peaks[label].values()) for label in peaks}
    figures = {
        "steps": args.steps, "times": args.times, "rows_per_step": rows_per_step(),
        "tokens_small": tokens["small"], "tokens_large": tokens["large"],
        "peak_rss_mib_small": mib(top["small"]), "peak_rss_mib_large": mib(top["large"]),
        "peak_anon_mib_small": mib(anon["small"]), "peak_anon_mib_large": mib(anon["large"]),
        # what loading every row as int64 ids + positions + labels used to hold on each rank
        "int64_copy_mib_large": round(tokens["large"] * 3 * 8 / 2**20, 1),
        "ratio": round(top["large"] / top["small"], 3),
    }
    print(json.dumps({"bench": "data_memory", **figures}))


if __name__ == "__main__":
    main()
