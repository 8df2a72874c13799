"""Profiling: a ``profile:`` step range becomes a Chrome trace per rank, a summary and a printed split."""
from __future__ import annotations

import json

import pytest

from conftest import QUIET, run_stage, tiny_recipe
from smolforge.errors import RecipeError
from smolforge.profiling import (ProfileSpec, StepProfiler, check_profile, is_communication, profile_window,
                                 summarize, time_split, union_length)
from smolforge.registry import load_stage


def read_profile(run_dir, rank: int = 0) -> tuple[dict, dict]:
    folder = run_dir / "profile"
    trace = json.loads((folder / f"trace-rank{rank}.json").read_text())
    summary = json.loads((folder / f"summary-rank{rank}.json").read_text())
    return trace, summary


def shares(split: dict, idle: str = "other") -> float:
    return split["compute_share"] + split["communication_share"] + split[f"{idle}_share"]


def test_collectives_are_told_apart_from_compute_by_name():
    collectives = ["c10d::allreduce_", "c10d::_reduce_scatter_base_", "gloo:all_reduce", "nccl:all_gather",
                   "record_param_comms", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "c10d::barrier"]
    compute = ["aten::mm", "aten::broadcast_tensors", "aten::all", "ProfilerStep#4", "Optimizer.step#AdamW.step",
               "autograd::engine::evaluate_function: MmBackward0", "void at::native::vectorized_elementwise_kernel"]
    assert [name for name in collectives if not is_communication(name)] == []
    assert [name for name in compute if is_communication(name)] == []


def test_the_split_of_hand_worked_intervals():
    # Two 1 ms steps. Ops (µs): 100-700 and 500-900 overlap (800 busy), 1200-1300; a collective at
    # 850-1000 overlaps the end of an op (counts as communication: 150) and one at 2500-2600 is
    # outside the steps (left out). compute = busy 1000 - communication 150 = 850; other = 2000 - 1000.
    split = time_split(steps=[(0, 1000), (1000, 2000)], ops=[(100, 700), (500, 900), (1200, 1300)],
                       comm=[(850, 1000), (2500, 2600)])
    assert split == {"total_s": 0.002, "compute_s": 0.00085, "communication_s": 0.00015, "other_s": 0.001,
                     "compute_share": 0.425, "communication_share": 0.075, "other_share": 0.5}
    assert union_length([(0, 5), (1, 2), (5, 7), (10, 11)]) == 8
    assert time_split(steps=[], ops=[(1, 2)], comm=[])["compute_share"] == 0.0


