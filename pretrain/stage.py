"""Pretrain a SmolLM3-architecture base model from scratch on a DeepSpeed engine.

    smolforge pretrain --config recipes/demo/pretrain.yaml
    smolforge pretrain --config recipes/demo/pretrain.yaml --set train.max_steps=50 --set model.num_layers=2

Reads a data run (``data/pretrain.jsonl`` + ``tokenizer/``), packs the documents padding-free
with per-document position ids (no attention across documents), and trains with ZeRO (stage 2 by
default; gloo on CPU, NCCL on GPU), linear warmup then cosine or WSD, gradient clipping and
accumulation. Writes ``model/`` (safetensors, tokenizer, chat template), ``metrics.jsonl`` (loss,
lr, grad norm, tokens/s) and ``checkpoints/step-N/`` every ``train.save_every`` steps.
One process unless launched by ``torchrun``/``deepspeed`` (each rank reads its own slice).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

from smolforge.errors import RecipeError
from smolforge.recipe import to_dict
from smolforge.runs import Run, Runs

from .model import ModelShape
from .schedule import SCHEDULES


@dataclass
class TrainSpec:
    max_steps: int = 400              # optimizer steps
    micro_batch_size: int = 16        # packed rows per process per forward pass
    grad_accum: int = 1               # micro-batches per optimizer step
    seq_len: int = 256                # tokens per packed row
    learning_rate: float = 3e-3       # peak LR (tiny models take high LRs; SmolLM3-3B used 2e-4)
    schedule: str = "cosine"          # cosine | wsd | constant
    warmup_steps: int = 20            # linear warmup (the playbook: >= 1k steps at real scale)
    min_lr_ratio: float = 0.1         # final LR as a fraction of the peak
    decay_fraction: float = 0.2       # WSD: share of steps spent decaying
    weight_decay: float = 0.1         # AdamW decoupled weight decay
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    grad_clip: float = 1.0            # clip the global grad norm (the playbook's 1.0)
    zero_stage: int = 2               # DeepSpeed ZeRO stage 0-3
    precision: str = "fp32"           # fp32 | bf16 (bf16 was slower than fp32 on CPU at tiny sizes)
    seed: int = 0                     # model init and data order
    log_every: int = 10               # steps between metrics.jsonl lines
    save_every: int = 0               # steps between checkpoints (0 = none; the final model is always saved)


@dataclass
class Recipe:
    name: str = "pretrain-demo"       # run name
    data: str = "data-demo"           # data run holding data/pretrain.jsonl and tokenizer/
    model: ModelShape = field(default_factory=ModelShape)
    train: TrainSpec = field(default_factory=TrainSpec)


def validate(recipe: Recipe, runs: Runs) -> None:
    t = recipe.train
    data_run = runs.get(recipe.data)
    for needed in ("data/pretrain.jsonl", "tokenizer/tokenizer_config.json"):
        if not (data_run.path / needed).is_file():
            raise RecipeError(f"data: run '{data_run.name}' has no {needed} (is it a data run? stage {data_run.stage})")
    if t.schedule not in SCHEDULES:
        raise RecipeError(f"train.schedule is {t.schedule!r}; expected one of {', '.join(SCHEDULES)}")
    if t.precision not in ("fp32", "bf16"):
        raise RecipeError(f"train.precision is {t.precision!r}; expected fp32 or bf16")
    if t.zero_stage not in (0, 1, 2, 3):
        raise RecipeError(f"train.zero_stage is {t.zero_stage}; expected 0, 1, 2 or 3")
    if min(t.max_steps, t.micro_batch_size, t.grad_accum) < 1 or t.seq_len < 8:
        raise RecipeError("train.max_steps, micro_batch_size and grad_accum must be >= 1 and seq_len >= 8")
    if t.seq_len > recipe.model.max_position_embeddings:
        raise RecipeError(f"train.seq_len {t.seq_len} exceeds model.max_position_embeddings "
                          f"{recipe.model.max_position_embeddings}")
    m = recipe.model
    if m.hidden_size % m.num_heads or m.num_heads % m.num_kv_heads:
        raise RecipeError(f"model: hidden_size {m.hidden_size} must divide by num_heads {m.num_heads} "
                          f"and num_heads by num_kv_heads {m.num_kv_heads}")


@contextlib.contextmanager
def distributed():
    """DeepSpeed's process group for this stage; single-process defaults when no launcher set them.

    The env:// variables it sets are restored afterwards, so later in-process stages (TRL
    trainers) do not mistake this process for a rank of a finished job.
    """
    import socket

    import torch

    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if int(os.environ["WORLD_SIZE"]) == 1:
        # The shared-memory comm op only speeds up multi-process CPU runs; skip its JIT build.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield deepspeed
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        _forget_deepspeed_groups()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _forget_deepspeed_groups() -> None:
    """DeepSpeed caches process groups in module globals; after the group is destroyed they would
    break the next engine built in this process (tests, notebooks), so drop them."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    for attr, value in vars(groups).items():
        if isinstance(value, dist.ProcessGroup):
            setattr(groups, attr, None)
        elif attr.endswith("_GROUP") and isinstance(value, dict):
            value.clear()


