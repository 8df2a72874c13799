"""Asynchronous GRPO rollouts with bounded staleness: the vLLM server samples the next batches while
the trainer trains on this one.

    smolforge grpo --config recipes/demo/grpo.yaml --set async.max_staleness=1
    .venv/bin/python bench/rl_async.py       # steps/s and held-out reward, synchronous vs asynchronous

A GRPO recipe's ``async: {max_staleness: N}`` (default off) on the ``vllm-server`` path (the CPU
build: :mod:`smolforge.generation.rollouts`, TRL's ``rollout_func`` hook). A worker thread generates
generation batch k as soon as the trainer's weights are at a version v ≥ u_k − N, where u_k is the
optimizer step that will train on it and a version is the ``global_step`` after which the weights
were copied (:func:`may_generate`). Before sampling it pushes the newest
copy to the server when the server holds an older one. So the batch a step trains on was sampled
from weights at most N steps old, and its generation ran while the previous steps trained. N = 0
is the synchronous loop (the batch is sampled only once the step before it has ended: no overlap).

Where the pieces come from:

- the prompts of the coming batches: the trainer's own dataloader, read ahead. The trainer's
  ``get_batch_samples`` (the one place its loop pulls batches) is wrapped so that, when it takes
  a batch, the next batches whose sampling the rule already allows are read too and handed to the
  worker (encoded here, on the main thread). The trainer then gets exactly the batches it would
  have got, in order; ``skip_first_batches`` on resume and new epochs need nothing special.
- the weights: copied on the main thread when training begins and at the end of every optimizer
  step (a ``TrainerCallback``, ``on_step_end``; tied tensors stay tied), never read from the live
  model by the worker.
- the batch: the ``rollout_func`` returns the worker's *k*-th batch after checking that its prompts
  are the ones TRL asks for. A batch whose prompts differ, or whose staleness would exceed N (the
  trainer stepped differently from the look-ahead's count), is generated again, synchronously,
  from the current weights, and counted (``rl/async_fallbacks``).

The correction: samples from weights *v* trained at step *s* > *v* are off-policy. TRL's GRPOTrainer
corrects the engine/trainer mismatch with its truncated importance-sampling ratio π_trainer/π_engine
(``trainer.vllm_importance_sampling_correction``, mode ``vllm_importance_sampling_mode``, default
``sequence_mask``) whenever ``use_vllm`` is set; π_engine is the stale policy's log-prob that the
server returned, π_trainer the current policy's. :func:`enable_is_correction` turns that on for
this path after the trainer is built (its ``vllm_generation`` is a stub whose ``sync_weights`` does
nothing: the worker pushes the weights), so the stale batches are corrected; TRL logs the ratio
(``sampling/importance_sampling_ratio/…``) and the gap including the policy's own drift
(``sampling/sampling_logp_difference/…``), and run.json records the mode (``rl/is_correction``).

Parity (:mod:`~smolforge.alignment.logprob_parity`) stays a check of the engine: each batch is
scored by the weights that generated it (the copy, through ``torch.func.functional_call``), so a
missed weight push still shows, and the policy's own change over the N steps does not stop a run.

Per step, with TRL's figures in metrics.jsonl: ``async/staleness`` (steps between the weights that
sampled the batch and the step that trains on it), ``async/wait_s`` (what the trainer waited for the
batch), ``async/generate_s`` (the worker's weight push and sampling), ``async/overlap``
(:func:`overlap`: the share of that time hidden behind training). run.json: ``rl/async_max_staleness``,
``rl/async_staleness_max`` / ``_mean``, ``rl/async_overlap_mean``, ``rl/async_fallbacks``.

On a GPU, with TRL's own vLLM modes, TRL's ``trl.experimental.async_grpo.AsyncGRPOTrainer`` is the
route (it needs FlashAttention-3 and streams the weights over NCCL); smolforge refuses ``async``
there. Single process only, no tools (TRL's tool loop regenerates through its own backends).

The overlap needs cores the other side is not using: on 2 CPU cores shared by the server and the
trainer the demo ran at 0.85× the synchronous steps/s; with the server's threads on one core and the
trainer's on the other (``VLLM_CPU_OMP_THREADS_BIND=1 OMP_NUM_THREADS=1``) at 1.38× (N = 1) and
1.49× (N = 2) (``bench/rl_async.py --staleness 1 2 --split``).

    >>> spec = AsyncSpec(max_staleness=1)
    >>> [may_generate(use_step=4, version=v, max_staleness=spec.max_staleness) for v in (2, 3, 4)]
    [False, True, True]
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from smolforge.errors import RecipeError, RunError

__all__ = ["AsyncSpec", "AsyncRollouts", "may_generate", "overlap", "snapshot", "enable_is_correction"]

log = logging.getLogger(__name__)


@dataclass
class AsyncSpec:
    """The recipe's ``async:`` block."""

    max_staleness: int = 1            # N: a batch may be sampled from weights up to N optimizer steps older than the
                                      #   step that trains on it; 0 = synchronous (no overlap)

    def check(self) -> None:
        """
        >>> AsyncSpec(max_staleness=-1).check()
        Traceback (most recent call last):
        ...
        smolforge.errors.RecipeError: async.max_staleness must be a whole number >= 0 (0: synchronous), got -1
        """
        n = self.max_staleness
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RecipeError(f"async.max_staleness must be a whole number >= 0 (0: synchronous), got {n!r}")


