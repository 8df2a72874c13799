"""``smolforge burnin``: check every rank's hardware before a long run (matmul, memory, all-reduce, NVML).

    smolforge burnin --processes 2                       # two ranks on this machine, started by torchrun
    smolforge burnin --processes 8 --seconds 300 --json  # an 8-GPU node: five minutes of matmuls per rank
    torchrun --nnodes 4 --nproc_per_node 8 --rdzv_endpoint HOST:29500 -m smolforge burnin   # under a launcher

Every rank runs the same checks at the same time as the others:

1. **matmul**: square matmuls (fp32 on CPU, bf16 on CUDA) for ``--seconds``, in TFLOP/s and as a
   share of the device's peak, the planner's figure (:func:`smolforge.pretrain.flops.peak_flops`).
   A CPU has no datasheet peak: each rank measures the planner's CPU benchmark and the best rank's
   figure is the peak, so a rank slowed down shows below it.
2. **memory**: known words (all zeros, all ones, 0x55…, 0xAA…, each word's own index) written over
   a ``--memory-mib`` buffer on the device, read back, mismatched words counted.
3. **all-reduce**: a few message sizes, the median time of ``--allreduce-iters`` calls each, as
   bus bandwidth the way nccl-tests defines it (``algbw × 2(n-1)/n``); then one all-reduce whose
   sum is checked element by element. Tensors sit where the backend needs them (NCCL: this rank's
   CUDA device, from ``LOCAL_RANK``; gloo: the CPU).
4. **NVML** (``pynvml``, GPUs only): temperature, SM clock and ECC error counts after the load.

A rank is flagged when its matmul throughput is more than ``--margin`` (default 10 %) below the
median of the ranks, or its all-reduce time more than ``--margin`` above the median; memory
mismatches, a wrong all-reduce sum and uncorrected ECC errors flag it too. Exit code: 1 when
anything is flagged, 0 when healthy, 2 for bad arguments.

    >>> slow_ranks([1.00, 0.95, 0.50, 1.02], margin=0.10)       # median 0.975: below 0.8775 is slow
    [2]
    >>> slow_ranks([10.0, 10.5, 12.0, 10.0], margin=0.10, higher_is_better=False)  # median 10.25: above 11.275
    [2]
    >>> round(bus_bandwidth(2**30, 0.1, world=8) / 1e9, 4)      # algbw 10.7374 GB/s × 2·7/8
    18.7905

This module imports only the stdlib and the spine at the top (the CLI builds its parser from it);
torch is imported by the functions that measure.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smolforge.devices import local_device_index
from smolforge.errors import RecipeError

if TYPE_CHECKING:
    import torch

__all__ = ["Options", "add_arguments", "command", "run_rank", "summarize", "slow_ranks", "bus_bandwidth",
           "matmul_tflops", "memory_test", "allreduce_sweep", "nvml_snapshot", "pin_cores", "pinned",
           "print_report"]

MIB = 2**20
# Words of the memory test, as int32 (0xFFFFFFFF is -1); "address" writes each word's own index.
PATTERNS: tuple[int | str, ...] = (0x00000000, 0xFFFFFFFF, 0x55555555, 0xAAAAAAAA, "address")
# Sizes that work on the demo's 2-core CPU (seconds) and that load a GPU (minutes with --seconds 300).
DEFAULTS = {
    "cpu": {"matmul_size": 1024, "memory_mib": 64, "allreduce_mib": (1.0, 8.0, 32.0), "allreduce_iters": 5},
    "cuda": {"matmul_size": 8192, "memory_mib": 4096, "allreduce_mib": (1.0, 64.0, 1024.0), "allreduce_iters": 20},
}


@dataclasses.dataclass
class Options:
    """What a rank measures; None: the device's default (:data:`DEFAULTS`)."""

    device: str = "auto"                          # auto (CUDA when present) | cpu | cuda
    seconds: float = 5.0                          # length of the matmul test on every rank
    matmul_size: int | None = None                # n of the n × n matmuls
    memory_mib: int | None = None                 # buffer of the memory pattern test (0: skip it)
    allreduce_mib: tuple[float, ...] | None = None  # all-reduce message sizes
    allreduce_iters: int | None = None            # timed all-reduces per size (after one warm-up)
    margin: float = 0.10                          # a rank this far from the median is flagged
    pin_cores: bool = False                       # pin each rank to its own slice of this machine's cores

    def resolved(self, kind: str) -> Options:
        """A copy with the defaults of device ``kind`` (``cpu`` or ``cuda``) filled in."""
        found = {key: value for key, value in dataclasses.asdict(self).items() if value is not None}
        return Options(**{**DEFAULTS[kind], **found})

    def to_args(self) -> list[str]:
        """The command-line options that rebuild these options (the ranks' command)."""
        args = ["--device", self.device, "--seconds", str(self.seconds), "--margin", str(self.margin)]
        for flag, value in (("--matmul-size", self.matmul_size), ("--memory-mib", self.memory_mib),
                            ("--allreduce-iters", self.allreduce_iters)):
            if value is not None:
                args += [flag, str(value)]
        if self.allreduce_mib is not None:
            args += ["--allreduce-mib", ",".join(f"{size:g}" for size in self.allreduce_mib)]
        return args + (["--pin-cores"] if self.pin_cores else [])


