"""DeepSpeed process groups and engine configs for the pretraining loop.

One process by default (a private env:// rendezvous on 127.0.0.1); under ``torchrun`` or the
``deepspeed`` launcher the launcher's variables are used. gloo on CPU, NCCL on GPU.

    >>> cfg = ds_config(micro_batch_size=4, grad_accum=2, world_size=2, grad_clip=1.0, zero_stage=3,
    ...                 bf16=False, offload_optimizer=True)
    >>> cfg["train_batch_size"], cfg["zero_optimization"]["offload_optimizer"]
    (16, {'device': 'cpu'})
"""
from __future__ import annotations

import contextlib
import os
import sys

from smolforge.devices import local_device


@contextlib.contextmanager
def distributed():
    """DeepSpeed's process group for this stage; single-process defaults when no launcher set them.

    The env:// variables it sets are restored afterwards, so later in-process stages (TRL
    trainers) do not mistake this process for a rank of a finished job.
    """
    import socket

    import torch

    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    if torch.cuda.is_available():
        # Before the group starts: NCCL binds each rank to the current device, which must be its own
        # (cuda:0 where the site binds one GPU per task, smolforge.devices).
        torch.cuda.set_device(local_device())
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if int(os.environ["WORLD_SIZE"]) == 1:
        # The shared-memory comm op only speeds up multi-process CPU runs; skip its JIT build.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield deepspeed, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        _forget_deepspeed_groups()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _forget_deepspeed_groups() -> None:
    """DeepSpeed caches process groups in module globals; after the group is destroyed they would
    break the next engine built in this process (tests, notebooks), so drop them."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    for attr, value in vars(groups).items():
        if isinstance(value, dist.ProcessGroup):
            setattr(groups, attr, None)
        elif attr.endswith("_GROUP") and isinstance(value, dict):
            value.clear()


def ds_config(micro_batch_size: int, grad_accum: int, world_size: int, grad_clip: float, zero_stage: int,
              bf16: bool, offload_optimizer: bool = False) -> dict:
    """The DeepSpeed config for a client (torch) AdamW optimizer and our own LR schedule."""
    zero: dict = {"stage": zero_stage}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": grad_accum,
            "train_batch_size": micro_batch_size * grad_accum * world_size,
            "gradient_clipping": grad_clip,
            "zero_optimization": zero,
            # offload with torch's AdamW instead of DeepSpeedCPUAdam (whose JIT build takes ~70 s)
            "zero_force_ds_cpu_optimizer": False,
            "bf16": {"enabled": bf16},
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def comm_device():
    """Where a collective's tensors must live: this rank's CUDA device under NCCL, else the CPU.

    NCCL refuses CPU tensors; gloo takes CPU tensors (and copies CUDA ones through the host).

    >>> comm_device()
    device(type='cpu')
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def process_rank() -> int:
    """This process's rank in the default process group (0 when there is none).

    >>> process_rank()
    0
    """
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def broadcast(value):
    """Rank 0's ``value`` on every rank (any picklable object)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, device=comm_device())
    return box[0]


def mean_across_ranks(value: float) -> float:
    """The mean of ``value`` over the ranks (a float64 all-reduce on :func:`comm_device`)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=comm_device())
    dist.all_reduce(tensor)
    return float(tensor.item()) / dist.get_world_size()