def ds_config(t: TrainSpec, world_size: int) -> dict:
    return {"train_micro_batch_size_per_gpu": t.micro_batch_size,
            "gradient_accumulation_steps": t.grad_accum,
            "train_batch_size": t.micro_batch_size * t.grad_accum * world_size,
            "gradient_clipping": t.grad_clip,
            "zero_optimization": {"stage": t.zero_stage},
            "bf16": {"enabled": t.precision == "bf16"},
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def load_rows(recipe: Recipe, data_run: Run, tokenizer) -> list[dict]:
    from data.packing import pack_documents
    from data.schemas import load_rows as load_jsonl
    from data.tokenizer import DOC_SEPARATOR

    sep = tokenizer.convert_tokens_to_ids(DOC_SEPARATOR)
    if sep is None or sep == tokenizer.unk_token_id:
        sep = tokenizer.eos_token_id
    texts = [r["text"] for r in load_jsonl(data_run.path / "data" / "pretrain.jsonl", "text")]
    docs = [ids + [sep] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    rows = pack_documents(docs, recipe.train.seq_len)
    if not rows:
        raise RecipeError(f"data run '{data_run.name}' holds fewer than seq_len={recipe.train.seq_len} tokens")
    return rows


def _batches(rows: list[dict], batch_size: int, seed: int, rank: int, world: int):
    """Endless micro-batches: a fresh seeded permutation each epoch, rank-strided."""
    import torch

    epoch = 0
    while True:
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        order = order[rank::world]
        for i in range(0, len(order) - batch_size + 1, batch_size):
            batch = [rows[j] for j in order[i:i + batch_size]]
            yield {k: torch.tensor([r[k] for r in batch]) for k in ("input_ids", "position_ids", "labels")}
        epoch += 1


def _save_checkpoint(engine, run: Run, step: int) -> None:
    final = run.checkpoints_dir / f"step-{step}"
    tmp = run.checkpoints_dir / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    engine.save_checkpoint(str(tmp), tag="state")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    from .model import build_model

    t = recipe.train
    data_run = runs.get(recipe.data)
    tokenizer = AutoTokenizer.from_pretrained(data_run.path / "tokenizer")
    rows = load_rows(recipe, data_run, tokenizer)
    fingerprints = dict(data_run.info.get("data_fingerprints", {}))
    with runs.start("pretrain", recipe.name, to_dict(recipe), parents=[data_run],
                    data_fingerprints=fingerprints, overwrite=overwrite) as run, distributed() as deepspeed:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        model = build_model(recipe.model, len(tokenizer), seed=t.seed, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        optimizer = torch.optim.AdamW(model.parameters(), lr=t.learning_rate, weight_decay=t.weight_decay,
                                      betas=(t.adam_beta1, t.adam_beta2))
        from .schedule import lr_multiplier
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_multiplier(t.schedule, t.max_steps, t.warmup_steps, t.min_lr_ratio, t.decay_fraction))
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                               config=ds_config(t, world))
        n_params = sum(p.numel() for p in model.parameters())
        tokens_per_step = t.micro_batch_size * t.grad_accum * world * t.seq_len
        batches = _batches(rows, t.micro_batch_size, t.seed, rank, world)
        bar = tqdm(total=t.max_steps, desc=f"pretrain {recipe.name}", disable=rank != 0, unit="step")
        window_loss, window_start, losses = [], time.perf_counter(), []
        started = time.perf_counter()
        engine.train()
        for step in range(1, t.max_steps + 1):
            for _ in range(t.grad_accum):
                batch = batches.__next__()
                loss = engine(input_ids=batch["input_ids"].to(engine.device),
                              position_ids=batch["position_ids"].to(engine.device),
                              labels=batch["labels"].to(engine.device), use_cache=False).loss
                engine.backward(loss)
                engine.step()
                window_loss.append(loss.item())
            if not torch.isfinite(loss):
                raise RuntimeError(f"loss became {loss.item()} at step {step}: lower train.learning_rate, "
                                   f"check the latest batch, keep train.grad_clip on")
            bar.update(1)
            if step % t.log_every == 0 or step == t.max_steps:
                elapsed = time.perf_counter() - window_start
                mean_loss = sum(window_loss) / len(window_loss)
                losses.append(mean_loss)
                grad_norm = engine.get_global_grad_norm()
                values = {"loss": round(mean_loss, 5), "lr": scheduler.get_last_lr()[0],
                          "grad_norm": None if grad_norm is None else round(float(grad_norm), 5),
                          "tokens": step * tokens_per_step,
                          "tokens_per_s": round(len(window_loss) / t.grad_accum * tokens_per_step / elapsed, 1)}
                if rank == 0:
                    run.log(step, **values)
                bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{values['lr']:.2e}")
                window_loss, window_start = [], time.perf_counter()
            if t.save_every and step % t.save_every == 0:
                _save_checkpoint(engine, run, step)
        bar.close()
        seconds = time.perf_counter() - started
        if rank == 0:
            run.save_model(engine.module, tokenizer)
        run.finish(metrics={"train/loss": round(losses[-1], 5), "train/first_loss": round(losses[0], 5),
                            "train/steps": t.max_steps, "train/tokens": t.max_steps * tokens_per_step,
                            "train/params": n_params, "train/seconds": round(seconds, 1),
                            "train/tokens_per_s": round(t.max_steps * tokens_per_step / seconds, 1)})
    return run