# --------------------------------------------------------------------------- the command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--processes", default="1", metavar="N",
                   help="start N ranks on this machine through torchrun (default 1); under a launcher "
                   "(RANK and WORLD_SIZE set) leave it out")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: this rank's GPU (LOCAL_RANK) when CUDA is present, else the CPU")
    p.add_argument("--seconds", default="5", metavar="S", help="length of the matmul test (default 5)")
    p.add_argument("--matmul-size", metavar="N", help="n of the n × n matmuls (default 1024 on CPU, 8192 on CUDA)")
    p.add_argument("--memory-mib", metavar="M", help="buffer of the memory pattern test in MiB "
                   "(default 64 on CPU, 4096 on CUDA; 0 skips it)")
    p.add_argument("--allreduce-mib", metavar="LIST", help="all-reduce message sizes in MiB "
                   "(default 1,8,32 on CPU, 1,64,1024 on CUDA)")
    p.add_argument("--allreduce-iters", metavar="K", help="timed all-reduces per size (default 5 on CPU, 20 on CUDA)")
    p.add_argument("--margin", default="0.1", metavar="F",
                   help="flag a rank this fraction below the median matmul throughput or above the median "
                   "all-reduce time (default 0.1)")
    p.add_argument("--pin-cores", action="store_true",
                   help="pin each rank to its own slice of this machine's CPU cores (CPU runs)")
    p.add_argument("--result-json", help=argparse.SUPPRESS)  # rank 0 writes the report here (--processes)


def _number(args: argparse.Namespace, name: str, kind: type, low: float, *, above: bool = False) -> Any:
    """``args.<name>`` as ``kind``, at least ``low`` (above it with ``above``); a RecipeError naming the option."""
    raw = getattr(args, name)
    if raw is None:
        return None
    flag = "--" + name.replace("_", "-")
    try:
        value = kind(raw)
    except ValueError:
        raise RecipeError(f"smolforge burnin: {flag} must be a{'n integer' if kind is int else ' number'}, "
                          f"got {raw!r}") from None
    if value < low or (above and value == low):
        raise RecipeError(f"smolforge burnin: {flag} must be {'above' if above else 'at least'} {low:g}, got {raw}")
    return value


