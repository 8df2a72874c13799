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
   full softmax, stopping at eos). With vLLM installed (``generation: auto``) a vLLM server
   holds the policy and samples; its weights are reloaded in place before every rollout
   (:mod:`smolforge.generation.rollouts`); otherwise HF ``generate``;
2. score each completion: the weighted sum of the reward functions (None = "does not apply"
   adds nothing), minus ``missing_eos_penalty`` when it never ended;
3. with one forward each (no gradients) take the log-probs of the sampled tokens under the
   policy and the reference, and the value of every response position; logits are divided by
   the sampling temperature first so the log-probs are those of the distribution sampled from;
4. per-token rewards: −β·KL_t on every response token (eos included), plus the score on the
   last token (:func:`~smolforge.alignment.ppo_math.token_rewards`); KL_t is the ``k1`` estimator
   log π − log π_ref by default (``k3`` optional); β is fixed or adaptive (``target_kl``);
5. optionally scale (not shift) the rewards to unit variance over the batch (``whiten_rewards``);
6. GAE (γ, λ) over the response tokens, bootstrapping 0 after the last one; advantages are then
   whitened over the batch's valid tokens (always, as in TRL);
7. ``ppo_epochs`` passes over shuffled minibatches of ``mini_batch_size`` rollouts: clipped
   surrogate + clipped value loss (both token-averaged), one AdamW step each, gradients of the
   policy and of the value model clipped separately to ``max_grad_norm``;
8. log reward, KL, β, clip fractions, losses, entropy and lengths to ``metrics.jsonl``.

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
  gathers the policy's parameters first. A DeepSpeed config must state
  ``train_micro_batch_size_per_gpu`` (= ``ppo.mini_batch_size``): there is no dataloader for
  accelerate to infer it from.
"""
from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from smolforge.errors import RecipeError
from smolforge.recipe import to_dict
from smolforge.runs import Run, Runs

from smolforge.generation.prompts import load_tokenizer

from .common import lineage_fingerprints, model_parent, split_heldout
from .online import OnlineRecipe

log = logging.getLogger(__name__)


@dataclass
class PPOSpec:
    steps: int = 100                  # PPO iterations (one rollout batch + its updates each)
    batch_size: int = 64              # prompts per rollout batch (per process), one completion each
    mini_batch_size: int = 16         # rollouts per optimizer step; must divide batch_size
    ppo_epochs: int = 4               # passes over each rollout batch
    learning_rate: float = 1.0e-5     # policy AdamW learning rate (constant)
    value_learning_rate: float | None = None  # value model's learning rate (None: learning_rate x 10)
    max_grad_norm: float = 1.0        # gradient-norm clip, applied to policy and value model separately
    kl_coef: float = 0.05             # β: weight of the per-token KL penalty against the reference
    kl_estimator: str = "k1"          # per-token KL: k1 (log π − log π_ref) or k3 (Schulman's, ≥ 0)
    target_kl: float | None = None    # adaptive β towards this per-sequence KL (None: fixed β)
    kl_horizon: int = 10000           # samples over which the adaptive β moves by up to 20 %
    gamma: float = 1.0                # discount of GAE
    lam: float = 0.95                 # λ of GAE
    cliprange: float = 0.2            # ε of the clipped policy ratio
    cliprange_value: float = 0.2      # ε of the clipped value update
    whiten_rewards: bool = False      # scale per-token rewards to unit variance per batch
    missing_eos_penalty: float | None = 1.0  # subtracted from the score of completions without eos
    max_new_tokens: int = 24          # completion length cap during rollouts
    temperature: float = 1.0          # sampling temperature of rollouts (log-probs use it too)
    seed: int = 0                     # prompt order, sampling, and the held-out split (as GRPO's trainer.seed)


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
    need(0 < recipe.heldout_fraction < 1, f"heldout_fraction must be between 0 and 1, got {recipe.heldout_fraction}")
    need(recipe.eval_max_new_tokens >= 1, f"eval_max_new_tokens must be >= 1, got {recipe.eval_max_new_tokens}")
    need(isinstance(recipe.rewards, list) and bool(recipe.rewards),
         "rewards: name at least one reward function (e.g. [answer_match]) or run:<reward run>")
    if recipe.reward_weights is not None:
        need(isinstance(recipe.reward_weights, list) and len(recipe.reward_weights) == len(recipe.rewards),
             f"reward_weights must list one weight per reward ({len(recipe.rewards)}), got {recipe.reward_weights!r}")
        need(all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
                 for w in recipe.reward_weights), f"reward_weights must be numbers, got {recipe.reward_weights!r}")


def load_prompts(recipe: Recipe, runs: Runs):
    """(paths, data run or None, train rows, held-out rows): GRPO's split for the same seed."""
    from smolforge.data.schemas import load_many, resolve_data

    paths, data_run = resolve_data(recipe.data, runs, "prompts")
    rows = load_many(paths, "prompt")
    train, heldout = split_heldout(rows, recipe.heldout_fraction, recipe.ppo.seed)
    if not train:
        raise RecipeError(f"{recipe.data}: {len(rows)} prompt rows leave none for training after the "
                          f"held-out split (heldout_fraction {recipe.heldout_fraction})")
    return paths, data_run, train, heldout