def test_device_kernels_get_their_own_split_and_table():
    """What torch.profiler hands over on a GPU (kernels as device events), without needing one."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name, start, end, device=DeviceType.CPU, annotation=False):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device,
                               is_user_annotation=annotation)

    def average(name, calls, cpu, device):
        return SimpleNamespace(key=name, count=calls, self_cpu_time_total=cpu, self_device_time_total=device)

    cuda = DeviceType.CUDA
    events = [event("ProfilerStep#2", 0, 1000), event("aten::mm", 100, 600), event("nccl:all_reduce", 600, 650),
              event("gpu_user_annotation", 0, 1000, cuda, annotation=True), event("sm90_gemm", 200, 700, cuda),
              event("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 650, 900, cuda)]
    averages = [average("aten::mm", 1, 450, 0), average("nccl:all_reduce", 1, 50, 0), average("sm90_gemm", 1, 0, 500),
                average("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1, 0, 250)]
    summary = summarize(events, averages, top=5)
    # host: mm 500 µs, the collective 50 µs, the rest (450) no op; device: gemm 200-650 outside the
    # collective kernel (450), the collective 650-900 (250), idle 300; the annotation is not compute.
    assert summary["steps"] == 1
    assert summary["host"] == {"total_s": 0.001, "compute_s": 0.0005, "communication_s": 5e-05, "other_s": 0.00045,
                               "compute_share": 0.5, "communication_share": 0.05, "other_share": 0.45}
    assert summary["device"] == {"total_s": 0.001, "compute_s": 0.00045, "communication_s": 0.00025,
                                 "idle_s": 0.0003, "compute_share": 0.45, "communication_share": 0.25,
                                 "idle_share": 0.3}
    assert [op["name"] for op in summary["top_cpu"]] == ["aten::mm", "nccl:all_reduce"]
    assert [(op["name"], op["share"], op["communication"]) for op in summary["top_device"]] == [
        ("sm90_gemm", 0.6667, False), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 0.3333, True)]


def test_a_resumed_run_records_what_is_left_of_its_range():
    assert profile_window(start=5, steps=3, warmup=2, done=0) == (2, 2, 3)   # steps 3-4 warm up, 5-7 recorded
    assert profile_window(start=5, steps=3, warmup=2, done=3) == (0, 1, 3)   # only step 4 is left to warm up
    assert profile_window(start=5, steps=3, warmup=2, done=5) == (0, 0, 2)   # resumed inside: 6-7
    assert profile_window(start=5, steps=3, warmup=2, done=7) is None
    assert profile_window(start=0, steps=3, warmup=2, done=0) is None        # off


@pytest.mark.parametrize("changes,field", [({"steps": 0}, "profile.steps"), ({"start": -1}, "profile.start"),
                                           ({"warmup": -2}, "profile.warmup"), ({"top": 0}, "profile.top"),
                                           ({"start": 11, "steps": 3}, "profile.start")])
def test_a_bad_profile_setting_names_its_field(changes, field):
    with pytest.raises(RecipeError, match=field):
        check_profile(ProfileSpec(**changes), max_steps=12)


def test_stages_refuse_a_bad_profile_before_any_run(runs, pretrain_run):
    for stage, changes in (("pretrain", {"train": {"max_steps": 4}, "profile": {"start": 3, "steps": 5}}),
                           ("sft", {"profile": {"steps": -1}})):
        with pytest.raises(RecipeError, match="profile"):      # -1: refused as the recipe is built
            load_stage(stage).validate(tiny_recipe(stage, name=f"{stage}-bad-profile", **changes), runs)
        assert not (runs.root / f"{stage}-bad-profile").exists()


def test_a_gloo_all_reduce_counts_as_communication(tmp_path):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with StepProfiler(ProfileSpec(start=2, steps=2), tmp_path) as profiler:
            for _ in range(3):
                torch.randn(256, 256) @ torch.randn(256, 256)
                dist.all_reduce(torch.ones(1_000_000))
                profiler.step()
    finally:
        dist.destroy_process_group()
    _, summary = read_profile(tmp_path)
    assert summary["steps"] == 2 and (summary["first_step"], summary["last_step"]) == (2, 3)
    assert summary["host"]["communication_s"] > 0 and summary["host"]["compute_s"] > 0
    assert {op["name"] for op in summary["top_cpu"] if op["communication"]} >= {"c10d::allreduce_"}
    assert profiler.metrics["profile/comm_share"] == summary["host"]["communication_share"] > 0


def test_a_range_cut_short_by_the_end_is_written_and_one_cut_by_an_error_is_not(tmp_path):
    import torch

    with pytest.raises(ValueError):
        with StepProfiler(ProfileSpec(start=1, steps=3, warmup=0), tmp_path / "failed") as profiler:
            profiler.step()
            raise ValueError("the step failed")
    assert not (tmp_path / "failed" / "profile").exists() and profiler.metrics == {}
    with StepProfiler(ProfileSpec(start=2, steps=5), tmp_path / "short") as profiler:   # the profiler was stopped
        for _ in range(3):
            torch.randn(64, 64) @ torch.randn(64, 64)
            profiler.step()
    _, summary = read_profile(tmp_path / "short")
    assert (summary["first_step"], summary["last_step"], summary["steps"]) == (2, 3, 2)


def test_pretraining_writes_a_chrome_trace_a_summary_and_run_metrics(runs, data_run, capsys):
    run = run_stage("pretrain", runs, name="pretrain-profiled", train={"max_steps": 4}, checkpoint={"every_steps": 0},
                    profile={"start": 2, "steps": 2, "top": 5}, **QUIET)
    trace, summary = read_profile(run.path)
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert {"aten::mm", "aten::addmm"} & names and any(n.startswith("ProfilerStep#") for n in names)
    assert (summary["first_step"], summary["last_step"], summary["steps"]) == (2, 3, 2)
    assert len(summary["top_cpu"]) == 5 and all(op["name"] and op["self_cpu_ms"] > 0 for op in summary["top_cpu"])
    assert shares(summary["host"]) == pytest.approx(1, abs=1e-3)
    assert summary["host"]["communication_share"] == 0        # one process: no collective runs
    metrics = run.metrics
    assert metrics["profile/steps"] == 2 and metrics["profile/comm_share"] == 0
    assert metrics["profile/compute_share"] == summary["host"]["compute_share"] > 0
    printed = capsys.readouterr().err
    assert "profile rank 0, steps 2-3: top operators by self CPU time" in printed and "communication" in printed
    assert not list((run.path / "profile").glob(".*"))        # no temp files left behind


def test_a_trl_stage_writes_its_trace_through_a_callback(runs, pretrain_run):
    run = run_stage("sft", runs, name="sft-profiled", trainer={"max_steps": 3}, eval_fraction=0,
                    early_stopping_patience=0, profile={"start": 2, "steps": 2})
    trace, summary = read_profile(run.path)
    assert any(event.get("name", "").startswith("aten::") for event in trace["traceEvents"])
    assert (summary["first_step"], summary["last_step"]) == (2, 3)
    assert shares(summary["host"]) == pytest.approx(1, abs=1e-3)
    assert run.metrics["profile/steps"] == 2 and "profile/comm_share" in run.metrics