def options_from(args: argparse.Namespace) -> tuple[int, Options]:
    """``(processes, options)`` from the parsed command line, every value checked.

    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> options_from(parser.parse_args(["--processes", "2", "--allreduce-mib", "1,4"]))[1].allreduce_mib
    (1.0, 4.0)
    >>> options_from(parser.parse_args(["--margin", "10"]))
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: smolforge burnin: --margin is a fraction below 1 (0.1 for 10 %), got 10
    """
    processes = _number(args, "processes", int, 1)
    margin = _number(args, "margin", float, 0.0, above=True)
    if margin >= 1:
        raise RecipeError(f"smolforge burnin: --margin is a fraction below 1 (0.1 for 10 %), got {args.margin}")
    sizes = None
    if args.allreduce_mib is not None:
        try:
            sizes = tuple(float(part) for part in str(args.allreduce_mib).split(","))
        except ValueError:
            raise RecipeError(f"smolforge burnin: --allreduce-mib takes sizes in MiB like 1,8,32, "
                              f"got {args.allreduce_mib!r}") from None
        if not sizes or min(sizes) <= 0 or any(size * MIB < 4 for size in sizes):
            raise RecipeError(f"smolforge burnin: --allreduce-mib sizes must be at least 4 bytes, "
                              f"got {args.allreduce_mib!r}")
    options = Options(device=args.device, seconds=_number(args, "seconds", float, 0.0, above=True),
                      matmul_size=_number(args, "matmul_size", int, 1),
                      memory_mib=_number(args, "memory_mib", int, 0), allreduce_mib=sizes,
                      allreduce_iters=_number(args, "allreduce_iters", int, 1), margin=margin,
                      pin_cores=args.pin_cores)
    return processes, options


def command(args: argparse.Namespace, ctx: Any) -> int:
    """The ``smolforge burnin`` handler: start the ranks (``--processes``) or be one; report; the exit code."""
    processes, options = options_from(args)
    if processes > 1:
        if "RANK" in os.environ:
            raise RecipeError(f"smolforge burnin: already one of {os.environ.get('WORLD_SIZE', '?')} ranks "
                              f"(RANK={os.environ['RANK']}): leave out --processes under a launcher")
        report = launch(processes, options)
    else:
        report = run_rank(options)
        if args.result_json:  # started by launch(): rank 0 hands the report over, every rank ends 0
            if report["rank"] == 0:
                from smolforge.runs import write_json_atomic

                write_json_atomic(args.result_json, report)
            return 0
        if report["rank"] != 0:
            return exit_code(report)
    if ctx.json:
        print(json.dumps({key: value for key, value in report.items() if key != "rank"}, indent=2))
    else:
        print_report(report)
    return exit_code(report)


def exit_code(report: dict) -> int:
    return 0 if report["healthy"] else 1


def launch(processes: int, options: Options) -> dict:
    """Run the ranks through torchrun on this machine; rank 0's report (a crash is an unhealthy report)."""
    from smolforge.launchers import LaunchSpec, launch_command, remove_shm_buffers
    from smolforge.processes import free_port

    with tempfile.TemporaryDirectory(prefix="smolforge-burnin-") as folder:
        result = Path(folder) / "report.json"
        port = free_port()
        cmd = launch_command(LaunchSpec(processes=processes, launcher="torchrun"),
                             ["burnin", *options.to_args(), "--result-json", str(result)], port=port)
        # torchrun gives each rank one compute thread; saying so keeps it from warning about it
        env = {"OMP_NUM_THREADS": "1", **os.environ}
        # the ranks' own output goes to stderr, so stdout holds only the report (--json)
        try:
            done = subprocess.run(cmd, env=env, stdout=2, check=False)
        finally:
            remove_shm_buffers(port)
        if result.is_file():
            return json.loads(result.read_text())
    problem = f"the {processes} ranks ended with exit code {done.returncode} before reporting (see the log above)"
    return {"world_size": processes, "ranks": [], "allreduce": [], "healthy": False,
            "problems": [{"rank": None, "host": socket.gethostname(), "check": "launch", "message": problem}]}


# --------------------------------------------------------------------------- the rules


