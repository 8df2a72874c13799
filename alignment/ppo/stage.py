"""Proximal policy optimisation of a run's model with a learned value function, on verifier rewards.

    smolforge ppo --config recipes/demo/ppo.yaml
    smolforge ppo --config recipes/demo/ppo.yaml --set ppo.steps=20 --set ppo.kl_coef=0.05
    accelerate launch --config_file ds.yaml -m smolforge ppo --config recipes/demo/ppo.yaml

Reads a parent run (an SFT model) and RL prompts (a data run's ``prompts`` kind: ``{"prompt",
"answer"}`` rows, or a ``.jsonl`` of them), like the GRPO and RLOO stages, with the same reward
functions (``rewards:``, TRL's signature, see :mod:`smolforge.alignment.rewards`) and the same held-out
split; ``rl/heldout_reward_before`` / ``rl/heldout_reward_after`` in run.json are the mean
verifier reward of greedy answers to the held-out prompts. ``model/`` is a plain HF model.

TRL dropped its ``PPOTrainer`` after 1.12, so smolforge owns this loop; it is the algorithm of
that trainer (itself following "The N Implementation Details of RLHF with PPO", Huang et al.
2024, and OpenAI's lm-human-preferences), on the same machinery: HF models, an accelerate
``Accelerator`` (so ``accelerate launch`` with a DDP or DeepSpeed config spreads it over GPUs),
TRL's log-softmax/entropy kernels and its ``unwrap_model_for_generation``. One step:

1. sample ``batch_size`` training prompts (shuffled epochs of the split) and generate one
   completion each with the policy (:mod:`smolforge.generation`; temperature sampling from the
   full softmax, stopping at an end token: the tokenizer's eos or one the policy's
   ``generation_config`` names). With vLLM installed (``generation: auto``) a vLLM server
   holds the policy and samples; its weights are reloaded in place before every rollout
   (:mod:`smolforge.generation.rollouts`); otherwise HF ``generate``;
2. score each completion: the weighted sum of the reward functions (None = "does not apply"
   adds nothing), minus ``missing_eos_penalty`` when it never ended (its last token is not one
   of those end tokens; :mod:`smolforge.alignment.ppo.scoring`);
3. with one forward each (no gradients) take the log-probs of the sampled tokens under the
   policy and the reference, and the value of every response position; logits are divided by
   the sampling temperature first so the log-probs are those of the distribution sampled from;
4. per-token rewards: −β·KL_t on every response token (eos included), plus the score on the
   last token (:func:`~smolforge.alignment.ppo.math.token_rewards`); KL_t is the ``k1`` estimator
   log π − log π_ref by default (``k3`` optional); β is fixed or adaptive (``target_kl``);
5. optionally scale (not shift) the rewards to unit variance over the batch (``whiten_rewards``);
6. GAE (γ, λ) over the response tokens, bootstrapping 0 after the last one; advantages are then
   whitened over the batch's valid tokens (always, as in TRL);
7. ``ppo_epochs`` passes over shuffled minibatches of ``mini_batch_size`` rollouts: clipped
   surrogate + clipped value loss (both token-averaged), one AdamW step each, gradients of the
   policy and of the value model clipped separately to ``max_grad_norm``;
8. log reward, KL, β, clip fractions, losses, entropy and lengths to ``metrics.jsonl``.

This module is the stage (recipe, ``validate``, ``run`` and the loop over steps). One step is
:func:`smolforge.alignment.ppo.step.step`, a function per phase above; the networks are
:mod:`smolforge.alignment.ppo.models` (imported only inside functions here, so importing this
module stays free of torch); the ``ppo:`` settings are :class:`~smolforge.alignment.ppo.spec.PPOSpec`;
the arithmetic is :mod:`smolforge.alignment.ppo.math`; prompts and
rewards load through :mod:`smolforge.alignment.online`, as for GRPO and RLOO.

Choices:
- *Reference*: a second frozen copy of the parent (no gradients, eval mode; DeepSpeed-initialised
  for inference under ZeRO-3, as TRL's ``prepare_deepspeed`` does).
- *Value model*: the parent's transformer body (``AutoModel`` from the parent's weights, without
  its LM head) plus a separate ``nn.Linear(hidden, 1)`` on each position's last hidden state,
  zero-initialised so the first values are 0 (lm-human-preferences' choice). Not
  ``AutoModelForTokenClassification``: not every causal-LM architecture has that class, and its
  head sits behind dropout and a randomly initialised classifier. Policy and value model are
  separate networks (no shared trunk, as TRL did), held in one module so accelerate/DeepSpeed
  prepare a single model with one optimizer; the value model has its own learning rate
  (``value_learning_rate``), so no value-loss coefficient is needed.
- *Dropout* is switched off in all three models (rollout and update log-probs must agree).
- *Rollout log-probs* are recomputed by the training model in step 3, whichever backend sampled:
  the update never trusts the sampler's numbers (they agree to ~1e-6 in fp32 anyway).
- What is not here: a reward model's own score whitening, LR annealing, multiple generations per
  prompt, vLLM rollouts with more than one training process (each process then uses HF), and
  in-process (colocated) vLLM. Saving under ZeRO-3
  gathers the policy's parameters first.
- *Scale*: ``ppo.precision`` (bf16 on a GPU by default), ``ppo.deepspeed`` (a DeepSpeed JSON,
  used when the launcher gave accelerate none) and ``ppo.gradient_checkpointing`` are what make
  a 3B policy + value model + reference fit a GPU (:func:`make_accelerator`); ``smolforge plan
  recipes/smollm3-3b/ppo.yaml --model recipes/smollm3-3b/pretrain.yaml --gpus 8`` estimates the
  memory per GPU (docs/planner.md, "PPO"). There is no dataloader for accelerate to infer
  DeepSpeed's ``train_micro_batch_size_per_gpu`` from: "auto" is filled with
  ``ppo.mini_batch_size``, and any other value must equal it. Under DeepSpeed the engine clips
  the global gradient norm of policy and value model together (``gradient_clipping``, "auto" =
  ``ppo.max_grad_norm``), not each separately. A vLLM rollout server on the trainer's GPU
  reserves ``ppo.vllm_gpu_memory_utilization`` of it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from smolforge.errors import RecipeError
from smolforge.profiling import StepProfiler, check_profile
from smolforge.recipe import to_dict
from smolforge.runs import Run, RunLayout, Runs, is_run

from ..common import (check_determinism, check_tracking, lineage_fingerprints, model_parent, open_tracker,
                      reproducible_training)
from ..online import OnlineRecipe, load_prompts, reward_functions, start_rollouts, unfixed_sampling
from .scoring import score_completions
from .spec import PRECISIONS, PPOSpec

log = logging.getLogger(__name__)


@dataclass
class Recipe(OnlineRecipe):
    name: str = "ppo-demo"            # run name
    # parent, data, rewards, heldout_fraction, eval_max_new_tokens: see smolforge.alignment.online.OnlineRecipe
    reward_weights: list | None = None  # one weight per reward (default: 1 each); the score is the weighted sum
    generation: str = "auto"          # rollout backend: auto, hf or vllm (see smolforge.generation.backends)
    ppo: PPOSpec = field(default_factory=PPOSpec)  # the PPO loop's settings


# --------------------------------------------------------------------------- validation


def _check_numbers(recipe: Recipe) -> None:
    spec = recipe.ppo

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise RecipeError(message)

    for key in ("steps", "batch_size", "mini_batch_size", "ppo_epochs", "max_new_tokens", "kl_horizon"):
        need(getattr(spec, key) >= 1, f"ppo.{key} must be >= 1, got {getattr(spec, key)}")
    need(spec.batch_size % spec.mini_batch_size == 0,
         f"ppo.mini_batch_size ({spec.mini_batch_size}) must divide ppo.batch_size ({spec.batch_size}); "
         f"e.g. ppo.mini_batch_size={max(d for d in range(1, min(spec.mini_batch_size, spec.batch_size) + 1) if spec.batch_size % d == 0)}")
    need(spec.learning_rate > 0, f"ppo.learning_rate must be > 0, got {spec.learning_rate}")
    need(spec.value_learning_rate is None or spec.value_learning_rate > 0,
         f"ppo.value_learning_rate must be > 0 (or null), got {spec.value_learning_rate}")
    need(spec.max_grad_norm > 0, f"ppo.max_grad_norm must be > 0, got {spec.max_grad_norm}")
    need(spec.kl_coef >= 0, f"ppo.kl_coef must be >= 0, got {spec.kl_coef}")
    need(spec.kl_estimator in ("k1", "k3"), f"ppo.kl_estimator must be k1 or k3, got {spec.kl_estimator!r}")
    need(spec.target_kl is None or spec.target_kl > 0, f"ppo.target_kl must be > 0 (or null), got {spec.target_kl}")
    need(spec.target_kl is None or spec.kl_coef > 0, "ppo.target_kl needs ppo.kl_coef > 0 to adapt from")
    need(0 <= spec.gamma <= 1, f"ppo.gamma must be in [0, 1], got {spec.gamma}")
    need(0 <= spec.lam <= 1, f"ppo.lam must be in [0, 1], got {spec.lam}")
    need(spec.cliprange > 0, f"ppo.cliprange must be > 0, got {spec.cliprange}")
    need(spec.cliprange_value > 0, f"ppo.cliprange_value must be > 0, got {spec.cliprange_value}")
    need(spec.temperature > 0, f"ppo.temperature must be > 0, got {spec.temperature}")
    need(spec.precision in PRECISIONS, f"ppo.precision must be one of {', '.join(PRECISIONS)}, got {spec.precision!r}")
    need(isinstance(spec.gradient_checkpointing, bool),
         f"ppo.gradient_checkpointing must be true or false, got {spec.gradient_checkpointing!r}")
    need(0 < spec.vllm_gpu_memory_utilization < 1,
         f"ppo.vllm_gpu_memory_utilization is a share of the GPU, between 0 and 1 (e.g. 0.3), "
         f"got {spec.vllm_gpu_memory_utilization}")
    if spec.deepspeed is not None:
        deepspeed_config(spec)
    need(0 < recipe.heldout_fraction < 1, f"heldout_fraction must be between 0 and 1, got {recipe.heldout_fraction}")
    need(recipe.eval_max_new_tokens >= 1, f"eval_max_new_tokens must be >= 1, got {recipe.eval_max_new_tokens}")
    need(isinstance(recipe.rewards, list) and bool(recipe.rewards),
         "rewards: name at least one reward function (e.g. [answer_match]) or run:<reward run>")
    from ..rewards import merged_weights

    merged_weights(recipe.rewards, recipe.reward_weights, "reward_weights")   # given beside the rewards, or here


def deepspeed_config(spec: PPOSpec) -> dict:
    """``spec.deepspeed`` read and checked: a JSON object with ``zero_optimization``, whose micro-batch
    (when not "auto") is ``ppo.mini_batch_size``; a RecipeError naming the file otherwise."""
    path = Path(spec.deepspeed)
    if not path.is_file():
        raise RecipeError(f"ppo.deepspeed: {path} not found (a DeepSpeed JSON such as recipes/smollm3-3b/zero3.json, "
                          "relative to the working directory)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(f"ppo.deepspeed: {path} is not JSON ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("zero_optimization"), dict):
        raise RecipeError(f"ppo.deepspeed: {path} must be a JSON object with a zero_optimization section")
    check_micro_batch(config.get("train_micro_batch_size_per_gpu", "auto"), spec, str(path))
    enabled = (config.get("bf16") or {}).get("enabled", "auto")
    if isinstance(enabled, bool) and spec.precision != "auto" and enabled != (spec.precision == "bf16"):
        raise RecipeError(f"ppo.deepspeed: {path} sets bf16.enabled={str(enabled).lower()} but ppo.precision is "
                          f"{spec.precision}; set bf16.enabled to \"auto\" (it then follows ppo.precision)")
    return config


def check_micro_batch(value, spec: PPOSpec, source: str) -> None:
    """A DeepSpeed micro-batch must be "auto" (filled with ``ppo.mini_batch_size``) or equal to it."""
    if value != "auto" and value != spec.mini_batch_size:
        raise RecipeError(f"{source}: train_micro_batch_size_per_gpu is {value!r} but PPO steps on "
                          f"ppo.mini_batch_size={spec.mini_batch_size} rollouts; set it to \"auto\" or "
                          f"{spec.mini_batch_size}")


def validate(recipe: Recipe, runs: Runs) -> None:
    """Numbers, parent model, prompt rows, rewards (each called once on two rows' gold answers)."""
    from smolforge.generation.backends import pick_backend

    _check_numbers(recipe)
    recipe.parity.check()
    check_tracking(recipe)
    check_profile(recipe.profile, recipe.ppo.steps)
    check_determinism(recipe)
    pick_backend(recipe.generation, model_parent(runs, recipe.parent).model_dir, accepts=("vllm-server",))
    _, _, train, _ = load_prompts(recipe, runs, recipe.ppo.seed)
    probe = train[:2]
    texts = [str(row.get("answer") or "") for row in probe]
    score_completions(reward_functions(recipe.rewards, runs), recipe.reward_weights, probe, texts,
                      [[] for _ in probe])


# --------------------------------------------------------------------------- the stage


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    """Parent model + prompts + rewards → ``ppo.steps`` iterations → ``model/``, held-out reward before/after."""
    from accelerate.utils import set_seed

    from smolforge.data.jsonl import write_jsonl

    from .models import build_models, gathered_policy

    from ..rewards import merged_weights

    spec = recipe.ppo
    recipe.reward_weights = merged_weights(recipe.rewards, recipe.reward_weights, "reward_weights")
    accelerator = make_accelerator(spec)
    main = accelerator.is_main_process
    parent = model_parent(runs, recipe.parent)
    paths, data_run, train, heldout = load_prompts(recipe, runs, spec.seed)
    reward_fns = reward_functions(recipe.rewards, runs)
    parents = [parent] + ([data_run] if data_run else [])
    backend = _rollout_backend(recipe, parent.model_dir, accelerator.num_processes)
    context = runs.start("ppo", recipe.name, to_dict(recipe), parents=parents, overwrite=overwrite,
                         data_fingerprints=lineage_fingerprints(parents, {"prompts": paths})) if main \
        else _NoRun(runs.root / recipe.name, accelerator.process_index)
    with context as run, reproducible_training(run, recipe, spec.seed, cuda=accelerator.device.type == "cuda",
                                               nondeterministic=unfixed_sampling(backend, spec.seed)):
        set_seed(spec.seed, device_specific=True)
        with _rollouts(backend, parent.model_dir, run, spec, cuda=accelerator.device.type == "cuda") as rollouts:
            models = build_models(parent.model_dir, spec, accelerator)
            before, details_before = heldout_reward(models, heldout, reward_fns, recipe.eval_max_new_tokens,
                                                      recipe.reward_weights)
            log.info("ppo: held-out reward of the parent policy %.3f on %d prompts", before, len(heldout))
            started = time.perf_counter()
            with (open_tracker(run, recipe, main) as tracker,
                  StepProfiler(recipe.profile, run.path, accelerator.process_index, main=main) as profiler):
                history, kl_coef = _train(models, recipe, run, train, reward_fns, rollouts, tracker, profiler)
            seconds = time.perf_counter() - started
        after, details_after = heldout_reward(models, heldout, reward_fns, recipe.eval_max_new_tokens,
                                                      recipe.reward_weights)
        log.info("ppo: held-out reward %.3f -> %.3f", before, after)
        accelerator.wait_for_everyone()
        with gathered_policy(models):
            if main:
                run.save_model(models.policy, models.tokenizer)
        if main:
            write_jsonl(run.heldout_path,
                        [{"before": b, "after": a} for b, a in zip(details_before, details_after)])
            run.finish(metrics={
                "rl/heldout_reward_before": round(before, 5), "rl/heldout_reward_after": round(after, 5),
                "rl/heldout_prompts": len(heldout), "rl/train_prompts": len(train),
                "train/steps": spec.steps, "train/seconds": round(seconds, 1),
                "rl/generation": backend, "rl/weight_syncs": rollouts.syncs if rollouts else 0,
                **_last_steps(history), "rl/kl_coef": kl_coef, **profiler.metrics,
            })
    accelerator.wait_for_everyone()
    return run if main else runs.get(recipe.name, require_done=False)


def _train(models, recipe: Recipe, run, train: list[dict], reward_fns: list, rollouts,
           tracker=None, profiler: StepProfiler | None = None) -> tuple[list[dict], float]:
    """The PPO iterations on shuffled batches of ``train``: each step's metrics (logged as they come), final β;
    ``profiler.step()`` after each."""
    import torch

    from ..logprob_parity import ParityWatch
    from .math import KLController
    from .step import step

    spec, accelerator = recipe.ppo, models.accelerator
    kl_ctl = KLController(spec.kl_coef, spec.target_kl, spec.kl_horizon)
    watch = ParityWatch(recipe.parity, "ppo") if rollouts is not None else None
    batches = _batches(train, spec.batch_size, random.Random(spec.seed * 1000 + accelerator.process_index))
    generator = torch.Generator().manual_seed(spec.seed)
    history = []
    for number in range(1, spec.steps + 1):
        metrics = step(models, spec, next(batches), reward_fns, kl_ctl, recipe.reward_weights, rollouts, generator,
                       watch=watch, number=number)
        history.append(metrics)
        run.log(number, **metrics)
        if tracker is not None:
            tracker.log(number, metrics)
        if not all(math.isfinite(metrics[k]) for k in ("policy_loss", "value_loss", "kl")):
            raise RuntimeError(f"ppo step {number}: non-finite loss or KL ({metrics}); lower ppo.learning_rate")
        log.info("ppo step %d/%d: reward %.3f kl %.3f clipfrac %.3f", number, spec.steps, metrics["reward"],
                 metrics["kl"], metrics["clipfrac"])
        if profiler is not None:
            profiler.step()
    if watch is not None:
        run.update_metrics(watch.summary())
    return history, kl_ctl.value


def _last_steps(history: list[dict]) -> dict[str, float]:
    """run.json's view of training: the first step's reward, the last ten steps' mean reward and KL."""
    last = history[-min(10, len(history)):]
    return {"rl/first_reward": history[0]["reward"],
            "rl/last_reward": round(sum(h["reward"] for h in last) / len(last), 5),
            "rl/last_kl": round(sum(h["kl"] for h in last) / len(last), 5)}


def _rollout_backend(recipe: Recipe, model_dir, num_processes: int) -> str:
    """"hf" or "vllm-server" (:func:`~smolforge.generation.backends.pick_backend`); HF with several processes."""
    from smolforge.generation.backends import pick_backend

    backend = pick_backend(recipe.generation, model_dir, accepts=("vllm-server",))
    if backend != "hf" and num_processes > 1:
        log.info("ppo: %d processes; vLLM rollouts serve one process, so each generates with HF", num_processes)
        return "hf"
    return backend


@contextlib.contextmanager
def _rollouts(backend: str, model_dir, run, spec: PPOSpec, *, cuda: bool):
    """A vLLM server holding the policy for "vllm-server", else None (HF generate); stopped on exit.
    On CPU it boots in the background while the models load (its first use waits); on a CUDA GPU it
    is ready before the models touch the card (:func:`~.online.server_first`)."""
    if backend == "hf":
        yield None
        return
    rollouts = server_rollouts(model_dir, run.rollouts_dir, spec)
    try:
        yield start_rollouts(rollouts, cuda=cuda)
    finally:
        rollouts.stop()


def server_rollouts(model_dir, workdir, spec: PPOSpec):
    """The (not yet started) vLLM server rollouts for ``spec``: its seed and its share of the GPU."""
    from smolforge.generation.rollouts import ServerRollouts

    return ServerRollouts(model_dir, workdir, seed=spec.seed, gpu_memory_utilization=spec.vllm_gpu_memory_utilization)


def resolved_precision(precision: str, cuda: bool) -> str:
    """``ppo.precision`` made concrete: "auto" is bf16 on a CUDA GPU and fp32 on CPU.

    >>> resolved_precision("auto", cuda=True), resolved_precision("auto", cuda=False), resolved_precision("bf16", False)
    ('bf16', 'fp32', 'bf16')
    """
    return ("bf16" if cuda else "fp32") if precision == "auto" else precision


def make_accelerator(spec: PPOSpec):
    """accelerate's ``Accelerator`` in ``ppo.precision``, on DeepSpeed with ``ppo.deepspeed`` unless the
    launcher already gave one (``accelerate launch --config_file``); its "auto" values filled for PPO.

    PPO hands accelerate no dataloader, so accelerate cannot infer DeepSpeed's micro-batch: an
    "auto" ``train_micro_batch_size_per_gpu`` becomes ``ppo.mini_batch_size`` (accelerate then
    fills ``train_batch_size`` = micro-batch × accumulation (1) × processes); an "auto"
    ``gradient_clipping`` becomes ``ppo.max_grad_norm`` (under DeepSpeed the engine clips the
    global norm of policy and value model together; accelerate's own fallback would be 1.0).
    ``bf16.enabled: "auto"`` follows the precision; accelerate fills the hidden-size keys from the
    model's config.
    """
    import os

    import torch
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    mixed = "bf16" if resolved_precision(spec.precision, torch.cuda.is_available()) == "bf16" else "no"
    plugin = None
    if spec.deepspeed and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        log.info("ppo: the launcher's DeepSpeed config is used; ppo.deepspeed (%s) is not", spec.deepspeed)
    elif spec.deepspeed:
        plugin = DeepSpeedPlugin(hf_ds_config=deepspeed_config(spec))
    accelerator = Accelerator(mixed_precision=mixed, deepspeed_plugin=plugin)
    state_plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if state_plugin is not None:
        config = state_plugin.deepspeed_config
        check_micro_batch(config.get("train_micro_batch_size_per_gpu", "auto"), spec, "the DeepSpeed config")
        config["train_micro_batch_size_per_gpu"] = spec.mini_batch_size
        if config.get("gradient_clipping", "auto") == "auto":
            config["gradient_clipping"] = spec.max_grad_norm
    return accelerator


def heldout_reward(models, rows: list[dict], reward_fns: list, max_new_tokens: int,
                   weights: list | None = None) -> tuple[float, list]:
    """Mean verifier reward of greedy answers to ``rows`` (:func:`smolforge.alignment.rewards.mean_reward`)."""
    from trl.models.utils import unwrap_model_for_generation

    from ..rewards import mean_reward

    with unwrap_model_for_generation(models.model, models.accelerator) as unwrapped:
        return mean_reward(unwrapped.policy, models.tokenizer, rows, reward_fns, max_new_tokens=max_new_tokens,
                           weights=weights)


class _NoRun(RunLayout):
    """Stands in for the run on processes other than the main one: they train, it records; an
    exception on this rank still fails the run, with this rank's message."""

    def __init__(self, path, rank: int) -> None:
        super().__init__(path)
        self.rank = rank

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and is_run(self.path):
            from ..ranks import fail_from_rank

            fail_from_rank(Run(self.path), self.rank, exc)
        return False

    def log(self, step, **values) -> None:
        pass


def _batches(rows: list[dict], size: int, rng: random.Random):
    """Endless batches of ``size`` rows: shuffled passes over ``rows``, a batch may span two."""
    pool: list[dict] = []
    while True:
        while len(pool) < size:
            epoch = list(rows)
            rng.shuffle(epoch)
            pool += epoch
        yield pool[:size]
        pool = pool[size:]
