"""``smolforge burnin``: the slow-rank rule and bus bandwidth by hand, then two real CPU ranks over gloo,
healthy, and with rank 1's core shared with busy loops (flagged, by rank and host).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from smolforge.cli import main
from smolforge.errors import RecipeError
from smolforge.ops import burnin
from smolforge.ops.burnin import Options, bus_bandwidth, slow_ranks, summarize

REPO = Path(__file__).resolve().parents[1]
GB = 1e9


def test_slow_rank_rule_with_hand_worked_numbers():
    # four ranks: median (0.95 + 1.00) / 2 = 0.975, so below 0.975 × 0.9 = 0.8775 is slow
    assert slow_ranks([1.00, 0.95, 0.50, 1.02], margin=0.10) == [2]
    # the threshold itself is not slow: median 1.0, 0.9 = 1.0 × 0.9 exactly; 0.89 is below it
    assert slow_ranks([1.0, 1.0, 0.90], margin=0.10) == []
    assert slow_ranks([1.0, 1.0, 0.89], margin=0.10) == [2]
    # two ranks: the median is their mean. 0.10 and 0.05: median 0.075, 0.05 < 0.0675 → rank 1
    assert slow_ranks([0.10, 0.05], margin=0.10) == [1]
    # 0.10 and 0.085: median 0.0925, 0.085 ≥ 0.08325 → nobody
    assert slow_ranks([0.10, 0.085], margin=0.10) == []
    # times: higher is worse. median 10 ms → above 11 ms is slow
    assert slow_ranks([10.0, 10.0, 11.5], margin=0.10, higher_is_better=False) == [2]
    assert slow_ranks([10.0, 10.0, 11.0], margin=0.10, higher_is_better=False) == []
    assert slow_ranks([5.0], margin=0.10) == []  # one rank has nobody to be slower than


def test_bus_bandwidth_is_algbw_times_two_n_minus_one_over_n():
    # 1 GiB in 0.1 s: algbw = 1073741824 / 0.1 = 10.737 GB/s; 8 ranks: × 2·7/8 = 1.75 → 18.79 GB/s
    assert bus_bandwidth(2**30, 0.1, world=8) / GB == pytest.approx(18.79048192)
    # 2 ranks: 2·1/2 = 1, bus bandwidth equals algbw; 100 MB in 0.5 s = 0.2 GB/s
    assert bus_bandwidth(100e6, 0.5, world=2) / GB == pytest.approx(0.2)
    # 4 ranks: × 1.5
    assert bus_bandwidth(100e6, 0.5, world=4) / GB == pytest.approx(0.3)
    assert bus_bandwidth(100e6, 0.5, world=1) == 0.0


def _rank(rank: int, tflops: float, ms: float = 10.0, **changes) -> dict:
    """One rank's measurements as run_rank gathers them (a CPU rank, 4 MiB all-reduced)."""
    result = {"rank": rank, "local_rank": rank, "host": f"node{rank // 2}", "kind": "cpu", "device": "cpu",
              "cores": None, "threads": 1, "peak_tflops": 0.05, "matmul_tflops": tflops, "matmul_iters": 10,
              "dtype": "float32", "memory": {"mib": 16, "words": 4 * 2**20, "errors": 0, "failed": [], "gbps": 5.0},
              "allreduce": [{"bytes": 4 * 2**20, "seconds": ms / 1e3}], "allreduce_errors": 0,
              "nvml": None, "nvml_note": "no GPU"}
    return {**result, **changes}


OPTIONS = Options(device="cpu").resolved("cpu")


def test_report_flags_the_slow_rank_by_rank_and_host():
    ranks = [_rank(0, 0.050), _rank(1, 0.051), _rank(2, 0.030, peak_tflops=0.06), _rank(3, 0.049)]
    report = summarize(ranks, OPTIONS, backend="gloo")
    assert not report["healthy"]
    [problem] = report["problems"]
    # median (0.049 + 0.050) / 2 = 0.0495; 0.030 is 39 % below it
    assert (problem["rank"], problem["host"], problem["check"]) == (2, "node1", "matmul")
    assert problem["message"].startswith("rank 2 (node1): matmul 0.03 TFLOP/s is 39 % below the median 0.0495")
    # on a CPU the peak is the best rank's own measurement (0.06): 0.030 is 50 % of it
    assert report["peak_tflops"] == 0.06
    assert [round(r["peak_pct"]) for r in report["ranks"]] == [83, 85, 50, 82]
    # the all-reduce row: 4 MiB in 10 ms on 4 ranks: algbw 0.4194 GB/s, busbw × 1.5
    [row] = report["allreduce"]
    assert row["algbw_gbps"] == pytest.approx(0.4194304) and row["busbw_gbps"] == pytest.approx(0.6291456)
    assert report["nvml"] == "not available (no GPU)"