def slow_ranks(values: Sequence[float], margin: float, *, higher_is_better: bool = True) -> list[int]:
    """Indices of the values more than ``margin`` (a fraction) worse than the median of all of them."""
    if len(values) < 2:
        return []
    median = statistics.median(values)
    if higher_is_better:
        return [i for i, value in enumerate(values) if value < median * (1 - margin)]
    return [i for i, value in enumerate(values) if value > median * (1 + margin)]


def bus_bandwidth(nbytes: float, seconds: float, world: int) -> float:
    """All-reduce bus bandwidth in bytes/s, as nccl-tests defines it: ``algbw × 2(n-1)/n``.

    ``algbw`` = bytes ÷ time; a ring all-reduce moves ``2(n-1)/n`` times the buffer through each
    rank's link, so bus bandwidth compares with the link's speed whatever the number of ranks.

    >>> bus_bandwidth(100e6, 0.5, world=2) / 1e9, bus_bandwidth(100e6, 0.5, world=1)
    (0.2, 0.0)
    """
    return nbytes / seconds * 2 * (world - 1) / world


def summarize(ranks: list[dict], options: Options, *, backend: str) -> dict:
    """The report of all ranks' results: % of peak, the all-reduce table, problems, ``healthy``.

    ``ranks`` holds one dict per rank as :func:`run_rank` measures it; ``options`` are resolved.
    """
    world = len(ranks)
    ranks = [dict(r) for r in sorted(ranks, key=lambda r: r["rank"])]
    cpu_peak = max((r["peak_tflops"] or 0 for r in ranks), default=0) if ranks and ranks[0]["kind"] == "cpu" else None
    for r in ranks:
        peak = cpu_peak or r["peak_tflops"]
        r["peak_pct"] = 100 * r["matmul_tflops"] / peak if peak else None
        r["allreduce_ms"] = 1e3 * r["allreduce"][-1]["seconds"] if r["allreduce"] else None
    table = []
    for i, size in enumerate(ranks[0]["allreduce"] if ranks else []):
        seconds = max(r["allreduce"][i]["seconds"] for r in ranks)  # the collective ends with its slowest rank
        table.append({"mib": size["bytes"] / MIB, "bytes": size["bytes"], "ms": 1e3 * seconds,
                      "algbw_gbps": size["bytes"] / seconds / 1e9,
                      "busbw_gbps": bus_bandwidth(size["bytes"], seconds, world) / 1e9})
    problems = _problems(ranks, options.margin)
    nvml = [r["nvml"] for r in ranks if r["nvml"]]
    return {"world_size": world, "backend": backend, "device": ranks[0]["kind"] if ranks else None,
            "dtype": ranks[0]["dtype"] if ranks else None, "seconds": options.seconds,
            "matmul_size": options.matmul_size, "memory_mib": options.memory_mib,
            "allreduce_iters": options.allreduce_iters, "margin": options.margin,
            "peak_tflops": cpu_peak if cpu_peak else (ranks[0]["peak_tflops"] if ranks else None),
            "ranks": ranks, "allreduce": table,
            "nvml": "available" if nvml else "not available" + (f" ({ranks[0]['nvml_note']})" if ranks else ""),
            "problems": problems, "healthy": not problems}


