"""Asynchronous rollouts (alignment/async_rollouts.py) without a server: the bounded-staleness rule, the
look-ahead over the trainer's batches, the worker's weight pushes, the fallback, stopping, and the
recipe checks. A fake server stands in for vLLM: it "samples" the version of the weights it holds, so
every completion says which weights generated it. The real server run is in tests/test_vllm_rollouts.py.
"""
from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from smolforge.alignment.async_rollouts import AsyncRollouts, AsyncSpec, may_generate
from smolforge.alignment.online import check_async
from smolforge.errors import RecipeError


class FakeServer:
    """ServerRollouts' sync/generate: the weights it holds are a version number (the model's one weight)."""

    def __init__(self) -> None:
        self.holds = 0.0
        self.pushed: list[float] = []
        self.sampled: list[float] = []

    def sync(self, weights) -> None:
        self.holds = float(weights.state_dict()["weight"].item())
        self.pushed.append(self.holds)

    def generate(self, prompt_ids, *, max_tokens, temperature, top_p):
        self.sampled.append(self.holds)
        return [([int(self.holds)], [0.0]) for _ in prompt_ids]


def fake_trainer(max_steps: int):
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    model.config = SimpleNamespace()
    trainer = SimpleNamespace(
        model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m), num_iterations=1,
        args=SimpleNamespace(gradient_accumulation_steps=1, steps_per_generation=1, max_completion_length=4,
                             temperature=1.0, top_p=1.0),
        state=SimpleNamespace(global_step=0, max_steps=max_steps), _metrics={"train": defaultdict(list)},
        vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask", use_vllm=False)
    trainer.get_batch_samples = lambda it, n, device: [next(it) for _ in range(n)]
    return trainer


def tokenizer(text, add_special_tokens=False):
    return {"input_ids": [len(text)]}


def train(max_staleness: int, steps: int = 5, *, others: dict | None = None):
    """A trainer loop as Trainer runs it (take a batch, roll out, train, step, copy the weights), on the fake server."""
    trainer = fake_trainer(steps)
    server = FakeServer()
    worker = AsyncRollouts(server, tokenizer, trainer.args, AsyncSpec(max_staleness=max_staleness))
    callback = worker.callback()
    worker.attach(trainer)
    batches = iter([[{"prompt": f"q{step}-{i}"} for i in range(2)] for step in range(steps + 3)])
    callback.on_train_begin(trainer.args, trainer.state, None)
    versions = []
    try:
        for step in range(steps):
            [batch] = trainer.get_batch_samples(batches, 1, None)
            prompts = [row["prompt"] for row in batch]
            if others and step in others:
                prompts = others[step]
            out = worker.rollout(prompts, trainer)
            versions.append(out["completion_ids"][0][0])
            # the step trains: with N >= 1 the next batch is sampled meanwhile, with N = 0 nothing is
            calls = len(server.sampled)
            if max_staleness and step + 1 < steps:
                assert worker._pending and worker._pending[0].done.wait(5.0), "the next batch waited for the step"
            else:
                time.sleep(0.2)
                assert len(server.sampled) == calls, "a batch was sampled while the step trained"
            with torch.no_grad():
                trainer.model.weight.fill_(float(step + 1))     # the optimizer step: weights are now version step+1
            trainer.state.global_step += 1
            callback.on_step_end(trainer.args, trainer.state, None)
    finally:
        worker.close()
    return worker, trainer, server, versions


def test_the_staleness_rule():
    assert [may_generate(3, v, 0) for v in (2, 3)] == [False, True]
    assert [may_generate(3, v, 2) for v in (0, 1)] == [False, True]


def test_max_staleness_0_is_the_synchronous_loop():
    worker, trainer, server, versions = train(0)
    assert versions == [0, 1, 2, 3, 4]                         # each batch from the weights that train on it
    assert [h["async/staleness"] for h in worker.history] == [0] * 5
    assert worker.fallbacks == 0
    assert trainer._metrics["train"]["async/staleness"] == [0] * 5
    assert server.pushed == [1.0, 2.0, 3.0, 4.0]               # the server starts on version 0


