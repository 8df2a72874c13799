"""Pretraining throughput: smolforge's DeepSpeed loop vs a plain HF ``Trainer``, same model and data.

    .venv/bin/python bench/pretrain_throughput.py               # demo model, 100 steps, 3 rounds
    .venv/bin/python bench/pretrain_throughput.py --steps 100 --rounds 3

Both train the demo SmolLM3 shape on the same packed rows (padding-free, per-document
positions), batch 16 x 256, fp32, AdamW. They alternate (ours, HF, ours, HF, …); the first
``--warmup`` steps of each run are excluded. Also prints packing efficiency (real tokens ÷ slots)
of packed rows vs padded per-document batches. Ends with one JSON line; ``ratio`` = ours ÷ HF
tokens/s (> 1: smolforge is faster).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from smolforge.recipe import build_stage_recipe, deep_merge, load_recipe
from smolforge.registry import load_stage
from smolforge.runs import Runs
from smolforge.table import render_table

DEMO = Path(__file__).resolve().parents[1] / "recipes" / "demo"


def recipe(stage: str, **changes):
    _, data = load_recipe(DEMO / f"{stage}.yaml")
    return build_stage_recipe(load_stage(stage), deep_merge(data, changes), source=f"bench {stage}")


def ours(runs: Runs, steps: int, warmup: int, name: str, zero_stage: int) -> tuple[float, int]:
    """Steady-state tokens/s of the pretrain stage (its own per-step log, warm-up steps dropped),
    and the ZeRO stage it ran (one process runs ZeRO-0, see smolforge.pretrain.stage.effective_zero_stage)."""
    stage = load_stage("pretrain")
    r = recipe("pretrain", name=name, train={"max_steps": steps, "log_every": 1, "zero_stage": zero_stage},
               checkpoint={"every_steps": 0}, tracking={"report_to": ["none"]}, mixture=[])
    run = stage.run(r, runs, overwrite=True)
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    times = [m["time"] for m in lines if "loss" in m]
    tokens_per_step = r.train.micro_batch_size * r.train.seq_len
    return (len(times) - 1 - warmup) * tokens_per_step / (times[-1] - times[warmup]), run.metrics["train/zero_stage"]


def hf_trainer(rows: list[dict], vocab: int, tokenizer, steps: int, warmup: int, workdir: Path) -> float:
    """Steady-state tokens/s of transformers' Trainer on the same rows and model shape."""
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from smolforge.pretrain.model import build_model

    r = recipe("pretrain")
    t = r.train
    model = build_model(r.model, vocab, seed=t.seed, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    model.config.use_cache = False  # packed rows: the per-document mask needs no cache
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    args = TrainingArguments(output_dir=str(workdir / "hf"), max_steps=steps, per_device_train_batch_size=t.micro_batch_size,
                             learning_rate=t.learning_rate, weight_decay=t.weight_decay, adam_beta1=t.adam_beta1,
                             adam_beta2=t.adam_beta2, max_grad_norm=t.grad_clip, lr_scheduler_type="cosine",
                             warmup_steps=t.warmup_steps, use_cpu=True, bf16=False, report_to="none",
                             save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
                             disable_tqdm=True, seed=t.seed)
    Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows), callbacks=[Clock()]).train()
    return (len(stamps) - 1 - warmup) * t.micro_batch_size * t.seq_len / (stamps[-1] - stamps[warmup])


def padded_efficiency(token_lists: list[list[int]], batch_size: int, seq_len: int) -> float:
    """Real tokens ÷ slots when each document is its own row, batches padded to their longest row."""
    real = slots = 0
    for i in range(0, len(token_lists), batch_size):
        batch = [ids[:seq_len] for ids in token_lists[i:i + batch_size]]
        real += sum(len(ids) for ids in batch)
        slots += len(batch) * max(len(ids) for ids in batch)
    return real / slots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--zero-stage", type=int, default=None,
                        help="ZeRO stage of smolforge's loop (default: the demo recipe's)")
    args = parser.parse_args()

    from smolforge.data.packing import packing_efficiency
    from smolforge.data.tokenizer import DOC_SEPARATOR
    from smolforge.data.shards import read_kind
    from smolforge.pretrain.batches import pack_shards

    workdir = Path(tempfile.mkdtemp(prefix="bench-pretrain-"))
    runs = Runs(workdir / "runs")
    data_stage = load_stage("data")
    data_run = data_stage.run(recipe("data"), runs)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(data_run.tokenizer_dir)
    seq_len = recipe("pretrain").train.seq_len
    domains = pack_shards(data_run.path, tokenizer, seq_len)
    rows = [row for domain_rows in domains.values() for row in domain_rows]

    ours_tps, hf_tps = [], []
    for round_ in range(args.rounds):
        zero = recipe("pretrain").train.zero_stage if args.zero_stage is None else args.zero_stage
        tps, ran_zero = ours(runs, args.steps, args.warmup, f"bench-ours-{round_}", zero)
        ours_tps.append(tps)
        hf_tps.append(hf_trainer(rows, len(tokenizer), tokenizer, args.steps, args.warmup, workdir))
        print(f"round {round_ + 1}: smolforge {ours_tps[-1]:,.0f} tok/s, HF Trainer {hf_tps[-1]:,.0f} tok/s",
              flush=True)

    texts = [row["text"] for _, row in read_kind(data_run.path, "pretrain")]
    sep = tokenizer.convert_tokens_to_ids(DOC_SEPARATOR)
    docs = [ids + [sep] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    packed = packing_efficiency(rows, seq_len)
    padded = padded_efficiency(docs, 16, seq_len)

    ours_median, hf_median = statistics.median(ours_tps), statistics.median(hf_tps)
    print(render_table(["loop", "tokens/s (median)", "rounds"],
                       [[f"smolforge (DeepSpeed, recipe ZeRO-{zero}, ran ZeRO-{ran_zero})", f"{ours_median:,.0f}",
                         len(ours_tps)],
                        ["HF Trainer", f"{hf_median:,.0f}", len(hf_tps)]]))
    print(render_table(["batches", "packing efficiency"], [["packed (padding-free)", f"{packed:.3f}"],
                                                           ["padded per document", f"{padded:.3f}"]]))
    print(json.dumps({"bench": "pretrain_throughput", "ours_tokens_per_s": round(ours_median, 1),
                      "hf_trainer_tokens_per_s": round(hf_median, 1), "ratio": round(ours_median / hf_median, 3),
                      "packed_efficiency": round(packed, 4), "padded_efficiency": round(padded, 4),
                      "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
                      "zero_stage_recipe": zero, "zero_stage_ran": ran_zero}))


if __name__ == "__main__":
    main()