def reward_functions(recipe: Recipe, runs: Runs) -> list:
    """The recipe's rewards as checked callables (a failure names the function); run:<name> in ``runs``."""
    from .rewards import resolve

    return [resolve(spec, runs) for spec in recipe.rewards]


def validate(recipe: Recipe, runs: Runs) -> None:
    """Numbers, parent model, prompt rows, rewards (each called once on two rows' gold answers)."""
    from smolforge.generation.backends import pick_backend

    _check_numbers(recipe)
    pick_backend(recipe.generation, model_parent(runs, recipe.parent).model_dir, accepts=("vllm-server",))
    _, _, train, _ = load_prompts(recipe, runs)
    probe = train[:2]
    texts = [str(row.get("answer") or "") for row in probe]
    score_completions(reward_functions(recipe, runs), recipe.reward_weights, probe, texts, [[] for _ in probe])


# --------------------------------------------------------------------------- scoring


def as_completions(rows: list[dict], texts: list[str]) -> list:
    """TRL's completion format: assistant messages for conversational prompts, else the text."""
    return [[{"role": "assistant", "content": text}] if isinstance(row["prompt"], list) else text
            for row, text in zip(rows, texts)]


def score_completions(reward_fns: list, weights: list | None, rows: list[dict], texts: list[str],
                      completion_ids: list[list[int]]) -> tuple[list[float], dict[str, float]]:
    """(score per completion, mean of each reward function) with TRL's call convention.

    Each function gets ``prompts=``, ``completions=``, ``completion_ids=`` and every other column
    of the rows as a keyword list; the score is Σ weight·reward over the functions that apply
    (None = not applicable).

        >>> rows = [{"prompt": "Add 1 and 2.", "answer": "3"}, {"prompt": "Add 2 and 2.", "answer": "4"}]
        >>> def exact(prompts, completions, answer, **kw):
        ...     return [float(c == a) for c, a in zip(completions, answer)]
        >>> score_completions([exact], [2.0], rows, ["3", "5"], [[], []])
        ([2.0, 0.0], {'exact': 0.5})
    """
    weights = weights or [1.0] * len(reward_fns)
    prompts = [row["prompt"] for row in rows]
    completions = as_completions(rows, texts)
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if k != "prompt"]
    columns = {k: [row.get(k) for row in rows] for k in keys}
    scores = [0.0] * len(rows)
    means = {}
    for fn, weight in zip(reward_fns, weights):
        name = getattr(fn, "__name__", repr(fn))
        values = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        if len(values) != len(rows):  # checked() says so first; a bare callable gets the same message
            raise RecipeError(f"reward function '{name}' returned {len(values)} values for {len(rows)} completions")
        applied = [float(v) for v in values if v is not None]
        means[name] = sum(applied) / len(applied) if applied else float("nan")
        for i, value in enumerate(values):
            if value is not None:
                scores[i] += float(weight) * float(value)
    return scores, means


# --------------------------------------------------------------------------- models