def test_max_staleness_1_samples_the_next_batch_while_the_step_trains():
    worker, trainer, server, versions = train(1)
    stale = [h["async/staleness"] for h in worker.history]
    assert stale == [0, 1, 1, 1, 1] and versions == [0, 0, 1, 2, 3]
    assert worker.summary()["rl/async_staleness_max"] == 1 and worker.summary()["rl/async_fallbacks"] == 0
    assert trainer.use_vllm and worker.is_mode == "sequence_mask"   # TRL's correction on for the stale batches
    assert not worker._thread.is_alive()


def test_a_batch_with_other_prompts_is_sampled_now_and_counted():
    worker, _, _, versions = train(1, others={2: ["something else", "entirely"]})
    assert worker.fallbacks == 1
    assert [h["async/staleness"] for h in worker.history][2] == 0 and versions[2] == 2


def test_a_worker_error_reaches_the_trainer_and_the_thread_ends():
    trainer = fake_trainer(3)
    server = FakeServer()
    server.generate = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("server gone"))
    worker = AsyncRollouts(server, tokenizer, trainer.args, AsyncSpec(max_staleness=1))
    callback = worker.callback()
    worker.attach(trainer)
    callback.on_train_begin(trainer.args, trainer.state, None)
    [batch] = trainer.get_batch_samples(iter([[{"prompt": "a"}], [{"prompt": "b"}]]), 1, None)
    with pytest.raises(RuntimeError, match="server gone"):
        worker.rollout([row["prompt"] for row in batch], trainer)
    worker.close()
    assert not worker._thread.is_alive()


def recipe(**changes):
    trainer = SimpleNamespace(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask",
                              loss_type="dapo", vllm_mode="colocate")
    values = dict(async_=AsyncSpec(max_staleness=1), trainer=trainer, tools=[], generation="auto")
    values.update(changes)
    return SimpleNamespace(**values)


@pytest.mark.parametrize("backend, hook, changes, processes, message", [
    ("trl-vllm", True, {}, 1, "use TRL's AsyncGRPOTrainer"),
    ("hf", False, {}, 1, "which only GRPO has"),
    ("hf", True, {"tools": ["calculator"]}, 1, "not with tools"),
    ("hf", True, {}, 2, "serves one process"),
    ("hf", True, {"generation": "hf"}, 1, "generates with hf"),
    ("vllm-server", True, {"async_": AsyncSpec(max_staleness=-1)}, 1, "whole number >= 0"),
])
def test_async_is_refused_where_it_cannot_run(backend, hook, changes, processes, message):
    with pytest.raises(RecipeError, match=message):
        check_async(recipe(**changes), backend, has_rollout_hook=hook, processes=processes)
    check_async(recipe(async_=None, **{k: v for k, v in changes.items() if k != "async_"}), backend,
                has_rollout_hook=hook, processes=processes)                      # without async: no objection


def test_the_recipe_field_is_built_and_checked():
    from conftest import tiny_recipe

    built = tiny_recipe("grpo", **{"async": {"max_staleness": 2}})
    assert built.async_ == AsyncSpec(max_staleness=2) and tiny_recipe("grpo").async_ is None
    with pytest.raises(RecipeError, match="max_staleness must be >= 0"):
        tiny_recipe("grpo", **{"async": {"max_staleness": -1}})
    with pytest.raises(RecipeError, match="max_staleness' must be an int"):
        tiny_recipe("grpo", **{"async": {"max_staleness": 1.5}})
    with pytest.raises(RecipeError, match="asynchronous rollouts are for GRPO"):
        tiny_recipe("ppo", **{"async": {"max_staleness": 1}})


def test_the_yaml_key_is_async():
    from conftest import tiny_recipe

    assert tiny_recipe("grpo", **{"async": {"max_staleness": 1}}).async_ == AsyncSpec(max_staleness=1)
