"""What the online-RL stages built on TRL (GRPO, RLOO) share: prompts, rewards, held-out scoring.

PPO (:mod:`smolforge.alignment.ppo`, its own loop) loads its prompts and rewards here too.

A stage reads a parent run's model and a data run's ``prompts`` kind (``{"prompt", "answer"}``
rows; or a ``.jsonl`` of such rows), holds out ``heldout_fraction`` of the prompts (a seeded
shuffle), resolves the recipe's ``rewards:`` (short names, ``module:function`` or ``run:<reward
run>``, see :mod:`smolforge.alignment.rewards`) and trains with TRL. The policy loads in fp32 (its
master weights, whatever the parent's checkpoint dtype) onto the device the trainer trains it on.
Before and after training it answers the held-out prompts greedily there; the mean verifier reward of
both lands in run.json as
``rl/heldout_reward_before`` and ``rl/heldout_reward_after``, which is how a recipe shows RL helped.

Generation (``generation:``, chosen by :func:`smolforge.generation.backends.pick_backend`, logged once):
``trainer.use_vllm: true`` hands rollouts to TRL's own vLLM modes as configured. Otherwise
``auto`` picks TRL's colocate mode (the ``vllm`` backend: an engine in this process) on a CUDA GPU
with vLLM; on a CPU machine with vLLM's CPU build, GRPO samples from a vLLM server that holds the
policy (``vllm-server``: TRL's ``rollout_func`` hook, weights reloaded in place after each
optimizer step, :mod:`smolforge.generation.rollouts`); RLOO has
no such hook in TRL and generates with HF there. Elsewhere, HF ``generate``.

``async: {max_staleness: N}`` (GRPO on the ``vllm-server`` path) samples the next batches while the
trainer trains, from weights at most N steps old, with TRL's importance-sampling correction on
(:mod:`smolforge.alignment.async_rollouts`); off by default.

    >>> sorted(OnlineRecipe().__dataclass_fields__)[:3]
    ['async_', 'chat_prompts', 'data']
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smolforge.recipe import FRACTION
from smolforge.errors import RecipeError
from smolforge.determinism import DeterminismSpec
from smolforge.eval_watch import EvalWhileTraining
from smolforge.profiling import ProfileSpec, check_profile
from smolforge.runs import Run, Runs
from smolforge.tracking import TrackingSpec

from smolforge.generation.environments import offered_tools
from smolforge.generation.prompts import load_tokenizer

from .async_rollouts import AsyncSpec
from .eval_watch import check_eval_watch, eval_watch
from .logprob_parity import ParitySpec, ParityWatch, parity_callback
from .common import (check_determinism, check_tracking, lineage_fingerprints, load_trainable, model_parent,
                     quiet_tracking, reproducible_training, run_logger, split_heldout, step_profiler, train_summary,
                     trainer_defaults)

log = logging.getLogger(__name__)


@dataclass
class OnlineRecipe:
    """Fields every online-RL recipe has; a stage adds its ``trainer`` (a TRL config)."""

    name: str = "rl-demo"             # run name
    parent: str = "sft-demo"          # run whose model/ is the starting policy
    data: str = "data-demo"           # data run (its prompts) or a .jsonl of {"prompt", "answer"} rows
    rewards: list = field(default_factory=lambda: ["answer_match"])  # functions, run:<reward run>, {judge: {...}}
    heldout_fraction: float = field(default=0.2, metadata=FRACTION)    # prompts kept out of training to measure the reward before/after
    eval_max_new_tokens: int = 32     # greedy answer length for the held-out measurement
    chat_prompts: bool = False        # plain-text prompts (a GSM8K question) become a user turn, so an instruct
                                      #   policy's chat template wraps them; false: the text as given (a base model)
    generation: str = "auto"          # rollout backend: auto, hf or vllm (see smolforge.generation.backends)
    tracking: TrackingSpec = field(default_factory=quiet_tracking)  # report_to: tensorboard | trackio | wandb; prometheus_port
    profile: ProfileSpec = field(default_factory=ProfileSpec)  # torch.profiler trace of a step range into profile/ (off)
    eval_while_training: EvalWhileTraining = field(default_factory=EvalWhileTraining)  # {every: N, suites, stop_on}:
                                      #   checkpoints scored while training; a breach stops it (smolforge.eval_watch)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # seed, fixed threads, deterministic kernels (null: on for CPU runs)
    parity: ParitySpec = field(default_factory=ParitySpec)  # vLLM rollouts: engine-vs-trainer log-prob gap per step,
                                      #   max_gap (nats/token) and on_breach: stop | warn (smolforge.alignment.logprob_parity)
    async_: AsyncSpec | None = field(default=None, metadata={"key": "async"})  # {max_staleness: N}: GRPO on the vLLM
                                      #   server samples the next batches while training, at most N steps stale (off:
                                      #   null; smolforge.alignment.async_rollouts)

    def __post_init__(self) -> None:
        if self.async_ is not None and not hasattr(self, "trainer"):   # PPO: its own loop, no TRL trainer
            raise RecipeError("async: asynchronous rollouts are for GRPO (TRL's rollout hook on the vLLM server); "
                              "this stage samples and trains in turn: drop async:")


def online_defaults(**overrides) -> dict:
    """Trainer values for a CPU demo: short completions, small groups, constant LR."""
    values = dict(max_steps=60, per_device_train_batch_size=16, num_generations=8, max_completion_length=24,
                  learning_rate=5e-6, temperature=1.0, lr_scheduler_type="constant", logging_steps=5)
    values.update(overrides)
    return {"trainer": trainer_defaults(**values)}


def load_prompts(recipe, runs: Runs, seed: int):
    """(paths, data run or None, train rows, held-out rows) for the recipe's ``data``.

    The held-out split is :func:`~smolforge.alignment.common.split_heldout` with ``seed`` (GRPO and
    RLOO pass ``trainer.seed``, PPO ``ppo.seed``), so one seed gives every stage the same split.
    """
    from smolforge.data.schemas import load_many, resolve_data

    paths, data_run = resolve_data(recipe.data, runs, "prompts")
    rows = load_many(paths, "prompt")
    if recipe.chat_prompts:
        rows = [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} if isinstance(row["prompt"], str)
                else row for row in rows]
    train, heldout = split_heldout(rows, recipe.heldout_fraction, seed)
    if not train:
        raise RecipeError(f"{recipe.data}: {len(rows)} prompt rows leave none for training after the "
                          f"held-out split (heldout_fraction {recipe.heldout_fraction})")
    return paths, data_run, train, heldout


def reward_functions(names: list, runs: Runs) -> list[Callable]:
    """The recipe's ``rewards:`` as checked callables (errors name the function); run:<name> in ``runs``."""
    from .rewards import resolve

    if not names:
        raise RecipeError("rewards: name at least one reward function (e.g. [answer_match]) or run:<reward run>")
    return [resolve(name, runs) for name in names]


