"""Every collective gets its tensors on the device the process group's backend needs.

NCCL (every multi-GPU run) refuses CPU tensors; gloo takes CPU tensors. Without a GPU the NCCL
case is checked by recording the device each collective call is given; the gloo case runs the
collectives for real in a one-rank group that reports two ranks (so no call short-circuits).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from smolforge.pretrain import distributed as ranks


def _record_collectives(monkeypatch, backend: str, world: int = 2) -> list:
    calls: list = []
    real_all_reduce, real_broadcast = dist.all_reduce, dist.broadcast_object_list
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world)
    monkeypatch.setattr(dist, "get_backend", lambda *a, **k: backend)

    def all_reduce(tensor, *args, **kwargs):
        calls.append(("all_reduce", tensor.device))
        if backend == "gloo":
            return real_all_reduce(tensor, *args, **kwargs)
        tensor.mul_(world)  # what a sum over identical ranks gives

    def broadcast_object_list(objects, src=0, group=None, device=None):
        calls.append(("broadcast_object_list", device))
        if backend == "gloo":
            return real_broadcast(objects, src=src, group=group, device=device)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "broadcast_object_list", broadcast_object_list)
    return calls


def test_collectives_run_on_cpu_under_gloo(tmp_path, monkeypatch):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        calls = _record_collectives(monkeypatch, "gloo")
        assert ranks.mean_across_ranks(3.0) == 1.5  # one real rank summed, divided by the two reported
        assert ranks.broadcast({"step": 7}) == {"step": 7}
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()
    assert calls == [("all_reduce", torch.device("cpu")), ("broadcast_object_list", torch.device("cpu"))]


def test_collectives_use_the_local_cuda_device_under_nccl(monkeypatch):
    """The NCCL case: each tensor (and broadcast's staging device) is this rank's CUDA device."""
    requested = []
    real_tensor = torch.tensor

    def tensor_on_cpu(data, *args, device=None, **kwargs):  # no GPU here: note the device, build on CPU
        requested.append(device)
        return real_tensor(data, *args, **kwargs)

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch, "tensor", tensor_on_cpu)
    calls = _record_collectives(monkeypatch, "nccl")
    assert ranks.mean_across_ranks(2.5) == 2.5
    assert ranks.broadcast("x") == "x"
    assert requested == [torch.device("cuda", 1)]
    assert calls[1] == ("broadcast_object_list", torch.device("cuda", 1))


@pytest.mark.parametrize("local_rank, visible, bound", [(1, 2, 1),   # every GPU of the node visible: cuda:LOCAL_RANK
                                                        (3, 1, 0)])  # one GPU per task (srun): cuda:0
def test_the_cuda_device_is_set_from_local_rank_before_the_group_starts(monkeypatch, local_rank, visible, bound):
    import deepspeed

    order = []
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: order.append(("set_device", index)))
    monkeypatch.setattr(deepspeed, "init_distributed",
                        lambda dist_backend: order.append(("init_distributed", dist_backend)))
    with ranks.distributed() as (_, rank, world):
        assert (rank, world) == (3, 4)
    assert order == [("set_device", torch.device("cuda", bound)), ("init_distributed", "nccl")]