def _modules():
    """torch.nn classes built lazily, so importing this module (the CLI, --help) stays cheap."""
    import torch
    from torch import nn

    class ValueModel(nn.Module):
        """The parent's transformer body and a scalar head: one value per position."""

        def __init__(self, backbone: nn.Module) -> None:
            super().__init__()
            self.backbone = backbone
            self.head = nn.Linear(backbone.config.hidden_size, 1)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

        def forward(self, input_ids, attention_mask, position_ids):
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=False).last_hidden_state
            return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    class PolicyAndValue(nn.Module):
        """Policy and value model as one module: one ``accelerator.prepare``, one optimizer."""

        def __init__(self, policy: nn.Module, value_model: nn.Module) -> None:
            super().__init__()
            self.policy = policy
            self.value_model = value_model

        @property
        def is_gradient_checkpointing(self) -> bool:  # read by TRL's unwrap_model_for_generation
            return bool(getattr(self.policy, "is_gradient_checkpointing", False))

        def gradient_checkpointing_disable(self) -> None:
            self.policy.gradient_checkpointing_disable()

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None) -> None:
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

        def forward(self, input_ids, attention_mask, position_ids, response_length: int):
            """(logits predicting each response token, value of the state before it), ``[B, R(, V)]``."""
            logits = self.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 logits_to_keep=response_length + 1, use_cache=False).logits[:, :-1]
            values = self.value_model(input_ids, attention_mask, position_ids)
            return logits, values[:, -(response_length + 1):-1]

    return torch, ValueModel, PolicyAndValue


def _no_dropout(model) -> None:
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


@dataclass
class Models:
    """What the loop holds: the prepared policy+value module, the frozen reference, the optimizer."""

    accelerator: Any
    model: Any                        # PolicyAndValue, as accelerate prepared it
    ref: Any                          # frozen copy of the parent
    optimizer: Any
    tokenizer: Any

    @property
    def policy(self):
        return self.accelerator.unwrap_model(self.model).policy


def _zero3(accelerator) -> bool:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and plugin.zero_stage == 3