def recipe_weights(recipe) -> list[float] | None:
    """The weights of the recipe's rewards: beside each reward (``{reward: …, weight: …}``) or as
    ``trainer.reward_weights`` (TRL's field) (:func:`~smolforge.alignment.rewards.merged_weights`)."""
    from .rewards import merged_weights

    return merged_weights(recipe.rewards, getattr(recipe.trainer, "reward_weights", None), "trainer.reward_weights")


def reward_figures(log_history: list[dict], names: list[str], before: list[dict], after: list[dict]) -> dict:
    """run.json's per-reward figures: each reward's last logged training mean and spread (TRL logs
    ``rewards/<name>/mean`` and ``/std`` per step), and its held-out mean before and after.

    >>> logs = [{"rewards/a/mean": 0.5, "rewards/a/std": 0.1}, {"rewards/a/mean": 0.7, "rewards/a/std": 0.2}]
    >>> reward_figures(logs, ["a"], [{"rewards": {"a": 0.0}}], [{"rewards": {"a": 1.0}}])
    {'rl/reward/a/mean_last': 0.7, 'rl/reward/a/std_last': 0.2, 'rl/heldout/a_before': 0.0, 'rl/heldout/a_after': 1.0}
    """
    out: dict = {}
    for name in names:
        for stat in ("mean", "std"):
            logged = [h[f"rewards/{name}/{stat}"] for h in log_history if f"rewards/{name}/{stat}" in h]
            if logged:
                out[f"rl/reward/{name}/{stat}_last"] = round(logged[-1], 5)
        for side, details in (("before", before), ("after", after)):
            values = [d["rewards"].get(name) for d in details if d["rewards"].get(name) is not None]
            if values:
                out[f"rl/heldout/{name}_{side}"] = round(sum(values) / len(values), 5)
    return out


