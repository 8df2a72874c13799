"""TRL stages on N processes: one process writes the run, every rank can fail it, saves are gathered.

Any launcher works the same way (``torchrun``, the ``deepspeed`` launcher, ``accelerate launch``):
accelerate's :class:`~accelerate.PartialState` reads the launcher's variables and starts the
process group (with DeepSpeed's when accelerate was told to use it), then

- :func:`start_run`: the main process creates (or reopens) the run; the others wait for it and
  then open it read-only. An exception on any rank marks the run failed with ``rank N:`` and
  that rank's message (the first failure wins, see :meth:`smolforge.runs.Run.fail`);
- a run that exists unfinished with a complete Trainer checkpoint is resumed from the newest
  one (``--overwrite`` starts over); lines of metrics.jsonl past that step are dropped;
- :func:`save_trained`: under ZeRO-3 the weights are gathered from the partitions (a collective
  every rank joins) and the main process writes ``model/``.

    smolforge sft --config recipes/demo/sft.yaml
    accelerate launch --num_processes 2 -m smolforge sft --config recipes/demo/sft.yaml
    torchrun --nproc_per_node 2 -m smolforge dpo --config recipes/demo/dpo.yaml

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for step, done in ((50, True), (100, True), (150, False)):  # 150: killed while saving
    ...     (folder / f"checkpoint-{step}").mkdir()
    ...     _ = (folder / f"checkpoint-{step}" / "trainer_state.json").write_text("{}" if done else '{"glo')
    >>> newest_checkpoint(folder).name
    'checkpoint-100'
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError, RunError
from smolforge.runs import Run, Runs, unfinished_run

log = logging.getLogger(__name__)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def process_state():
    """accelerate's view of this process (rank, world, main), starting the launcher's process group."""
    from accelerate import PartialState

    return PartialState()


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest complete Trainer checkpoint (``checkpoint-N`` holding a whole ``trainer_state.json``,
    which the Trainer writes last, after the weights, optimizer and RNG states, and not atomically: a
    process killed while writing it leaves it empty or cut short), or None."""
    if not folder.is_dir():
        return None
    complete = [(int(m.group(1)), p) for p in folder.iterdir()
                if (m := _CHECKPOINT.match(p.name)) and _whole_json(p / "trainer_state.json")]
    return max(complete)[1] if complete else None


def _whole_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def resume_point(path: Path, overwrite: bool) -> Path | None:
    """The checkpoint an unfinished run at ``path`` resumes from (None: start fresh).

    A done run, or an unfinished one without a complete checkpoint, is a RunError unless
    ``overwrite``; every rank reaches the same answer from the same files.
    """
    run = unfinished_run(path, overwrite=overwrite)
    if run is None:
        return None
    found = newest_checkpoint(run.checkpoints_dir)
    if found is None:
        raise RunError(f"run '{run.name}' exists unfinished (status {run.status}) without a complete "
                       f"checkpoint under {run.checkpoints_dir}; pass --overwrite to start over")
    return found


@contextlib.contextmanager
def start_run(runs: Runs, stage: str, recipe: Any, parents: list[Run], data_fingerprints: dict, *,
              overwrite: bool = False) -> Iterator[tuple[Run, Path | None]]:
    """``(run, checkpoint to resume from or None)`` on every rank; only the main process writes run.json."""
    from smolforge.recipe import to_dict

    state = process_state()
    path = runs.root / recipe.name
    resume_from = resume_point(path, overwrite)
    state.wait_for_everyone()  # nobody reads the old run after the main process starts replacing it
    if state.is_main_process:
        with runs.start(stage, recipe.name, to_dict(recipe), parents=parents, data_fingerprints=data_fingerprints,
                        overwrite=overwrite, resume=resume_from is not None) as run:
            if resume_from is not None:
                run.truncate_metrics(int(resume_from.name.rsplit("-", 1)[1]))
                log.info("%s: resuming run '%s' from %s", stage, run.name, resume_from.name)
            state.wait_for_everyone()
            yield run, resume_from
        return
    state.wait_for_everyone()
    run = Run(path)
    try:
        yield run, resume_from
    except BaseException as exc:
        fail_from_rank(run, state.process_index, exc)
        raise


