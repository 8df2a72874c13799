"""``eval_while_training:`` on the TRL stages: the Trainer side of :mod:`smolforge.eval_watch`.

:func:`eval_watch` is a TrainerCallback that asks the Trainer for a checkpoint every ``every`` steps,
hands each to :class:`~smolforge.eval_watch.EvalWatch` (one background evaluation at a time, the newest
waiting), holds training back under ``max_lag`` and stops it at the step end after a ``stop_on`` rule
breaks (every rank at the same step). Used as a context manager around ``trainer.train()``: leaving it
waits for the evaluations still going (``final_wait``), or stops them at once when training raised.
:meth:`conclude` then records the figures and, after a breach, fails the run (run.json ``stopped_by``).

    >>> from types import SimpleNamespace
    >>> check_eval_watch(SimpleNamespace(trainer=SimpleNamespace(max_steps=10)))   # a recipe without the field
"""
from __future__ import annotations

from pathlib import Path

from smolforge.errors import RunError
from smolforge.eval_watch import EvalWatch, EvalWhileTraining, check_spec, record_stop
from smolforge.runs import Run
from smolforge.slurm import stop_requested

__all__ = ["EvalWhileTraining", "check_eval_watch", "eval_watch"]


def check_eval_watch(recipe) -> None:
    """RecipeError, before any run exists, when the recipe's ``eval_while_training:`` cannot work."""
    spec = getattr(recipe, "eval_while_training", None)
    trainer = getattr(recipe, "trainer", None)
    check_spec(spec, max_steps=getattr(trainer, "max_steps", None), lora=getattr(recipe, "lora", None) is not None)


def _broadcast(value, world_size: int):
    """``value`` of the main process on every rank (itself with one process)."""
    if world_size <= 1:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value], from_process=0)[0]


def eval_watch(run: Run, recipe):
    """The TrainerCallback (and context manager) of ``recipe.eval_while_training`` for ``run``; it does
    nothing when the recipe has none or ``every`` is 0."""
    from transformers import TrainerCallback

    spec: EvalWhileTraining | None = getattr(recipe, "eval_while_training", None)
    on = spec is not None and spec.on

    class WatchCheckpoints(TrainerCallback):
        def __init__(self) -> None:
            self.watch: EvalWatch | None = None
            self.stopped_at: int | None = None
            self.world_size = 1

        def on_train_begin(self, args, state, control, **kwargs):
            self.world_size = args.world_size
            if on and state.is_world_process_zero and self.watch is None:
                self.watch = EvalWatch(spec, run).__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if not on:
                return
            step = state.global_step
            if self.watch is not None:
                self.watch.wait_for_lag(step)
            if _broadcast(self.watch is not None and self.watch.breach is not None, args.world_size):
                control.should_training_stop = True
                self.stopped_at = step if self.stopped_at is None else self.stopped_at
            elif step % spec.every == 0:
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            step = state.global_step
            if self.watch is not None and self.stopped_at is None and step % spec.every == 0:
                self.watch.submit(step, Path(args.output_dir) / f"checkpoint-{step}")

        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb) -> None:
            if self.watch is not None:   # the job asked to stop (a time limit near): no waiting for scores
                self.watch.close(wait=exc_type is None and not stop_requested())

        def conclude(self, trainer) -> None:
            """After training: the ``eval_watch/*`` figures into run.json; after a breach (also one found
            while waiting at the end), run.json's ``stopped_by`` and a RunError that fails the run."""
            if not on:
                return
            step = trainer.state.global_step
            record = self.watch.stop_record(self.stopped_at or step) if self.watch is not None else None
            record = _broadcast(record, self.world_size)
            if self.watch is None:     # another rank: the main process writes the run
                if record is not None:
                    raise RunError(f"stopped by eval_while_training.stop_on: {record['message']}")
                return
            if record is None:
                run.update_metrics(self.watch.summary())
                return
            raise record_stop(run, record, {**self.watch.summary(), "train/steps": step})

    return WatchCheckpoints()