def test_report_flags_slow_allreduce_memory_errors_wrong_sums_and_ecc():
    ranks = [_rank(0, 0.05, ms=10.0), _rank(1, 0.05, ms=12.0), _rank(2, 0.05, ms=10.0),
             _rank(3, 0.05, memory={"mib": 16, "words": 4 * 2**20, "errors": 3, "failed": ["0x55555555"],
                                    "gbps": 5.0}, allreduce_errors=2,
                   kind="cuda", nvml={"ecc_corrected": 7, "ecc_uncorrected": 1})]
    report = summarize(ranks, OPTIONS, backend="gloo")
    assert [(p["rank"], p["check"]) for p in report["problems"]] == [
        (1, "allreduce"), (3, "memory"), (3, "allreduce-sum"), (3, "ecc")]
    # median 10 ms; 12 ms is 20 % above it
    assert "all-reduce 12 ms is 20 % above the median 10" in report["problems"][0]["message"]
    assert "3 of 4194304 words read back wrong (patterns 0x55555555)" in report["problems"][1]["message"]
    healthy = summarize([_rank(0, 0.05), _rank(1, 0.05)], OPTIONS, backend="gloo")
    assert healthy["healthy"] and healthy["problems"] == []


def test_memory_test_counts_the_words_that_read_back_wrong(monkeypatch):
    real = burnin._expected
    seen: set = set()

    def expected(pattern, lo, hi, device):
        value = real(pattern, lo, hi, device)
        if (pattern, lo) in seen and pattern == 0x55555555:   # the read-back of one pattern: 3 words differ
            value = value.expand(hi - lo).clone()
            value[[5, 70_000, hi - lo - 1]] = 0
        seen.add((pattern, lo))
        return value

    monkeypatch.setattr(burnin, "_expected", expected)
    result = burnin.memory_test(torch.device("cpu"), mib=2, chunk_mib=1)   # 2 chunks: 3 + 3 wrong words
    assert (result["errors"], result["failed"], result["words"]) == (6, ["0x55555555"], 2 * 2**20 // 4)
    monkeypatch.undo()
    assert burnin.memory_test(torch.device("cpu"), mib=2, chunk_mib=1)["errors"] == 0


@pytest.mark.parametrize("args, message", [
    (["--margin", "1.5"], "--margin is a fraction below 1"),
    (["--margin", "0"], "--margin must be above 0"),
    (["--processes", "0"], "--processes must be at least 1"),
    (["--seconds", "x"], "--seconds must be a number"),
    (["--allreduce-mib", "1,x"], "--allreduce-mib takes sizes in MiB"),
    (["--memory-mib", "1.5"], "--memory-mib must be an integer"),
])
def test_bad_arguments_exit_2_and_name_the_option(capsys, args, message):
    assert main(["burnin", *args]) == 2
    assert message in capsys.readouterr().err


def test_processes_under_a_launcher_is_an_error(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert main(["burnin", "--processes", "2"]) == 2
    assert "already one of 4 ranks (RANK=0): leave out --processes" in capsys.readouterr().err


def test_one_rank_alone_prints_the_table_and_a_healthy_verdict(capsys):
    assert main(["burnin", "--device", "cpu", "--seconds", "0.2", "--matmul-size", "256", "--memory-mib", "4"]) == 0
    out = capsys.readouterr().out
    assert "burnin: 1 rank(s), backend none, matmul 256×256 float32 for 0.2 s" in out
    assert "NVML: not available (no GPU)" in out and "verdict: healthy" in out
    row = next(parts for parts in map(str.split, out.splitlines()) if parts[:1] == ["0"])
    assert row[1] == socket.gethostname() and float(row[4]) > 0   # rank, host, device, cores, TFLOP/s


def test_nccl_ranks_set_their_gpu_before_the_group_starts(monkeypatch):
    """No GPU here: the calls are recorded. Each rank's device is cuda:LOCAL_RANK, made current before NCCL."""
    order = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: order.append(("set_device", device)))
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: order.append(("init_process_group", backend, kw.get("device_id"))))
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    device = burnin.compute_device("auto", local_rank=1)
    assert device == torch.device("cuda", 1)
    with burnin.process_group(device, world=2) as backend:
        assert backend == "nccl"
    assert order == [("set_device", device), ("init_process_group", "nccl", device)]
    with pytest.raises(RecipeError, match="local rank 2 has no GPU \\(2 visible\\)"):
        burnin.compute_device("cuda", local_rank=2)
    assert burnin.compute_device("cpu", local_rank=1) == torch.device("cpu")


