"""Pretrain a SmolLM3-architecture base model from scratch on a DeepSpeed engine.

    smolforge pretrain --config recipes/demo/pretrain.yaml
    smolforge pretrain --config recipes/demo/pretrain.yaml --set train.max_steps=50 --set train.schedule=wsd
    torchrun --nproc_per_node 2 -m smolforge pretrain --config recipes/demo/pretrain.yaml --set train.zero_stage=3

Reads a data run (``data/pretrain.jsonl`` + ``tokenizer/``), packs each domain's documents
padding-free with per-document position ids (no attention across documents), and trains with
ZeRO 0-3 (optimizer offload optional; gloo on CPU, NCCL on GPU), warmup then cosine or WSD,
gradient accumulation and clipping, fp32 or bf16, optional activation checkpointing.

- ``mixture:`` phases weight the data's domains over training (deterministic; the realised mix
  per phase lands in run.json).
- ``spike:`` a loss above ``factor`` x its rolling median skips the batch (the optimizer step runs
  with LR 0, so weights do not move) or rewinds to the last checkpoint and skips the data since.
  Grad-norm spikes are only known after DeepSpeed's step: ``skip`` logs them, ``rewind`` rewinds.
- ``checkpoint:`` every N steps and/or M minutes, atomic with a checksum manifest, last K kept.
  A run that exists unfinished resumes from its newest valid checkpoint (``resume: auto``) and
  reproduces the losses of an uninterrupted run exactly.

Writes ``model/`` (safetensors + tokenizer), ``metrics.jsonl`` (loss, lr, grad norm, tokens/s,
MFU, memory, events), ``checkpoints/step-N/`` and tracker output (TensorBoard when installed).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from smolforge.attention import resolve_attention
from smolforge.determinism import DeterminismSpec, as_metrics, check_spec, reproducible
from smolforge.errors import Preempted, RecipeError, RunError
from smolforge.model_folder import check_model_folder
from smolforge.profiling import ProfileSpec, StepProfiler, check_profile
from smolforge.recipe import FRACTION, build, to_dict
from smolforge.runs import Run, Runs, unfinished_run
from smolforge.tracking import TrackingSpec

from . import checkpoint as ckpt
from .distributed import barrier, broadcast, distributed, ds_config, mean_across_ranks, process_rank
from .mixture import MixtureSampler, Phase, validate_phases
from .model import ModelShape
from .schedule import SCHEDULES
from .spike import ACTIONS, SpikeGuard

log = logging.getLogger(__name__)


@dataclass
class TrainSpec:
    max_steps: int = 400              # optimizer steps
    micro_batch_size: int = 16        # packed rows per process per forward pass
    grad_accum: int = 1               # micro-batches per optimizer step
    seq_len: int = 256                # tokens per packed row
    whole_documents: bool = False     # never cut a document that fits in a row (pad the row's end): long-context steps
    learning_rate: float = 3e-3       # peak LR (tiny models take high LRs; SmolLM3-3B used 2e-4)
    schedule: str = "cosine"          # cosine | wsd | constant
    warmup_steps: int = 20            # linear warmup (the playbook: >= 1k steps at real scale)
    min_lr_ratio: float = field(default=0.1, metadata=FRACTION)        # final LR as a fraction of the peak
    decay_fraction: float = field(default=0.2, metadata=FRACTION)      # WSD: share of steps spent decaying
    weight_decay: float = 0.1         # AdamW decoupled weight decay
    adam_beta1: float = field(default=0.9, metadata=FRACTION)
    adam_beta2: float = field(default=0.95, metadata=FRACTION)
    grad_clip: float = 1.0            # clip the global grad norm (the playbook's 1.0); 0 = off
    zero_stage: int = 2               # DeepSpeed ZeRO stage 0-3
    offload_optimizer: bool = False   # keep optimizer states in CPU memory (ZeRO-Offload)
    precision: str = "fp32"           # fp32 | bf16 (bf16 was slower than fp32 on CPU at tiny sizes)
    activation_checkpointing: bool = False  # recompute activations in backward (~30 % memory for ~10 % compute)
    attn_implementation: str = "auto"  # auto | sdpa | flex_attention | flash_attention_2 | flash_attention_3 | eager (docs/pretraining.md)
    seed: int = 0                     # model init, data order, per-step RNG
    log_every: int = 10               # steps between metrics.jsonl lines


@dataclass
class CheckpointSpec:
    every_steps: int = 0              # save every N steps (0 = off)
    every_minutes: float = 0.0        # save every M minutes of wall time (0 = off; the playbook: 2-4 h)
    keep: int = 3                     # newest checkpoints kept on disk
    resume: str = "auto"              # auto: resume an unfinished run of this name; never: refuse


@dataclass
class SpikeSpec:
    action: str = "skip"              # skip | rewind | off
    factor: float = 3.0               # spike = value above factor x rolling median
    window: int = 50                  # steps in the rolling median
    min_history: int = 10             # steps before the guard arms
    max_consecutive: int = 5          # this many spiking steps in a row fail the run (it is not a spike any more)


@dataclass
class ContextSpec:
    """Continued pretraining (``init:``) only: the parent's positions, changed; unset keeps the parent's."""
    max_position_embeddings: int | None = None  # longest sequence the continued model is built for
    rope_theta: float | None = None   # RoPE base (SmolLM3 raised it at each long-context step)


@dataclass
class Recipe:
    name: str = "pretrain-demo"       # run name
    data: str = "data-demo"           # data run holding data/pretrain.jsonl and tokenizer/
    init: str | None = None           # continue from this model run's weights (its architecture; `model:` unused)
    model: ModelShape = field(default_factory=ModelShape)
    context: ContextSpec = field(default_factory=ContextSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    mixture: list = field(default_factory=list)  # phases [{until: 0.7, weights: {facts: 1.0}}, ...]; empty = natural mix
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    spike: SpikeSpec = field(default_factory=SpikeSpec)
    tracking: TrackingSpec = field(default_factory=TrackingSpec)
    profile: ProfileSpec = field(default_factory=ProfileSpec)  # torch.profiler trace of a step range into profile/ (off)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # train.seed, fixed threads, deterministic kernels (null: on for CPU runs)


def phases_of(recipe: Recipe, domain_sizes: dict[str, int]) -> list[Phase]:
    """The recipe's mixture phases, or one phase weighting domains by their size."""
    if not recipe.mixture:
        return [Phase(until=1.0, weights={d: float(n) for d, n in domain_sizes.items()})]
    return [build(Phase, p, source="pretrain recipe", prefix=f"mixture[{i}].") for i, p in enumerate(recipe.mixture)]