def may_generate(use_step: int, version: int, max_staleness: int) -> bool:
    """The bounded-staleness rule: the batch trained at optimizer step ``use_step`` may be sampled
    from weights at ``version`` (the ``global_step`` they were copied after) once
    ``version >= use_step - max_staleness``.

    >>> may_generate(5, 4, 1), may_generate(5, 3, 1), may_generate(5, 4, 0), may_generate(5, 5, 0)
    (True, False, False, True)
    """
    return version >= use_step - max_staleness


def overlap(wait_s: float, generate_s: float) -> float:
    """The share of a batch's generation time hidden behind training: 1 − wait/generate, in [0, 1].

    >>> overlap(0.0, 2.0), overlap(0.5, 2.0), overlap(3.0, 2.0), overlap(0.0, 0.0)
    (1.0, 0.75, 0.0, 0.0)
    """
    if generate_s <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - wait_s / generate_s))


def snapshot(model: Any) -> dict:
    """A copy of ``model``'s state dict, detached from it; tensors tied in the model (an embedding and
    its ``lm_head``) stay one tensor under both names, as ``functional_call`` wants them.

    >>> import torch
    >>> layer = torch.nn.Linear(2, 2)
    >>> copy = snapshot(layer)
    >>> with torch.no_grad():
    ...     _ = layer.weight.add_(1.0)
    >>> torch.equal(copy["weight"] + 1.0, layer.weight), copy["weight"].data_ptr() != layer.weight.data_ptr()
    (True, True)
    """
    copies: dict = {}
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if key not in copies:
            copies[key] = tensor.detach().clone()
        out[name] = copies[key]
    return out


class _Weights:
    """A copy of the weights in the shape :meth:`ServerRollouts.sync` reads (``state_dict()``, ``config``)."""

    def __init__(self, state: dict, config: Any) -> None:
        self.state, self.config = state, config

    def state_dict(self) -> dict:
        return self.state


class _AtWeights:
    """``model`` run with the weights ``state`` instead of its own (``torch.func.functional_call``): what
    :func:`~smolforge.alignment.logprob_parity.policy_logprobs` needs of a model, the live one untouched."""

    def __init__(self, model: Any, state: dict) -> None:
        self.model, self.state = model, state

    @property
    def training(self) -> bool:
        return self.model.training

    def parameters(self):
        return self.model.parameters()

    def eval(self) -> "_AtWeights":
        self.model.eval()
        return self

    def train(self, mode: bool = True) -> "_AtWeights":
        self.model.train(mode)
        return self

    def __call__(self, **kwargs):
        from torch.func import functional_call

        return functional_call(self.model, self.state, args=(), kwargs=kwargs)


class _ServerEngine:
    """What TRL's GRPOTrainer calls on its vLLM backend before a rollout (``sync_weights``). The rollout
    worker pushes the weights itself, each batch from its own copy, so there is nothing to do here."""

    def sync_weights(self) -> None:
        pass


def enable_is_correction(trainer: Any) -> str:
    """Turn TRL's vLLM importance-sampling correction on for a GRPOTrainer whose rollouts come from
    ``rollout_func``: TRL applies it (and logs ``sampling/…``) only where ``use_vllm`` is set. Every
    other use of ``use_vllm`` in the trainer after ``__init__`` is in its own generation path (not taken
    with a ``rollout_func``) or its tool loop (refused with ``async``). Returns the mode, or "none"
    where the recipe turned the correction off.

    >>> from types import SimpleNamespace
    >>> t = SimpleNamespace(use_vllm=False, vllm_importance_sampling_correction=True,
    ...                     vllm_importance_sampling_mode="sequence_mask", state=SimpleNamespace(global_step=0))
    >>> enable_is_correction(t), t.use_vllm, t._last_loaded_step
    ('sequence_mask', True, 0)
    """
    if not getattr(trainer, "vllm_importance_sampling_correction", False):
        return "none"
    trainer.use_vllm = True
    trainer.vllm_generation = _ServerEngine()
    trainer._last_loaded_step = trainer.state.global_step
    return trainer.vllm_importance_sampling_mode