def _choose_rollouts(recipe, model_dir, has_rollout_hook: bool, processes: int = 1) -> tuple[str, str]:
    """(backend, why) without side effects: "trl-vllm", "vllm-server" or "hf"; RecipeError when impossible."""
    from smolforge.generation.backends import pick_backend

    if recipe.trainer.use_vllm:
        return "trl-vllm", f"TRL's vLLM {recipe.trainer.vllm_mode} mode (trainer.use_vllm)"
    backend = pick_backend(recipe.generation, model_dir)
    if backend == "vllm":
        return "trl-vllm", "TRL's vLLM colocate mode (an engine in this process)"
    if backend == "vllm-server" and offered_tools(recipe):
        return "hf", "HF generate (with tools, TRL's tool-call loop regenerates through its own backends)"
    if backend == "vllm-server" and processes > 1:
        return "hf", f"HF generate on each of the {processes} processes (the vLLM server path serves one process)"
    if backend == "vllm-server" and not has_rollout_hook:
        if recipe.generation == "vllm":
            raise RecipeError("generation: vllm on CPU needs TRL's rollout_func hook, which this trainer lacks; "
                              "use generation: hf (or auto)")
        return "hf", "HF generate (this TRL trainer has no rollout hook for the vLLM server path)"
    return backend, backend


def rollout_backend(recipe, model_dir, *, has_rollout_hook: bool, processes: int = 1) -> str:
    """"trl-vllm" (TRL's own vLLM modes), "vllm-server" (our server via rollout_func) or "hf"; logged."""
    backend, why = _choose_rollouts(recipe, model_dir, has_rollout_hook, processes)
    if backend == "trl-vllm" and not recipe.trainer.use_vllm:
        recipe.trainer.use_vllm, recipe.trainer.vllm_mode = True, "colocate"
    log.info("rollouts: %s", why)
    return backend


def check_async(recipe, backend: str, *, has_rollout_hook: bool, processes: int = 1) -> None:
    """RecipeError when the recipe's ``async:`` cannot run with the rollout ``backend`` (before any run exists).

    >>> from types import SimpleNamespace
    >>> trainer = SimpleNamespace(vllm_importance_sampling_correction=True, loss_type="dapo", vllm_mode="colocate")
    >>> recipe = SimpleNamespace(async_=AsyncSpec(max_staleness=1), trainer=trainer, tools=[], generation="auto")
    >>> check_async(recipe, "vllm-server", has_rollout_hook=True)
    >>> check_async(recipe, "hf", has_rollout_hook=False)
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: async: asynchronous rollouts need TRL's rollout_func hook on smolforge's vLLM server, which only GRPO has (this stage's TRL trainer has none): drop async:
    """
    spec = getattr(recipe, "async_", None)
    if spec is None:
        return
    spec.check()
    if backend == "trl-vllm":
        raise RecipeError("async: smolforge's asynchronous rollouts run on its vLLM server (the CPU path); with TRL's "
                          f"own vLLM {recipe.trainer.vllm_mode} mode on a GPU use TRL's AsyncGRPOTrainer "
                          "(trl.experimental.async_grpo: FlashAttention-3, weights over NCCL), or drop async:")
    if not has_rollout_hook:
        raise RecipeError("async: asynchronous rollouts need TRL's rollout_func hook on smolforge's vLLM server, "
                          "which only GRPO has (this stage's TRL trainer has none): drop async:")
    if offered_tools(recipe):
        raise RecipeError("async: not with tools (TRL's tool-call loop regenerates through its own backends): "
                          "drop async: or tools")
    if processes > 1:
        raise RecipeError(f"async: the vLLM server path serves one process, this run has {processes}: drop async:")
    if backend != "vllm-server":
        raise RecipeError(f"async: asynchronous rollouts sample from smolforge's vLLM server, but this run "
                          f"generates with {backend} (generation: {recipe.generation}; the server needs vLLM's CPU "
                          "build and a head size its CPU attention supports): drop async:")
    trainer = recipe.trainer
    if (getattr(trainer, "loss_type", None) == "vespo" and trainer.vllm_importance_sampling_correction
            and trainer.vllm_importance_sampling_mode not in ("token_truncate", "token_mask")):
        raise RecipeError("async: with trainer.loss_type vespo: TRL's importance-sampling correction needs "
                          "trainer.vllm_importance_sampling_mode token_truncate or token_mask there")