def fail_from_rank(run: Run, rank: int, exc: BaseException) -> None:
    """Mark ``run`` failed with ``rank N: <ExcType>: <message>`` (the first failure recorded wins)."""
    message = str(exc)
    run.fail(f"rank {rank}: {type(exc).__name__}" + (f": {message}" if message else ""))


def stop_on_request():
    """A TrainerCallback: when the Slurm job asks (``smolforge launch``'s stop file), save a checkpoint
    and stop after this step, on every rank at the same step; :meth:`raise_if_stopped` then ends the
    stage with :class:`~smolforge.errors.Preempted`, so the run stays unfinished and resumes."""
    import os

    from transformers import TrainerCallback

    from smolforge.slurm import STOP_FILE_ENV, stop_requested

    class StopOnRequest(TrainerCallback):
        stopped_at: int | None = None

        def on_step_end(self, args, state, control, **kwargs):
            if STOP_FILE_ENV not in os.environ or state.global_step >= state.max_steps:
                return
            from accelerate.utils import broadcast_object_list

            asked = broadcast_object_list([stop_requested()], from_process=0)[0]
            if asked:
                control.should_save = control.should_training_stop = True
                self.stopped_at = state.global_step

        def raise_if_stopped(self) -> None:
            if self.stopped_at is not None:
                from smolforge.errors import Preempted

                raise Preempted(f"stopped at step {self.stopped_at} before the job's time limit; "
                                f"checkpoint-{self.stopped_at} saved: the requeued job resumes from it")

    return StopOnRequest()


def zero_stage(accelerator) -> int:
    """The DeepSpeed ZeRO stage the trainer runs under (0 without DeepSpeed)."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return int(plugin.zero_stage) if plugin is not None else 0


def check_exportable(trainer, exporting: bool) -> None:
    """LoRA merging needs whole weights on one process; under ZeRO-3 say so before training."""
    if exporting and zero_stage(trainer.accelerator) == 3:
        raise RecipeError("lora: merging the adapter into model/ under DeepSpeed ZeRO-3 is not supported; "
                          "use ZeRO-2 (or no DeepSpeed) with LoRA, whose frozen base needs no sharding")


@contextlib.contextmanager
def full_weights(model):
    """Every parameter whole on every rank inside the block (ZeRO-3 partitions gathered; else nothing)."""
    params = list(model.parameters())
    if not any(hasattr(p, "ds_id") for p in params):
        yield model
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield model


def gathered_state_dict(trainer) -> dict | None:
    """The full state dict under ZeRO-3 (every rank must call it), else None."""
    accelerator = trainer.accelerator
    if zero_stage(accelerator) != 3:
        return None
    try:
        return accelerator.get_state_dict(trainer.model_wrapped)
    except ValueError:  # stage3_gather_16bit_weights_on_model_save is off: gather the parameters ourselves
        model = accelerator.unwrap_model(trainer.model)
        with full_weights(model):
            return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def save_trained(trainer, run: Run, tokenizer, export=None) -> None:
    """Write ``model/`` from the main process: ZeRO-3 weights gathered, ``export(trainer, run)``
    (e.g. LoRA merged) otherwise; every rank waits until it is written."""
    accelerator = trainer.accelerator
    state_dict = gathered_state_dict(trainer)
    if accelerator.is_main_process:
        if state_dict is not None:
            run.save_model(accelerator.unwrap_model(trainer.model), tokenizer, state_dict=state_dict)
        else:
            run.save_model(export(trainer, run) if export is not None else accelerator.unwrap_model(trainer.model),
                           tokenizer)
    accelerator.wait_for_everyone()