@dataclass
class _Job:
    """One generation batch: what to sample, and (once done) from which weights and what came back."""

    index: int                        # the k-th generation batch of this process
    item: int                         # the item of the trainer's iterator it belongs to (its _step)
    use_step: int                     # the optimizer step expected to train on it
    prompts: list
    prompt_ids: list
    version: int = -1                 # the weights it was sampled from (a global_step)
    state: dict | None = None         # those weights (parity is measured against them)
    samples: list | None = None
    generate_s: float = 0.0           # weight push + sampling, in the worker
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _LookAhead:
    """The trainer's epoch iterator, as :class:`AsyncRollouts` reads it ahead."""

    def __init__(self, owner: "AsyncRollouts") -> None:
        self.owner = owner

    def __iter__(self):
        return self

    def __next__(self):
        return self.owner._hand_out()


class AsyncRollouts:
    """The rollout worker and its glue to a TRL GRPOTrainer: :meth:`rollout` is the ``rollout_func``,
    :meth:`callback` copies the weights, :meth:`attach` (after the trainer is built) wraps its batch
    reading and turns TRL's correction on, :meth:`close` stops the worker.

    ``rollouts`` is a :class:`~smolforge.generation.rollouts.ServerRollouts` whose server holds the
    policy at step 0 (the parent's weights); ``args`` the GRPOConfig; ``watch`` a ParityWatch or None.
    """

    def __init__(self, rollouts: Any, tokenizer: Any, args: Any, spec: AsyncSpec, watch: Any = None) -> None:
        self.rollouts, self.tokenizer, self.args, self.spec, self.watch = rollouts, tokenizer, args, spec, watch
        self.n = spec.max_staleness
        self.history: list[dict] = []          # per trained batch: step, staleness, wait_s, generate_s, overlap
        self.fallbacks = 0
        self.is_mode = "none"
        self._trainer: Any = None
        self._config: Any = None
        self._cond = threading.Condition()
        self._queue: collections.deque[_Job] = collections.deque()     # for the worker, in order
        self._pending: collections.deque[_Job] = collections.deque()   # submitted, not yet trained on
        self._version: int | None = None        # the newest copy of the weights
        self._state: dict | None = None
        self._server_version = 0                # the server starts on the parent's weights: step 0
        self._server_lock = threading.Lock()    # one user of the server at a time (worker, or a fallback)
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        # look-ahead state
        self._source: Any = None
        self._iterator = _LookAhead(self)
        self._buffer: collections.deque = collections.deque()
        self._exhausted = False
        self._read = 0                          # items read from the trainer's iterators (this process)
        self._handed = 0                        # items handed to the trainer (= its _step when it trains each)
        self._first_step: int | None = None     # global_step when the first item was handed out
        self._submitted = 0

    # ------------------------------------------------------------------ wiring

    def callback(self):
        """A TrainerCallback copying the weights when training begins and after each optimizer step."""
        from transformers import TrainerCallback

        owner = self

        class WeightCopies(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                owner.publish(state.global_step)

            def on_step_end(self, args, state, control, **kwargs):
                owner.publish(state.global_step)

        return WeightCopies()

    def attach(self, trainer: Any) -> "AsyncRollouts":
        """Wrap ``trainer.get_batch_samples`` (the look-ahead), turn TRL's IS correction on, start the worker."""
        self._trainer = trainer
        self._config = trainer.accelerator.unwrap_model(trainer.model).config
        original = trainer.get_batch_samples

        def get_batch_samples(epoch_iterator, num_batches, device):
            return original(self._over(epoch_iterator), num_batches, device)

        trainer.get_batch_samples = get_batch_samples
        self.is_mode = enable_is_correction(trainer)
        self._thread = threading.Thread(target=self._work, name="async-rollouts", daemon=True)
        self._thread.start()
        log.info("rollouts: asynchronous, at most %d step(s) stale; importance-sampling correction: %s",
                 self.n, self.is_mode)
        return self

    def publish(self, version: int) -> None:
        """Copy the trainer's weights as ``version`` (main thread) for the worker to push."""
        with self._cond:
            if self._version == version:
                return
        model = self._trainer.accelerator.unwrap_model(self._trainer.model)
        state = snapshot(model)
        with self._cond:
            self._version, self._state = version, state
            self._cond.notify_all()

    def close(self, timeout: float = 300.0) -> None:
        """Stop the worker (after the batch it is sampling, if any); batches not yet trained on are dropped."""
        with self._cond:
            self._stop = True
            self._queue.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("rollouts: the asynchronous worker did not stop within %.0f s", timeout)
        self._pending.clear()
        self._state = None

    # ------------------------------------------------------------------ look-ahead (main thread)

    def _over(self, source: Any) -> _LookAhead:
        if source is not self._source:
            if self._buffer:                     # the trainer left an iterator with items read ahead
                self._drop_unread()
            self._source, self._exhausted = source, False
        return self._iterator

    def _drop_unread(self) -> None:
        dropped = {id(job) for job in self._pending if job.item >= self._handed}
        with self._cond:
            self._queue = collections.deque(j for j in self._queue if id(j) not in dropped)
        self._pending = collections.deque(j for j in self._pending if id(j) not in dropped)
        self._buffer.clear()
        self._read = self._handed

    def _use_step(self, item: int) -> int:
        """The optimizer step expected to train on the ``item``-th item handed to the trainer."""
        return (self._first_step or 0) + item // self._trainer.args.gradient_accumulation_steps

    def _generation_item(self, item: int) -> bool:
        """Whether TRL generates for this item (its ``_step % (steps_per_generation × num_iterations) == 0``)."""
        return item % (self._trainer.args.steps_per_generation * self._trainer.num_iterations) == 0

    def _hand_out(self):
        if self._first_step is None:
            self._first_step = self._trainer.state.global_step
        horizon = self._use_step(self._handed) + self.n
        last = self._trainer.state.max_steps
        while not self._exhausted and (self._read == self._handed
                                       or self._use_step(self._read) <= min(horizon, last - 1)):
            try:
                item = next(self._source)
            except StopIteration:
                self._exhausted = True
                break
            if self._generation_item(self._read) and self._use_step(self._read) < last:
                self._submit(item, self._read)
            self._buffer.append(item)
            self._read += 1
        if not self._buffer:
            raise StopIteration
        self._handed += 1
        return self._buffer.popleft()

    def _submit(self, item: list, index: int) -> None:
        from smolforge.generation.prompts import encode_prompts

        prompts = [row["prompt"] for row in item]
        job = _Job(self._submitted, index, self._use_step(index), prompts, encode_prompts(self.tokenizer, prompts))
        self._submitted += 1
        self._pending.append(job)
        with self._cond:
            self._queue.append(job)
            self._cond.notify_all()

    # ------------------------------------------------------------------ the worker

    def _work(self) -> None:
        job = None
        try:
            while True:
                with self._cond:
                    while not self._stop and not (self._queue and self._version is not None and may_generate(
                            self._queue[0].use_step, self._version, self.n)):
                        self._cond.wait()
                    if self._stop:
                        return
                    job = self._queue.popleft()
                    version, state = self._version, self._state
                self._sample(job, version, state)
                if job.samples is None:          # stopped before sampling it
                    return
                job.done.set()
                job = None
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread by rollout()
            with self._cond:
                self._error = exc
            if job is not None:
                job.error = exc
                job.done.set()

    def _sample(self, job: _Job, version: int, state: dict) -> None:
        started = time.perf_counter()
        with self._server_lock:
            if self._stop:
                return
            if version != self._server_version:
                self.rollouts.sync(_Weights(state, self._config))
                self._server_version = version
            samples = self.rollouts.generate(job.prompt_ids, max_tokens=self.args.max_completion_length,
                                             temperature=self.args.temperature, top_p=self.args.top_p)
        job.version, job.state, job.samples = version, state, samples
        job.generate_s = time.perf_counter() - started

    # ------------------------------------------------------------------ the rollout_func (main thread)

    def rollout(self, prompts: list, trainer: Any) -> dict:
        """TRL ``rollout_func``: the prefetched batch for these prompts, with its figures logged."""
        if not trainer.model.training:                        # an evaluation batch: not prefetched
            return self._now(prompts, trainer, record=False)
        job = self._pending.popleft() if self._pending else None
        if job is None or job.prompts != prompts:
            if job is not None:
                with self._cond:
                    if job in self._queue:
                        self._queue.remove(job)
            self._fallback("the prefetched batch holds other prompts" if job else "no batch was prefetched")
            return self._now(prompts, trainer)
        started = time.perf_counter()
        while not job.done.wait(0.5):
            if self._thread is None or not self._thread.is_alive():
                raise RunError("rollouts: the asynchronous worker stopped before sampling the batch of step "
                               f"{trainer.state.global_step + 1}" + (f": {self._error}" if self._error else ""))
        wait_s = time.perf_counter() - started
        if job.error is not None:
            raise job.error
        step = trainer.state.global_step
        staleness = step - job.version
        if not 0 <= staleness <= self.n:                    # never train past the bound
            self._fallback(f"the batch is {staleness} steps stale (max_staleness {self.n})")
            return self._now(prompts, trainer)
        policy = trainer.accelerator.unwrap_model(trainer.model)
        scorer = policy if staleness == 0 else _AtWeights(policy, job.state)
        result = self._result(trainer, job.prompt_ids, job.samples, scorer)
        self._record(trainer, staleness, wait_s, job.generate_s)
        job.state = None
        return result

    def _fallback(self, why: str) -> None:
        if not self.fallbacks:
            log.warning("rollouts: %s; sampling it now from the current weights (counted in rl/async_fallbacks)", why)
        self.fallbacks += 1

    def _now(self, prompts: list, trainer: Any, record: bool = True) -> dict:
        """Sample ``prompts`` synchronously from the trainer's current weights."""
        from smolforge.generation.prompts import encode_prompts

        step = trainer.state.global_step
        self.publish(step)
        with self._cond:
            version, state = self._version, self._state
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        started = time.perf_counter()
        with self._server_lock:
            if version != self._server_version:
                self.rollouts.sync(_Weights(state, self._config))
                self._server_version = version
            samples = self.rollouts.generate(prompt_ids, max_tokens=self.args.max_completion_length,
                                             temperature=self.args.temperature, top_p=self.args.top_p)
        took = time.perf_counter() - started
        result = self._result(trainer, prompt_ids, samples, trainer.accelerator.unwrap_model(trainer.model))
        if record:
            self._record(trainer, 0, took, took)
        return result

    def _result(self, trainer: Any, prompt_ids: list, samples: list, scorer: Any) -> dict:
        completion_ids, logprobs = [ids for ids, _ in samples], [lps for _, lps in samples]
        if self.watch is not None:
            stats = self.watch.measure(trainer.state.global_step + 1, scorer, prompt_ids, completion_ids, logprobs,
                                       temperature=self.args.temperature)
            for key, value in stats.items():
                trainer._metrics["train"][key].append(value)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def _record(self, trainer: Any, staleness: int, wait_s: float, generate_s: float) -> None:
        figures = {"async/staleness": staleness, "async/wait_s": round(wait_s, 4),
                   "async/generate_s": round(generate_s, 4), "async/overlap": round(overlap(wait_s, generate_s), 4)}
        for key, value in figures.items():
            trainer._metrics["train"][key].append(value)     # logged with TRL's own figures of the step
        self.history.append({"step": trainer.state.global_step + 1, **figures})

    # ------------------------------------------------------------------ run.json

    def summary(self) -> dict:
        """run.json figures: the bound, the staleness the steps trained at, the overlap, the fallbacks.

        >>> a = AsyncRollouts(None, None, None, AsyncSpec(max_staleness=1))
        >>> a.history = [{"async/staleness": 0, "async/overlap": 0.0, "async/wait_s": 1.0, "async/generate_s": 1.0},
        ...              {"async/staleness": 1, "async/overlap": 0.5, "async/wait_s": 0.5, "async/generate_s": 1.0}]
        >>> a.summary()["rl/async_staleness_mean"], a.summary()["rl/async_overlap_mean"]
        (0.5, 0.25)
        """
        out: dict = {"rl/async_max_staleness": self.n, "rl/async_fallbacks": self.fallbacks}
        if self.history:
            stale = [h["async/staleness"] for h in self.history]
            hidden = [h["async/overlap"] for h in self.history]
            out.update({"rl/async_staleness_max": max(stale),
                        "rl/async_staleness_mean": round(sum(stale) / len(stale), 4),
                        "rl/async_overlap_mean": round(sum(hidden) / len(hidden), 4),
                        "rl/async_wait_s": round(sum(h["async/wait_s"] for h in self.history), 2),
                        "rl/async_generate_s": round(sum(h["async/generate_s"] for h in self.history), 2)})
        return out