def validate_online(recipe, runs: Runs, *, has_rollout_hook: bool = False) -> None:
    """Parent model, prompt rows, reward names, the split and the rollout backend, before any run folder exists."""
    check_tracking(recipe)
    check_profile(recipe.profile, recipe.trainer.max_steps)
    check_determinism(recipe)
    recipe.parity.check()
    check_eval_watch(recipe)
    model_dir = model_parent(runs, recipe.parent).model_dir
    backend, _ = _choose_rollouts(recipe, model_dir, has_rollout_hook)
    check_async(recipe, backend, has_rollout_hook=has_rollout_hook)
    if recipe.chat_prompts and not getattr(load_tokenizer(model_dir), "chat_template", None):
        raise RecipeError(f"chat_prompts: true, but the parent '{recipe.parent}' has no chat template to wrap the "
                          "prompts with (a base model: set chat_prompts: false)")
    if not 0 < recipe.heldout_fraction < 1:
        raise RecipeError(f"heldout_fraction must be between 0 and 1, got {recipe.heldout_fraction}")
    _, _, train, heldout = load_prompts(recipe, runs, recipe.trainer.seed)
    if len(train) < recipe.trainer.num_generations:
        raise RecipeError(f"only {len(train)} training prompts; need at least trainer.num_generations "
                          f"({recipe.trainer.num_generations})")
    reward_functions(recipe.rewards, runs)
    recipe_weights(recipe)


def policy_device(local: Any, *, use_cpu: bool) -> Any:
    """The device the trainer will train the policy on, where its held-out "before" answers are
    sampled too: this rank's device ``local`` (:func:`smolforge.devices.local_device`: its CUDA card,
    else the CPU), or the CPU when the recipe says ``trainer.use_cpu``.

    >>> import torch
    >>> policy_device(torch.device("cuda", 1), use_cpu=False), policy_device(torch.device("cuda", 1), use_cpu=True)
    (device(type='cuda', index=1), device(type='cpu'))
    """
    import torch

    return torch.device("cpu") if use_cpu else local


def load_policy(model_dir: Any, device: Any) -> Any:
    """The starting policy: fp32 master weights (:func:`~.common.load_trainable`) on ``device``
    (:func:`policy_device`). A policy DeepSpeed ZeRO-3 loaded sharded stays as it is: its shards
    already sit on this rank's device, and ``full_weights`` gathers them there."""
    model = load_trainable(model_dir)
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return model
    return model.to(device)


def server_first(cuda: bool) -> bool:
    """Whether the rollout vLLM server must be ready before the policy touches the training device.

    On a CUDA GPU vLLM measures the card's free memory while it starts (it sizes its KV cache from
    it), so a trainer allocating meanwhile makes it fail or mis-size the cache. On CPU nothing is
    shared: vLLM boots while the policy loads and answers the held-out prompts.

    >>> server_first(cuda=True), server_first(cuda=False)
    (True, False)
    """
    return cuda


def start_rollouts(rollouts: Any, *, cuda: bool) -> Any:
    """Start ``rollouts`` (a :class:`~smolforge.generation.rollouts.ServerRollouts`): ready when this
    returns if :func:`server_first`, else booting in the background (its first use waits)."""
    return rollouts.start() if server_first(cuda) else rollouts.start_in_background()


