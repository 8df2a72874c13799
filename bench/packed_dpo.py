"""Packed DPO against TRL's padded batches: the padding each removes, and training tokens/s, same data.

    .venv/bin/python bench/packed_dpo.py --runs-dir runs              # reuses runs/sft-demo and runs/data-demo
    .venv/bin/python bench/packed_dpo.py --runs-dir runs --steps 40 --rounds 2

Padding: the demo's preference pairs, tokenized as TRL's DPO collator sees them (prompt + answer
through the SFT model's chat template, cut at the recipe's ``max_length``), batched 16 pairs at a time
and padded to each batch's longest sequence, against packed rows (no padding). The same for rows in
``HuggingFaceH4/ultrafeedback_binarized``'s layout with that dataset's length profile (prompts and
answers of a few to several hundred words, drawn from a seeded log-normal: the shape, not the data,
which no hub serves here), cut at 1024 tokens.

Speed: the ``dpo`` stage with the demo recipe, ``--steps`` steps, padded and packed alternately
(``--rounds`` of each, in a temporary runs folder); the steps see the same batches, so their real
tokens are equal and tokens/s ÷ tokens/s = seconds ÷ seconds. On a CPU the packed row runs SDPA
with a per-document mask over the whole row (quadratic in the row's length); the GPU's varlen
kernels (flash-attention) do not build one.

Ends with ONE JSON line: ``waste_padded`` (demo), ``waste_padded_ultrafeedback_shape``,
``waste_packed`` (0), and ``ratio`` = packed ÷ padded tokens/s.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_seeds import DEMO, ensure_parent  # noqa: E402

from smolforge.alignment.packed_preference import padding_waste  # noqa: E402
from smolforge.runs import Runs  # noqa: E402


def pair_lengths(tokenizer, rows: list[dict], max_length: int) -> list[int]:
    """Token counts of prompt+chosen and prompt+rejected for each pair (in that order), cut at ``max_length``."""
    def count(prompt, answer) -> int:
        if isinstance(prompt, list):
            reply = answer if isinstance(answer, list) else [{"role": "assistant", "content": answer}]
            text = tokenizer.apply_chat_template(list(prompt) + list(reply), tokenize=False)
            return min(len(tokenizer(text, add_special_tokens=False)["input_ids"]), max_length)
        return min(len(tokenizer(prompt + answer)["input_ids"]), max_length)

    return [count(row["prompt"], row[side]) for row in rows for side in ("chosen", "rejected")]


def ultrafeedback_shaped(count: int, seed: int = 0) -> list[dict]:
    """Rows in ultrafeedback_binarized's layout with its rough length profile (words): prompt median ~60,
    answers median ~180 with a long tail; the two answers of a pair independent."""
    rng = random.Random(seed)
    words = "the model answers a question about data with some detail and an example".split()

    def text(median: float) -> str:
        n = max(3, int(rng.lognormvariate(math.log(median), 0.8)))
        return " ".join(rng.choice(words) for _ in range(n))

    rows = []
    for _ in range(count):
        prompt = [{"role": "user", "content": text(60)}]
        rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": text(180)}],
                     "rejected": [{"role": "assistant", "content": text(180)}]})
    return rows


def train_seconds(runs_dir: Path, packing: bool, steps: int, name: str) -> float:
    from smolforge.recipe import build_stage_recipe, deep_merge, load_recipe
    from smolforge.registry import load_stage

    stage = load_stage("dpo")
    _, data = load_recipe(DEMO / "dpo.yaml")
    data = deep_merge(data, {"name": name, "packing": packing,
                             "trainer": {"max_steps": steps, "logging_steps": steps, "save_steps": steps + 1}})
    recipe = build_stage_recipe(stage, data, source="bench")
    runs = Runs(runs_dir)
    stage.validate(recipe, runs)
    return stage.run(recipe, runs, overwrite=True).metrics["train/seconds"]   # the training loop, not the loading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", default="runs", help="where sft-demo and data-demo live (built there if missing)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    source = Path(args.runs_dir).resolve()
    ensure_parent(source)

    from smolforge.data.schemas import load_many, resolve_data
    from smolforge.generation.prompts import load_tokenizer

    runs = Runs(source)
    tokenizer = load_tokenizer(runs.get("sft-demo").model_dir)
    paths, _ = resolve_data("data-demo", runs, "prefs")
    demo = pair_lengths(tokenizer, load_many(paths, "preference"), max_length=128)
    shaped = pair_lengths(tokenizer, ultrafeedback_shaped(512), max_length=1024)
    waste = {"demo": padding_waste(demo, batch_size=16), "ultrafeedback_shape": padding_waste(shaped, batch_size=8)}
    for what, figures in waste.items():
        print(f"{what}: {figures['real_tokens']} real tokens in {figures['padded_slots']} padded slots "
              f"({figures['waste']:.1%} padding); packed: 0 %", flush=True)

    work = Path(tempfile.mkdtemp(prefix="packed-dpo-"))
    try:
        for name in ("data-demo", "sft-demo"):
            shutil.copytree(source / name, work / name)
        seconds: dict[str, list[float]] = {"padded": [], "packed": []}
        for round_ in range(args.rounds):
            for kind in ("padded", "packed"):
                took = train_seconds(work, kind == "packed", args.steps, f"dpo-{kind}")
                seconds[kind].append(took)
                print(f"round {round_ + 1} {kind}: {args.steps} steps trained in {took:.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    padded, packed = statistics.median(seconds["padded"]), statistics.median(seconds["packed"])
    print(json.dumps({"steps": args.steps, "rounds": args.rounds, "seconds": seconds,
                      "waste_padded": waste["demo"]["waste"],
                      "waste_padded_ultrafeedback_shape": waste["ultrafeedback_shape"]["waste"], "waste_packed": 0.0,
                      "padding": waste, "ratio": round(padded / packed, 3)}))


if __name__ == "__main__":
    main()