def build_models(model_dir, spec: PPOSpec, accelerator=None) -> Models:
    """Policy, value model and reference from a parent's ``model/``, prepared by accelerate."""
    from accelerate import Accelerator
    from transformers import AutoModel, AutoModelForCausalLM

    torch, ValueModel, PolicyAndValue = _modules()
    accelerator = accelerator or Accelerator()
    tokenizer = load_tokenizer(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    value_model = ValueModel(AutoModel.from_pretrained(model_dir))
    ref = AutoModelForCausalLM.from_pretrained(model_dir)
    for module in (policy, value_model, ref):
        _no_dropout(module)
    ref.requires_grad_(False)
    ref.eval()
    model = PolicyAndValue(policy, value_model)
    value_lr = spec.value_learning_rate if spec.value_learning_rate is not None else 10 * spec.learning_rate
    optimizer = torch.optim.AdamW([{"params": list(policy.parameters()), "lr": spec.learning_rate},
                                   {"params": list(value_model.parameters()), "lr": value_lr}],
                                  eps=1e-5, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        from trl.models.utils import prepare_deepspeed

        ref = prepare_deepspeed(ref, accelerator)
    else:
        ref = ref.to(accelerator.device)
    return Models(accelerator, model, ref, optimizer, tokenizer)


# --------------------------------------------------------------------------- one PPO step


@dataclass
class Rollout:
    """One batch of sampled completions with everything the update needs, ``[B, R]`` tensors."""

    input_ids: Any                    # [B, Q+R] left-padded prompt + right-padded response
    attention_mask: Any
    position_ids: Any
    response_mask: Any                # [B, R] bool: response tokens up to and including eos
    response_ids: Any                 # [B, R]
    logprobs: Any = None
    ref_logprobs: Any = None
    values: Any = None
    advantages: Any = None
    returns: Any = None

    @property
    def response_length(self) -> int:
        return int(self.response_ids.shape[1])

    def rows(self, index):
        return self.input_ids[index], self.attention_mask[index], self.position_ids[index]


def make_rollout(query_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int, device) -> Rollout:
    """Tensors for prompts (left-padded to a common start of the response) + completions (right-padded).

    >>> r = make_rollout([[5, 6], [7]], [[8, 2], [9]], pad_id=0, device="cpu")
    >>> r.input_ids.tolist(), r.response_mask.tolist(), r.position_ids.tolist()
    ([[5, 6, 8, 2], [0, 7, 9, 0]], [[True, True], [True, False]], [[0, 1, 2, 3], [0, 0, 1, 1]])
    """
    import torch

    from smolforge.generation.prompts import left_pad

    queries, query_mask = left_pad(query_ids, pad_id)
    width = max(1, max(len(c) for c in completion_ids))
    responses = torch.full((len(completion_ids), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(completion_ids), width), dtype=torch.bool)
    for i, ids in enumerate(completion_ids):
        if ids:
            responses[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_mask[i, :len(ids)] = True
    input_ids = torch.cat([queries, responses], dim=1)
    attention_mask = torch.cat([query_mask, response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return Rollout(input_ids.to(device), attention_mask.to(device), position_ids.to(device),
                   response_mask.to(device), responses.to(device))


def _logprobs(logits, response_ids, temperature: float):
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(logits, response_ids, temperature=temperature)


def _rollout_forward(models: Models, rollout: Rollout, spec: PPOSpec) -> None:
    """Old log-probs, reference log-probs and values, without gradients, a minibatch at a time."""
    import torch

    logprobs, ref_logprobs, values = [], [], []
    models.model.eval()
    with torch.no_grad():
        for start in range(0, rollout.input_ids.shape[0], spec.mini_batch_size):
            index = slice(start, start + spec.mini_batch_size)
            ids, mask, pos = rollout.rows(index)
            logits, value = models.model(ids, mask, pos, rollout.response_length)
            logprobs.append(_logprobs(logits, rollout.response_ids[index], spec.temperature))
            values.append(value.float())
            ref_logits = models.ref(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                                    logits_to_keep=rollout.response_length + 1).logits[:, :-1]
            ref_logprobs.append(_logprobs(ref_logits, rollout.response_ids[index], spec.temperature))
    models.model.train()
    rollout.logprobs, rollout.ref_logprobs = torch.cat(logprobs), torch.cat(ref_logprobs)
    rollout.values = torch.cat(values)


def ppo_step(models: Models, spec: PPOSpec, rows: list[dict], reward_fns: list, kl_ctl,
             weights: list | None = None, rollouts=None, generator=None) -> dict:
    """One PPO iteration on ``rows`` (prompt rows): rollout → score → advantages → update; its metrics."""
    import torch
    from trl.models.utils import unwrap_model_for_generation
    from trl.trainer.utils import entropy_from_logits

    from . import ppo_math as pm
    from smolforge.generation.hf import HFSampler
    from smolforge.generation.prompts import encode_prompts
    from smolforge.generation.rollouts import ServerSampler

    accelerator, tokenizer = models.accelerator, models.tokenizer
    started = time.perf_counter()
    prompts = [row["prompt"] for row in rows]
    with unwrap_model_for_generation(models.model, accelerator) as unwrapped:
        if rollouts is not None:
            rollouts.sync(unwrapped.policy)
        sampler = ServerSampler(rollouts, tokenizer) if rollouts is not None else HFSampler(unwrapped.policy, tokenizer)
        outputs = sampler.sample(prompts, max_new_tokens=spec.max_new_tokens, temperature=spec.temperature)
    texts, completion_ids = [s.text for s in outputs], [s.token_ids for s in outputs]
    generated = time.perf_counter()

    scores, reward_means = score_completions(reward_fns, weights, rows, texts, completion_ids)
    eos_ids = {tokenizer.eos_token_id}
    ended = [bool(ids) and ids[-1] in eos_ids for ids in completion_ids]
    score = torch.tensor(scores, dtype=torch.float32, device=accelerator.device)
    if spec.missing_eos_penalty is not None:
        score -= spec.missing_eos_penalty * (~torch.tensor(ended, device=accelerator.device)).float()

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rollout = make_rollout(encode_prompts(tokenizer, prompts), completion_ids, pad_id, accelerator.device)
    _rollout_forward(models, rollout, spec)
    mask = rollout.response_mask
    kl = pm.per_token_kl(rollout.logprobs, rollout.ref_logprobs, spec.kl_estimator)
    rewards = pm.token_rewards(score, kl, mask, kl_ctl.value)
    if spec.whiten_rewards:
        rewards = pm.masked_whiten(rewards, mask, shift_mean=False)
    advantages, returns = pm.gae(rewards, rollout.values, mask, spec.gamma, spec.lam)
    rollout.advantages, rollout.returns = pm.masked_whiten(advantages, mask), returns

    totals: dict[str, float] = {}
    n_updates = 0
    unwrapped = accelerator.unwrap_model(models.model)
    batch = rollout.input_ids.shape[0]
    for _ in range(spec.ppo_epochs):
        order = torch.randperm(batch, generator=generator).to(accelerator.device)
        for start in range(0, batch, spec.mini_batch_size):
            index = order[start:start + spec.mini_batch_size]
            ids, attn, pos = rollout.rows(index)
            logits, values = models.model(ids, attn, pos, rollout.response_length)
            logprobs = _logprobs(logits, rollout.response_ids[index], spec.temperature)
            m = mask[index]
            pg_loss, clipfrac, approx_kl = pm.policy_loss(logprobs, rollout.logprobs[index],
                                                          rollout.advantages[index], m, spec.cliprange)
            vf_loss, vf_clipfrac = pm.value_loss(values.float(), rollout.values[index], rollout.returns[index], m,
                                                 spec.cliprange_value)
            accelerator.backward(pg_loss + vf_loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(unwrapped.policy.parameters(), spec.max_grad_norm)
                accelerator.clip_grad_norm_(unwrapped.value_model.parameters(), spec.max_grad_norm)
            models.optimizer.step()
            models.optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                entropy = pm.masked_mean(entropy_from_logits(logits.detach() / spec.temperature), m)
            for key, value in (("policy_loss", pg_loss), ("value_loss", vf_loss), ("clipfrac", clipfrac),
                               ("value_clipfrac", vf_clipfrac), ("approx_kl", approx_kl), ("entropy", entropy)):
                totals[key] = totals.get(key, 0.0) + float(value.detach())
            n_updates += 1

    kl_per_sequence = (torch.where(mask, kl, torch.zeros_like(kl))).sum(1)
    local = {
        "reward": score.mean(), "reward_std": score.std() if len(scores) > 1 else torch.tensor(0.0),
        "kl": kl_per_sequence.mean(), "non_score_reward": -kl_ctl.value * kl_per_sequence.mean(),
        "completion_length": mask.sum(1).float().mean(), "eos_frac": torch.tensor(ended).float().mean(),
        "value_mean": pm.masked_mean(rollout.values, mask), "advantage_raw_mean": pm.masked_mean(advantages, mask),
        **{key: torch.tensor(value / n_updates) for key, value in totals.items()},
        **{f"rewards/{name}": torch.tensor(value) for name, value in reward_means.items()},
    }
    keys = list(local)
    stacked = torch.stack([torch.as_tensor(local[k], dtype=torch.float32).to(accelerator.device) for k in keys])
    reduced = accelerator.reduce(stacked, reduction="mean")
    metrics = {k: round(float(v), 6) for k, v in zip(keys, reduced.tolist())}
    metrics["kl_coef"] = kl_ctl.value
    kl_ctl.update(metrics["kl"], batch * accelerator.num_processes)
    metrics["generate_s"] = round(generated - started, 3)
    metrics["step_s"] = round(time.perf_counter() - started, 3)
    return metrics


# --------------------------------------------------------------------------- the stage


class _NoRun:
    """Stands in for the run on processes other than the main one: they train, it records."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
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


@contextlib.contextmanager
def _gathered(models: Models):
    """The policy's full parameters on every process (ZeRO-3 shards them), for saving."""
    if _zero3(models.accelerator):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(models.policy.parameters()), modifier_rank=None):
            yield
    else:
        yield


def heldout_reward(models: Models, rows: list[dict], reward_fns: list, max_new_tokens: int) -> tuple[float, list]:
    """Mean verifier reward of greedy answers to ``rows`` (:func:`smolforge.alignment.rewards.mean_reward`)."""
    from trl.models.utils import unwrap_model_for_generation

    from .rewards import mean_reward

    with unwrap_model_for_generation(models.model, models.accelerator) as unwrapped:
        return mean_reward(unwrapped.policy, models.tokenizer, rows, reward_fns, max_new_tokens=max_new_tokens)


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from smolforge.data.jsonl import write_jsonl

    from . import ppo_math as pm
    from smolforge.generation.backends import pick_backend

    spec = recipe.ppo
    accelerator = Accelerator()
    main = accelerator.is_main_process
    parent = model_parent(runs, recipe.parent)
    paths, data_run, train, heldout = load_prompts(recipe, runs)
    reward_fns = reward_functions(recipe, runs)
    parents = [parent] + ([data_run] if data_run else [])
    backend = pick_backend(recipe.generation, parent.model_dir, accepts=("vllm-server",))
    if backend != "hf" and accelerator.num_processes > 1:
        log.info("ppo: %d processes; vLLM rollouts serve one process, so each generates with HF",
                 accelerator.num_processes)
        backend = "hf"
    context = runs.start("ppo", recipe.name, to_dict(recipe), parents=parents, overwrite=overwrite,
                         data_fingerprints=lineage_fingerprints(parents, {"prompts": paths})) if main else _NoRun()
    with context as run:
        set_seed(spec.seed, device_specific=True)
        models = build_models(parent.model_dir, spec, accelerator)
        before, details_before = heldout_reward(models, heldout, reward_fns, recipe.eval_max_new_tokens)
        log.info("ppo: held-out reward of the parent policy %.3f on %d prompts", before, len(heldout))
        kl_ctl = pm.KLController(spec.kl_coef, spec.target_kl, spec.kl_horizon)
        rng = random.Random(spec.seed * 1000 + accelerator.process_index)
        generator = torch.Generator().manual_seed(spec.seed)
        batches = _batches(train, spec.batch_size, rng)
        rollouts = None
        if backend != "hf":
            from smolforge.generation.rollouts import ServerRollouts

            rollouts = ServerRollouts(parent.model_dir, run.path / "rl" / "rollouts", seed=spec.seed).start()
        started = time.perf_counter()
        try:
            history = _train(models, spec, recipe, run, batches, reward_fns, kl_ctl, rollouts, generator)
        finally:
            if rollouts is not None:
                rollouts.stop()
        seconds = time.perf_counter() - started
        after, details_after = heldout_reward(models, heldout, reward_fns, recipe.eval_max_new_tokens)
        log.info("ppo: held-out reward %.3f -> %.3f", before, after)
        accelerator.wait_for_everyone()
        with _gathered(models):
            if main:
                run.save_model(models.policy, models.tokenizer)
        if main:
            write_jsonl(run.path / "rl" / "heldout.jsonl",
                        [{"before": b, "after": a} for b, a in zip(details_before, details_after)])
            last = history[-min(10, len(history)):]
            run.finish(metrics={
                "rl/heldout_reward_before": round(before, 5), "rl/heldout_reward_after": round(after, 5),
                "rl/heldout_prompts": len(heldout), "rl/train_prompts": len(train),
                "train/steps": spec.steps, "train/seconds": round(seconds, 1),
                "rl/generation": backend, "rl/weight_syncs": rollouts.syncs if rollouts else 0,
                "rl/first_reward": history[0]["reward"],
                "rl/last_reward": round(sum(h["reward"] for h in last) / len(last), 5),
                "rl/last_kl": round(sum(h["kl"] for h in last) / len(last), 5),
                "rl/kl_coef": kl_ctl.value,
            })
    accelerator.wait_for_everyone()
    return run if main else runs.get(recipe.name, require_done=False)


def _train(models: Models, spec: PPOSpec, recipe: Recipe, run, batches, reward_fns, kl_ctl, rollouts,
           generator) -> list[dict]:
    """The PPO iterations; each step's metrics, logged to the run as they come."""
    history = []
    for step in range(1, spec.steps + 1):
        metrics = ppo_step(models, spec, next(batches), reward_fns, kl_ctl, recipe.reward_weights,
                           rollouts, generator)
        history.append(metrics)
        run.log(step, **metrics)
        if not all(math.isfinite(metrics[k]) for k in ("policy_loss", "value_loss", "kl")):
            raise RuntimeError(f"ppo step {step}: non-finite loss or KL ({metrics}); lower ppo.learning_rate")
        log.info("ppo step %d/%d: reward %.3f kl %.3f clipfrac %.3f", step, spec.steps, metrics["reward"],
                 metrics["kl"], metrics["clipfrac"])
    return history