def server_rollout_func(rollouts, tokenizer, args, watch: ParityWatch | None = None) -> Callable:
    """TRL ``rollout_func``: one sampled completion per prompt row from the vLLM server.

    The policy's weights are pushed to the server whenever the trainer's step has moved since
    the last push. TRL's sampler already repeats each prompt ``num_generations`` times. ``watch``
    measures the engine-vs-policy log-prob gap of every batch (logged as ``parity/…`` with TRL's metrics).
    """
    from smolforge.generation.prompts import encode_prompts

    synced = {"step": 0}  # the server starts on the parent's weights = the policy at step 0

    def rollout(prompts: list, trainer) -> dict:
        policy = trainer.accelerator.unwrap_model(trainer.model)
        if trainer.state.global_step != synced["step"]:
            rollouts.sync(policy)
            synced["step"] = trainer.state.global_step
        prompt_ids = encode_prompts(tokenizer, prompts)
        samples = rollouts.generate(prompt_ids, max_tokens=args.max_completion_length,
                                    temperature=args.temperature, top_p=args.top_p)
        completion_ids, logprobs = [ids for ids, _ in samples], [lps for _, lps in samples]
        if watch is not None:
            stats = watch.measure(trainer.state.global_step + 1, policy, prompt_ids, completion_ids, logprobs,
                                  temperature=args.temperature)
            for key, value in stats.items():
                trainer._metrics["train"][key].append(value)     # logged with TRL's own figures of the step
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    return rollout


def heldout_tools(recipe) -> dict:
    """``mean_reward``'s tool settings for a recipe with ``tools:`` (or an ``environment:``): the held-out prompts are answered with
    the tools on offer, as the policy is trained (TRL's ``max_tool_calling_iterations`` rounds, 2 if unset).

    >>> from types import SimpleNamespace
    >>> heldout_tools(SimpleNamespace(tools=["calculator"], trainer=SimpleNamespace(max_tool_calling_iterations=None)))
    {'tools': ['calculator'], 'max_tool_iterations': 2}
    >>> heldout_tools(SimpleNamespace(trainer=None))
    {}
    """
    tools = offered_tools(recipe)   # an environment's answered with its stateless equivalents
    if not tools:
        return {}
    return {"tools": list(tools), "max_tool_iterations": getattr(recipe.trainer, "max_tool_calling_iterations", None) or 2}


def tool_figures(before: list[dict], after: list[dict]) -> dict:
    """run.json's tool-use figures from the held-out details: the share of prompts answered with a tool
    call and the share of calls that were valid, before and after.

    >>> tool_figures([{"tool_calls": 1, "valid_tool_calls": 0}, {"tool_calls": 0, "valid_tool_calls": 0}],
    ...              [{"tool_calls": 2, "valid_tool_calls": 2}, {"tool_calls": 1, "valid_tool_calls": 1}])
    {'rl/tools/called_before': 0.5, 'rl/tools/call_validity_before': 0.0, 'rl/tools/called_after': 1.0, 'rl/tools/call_validity_after': 1.0}
    """
    out: dict = {}
    for side, details in (("before", before), ("after", after)):
        if not details or "tool_calls" not in details[0]:
            continue
        calls = sum(d["tool_calls"] for d in details)
        out[f"rl/tools/called_{side}"] = round(sum(d["tool_calls"] > 0 for d in details) / len(details), 5)
        out[f"rl/tools/call_validity_{side}"] = round(sum(d["valid_tool_calls"] for d in details) / calls, 5) \
            if calls else None
    return out


def loss_settings(trainer: Any) -> dict:
    """What the run's policy loss was (those of these TRL config fields the trainer has), for run.json.

    >>> from types import SimpleNamespace
    >>> loss_settings(SimpleNamespace(loss_type="dapo", importance_sampling_level="sequence"))
    {'rl/loss_type': 'dapo', 'rl/importance_sampling_level': 'sequence'}
    """
    fields = ("loss_type", "importance_sampling_level", "scale_rewards", "multi_objective_aggregation",
              "epsilon", "epsilon_high", "beta")
    return {f"rl/{name}": getattr(trainer, name) for name in fields if getattr(trainer, name, None) is not None}