def _domains_in(data_run: Run) -> list[str]:
    card = data_card(data_run)
    if card.get("domains"):
        return sorted(card["domains"])
    from smolforge.data.shards import read_kind

    return sorted({str(row.get("domain", "default")) for _, row in read_kind(data_run.path, "pretrain")})


def data_card(data_run: Run) -> dict:
    path = data_run.data_card_path
    return json.loads(path.read_text()) if path.is_file() else {}


def adopt_data_mixture(recipe: Recipe, data_run: Run) -> None:
    """A recipe without a mixture takes the one its data run declares (recorded in run.json)."""
    card = data_card(data_run)
    if not recipe.mixture and card.get("mixture_source") == "recipe":
        recipe.mixture = [dict(phase) for phase in card["mixture"]]


def validate(recipe: Recipe, runs: Runs) -> None:
    t, m = recipe.train, recipe.model
    from smolforge.data.shards import kind_files

    data_run = runs.get(recipe.data)
    if not kind_files(data_run.path, "pretrain"):
        raise RecipeError(f"data: run '{data_run.name}' has no data/pretrain/ shards (is it a data run? stage {data_run.stage})")
    if not (data_run.tokenizer_dir / "tokenizer_config.json").is_file():
        raise RecipeError(f"data: run '{data_run.name}' has no tokenizer/ (is it a data run? stage {data_run.stage})")
    adopt_data_mixture(recipe, data_run)
    max_positions = m.max_position_embeddings
    if recipe.init is not None:
        max_positions = check_init(recipe, runs, data_run)
    elif recipe.context.max_position_embeddings is not None or recipe.context.rope_theta is not None:
        raise RecipeError("context: changes a parent's positions; it needs init: <model run> "
                          "(from scratch, set model.max_position_embeddings and model.rope_theta)")
    checks = [
        (t.schedule in SCHEDULES, f"train.schedule is {t.schedule!r}; expected one of {', '.join(SCHEDULES)}"),
        (t.precision in ("fp32", "bf16"), f"train.precision is {t.precision!r}; expected fp32 or bf16"),
        (t.zero_stage in (0, 1, 2, 3), f"train.zero_stage is {t.zero_stage}; expected 0, 1, 2 or 3"),
        (not t.offload_optimizer or t.zero_stage >= 1, "train.offload_optimizer needs train.zero_stage >= 1"),
        (min(t.max_steps, t.micro_batch_size, t.grad_accum, t.log_every) >= 1 and t.seq_len >= 8,
         "train.max_steps, micro_batch_size, grad_accum and log_every must be >= 1 and seq_len >= 8"),
        (t.seq_len <= max_positions,
         f"train.seq_len {t.seq_len} exceeds the model's max_position_embeddings {max_positions}"
         + (" (set context.max_position_embeddings to extend it)" if recipe.init else "")),
        (m.hidden_size % m.num_heads == 0 and m.num_heads % m.num_kv_heads == 0,
         f"model: hidden_size {m.hidden_size} must divide by num_heads {m.num_heads} "
         f"and num_heads by num_kv_heads {m.num_kv_heads}"),
        (recipe.spike.action in ACTIONS, f"spike.action is {recipe.spike.action!r}; expected one of {', '.join(ACTIONS)}"),
        (recipe.spike.factor > 1, f"spike.factor must be > 1, got {recipe.spike.factor}"),
        (recipe.spike.max_consecutive >= 1, f"spike.max_consecutive must be >= 1, got {recipe.spike.max_consecutive}"),
        (recipe.checkpoint.resume in ("auto", "never"), f"checkpoint.resume is {recipe.checkpoint.resume!r}; expected auto or never"),
        (recipe.spike.action != "rewind" or recipe.checkpoint.every_steps or recipe.checkpoint.every_minutes,
         "spike.action 'rewind' needs checkpoints: set checkpoint.every_steps or checkpoint.every_minutes"),
    ]
    for ok, message in checks:
        if not ok:
            raise RecipeError(message)
    check_profile(recipe.profile, t.max_steps)
    check_spec(recipe.determinism)
    resolve_attention(t.attn_implementation, packed=True, half_precision=t.precision == "bf16",
                      dropout=0.0 if recipe.init else m.dropout, field="train.attn_implementation")
    domains = _domains_in(data_run)
    problems = validate_phases(phases_of(recipe, {d: 1 for d in domains}), domains)
    if problems:
        raise RecipeError("mixture: " + "; ".join(problems))