def _problems(ranks: list[dict], margin: float) -> list[dict]:
    """Every flag: slow matmul, slow all-reduce, memory mismatches, a wrong sum, uncorrected ECC errors."""
    out: list[dict] = []

    def flag(r: dict, check: str, message: str) -> None:
        out.append({"rank": r["rank"], "host": r["host"], "check": check,
                    "message": f"rank {r['rank']} ({r['host']}): {message}"})

    tflops = [r["matmul_tflops"] for r in ranks]
    for i in slow_ranks(tflops, margin):
        median = statistics.median(tflops)
        flag(ranks[i], "matmul", f"matmul {tflops[i]:.4g} TFLOP/s is {100 * (1 - tflops[i] / median):.0f} % below "
             f"the median {median:.4g} (margin {100 * margin:g} %)")
    times = [r["allreduce_ms"] for r in ranks if r["allreduce_ms"] is not None]
    if len(times) == len(ranks):
        for i in slow_ranks(times, margin, higher_is_better=False):
            median = statistics.median(times)
            flag(ranks[i], "allreduce", f"all-reduce {times[i]:.4g} ms is {100 * (times[i] / median - 1):.0f} % "
                 f"above the median {median:.4g} (margin {100 * margin:g} %)")
    for r in ranks:
        if r["memory"] and r["memory"]["errors"]:
            flag(r, "memory", f"{r['memory']['errors']} of {r['memory']['words']} words read back wrong "
                 f"(patterns {', '.join(r['memory']['failed'])})")
        if r["allreduce_errors"]:
            flag(r, "allreduce-sum", f"{r['allreduce_errors']} elements of the checked all-reduce hold a wrong sum")
        if r["nvml"] and r["nvml"].get("ecc_uncorrected"):
            flag(r, "ecc", f"{r['nvml']['ecc_uncorrected']} uncorrected ECC errors since the driver loaded")
    return out


# --------------------------------------------------------------------------- one rank