def is_correction(trainer: Any, backend: str, *, on_server: bool = False) -> dict:
    """run.json's record of the importance-sampling correction for the engine/trainer mismatch: TRL's
    mode where TRL applies it (and logs ``sampling/…``): its own vLLM modes, and smolforge's vLLM-server
    path, synchronous or ``async`` (``on_server``, :func:`~smolforge.alignment.async_rollouts.enable_is_correction`);
    else none (the HF path samples from the policy itself).

    >>> from types import SimpleNamespace
    >>> t = SimpleNamespace(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate")
    >>> is_correction(t, "trl-vllm"), is_correction(t, "vllm-server"), is_correction(t, "vllm-server", on_server=True)
    ({'rl/is_correction': 'token_truncate'}, {'rl/is_correction': 'none'}, {'rl/is_correction': 'token_truncate'})
    """
    on = (backend == "trl-vllm" or (backend == "vllm-server" and on_server)) and \
        getattr(trainer, "vllm_importance_sampling_correction", False)
    return {"rl/is_correction": getattr(trainer, "vllm_importance_sampling_mode", "on") if on else "none"}


def unfixed_sampling(backend: str, seed: int, engine_seed: int = 0) -> tuple[dict, ...]:
    """The rollout samplers a fixed seed and thread count cannot make repeat (run.json's
    ``determinism/nondeterministic``): vLLM's, which batches requests as they arrive (the server, seeded with
    ``seed``, the recipe's), and TRL's in-process engine with its own kernels (``engine_seed``: TRL seeds it
    with the process index over the tensor-parallel size). HF ``generate`` draws from the trainer's seeded
    torch RNG: nothing to name.

    >>> unfixed_sampling("hf", 0)
    ()
    >>> unfixed_sampling("vllm-server", 3)[0]["component"], unfixed_sampling("vllm-server", 3)[0]["seed"]
    ('vllm-server sampling', 3)
    """
    from smolforge.determinism import nondeterministic

    if backend == "vllm-server":
        return (nondeterministic("vllm-server sampling", seed, "the server's sampler (--seed) draws in the order its "
                                 "scheduler batches requests, which follows their arrival; its CPU kernels and "
                                 "threads are its own"),)
    if backend == "trl-vllm":
        return (nondeterministic("trl-vllm sampling", engine_seed, "TRL's vLLM engine samples with its own kernels "
                                 "and batching, outside torch's deterministic mode"),)
    return ()


def engine_seed(recipe) -> int:
    """The seed TRL gives its in-process vLLM engine on this process (its index over the tensor-parallel size)."""
    from .ranks import process_state

    return process_state().process_index // max(1, getattr(recipe.trainer, "vllm_tensor_parallel_size", 1) or 1)