def check_init(recipe: Recipe, runs: Runs, data_run: Run) -> int:
    """``init:`` names a model run whose vocabulary is the data run's tokenizer; returns the
    continued model's max_position_embeddings."""
    from transformers import AutoConfig, AutoTokenizer

    parent = runs.get(recipe.init)
    if not (parent.model_dir / "config.json").is_file():
        raise RecipeError(f"init: run '{parent.name}' (stage {parent.stage}) has no model/ to continue from")
    check_model_folder(parent.model_dir, f"init: run '{parent.name}'", tokenizer=False)
    try:
        config = AutoConfig.from_pretrained(parent.model_dir)
    except (OSError, ValueError) as exc:
        raise RecipeError(f"init: {parent.model_dir}/config.json cannot be read: {exc}") from None
    vocab = len(AutoTokenizer.from_pretrained(data_run.tokenizer_dir))
    if config.vocab_size < vocab:
        raise RecipeError(f"init: run '{parent.name}' has a vocabulary of {config.vocab_size}; data run "
                          f"'{data_run.name}''s tokenizer has {vocab} tokens (continue on data made with the "
                          "parent's tokenizer)")
    c = recipe.context
    if c.rope_theta is not None and c.rope_theta <= 0:
        raise RecipeError(f"context.rope_theta must be > 0, got {c.rope_theta}")
    if c.max_position_embeddings is not None and c.max_position_embeddings < 8:
        raise RecipeError(f"context.max_position_embeddings must be >= 8, got {c.max_position_embeddings}")
    return c.max_position_embeddings or config.max_position_embeddings


