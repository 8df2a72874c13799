"""How a stage is started on N processes: the command line of each common launcher.

A pipeline step (``launch: {processes: 2, launcher: accelerate}``) runs through
:func:`launch_command`; the stage itself learns how it was started from :func:`launch_info`,
which run.json records (``train/processes``, ``train/launcher``).

    >>> spec = LaunchSpec(processes=2, launcher="torchrun")
    >>> launch_command(spec, ["sft", "--config", "sft.yaml"], python="python", port=29500)
    ['python', '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_addr', '127.0.0.1', '--master_port', '29500', '-m', 'smolforge', 'sft', '--config', 'sft.yaml']
    >>> LaunchSpec.parse({"processes": 2, "launcher": "slurmz"}, "pipeline step 3")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: pipeline step 3 launch: launcher 'slurmz' is not one of torchrun, deepspeed, accelerate (did you mean 'slurm'?)
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from smolforge.errors import RecipeError
from smolforge.processes import free_port

__all__ = ["LAUNCHERS", "LaunchSpec", "launch_command", "launch_info"]

LAUNCHERS = ("torchrun", "deepspeed", "accelerate")
LAUNCHER_ENV = "SMOLFORGE_LAUNCHER"
_KEYS = ("processes", "launcher", "config")


@dataclasses.dataclass
class LaunchSpec:
    processes: int = 1                  # processes (ranks) on this machine
    launcher: str = "torchrun"          # torchrun | deepspeed | accelerate
    config: str | None = None           # accelerate: its config file (e.g. DeepSpeed ZeRO-3 settings)

    @classmethod
    def parse(cls, value, where: str, base: Path | None = None) -> LaunchSpec:
        """A ``launch:`` mapping checked: known keys, processes >= 1, a known launcher, a config that exists."""
        if not isinstance(value, dict):
            raise RecipeError(f"{where} launch must be a mapping like {{processes: 2, launcher: torchrun}}, got {value!r}")
        for key in value:
            if key not in _KEYS:
                close = difflib.get_close_matches(str(key), _KEYS, n=1)
                raise RecipeError(f"{where} launch: unknown key '{key}'"
                                  + (f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(_KEYS)})"))
        spec = cls(**value)
        if not isinstance(spec.processes, int) or isinstance(spec.processes, bool) or spec.processes < 1:
            raise RecipeError(f"{where} launch: processes must be an integer >= 1, got {spec.processes!r}")
        if spec.launcher not in LAUNCHERS:
            close = difflib.get_close_matches(str(spec.launcher), LAUNCHERS + ("slurm",), n=1)
            raise RecipeError(f"{where} launch: launcher {spec.launcher!r} is not one of {', '.join(LAUNCHERS)}"
                              + (f" (did you mean '{close[0]}'?)" if close else ""))
        if spec.config is not None:
            if spec.launcher != "accelerate":
                raise RecipeError(f"{where} launch: config is an accelerate config file; launcher is {spec.launcher}")
            path = Path(spec.config) if base is None else base / spec.config
            if not path.is_file():
                raise RecipeError(f"{where} launch: config file {path} not found")
            spec.config = str(path.resolve())
        return spec


def launch_command(spec: LaunchSpec, smolforge_args: Sequence[str], *, python: str | None = None,
                   port: int | None = None) -> list[str]:
    """The command that starts ``smolforge <smolforge_args>`` on ``spec.processes`` ranks of this machine.

    One process needs no launcher. The rendezvous stays on 127.0.0.1.
    """
    python = python or sys.executable
    args = ["-m", "smolforge", *smolforge_args]
    if spec.processes == 1 and spec.config is None:
        return [python, *args]
    port = port or free_port()
    n = str(spec.processes)
    if spec.launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", "--nproc_per_node", n, "--master_addr", "127.0.0.1",
                "--master_port", str(port), *args]
    if spec.launcher == "deepspeed":
        # --module runs `python -m smolforge`; every rank gets --local_rank=N, which the CLI accepts
        return [python, "-m", "deepspeed.launcher.runner", "--num_accelerators", n, "--master_addr", "127.0.0.1",
                "--master_port", str(port), "--module", "smolforge", *smolforge_args]
    config = ["--config_file", spec.config] if spec.config else []
    return [python, "-m", "accelerate.commands.launch", *config, "--num_processes", n,
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *args]


SHM_BUFFER = "deepspeed_allreduce_buffer"   # DeepSpeed's CPU all-reduce: /dev/shm/<this>_<uid>_<addr>_<port>_<rank>


def remove_shm_buffers(port: int, addr: str = "127.0.0.1", shm: Path = Path("/dev/shm")) -> int:
    """Unlink the shared-memory all-reduce buffers DeepSpeed's CPU backend made for the job whose
    rendezvous was ``addr:port`` (69 MB a rank; DeepSpeed never unlinks them, and /dev/shm is RAM).
    Call it once the job's processes have exited. Returns how many it removed.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / f"{SHM_BUFFER}_{os.getuid()}_127.0.0.1_20025_0").write_bytes(b"x")
    >>> remove_shm_buffers(20025, shm=folder), remove_shm_buffers(20025, shm=folder)
    (1, 0)
    """
    removed = 0
    for path in shm.glob(f"{SHM_BUFFER}_{os.getuid()}_{addr}_{port}_*"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def launch_info() -> dict:
    """``{"train/processes": N, "train/launcher": name}`` for a process started by a launcher, else {}.

    The pipeline runner names the launcher in ``$SMOLFORGE_LAUNCHER``; otherwise the launcher's
    own variables tell (accelerate, the deepspeed launcher, torchrun).
    """
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1 and LAUNCHER_ENV not in os.environ:
        return {}
    launcher = os.environ.get(LAUNCHER_ENV)
    if launcher is None:
        if any(key.startswith("ACCELERATE_") for key in os.environ):
            launcher = "accelerate"
        elif "CROSS_RANK" in os.environ:  # set by deepspeed.launcher.launch
            launcher = "deepspeed"
        elif "TORCHELASTIC_RUN_ID" in os.environ:
            launcher = "torchrun"
        else:
            launcher = "unknown"
    return {"train/processes": world, "train/launcher": launcher}