def train_online(stage: str, recipe, runs: Runs, make_trainer: Callable[..., Any], *,
                 overwrite: bool = False, has_rollout_hook: bool = False) -> Run:
    """Parent model + prompts + rewards → TRL trainer → ``model/``, with held-out reward before/after.

    ``make_trainer(model, dataset, tokenizer, reward_fns, callbacks, rollout_func)`` builds the
    TRL trainer; ``rollout_func`` is None unless rollouts go through the vLLM server, which only
    a trainer with TRL's rollout hook (``has_rollout_hook``) can take.
    """
    from datasets import Dataset

    from smolforge.data.jsonl import write_jsonl
    from smolforge.devices import local_device

    from .rewards import mean_reward

    from .ranks import full_weights, process_state, save_trained, start_run, stop_on_request

    parent = model_parent(runs, recipe.parent)
    paths, data_run, train, heldout = load_prompts(recipe, runs, recipe.trainer.seed)
    rewards = reward_functions(recipe.rewards, runs)
    weights = recipe_weights(recipe)
    if weights is not None:
        recipe.trainer.reward_weights = weights            # TRL weighs the rewards' sum (or normalised sum) so
    backend = rollout_backend(recipe, parent.model_dir, has_rollout_hook=has_rollout_hook,
                              processes=process_state().num_processes)
    check_async(recipe, backend, has_rollout_hook=has_rollout_hook, processes=process_state().num_processes)
    device = policy_device(local_device(), use_cpu=recipe.trainer.use_cpu)
    parents = [parent] + ([data_run] if data_run else [])
    fingerprints = lineage_fingerprints(parents, {"prompts": paths})
    with start_run(runs, stage, recipe, parents, fingerprints, overwrite=overwrite) as (run, resume_from), \
            reproducible_training(run, recipe, recipe.trainer.seed, cuda=device.type == "cuda",
                                  nondeterministic=unfixed_sampling(backend, recipe.trainer.seed, engine_seed(recipe))):
        recipe.trainer.output_dir = str(run.checkpoints_dir)
        rollouts = asynchronous = None
        try:
            if backend == "vllm-server":   # on CPU it boots while the policy loads; on a GPU it is ready first
                from smolforge.generation.rollouts import ServerRollouts

                rollouts = ServerRollouts(parent.model_dir, run.rollouts_dir, seed=recipe.trainer.seed)
                start_rollouts(rollouts, cuda=device.type == "cuda")
            tokenizer = load_tokenizer(parent.model_dir)
            model = load_policy(parent.model_dir, device)
            with full_weights(model):
                before, details_before = mean_reward(model, tokenizer, heldout, rewards, weights=weights,
                                                     max_new_tokens=recipe.eval_max_new_tokens, **heldout_tools(recipe))
            log.info("%s: held-out reward of the parent policy %.3f on %d prompts", stage, before, len(heldout))
            watch = ParityWatch(recipe.parity, stage)
            callbacks = [run_logger(run, recipe), stopper := stop_on_request(), profiler := step_profiler(run, recipe)]
            callbacks.append(watcher := eval_watch(run, recipe))
            if backend == "trl-vllm":
                callbacks.append(parity_callback(watch))   # TRL's own vLLM modes log the gap themselves
            rollout_func = None
            if rollouts is not None and recipe.async_ is not None:
                from .async_rollouts import AsyncRollouts

                asynchronous = AsyncRollouts(rollouts, tokenizer, recipe.trainer, recipe.async_, watch)
                rollout_func = asynchronous.rollout
                callbacks.append(asynchronous.callback())
            elif rollouts is not None:
                rollout_func = server_rollout_func(rollouts, tokenizer, recipe.trainer, watch)
            trainer = make_trainer(model, Dataset.from_list(train), tokenizer, rewards, callbacks, rollout_func)
            server_is_mode = "none"
            if asynchronous is not None:
                asynchronous.attach(trainer)
            elif rollout_func is not None:   # the synchronous server path: TRL's IS correction on it too
                from .async_rollouts import enable_is_correction

                server_is_mode = enable_is_correction(trainer)
            with profiler, watcher:
                result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
            stopper.raise_if_stopped()
            watcher.conclude(trainer)
        finally:
            if asynchronous is not None:
                asynchronous.close()
            if rollouts is not None:
                rollouts.stop()
        policy = trainer.accelerator.unwrap_model(trainer.model)
        with full_weights(policy):
            after, details = mean_reward(policy, tokenizer, heldout, rewards, weights=weights,
                                         max_new_tokens=recipe.eval_max_new_tokens, **heldout_tools(recipe))
        save_trained(trainer, run, tokenizer)
        if not trainer.accelerator.is_main_process:
            return run
        write_jsonl(run.heldout_path,
                    [{"before": b, "after": a} for b, a in zip(details_before, details)])
        summary = {**train_summary(trainer, result), **profiler.metrics}
        if summary["train/seconds"] > 0:
            summary["rl/steps_per_s"] = round(summary["train/steps"] / summary["train/seconds"], 4)
        summary.update({"rl/heldout_reward_before": round(before, 5), "rl/heldout_reward_after": round(after, 5),
                        "rl/heldout_prompts": len(heldout), "rl/train_prompts": len(train),
                        "rl/generation": backend, "rl/weight_syncs": rollouts.syncs if rollouts else 0,
                        **loss_settings(recipe.trainer), **watch.summary(),
                        **is_correction(recipe.trainer, backend, on_server=server_is_mode != "none" or (
                                        asynchronous is not None and asynchronous.is_mode != "none")),
                        **(asynchronous.summary() if asynchronous is not None else {}),
                        **reward_figures(trainer.state.log_history, [fn.__name__ for fn in rewards],
                                         details_before, details), **tool_figures(details_before, details)})
        if weights is not None:
            summary["rl/reward_weights"] = weights
        run.finish(metrics=summary)
    return run
