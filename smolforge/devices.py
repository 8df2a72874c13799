"""Which accelerator this process drives: one answer for every stage that binds a device.

Launchers export ``LOCAL_RANK`` (torchrun, accelerate, srun via ``$SLURM_LOCALID``). Where
the site hands each task a whole node's GPUs, ``cuda:LOCAL_RANK`` is this process's card; where
it binds one GPU per task (``CUDA_VISIBLE_DEVICES`` narrowed per task, so ``device_count()`` is
1) ``LOCAL_RANK`` 3 is not a valid ordinal: the card is ``cuda:0``. The rule lives in
:func:`local_device_index`, a pure function, so it is checked without a GPU.

The spine imports no ML library at module level: torch is imported inside :func:`local_device`.

    >>> local_device_index(3, 8), local_device_index(3, 1)
    (3, 0)
"""
from __future__ import annotations

import os
from typing import Any

__all__ = ["local_device_index", "local_device"]


def local_device_index(local_rank: int, device_count: int) -> int:
    """The CUDA ordinal a process with ``local_rank`` uses when it sees ``device_count`` devices.

    ``local_rank`` itself when it names a visible device, else ``local_rank % device_count``
    (several tasks sharing fewer cards; 0 for a one-device binding).

    >>> local_device_index(3, 8)
    3
    >>> local_device_index(3, 1)
    0
    >>> local_device_index(5, 4)
    1
    >>> local_device_index(2, 0)
    Traceback (most recent call last):
    ...
    ValueError: no device to bind local rank 2 to (device_count=0)
    """
    if device_count < 1:
        raise ValueError(f"no device to bind local rank {local_rank} to (device_count={device_count})")
    if local_rank < 0:
        raise ValueError(f"local rank must be >= 0, got {local_rank}")
    return local_rank if local_rank < device_count else local_rank % device_count


def local_device() -> Any:
    """This process's ``torch.device``: its CUDA card per :func:`local_device_index`, else the CPU.

    >>> import torch
    >>> local_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    True
    """
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return torch.device("cuda", local_device_index(local_rank, torch.cuda.device_count()))