def run_rank(options: Options) -> dict:
    """Measure this rank (RANK / WORLD_SIZE / LOCAL_RANK from a launcher, else one rank alone).

    Returns the report of every rank (:func:`summarize`, each rank gets all of them) plus ``rank``.
    """
    import torch

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = compute_device(options.device, local)
    options = options.resolved(device.type)
    with pinned(options.pin_cores, local, int(os.environ.get("LOCAL_WORLD_SIZE", world))) as cores:
        if cores:
            torch.set_num_threads(len(cores))
        peak = _peak_tflops(device)  # on a CPU a short benchmark of its own, before the ranks line up
        with process_group(device, world) as backend:
            if rank == 0:  # every rank has joined: the measurements start
                print(f"burnin: {world} rank(s) on {device.type}, backend {backend}: matmul for {options.seconds:g} s, "
                      "then memory and all-reduce", file=sys.stderr, flush=True)
            mine = {"rank": rank, "local_rank": local, "host": socket.gethostname(), "kind": device.type,
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "cores": _core_list(cores) if cores else None, "threads": torch.get_num_threads(),
                    "peak_tflops": peak}
            _barrier(device)
            mine["matmul_tflops"], mine["matmul_iters"], mine["dtype"] = matmul_tflops(
                device, options.matmul_size, options.seconds)
            _barrier(device)
            mine["memory"] = memory_test(device, options.memory_mib) if options.memory_mib else None
            sizes = [int(mib * MIB) // 4 * 4 for mib in options.allreduce_mib] if world > 1 else []
            mine["allreduce"], mine["allreduce_errors"] = allreduce_sweep(sizes, options.allreduce_iters)
            mine["nvml"], mine["nvml_note"] = nvml_snapshot(device)
            everyone = _gather(mine, world)
    return {"rank": rank, **summarize(everyone, options, backend=backend)}


def compute_device(choice: str, local_rank: int, device_count: int | None = None) -> torch.device:
    """This rank's GPU (auto with a GPU, or cuda) or the CPU; a RecipeError when the GPU is missing.

    ``device_count``: the CUDA devices this process sees (default: torch's count). Several visible
    devices: ``cuda:LOCAL_RANK``, and a local rank past them is refused (two ranks sharing a card
    would halve both figures). One visible device is a one-GPU-per-task binding (Slurm, containers):
    ``cuda:0`` whatever the local rank (:func:`smolforge.devices.local_device_index`).

    >>> compute_device("cuda", 3, device_count=8), compute_device("cuda", 3, device_count=1)
    (device(type='cuda', index=3), device(type='cuda', index=0))
    """
    import torch

    if device_count is None:
        device_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice == "cpu" or (choice == "auto" and device_count == 0):
        return torch.device("cpu")
    if device_count == 0 or (device_count > 1 and local_rank >= device_count):
        raise RecipeError(f"smolforge burnin: local rank {local_rank} has no GPU ({device_count} visible); "
                          "start at most one rank per GPU, or --device cpu")
    return torch.device("cuda", local_device_index(local_rank, device_count))


@contextlib.contextmanager
def process_group(device: torch.device, world: int) -> Iterator[str]:
    """The ranks' process group (env:// from the launcher) while the checks run; its backend ("none": one rank).

    gloo on CPU; on CUDA the rank's device is made current before NCCL starts, as
    :func:`smolforge.pretrain.distributed.distributed` does, so NCCL binds each rank to its own GPU.
    """
    import torch
    import torch.distributed as dist

    if world == 1:
        yield "none"
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    try:
        yield dist.get_backend()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _barrier(device: torch.device) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    _sync(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _gather(mine: dict, world: int) -> list[dict]:
    """Every rank's results on every rank."""
    if world == 1:
        return [mine]
    import torch.distributed as dist

    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)  # NCCL: through the current CUDA device, set before the group
    return everyone


def pin_cores(local_rank: int, local_world: int) -> list[int]:
    """Pin this process to its own slice of the cores it may use (rank 0 the first slice, …); the slice."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // max(local_world, 1))
    start = (local_rank * per) % len(cores)
    mine = cores[start:start + per]
    os.sched_setaffinity(0, mine)
    return mine


@contextlib.contextmanager
def pinned(pin: bool, local_rank: int, local_world: int) -> Iterator[list[int] | None]:
    """:func:`pin_cores` while the checks run (``pin``), then the cores this process had before."""
    if not pin:
        yield None
        return
    before = os.sched_getaffinity(0)
    try:
        yield pin_cores(local_rank, local_world)
    finally:
        os.sched_setaffinity(0, before)


def _core_list(cores: Sequence[int]) -> str:
    """``0`` / ``0-3`` / ``0,2``.

    >>> _core_list([1]), _core_list([4, 5, 6, 7]), _core_list([0, 2])
    ('1', '4-7', '0,2')
    """
    if len(cores) > 1 and list(cores) == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def _peak_tflops(device: torch.device) -> float | None:
    """The planner's peak for this device in TFLOP/s: a datasheet figure, or measured on a CPU."""
    from smolforge.pretrain.flops import peak_flops

    peak = peak_flops(str(device) if device.type == "cpu" else _cuda_name(device))
    return peak / 1e12 if peak else None


def _cuda_name(device: torch.device) -> str:
    import torch

    return torch.cuda.get_device_name(device)


def matmul_tflops(device: torch.device, n: int, seconds: float) -> tuple[float, int, str]:
    """``(TFLOP/s, matmuls done, dtype)`` of back-to-back ``n × n`` matmuls for ``seconds``.

    fp32 on CPU, bf16 on CUDA; ``2·n³`` FLOPs each. The mean over the whole time, not the best
    matmul: a rank that loses its core half the time shows half the throughput.

    >>> import torch
    >>> tflops, iters, dtype = matmul_tflops(torch.device("cpu"), 64, 0.01)
    >>> tflops > 0, iters >= 1, dtype
    (True, True, 'float32')
    """
    import torch

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty_like(a)
    chunk = 10 if device.type == "cuda" else 1  # matmuls queued between synchronisations
    for _ in range(chunk):  # warm-up: kernels chosen, clocks up, thread pool started
        torch.matmul(a, b, out=out)
    _sync(device)
    iters, start = 0, time.perf_counter()
    while True:
        for _ in range(chunk):
            torch.matmul(a, b, out=out)
        _sync(device)
        iters += chunk
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * n**3 * iters / elapsed / 1e12, iters, str(dtype).removeprefix("torch.")


def memory_test(device: torch.device, mib: int, chunk_mib: int = 64) -> dict:
    """Write each pattern over a ``mib`` MiB buffer, then read it all back; mismatched words counted.

    The whole buffer is written before any of it is read, so the words come back from memory,
    not from a cache. Returns ``{mib, words, errors, failed (patterns), gbps (written + read)}``.

    >>> import torch
    >>> memory_test(torch.device("cpu"), 1)["errors"]
    0
    """
    import torch

    words = mib * MIB // 4
    chunk = max(1, chunk_mib * MIB // 4)
    buffer = torch.empty(words, dtype=torch.int32, device=device)
    errors, failed = 0, []
    start = time.perf_counter()
    for pattern in PATTERNS:
        for lo in range(0, words, chunk):
            buffer[lo:lo + chunk].copy_(_expected(pattern, lo, min(lo + chunk, words), device))
        wrong = 0
        for lo in range(0, words, chunk):
            wrong += int((buffer[lo:lo + chunk] != _expected(pattern, lo, min(lo + chunk, words), device))
                         .count_nonzero())
        if wrong:
            errors += wrong
            failed.append(pattern if isinstance(pattern, str) else f"0x{pattern:08X}")
    _sync(device)
    elapsed = time.perf_counter() - start
    del buffer
    return {"mib": mib, "words": words, "errors": errors, "failed": failed,
            "gbps": 2 * len(PATTERNS) * words * 4 / elapsed / 1e9}


def _expected(pattern: int | str, lo: int, hi: int, device: torch.device) -> torch.Tensor:
    """The words ``lo:hi`` of a pattern as int32: a constant (broadcast) or each word's own index."""
    import torch

    if pattern == "address":  # int32 wraps past 2**31 words (8 GiB): still the same words written and read
        if hi <= 2**31:
            return torch.arange(lo, hi, dtype=torch.int32, device=device)
        return torch.arange(lo, hi, dtype=torch.int64, device=device).to(torch.int32)
    signed = pattern - 2**32 if pattern >= 2**31 else pattern
    return torch.tensor(signed, dtype=torch.int32, device=device)


def allreduce_sweep(sizes: Sequence[int], iters: int) -> tuple[list[dict], int]:
    """``([{bytes, seconds}, …], wrong elements)``: the median time of ``iters`` fp32 all-reduces per size.

    Each call is timed alone, right after a one-element all-reduce that lines the ranks up, so a
    rank's time is the collective's, not how long it waited for the others to arrive. Then one
    all-reduce of ``rank + 1`` everywhere at the largest size must sum to ``n(n+1)/2`` in every
    element. Tensors go where the backend needs them (:func:`smolforge.pretrain.distributed.comm_device`).
    No sizes (one rank): nothing to measure.
    """
    if not sizes:
        return [], 0
    import torch
    import torch.distributed as dist

    from smolforge.pretrain.distributed import comm_device

    device = comm_device()
    line_up = torch.zeros(1, device=device)
    out = []
    for nbytes in sizes:
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
        dist.all_reduce(tensor)  # warm-up: connections, buffers
        times = []
        for _ in range(iters):
            dist.all_reduce(line_up)
            _sync(device)
            start = time.perf_counter()
            dist.all_reduce(tensor)
            _sync(device)
            times.append(time.perf_counter() - start)
        out.append({"bytes": nbytes, "seconds": statistics.median(times)})
    world, rank = dist.get_world_size(), dist.get_rank()
    tensor.fill_(rank + 1)
    dist.all_reduce(tensor)
    wrong = int((tensor != world * (world + 1) / 2).count_nonzero())
    return out, wrong


def nvml_snapshot(device: torch.device) -> tuple[dict | None, str]:
    """``(readings, note)``: temperature, SM clock (now and max) and ECC counts of this rank's GPU via NVML.

    None with the reason when there is no GPU, no ``pynvml`` or no NVML driver.

    >>> import torch
    >>> nvml_snapshot(torch.device("cpu"))
    (None, 'no GPU')
    """
    if device.type != "cuda":
        return None, "no GPU"
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML did not start: {exc}"
    try:
        handle = _nvml_handle(pynvml, device)

        def read(call, *args):
            try:
                return call(handle, *args)
            except pynvml.NVMLError:  # not supported on this GPU (ECC off, …)
                return None

        return {"temperature_c": read(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
                "sm_clock_mhz": read(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
                "sm_clock_max_mhz": read(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
                "ecc_corrected": read(pynvml.nvmlDeviceGetTotalEccErrors, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                      pynvml.NVML_VOLATILE_ECC),
                "ecc_uncorrected": read(pynvml.nvmlDeviceGetTotalEccErrors,
                                        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)}, ""
    except pynvml.NVMLError as exc:
        return None, f"NVML: {exc}"
    finally:
        pynvml.nvmlShutdown()


def _nvml_handle(pynvml: Any, device: torch.device) -> Any:
    """NVML's handle of the GPU torch calls ``device``: by PCI bus id (CUDA_VISIBLE_DEVICES renumbers), else index."""
    import torch

    props = torch.cuda.get_device_properties(device)
    if hasattr(props, "pci_bus_id"):
        bus_id = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)


# --------------------------------------------------------------------------- the report


def print_report(report: dict) -> None:
    """The per-rank table, the all-reduce table, the NVML line and the verdict."""
    from smolforge.table import print_table

    ranks = report["ranks"]
    if ranks:
        sizes = ",".join(f"{row['mib']:g}" for row in report["allreduce"]) or "-"
        print(f"burnin: {report['world_size']} rank(s), backend {report['backend']}, matmul "
              f"{report['matmul_size']}×{report['matmul_size']} {report['dtype']} for {report['seconds']:g} s, "
              f"memory {report['memory_mib']} MiB, all-reduce {sizes} MiB × {report['allreduce_iters']}")
        nvml = any(r["nvml"] for r in ranks)
        headers = ["rank", "host", "device", "cores", "TFLOP/s", "% peak", "mem GB/s", "mem errors", "all-reduce ms"]
        if nvml:
            headers += ["temp °C", "SM MHz", "SM max MHz", "ECC corr", "ECC uncorr"]
        rows = []
        for r in ranks:
            row = [r["rank"], r["host"], r["device"], r["cores"] or "-", r["matmul_tflops"], r["peak_pct"],
                   r["memory"]["gbps"] if r["memory"] else None, r["memory"]["errors"] if r["memory"] else None,
                   r["allreduce_ms"]]
            if nvml:
                reading = r["nvml"] or {}
                row += [reading.get(key) for key in ("temperature_c", "sm_clock_mhz", "sm_clock_max_mhz",
                                                     "ecc_corrected", "ecc_uncorrected")]
            rows.append(row)
        peak = report["peak_tflops"]
        print_table(headers, rows, title=f"per rank (peak {peak:.4g} TFLOP/s)" if peak else "per rank")
        if report["allreduce"]:
            print()
            print_table(["size MiB", "time ms", "algbw GB/s", "busbw GB/s"],
                        [[row["mib"], row["ms"], row["algbw_gbps"], row["busbw_gbps"]] for row in report["allreduce"]],
                        title="all-reduce (time: the slowest rank's median; busbw = algbw × 2(n-1)/n)")
        if not nvml:
            print(f"NVML: {report['nvml']}")
    if report["healthy"]:
        print(f"verdict: healthy ({report['world_size']} rank(s) within {100 * report['margin']:g} % of the median, "
              "no memory errors)")
    else:
        print(f"verdict: FLAGGED ({len(report['problems'])} problem(s))")
        for problem in report["problems"]:
            print(f"  {problem['message']}")