def test_nvml_readings_and_an_uncorrected_ecc_error_flag_the_rank(monkeypatch):
    """A stand-in pynvml (no GPU here): what NVML answers reaches the report; NotSupported reads as None."""
    class NVMLError(Exception):
        pass

    def ecc(handle, kind, counter):
        if kind == "corrected":
            raise NVMLError("Not Supported")
        return 2

    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}", NVML_TEMPERATURE_GPU="gpu", NVML_CLOCK_SM="sm",
        NVML_MEMORY_ERROR_TYPE_CORRECTED="corrected", NVML_MEMORY_ERROR_TYPE_UNCORRECTED="uncorrected",
        NVML_VOLATILE_ECC="volatile", nvmlDeviceGetTemperature=lambda h, s: 71,
        nvmlDeviceGetClockInfo=lambda h, c: 1755, nvmlDeviceGetMaxClockInfo=lambda h, c: 1980,
        nvmlDeviceGetTotalEccErrors=ecc)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace())  # no PCI id
    readings, note = burnin.nvml_snapshot(torch.device("cuda", 1))
    assert readings == {"temperature_c": 71, "sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980,
                        "ecc_corrected": None, "ecc_uncorrected": 2} and note == ""
    report = summarize([_rank(0, 0.05), _rank(1, 0.05, nvml=readings)], OPTIONS, backend="nccl")
    assert report["nvml"] == "available"
    assert [p["message"] for p in report["problems"]] == [
        "rank 1 (node0): 2 uncorrected ECC errors since the driver loaded"]
    monkeypatch.setitem(sys.modules, "pynvml", None)   # not installed
    assert burnin.nvml_snapshot(torch.device("cuda", 0))[0] is None


# --------------------------------------------------------------------------- two real ranks

SMALL = ["--device", "cpu", "--seconds", "1", "--memory-mib", "8", "--allreduce-mib", "1,4", "--allreduce-iters", "3"]


def _burnin(*args: str, cores: list[int], measuring=lambda: None) -> tuple[subprocess.CompletedProcess, float]:
    """``smolforge burnin --processes 2 --json …`` on ``cores`` only (torchrun and its ranks inherit them);
    ``measuring()`` is called when rank 0 says every rank has joined and the measurements start."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "smolforge", "burnin", "--processes", "2", "--json", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                          preexec_fn=lambda: os.sched_setaffinity(0, cores)) as child:
        deadline = threading.Timer(120, child.kill)
        deadline.start()
        err = []
        for line in child.stderr:
            err.append(line)
            if line.startswith("burnin: "):
                measuring()
        out = child.stdout.read()
        child.wait()
        deadline.cancel()
    done = subprocess.CompletedProcess(command, child.returncode, out, "".join(err))
    return done, time.perf_counter() - start


def _two_cores() -> list[int]:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two CPU cores (one per rank)")
    return cores[:2]


@pytest.mark.slow
def test_a_rank_whose_core_is_busy_is_flagged():
    """Each rank pinned to its own core; twenty-four busy loops share rank 1's core while the ranks measure.

    Each loop is its own session, so the kernel's autogroup scheduling gives it a session's share of
    the core, as much as rank 1's whole session gets: rank 1 is left at most a twenty-fifth of its core.
    The kernel moves what else runs here (the other test worker, a busy machine) to rank 0's core,
    so rank 0 keeps more than that unless two dozen other sessions compete for the machine (with twelve
    loops, the other worker's servers, each started in a session of its own, once left rank 0 the
    slower). The loops start when the ranks have joined, so the ranks' start-up is not slowed, and are
    killed 3 s later (rank 1's 1 s of matmuls falls inside that), so the memory and all-reduce checks
    and the other test worker are not slowed either.
    """
    cores = _two_cores()
    loops = [subprocess.Popen(["sh", "-c", "read -r go; while :; do :; done"], stdin=subprocess.PIPE,
                              start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, {cores[1]}))
             for _ in range(24)]

    def stop() -> None:
        for loop in loops:
            loop.kill()
            loop.wait()

    stopping = threading.Timer(3.0, stop)

    def spin() -> None:   # the loops wait on stdin: closing it sets them spinning at once
        for loop in loops:
            loop.stdin.close()
        stopping.start()

    try:
        done, seconds = _burnin(*SMALL, "--pin-cores", cores=cores, measuring=spin)
    finally:
        stopping.cancel()
        if stopping.is_alive():   # already stopping the loops: let it finish
            stopping.join()
        stop()
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert [r["cores"] for r in report["ranks"]] == [str(cores[0]), str(cores[1])]
    assert not report["healthy"]
    slow = [p for p in report["problems"] if p["check"] == "matmul"]
    assert [(p["rank"], p["host"]) for p in slow] == [(1, socket.gethostname())]
    assert slow[0]["message"].startswith(f"rank 1 ({socket.gethostname()}): matmul ")
    fast, busy = (r["matmul_tflops"] for r in report["ranks"])
    assert busy < 0.8 * fast
    print(f"slow-rank burnin: {seconds:.1f} s; {slow[0]['message']}")