def continued_model(parent_dir: Path, context: ContextSpec):
    """The parent's model in fp32, its positions changed by ``context`` (RoPE frequencies are built
    from the config when the model is, so the change goes in before loading)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(parent_dir)
    if context.max_position_embeddings is not None:
        config.max_position_embeddings = context.max_position_embeddings
    if context.rope_theta is not None:
        rope = dict(getattr(config, "rope_parameters", None) or {"rope_type": "default"})
        config.rope_parameters = {**rope, "rope_theta": context.rope_theta}
    return AutoModelForCausalLM.from_pretrained(parent_dir, config=config, dtype="float32", use_safetensors=True)


def resume_point(recipe: Recipe, runs: Runs, overwrite: bool) -> Path | None:
    """The checkpoint to resume from, or None to start fresh: one answer (or one refusal) for every rank.

    Finding it hashes every file of the newest checkpoints (:func:`.checkpoint.newest_valid`: tens of
    GB at 3B scale), so rank 0 alone decides and the other ranks, on every node, receive its answer:
    call it on every rank once the process group exists (without one it decides in place). Rank 0
    reads run.json before any rank writes it (``runs.start`` follows on rank 0 only).
    """
    decided, failure = None, None
    if process_rank() == 0:
        try:
            decided = _decide_resume(recipe, runs, overwrite)
        except Exception as exc:  # noqa: BLE001 - every rank leaves the broadcast first, then fails alike
            failure = exc
    found, why = broadcast((decided, None if failure is None else str(failure)))
    if failure is not None:
        raise failure
    if why is not None:
        raise RunError(why)
    return found


def _decide_resume(recipe: Recipe, runs: Runs, overwrite: bool) -> Path | None:
    """:func:`resume_point` as rank 0 works it out (hashing the checkpoints it tries)."""
    run = unfinished_run(runs.root / recipe.name, overwrite=overwrite)
    if run is None:
        return None
    found = ckpt.newest_valid(run.checkpoints_dir)
    if recipe.checkpoint.resume == "never" or found is None:
        raise RunError(f"run '{recipe.name}' exists unfinished (status {run.status}) "
                       f"{'with' if found else 'without'} a usable checkpoint; "
                       + ("set checkpoint.resume: auto to resume it, " if found else "")
                       + "or pass --overwrite to start over")
    return found


def load_data(recipe: Recipe, runs: Runs) -> tuple[Run, object, dict]:
    """The data run (its mixture adopted by a recipe without one), its tokenizer, and the packed rows
    by domain: what :func:`run` and the LR range test (:mod:`smolforge.ops.lr_find.pretrain`) train
    on."""
    from transformers import AutoTokenizer

    from .batches import load_domains

    data_run = runs.get(recipe.data)
    adopt_data_mixture(recipe, data_run)
    tokenizer = AutoTokenizer.from_pretrained(data_run.tokenizer_dir)
    domains, how = load_domains(data_run.path, tokenizer, recipe.train.seq_len, recipe.train.whole_documents)
    log.info("pretrain data: %s", how)
    return data_run, tokenizer, domains


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    data_run, tokenizer, domains = load_data(recipe, runs)
    with distributed() as (deepspeed, rank, world), contextlib.ExitStack() as stack:
        resume_from = resume_point(recipe, runs, overwrite)   # rank 0 verifies, every rank gets its answer
        if rank == 0:
            parents = [data_run] + ([runs.get(recipe.init)] if recipe.init else [])
            run = stack.enter_context(runs.start(
                "pretrain", recipe.name, to_dict(recipe), parents=parents,
                data_fingerprints=dict(data_run.info.get("data_fingerprints") or {}),
                overwrite=overwrite, resume=resume_from is not None))
        barrier()
        if rank != 0:
            run = Run(runs.root / recipe.name)
        record = stack.enter_context(reproducible(recipe.determinism, recipe.train.seed))
        if rank == 0:
            run.update_metrics(as_metrics(record))
        Loop(recipe, runs, run, deepspeed, tokenizer, domains, rank, world).train(resume_from)
        barrier()
    return run.reload()


def effective_zero_stage(t: TrainSpec, world: int) -> int:
    """ZeRO shards across processes; with one process there is nothing to shard, and stages 1-3
    only add buffer copies (8 % slower than stage 0 on the demo, bench/pretrain_throughput.py).
    Optimizer offload is the exception: it moves state off the device even on one process."""
    if world == 1 and t.zero_stage > 0 and not t.offload_optimizer:
        log.warning("one process: ZeRO-%d has nothing to shard, running ZeRO-0 (stage %d applies with more "
                    "processes; run.json records train/zero_stage)", t.zero_stage, t.zero_stage)
        return 0
    return t.zero_stage


class Loop:
    """load → setup → train; the step body is in :meth:`train` and fits on a screen."""

    def __init__(self, recipe: Recipe, runs: Runs, run: Run, deepspeed, tokenizer, domains: dict, rank: int,
                 world: int, schedule: Callable[[int], float] | None = None):
        """``runs``: where the recipe's ``init:`` run is found. ``schedule``: the LR as a multiple of
        ``train.learning_rate`` by 0-based optimizer step; default the recipe's warmup and decay (the LR
        range test passes an exponential one)."""
        import torch

        from .flops import flops_per_token, peak_flops
        from .model import build_model, use_attention
        from .monitor import ThroughputMonitor, device_memory_gb
        from .schedule import lr_multiplier

        self.recipe, self.run, self.tokenizer = recipe, run, tokenizer
        self.rank, self.world, self.t = rank, world, recipe.train
        t = self.t
        if recipe.init:
            model = continued_model(runs.get(recipe.init).model_dir, recipe.context)
        else:
            model = build_model(recipe.model, len(tokenizer), seed=t.seed, pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=tokenizer.eos_token_id)
        self.shape = ModelShape.of(model.config)
        self.attention = use_attention(model, t.attn_implementation, half_precision=t.precision == "bf16")
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        if t.activation_checkpointing:
            model.gradient_checkpointing_enable()
        self.n_params = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=t.learning_rate, weight_decay=t.weight_decay,
                                      betas=(t.adam_beta1, t.adam_beta2))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, schedule or lr_multiplier(t.schedule, t.max_steps, t.warmup_steps, t.min_lr_ratio,
                                                 t.decay_fraction))
        self.zero_stage = effective_zero_stage(t, world)
        # At ZeRO-0 DeepSpeed clips but discards the norm, so the loop clips itself (see step()).
        config = ds_config(t.micro_batch_size, t.grad_accum, world, t.grad_clip if self.zero_stage else 0.0,
                           self.zero_stage, t.precision == "bf16", t.offload_optimizer)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                 lr_scheduler=self.scheduler, config=config)
        if world == 1 and self.zero_stage == 0:
            # A one-process all-reduce only flattens and copies every gradient back. (Under ZeRO
            # this hook is what moves gradients into the partitions: it must stay on there.)
            self.engine.enable_backward_allreduce = False
        self.rows_per_step = t.micro_batch_size * t.grad_accum * world
        self.tokens_per_step = self.rows_per_step * t.seq_len
        self.domains = domains
        sizes = {d: len(rows) for d, rows in domains.items()}
        self.sampler = MixtureSampler(sizes, phases_of(recipe, sizes),
                                      t.max_steps, self.rows_per_step, seed=t.seed)
        spike = recipe.spike
        self.guard = SpikeGuard(spike.factor, spike.window, spike.min_history)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.monitor = ThroughputMonitor(flops_per_token(self.shape, len(tokenizer), t.seq_len),
                                         peak_flops(device), devices=world)
        self.tracker = None
        if rank == 0:
            from smolforge.tracking import Tracker

            self.tracker = Tracker(run.path, run.name, to_dict(recipe), recipe.tracking.report_to,
                                   recipe.tracking.prometheus_port)
            device_gb = device_memory_gb()
            run.update_metrics({"train/device_memory_gb": device_gb,  # `smolforge doctor`, even on failure
                                "train/attn_implementation": self.attention})
            self.tracker.log(0, {"device_memory_gb": device_gb})   # the memory alert's denominator
        self.spikes_in_a_row = 0
        self.grad_norm: float | None = None
        self.step_lr = 0.0
        self.last_checkpoint_time = time.monotonic()

    # -- the loop ---------------------------------------------------------------------------
    def train(self, resume_from: Path | None) -> None:
        import torch
        from tqdm.auto import tqdm

        t = self.t
        start = self.restore(resume_from) if resume_from else 0
        bar = tqdm(total=t.max_steps, initial=start, desc=f"pretrain {self.run.name}", unit="step",
                   disable=self.rank != 0)
        window: list[float] = []
        started = time.perf_counter()
        try:
            self.engine.train()
            with StepProfiler(self.recipe.profile, self.run.path, self.rank, done=start) as profiler:
                for step in range(start + 1, t.max_steps + 1):
                    torch.manual_seed(t.seed * 100_003 + step * 101 + self.rank)  # resume-exact dropout
                    loss, skipped, reason = self.step(step)
                    grad_norm = None if skipped else self.last_grad_norm()
                    if reason is None and self.recipe.spike.action != "off":
                        reason = self.guard.check(grad_norm=grad_norm)
                    if reason:
                        self.on_spike(step, reason)
                        self.check_not_diverged(step, reason, loss)
                    else:
                        self.guard.observe(loss=loss, grad_norm=grad_norm)
                        self.spikes_in_a_row = 0
                    window.append(loss)
                    self.monitor.add_tokens(self.tokens_per_step)
                    bar.update(1)
                    if step % t.log_every == 0 or step == t.max_steps:
                        self.log(step, window, grad_norm)
                        bar.set_postfix(loss=f"{sum(window) / len(window):.3f}")
                        window = []
                    if self.checkpoint_due(step):
                        self.save_checkpoint(step)
                    if step < t.max_steps and self.stop_asked():
                        self.stop(step)
                    profiler.step()
            bar.close()
            self.finish(time.perf_counter() - started, start, profiler.metrics)
        finally:
            if self.tracker is not None:
                self.tracker.close()
            self.engine.destroy()  # ZeRO-3 hooks/threads must go before the process group does

    def step(self, step: int) -> tuple[float, bool, str | None]:
        """One optimizer step over ``grad_accum`` micro-batches.

        Returns (mean loss, whether every micro-batch was skipped, the spike reason if any).
        A spiking micro-batch contributes a zero loss, so DeepSpeed's accumulation counters and
        collectives stay in step on every rank; when all of them spiked the step runs at LR 0.
        """
        import torch

        from .batches import micro_batches
        from .model import varlen_kwargs

        t = self.t
        picks = self.sampler.next_batch(step)
        losses, spiked, spike_reason = [], 0, None
        batches = micro_batches(self.domains, picks, t.micro_batch_size, t.grad_accum, self.rank, self.world)
        for micro in self.monitor.timed(batches):  # the wait for each batch: data_s / data_share
            extra = varlen_kwargs(micro["position_ids"], self.attention)  # flash attention's document bounds
            batch = {k: v.to(self.engine.device) if hasattr(v, "to") else v for k, v in {**micro, **extra}.items()}
            loss = self.engine(**batch, use_cache=False).loss
            value = mean_across_ranks(loss.item())
            reason = self.guard.check(loss=value) if self.recipe.spike.action != "off" else None
            if reason is None and not torch.isfinite(loss):  # the guard is off
                raise RuntimeError(f"loss became {loss.item()} at step {step}: lower train.learning_rate, "
                                   f"check the latest batch, keep train.grad_clip on")
            if reason:
                spiked, spike_reason = spiked + 1, reason
                loss = loss * 0.0
            losses.append(value)
            if spiked == t.grad_accum:
                for group in self.optimizer.param_groups:
                    group["lr"] = 0.0
            self.engine.backward(loss)
            if self.engine.is_gradient_accumulation_boundary():
                self.step_lr = self.optimizer.param_groups[0]["lr"]  # the LR this step applies
            if self.zero_stage == 0 and self.engine.is_gradient_accumulation_boundary():
                self.grad_norm = float(torch.nn.utils.clip_grad_norm_(
                    self.engine.module.parameters(), t.grad_clip if t.grad_clip > 0 else float("inf")))
            self.engine.step()
        return sum(losses) / len(losses), spiked == t.grad_accum, spike_reason

    def last_grad_norm(self) -> float | None:
        norm = self.grad_norm if self.zero_stage == 0 else self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    # -- spikes -----------------------------------------------------------------------------
    def on_spike(self, step: int, reason: str) -> None:
        """``rewind``: back to the newest checkpoint. ``skip``: the batch was already dropped (a loss
        spike) or, for a grad-norm spike DeepSpeed has already applied, the event is logged."""
        if self.recipe.spike.action == "rewind" and self.rewind(step, reason):
            return
        self.event(step, "spike", reason=reason, action="skip" if reason.startswith("loss") else "logged")

    def check_not_diverged(self, step: int, reason: str, loss: float) -> None:
        self.spikes_in_a_row += 1
        if self.spikes_in_a_row < self.recipe.spike.max_consecutive:
            return
        what = f"loss became {loss}" if not math.isfinite(loss) else f"{self.spikes_in_a_row} spikes in a row ({reason})"
        raise RuntimeError(f"{what} at step {step}: lower train.learning_rate, check the latest batches, "
                           f"keep train.grad_clip on (the training diverged; skipping cannot save it)")

    def rewind(self, step: int, reason: str) -> bool:
        """Reload the newest valid checkpoint; the data drawn since it stays consumed (skipped)."""
        folder = broadcast(ckpt.newest_valid(self.run.checkpoints_dir) if self.rank == 0 else None)
        if folder is None:
            self.event(step, "spike", reason=reason, action="skip", note="no checkpoint to rewind to")
            return False
        self.engine.load_checkpoint(str(folder), tag="state")
        self.event(step, "spike", reason=reason, action="rewind", to_step=ckpt.step_of(folder),
                   skipped_steps=step - ckpt.step_of(folder))
        return True

    # -- stopping on the job's request -------------------------------------------------------
    def stop_asked(self) -> bool:
        """Whether the Slurm job asked to stop (its time limit is near); one answer for every rank."""
        from smolforge.slurm import STOP_FILE_ENV, stop_requested

        return STOP_FILE_ENV in os.environ and bool(broadcast(stop_requested() if self.rank == 0 else None))

    def stop(self, step: int) -> None:
        """Checkpoint here and end the process; the job requeues and the run resumes from this step."""
        newest = ckpt.newest_valid(self.run.checkpoints_dir) if self.rank == 0 else None
        if broadcast(newest is None or ckpt.step_of(newest) != step):
            self.save_checkpoint(step)
        self.event(step, "stopped", reason="the job asked (time limit near)", checkpoint=f"step-{step}")
        raise Preempted(f"stopped at step {step} of {self.t.max_steps} before the job's time limit; "
                        f"checkpoint step-{step} saved: the same command (the requeued job) resumes from it")

    # -- checkpoints ------------------------------------------------------------------------
    def checkpoint_due(self, step: int) -> bool:
        spec = self.recipe.checkpoint
        due = bool(spec.every_steps) and step % spec.every_steps == 0
        if spec.every_minutes:
            due = due or broadcast(time.monotonic() - self.last_checkpoint_time >= spec.every_minutes * 60)
        return due

    def save_checkpoint(self, step: int) -> None:
        staging = ckpt.staging_dir(self.run.checkpoints_dir, step)
        if self.rank == 0:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
        barrier()
        self.engine.save_checkpoint(str(staging), tag="state")
        barrier()
        if self.rank == 0:
            state = {"step": step, "sampler": self.sampler.state_dict(), "guard": self.guard.state_dict()}
            ckpt.publish(self.run.checkpoints_dir, step, state, self.recipe.checkpoint.keep)
        barrier()
        self.last_checkpoint_time = time.monotonic()

    def restore(self, folder: Path) -> int:
        folder = broadcast(folder)
        self.engine.load_checkpoint(str(folder), tag="state")
        state = ckpt.read_state(folder)
        self.sampler.load_state_dict(state["sampler"])
        self.guard.load_state_dict(state["guard"])
        step = int(state["step"])
        if self.rank == 0:
            self.run.truncate_metrics(step)
        self.event(step, "resume", checkpoint=folder.name)
        return step

    # -- reporting --------------------------------------------------------------------------
    def event(self, step: int, kind: str, **details) -> None:
        if self.rank == 0:
            self.run.log(step, event=kind, **details)
            self.tracker.event(step, kind, **details)

    def log(self, step: int, window: list[float], grad_norm: float | None) -> None:
        values = {"loss": round(sum(window) / len(window), 6), "lr": self.step_lr,
                  "grad_norm": None if grad_norm is None else round(grad_norm, 6),
                  "tokens": step * self.tokens_per_step, **self.monitor.window()}
        if self.rank == 0:
            self.run.log(step, **values)
            self.tracker.log(step, values)

    def finish(self, seconds: float, start: int, profiled: dict) -> None:
        import deepspeed

        if self.zero_stage == 3:  # parameters are partitioned: gather them to save one model
            with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None):
                if self.rank == 0:
                    self.run.save_model(self.engine.module, self.tokenizer)
        elif self.rank == 0:
            self.run.save_model(self.engine.module, self.tokenizer)
        barrier()
        if self.rank != 0:
            return
        logged = [json.loads(line) for line in self.run.metrics_path.read_text().splitlines()]
        losses = [m["loss"] for m in logged if "loss" in m]
        trained = self.t.max_steps - start
        metrics = {"train/loss": losses[-1], "train/first_loss": losses[0], "train/steps": self.t.max_steps,
                   "train/tokens": self.t.max_steps * self.tokens_per_step, "train/params": self.n_params,
                   "train/seconds": round(seconds, 1),
                   "train/tokens_per_s": round(trained * self.tokens_per_step / max(seconds, 1e-9), 1),
                   "train/spikes": sum(1 for m in logged if m.get("event") == "spike"),
                   "train/resumes": sum(1 for m in logged if m.get("event") == "resume"),
                   "train/zero_stage": self.zero_stage, "train/processes": self.world}
        for phase, mix in self.sampler.realised_mix().items():
            metrics.update({f"train/mix/phase{phase}/{d}": share for d, share in mix.items()})
        self.run.finish(metrics={**metrics, **profiled})
