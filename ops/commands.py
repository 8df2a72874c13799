"""The ops tools' commands: ``lr-find``, ``plan``, ``burnin``, ``doctor`` and ``ablate``.

``plan`` sizes a run (FLOPs, GPUs, days, cost, memory), ``burnin`` checks every rank's hardware before
a long run, ``doctor`` applies the playbook's troubleshooting table to a run's metrics, ``lr-find``
runs a learning-rate range test on a stage's recipe and ``ablate`` trains and compares variants of a
recipe. Stdlib and spine imports only: a handler imports its tool when it runs, so ``smolforge
--help`` stays fast.

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> list(cli.tools)
    ['lr-find', 'plan', 'burnin', 'doctor', 'ablate']
"""
from __future__ import annotations

import argparse
import importlib
import json

from smolforge.commands import Arguments, Commands, Context

__all__ = ["register"]


def _arguments_of(module: str) -> Arguments:
    """A tool module's ``add_arguments`` (stdlib and spine only at its top: the parser stays cheap)."""
    return lambda p: importlib.import_module(module).add_arguments(p)


def _lr_find(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .lr_find.command import command

    return command(args, ctx)


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", metavar="RECIPE", help="recipe YAML: pretrain, sft, dpo, merge, or ppo (its memory "
                   "per GPU); or a folder of recipes: one table, the total (needs --gpus)")
    p.add_argument("--tokens", metavar="N", help="training tokens (default: max_steps × the batch on --gpus; sft/dpo "
                   "by epochs: the data's tokens × epochs; else 20 × parameters)")
    p.add_argument("--gpu", default="h100", metavar="NAME",
                   help="device: h100, h200, a100, a100-40g, l40s, a10g or cpu (measured); default h100")
    p.add_argument("--gpus", metavar="G", help="number of GPUs (with --days: the MFU required)")
    p.add_argument("--days", metavar="D", help="wall-clock days (alone: the GPUs needed)")
    p.add_argument("--mfu", metavar="M", help="model FLOPs utilisation as a fraction, e.g. 0.3 "
                   "(default 0.30, or what --gpus and --days require)")
    p.add_argument("--price", metavar="USD_PER_GPU_HOUR", help="price of one GPU-hour, for the cost")
    p.add_argument("--seq-len", metavar="L", help="tokens per sequence (default: train.seq_len)")
    p.add_argument("--vocab", default="128256", metavar="N",
                   help="vocabulary size (default 128256: Llama-3's tokenizer, as SmolLM3)")
    p.add_argument("--model", metavar="PATH", help="PPO, SFT, DPO recipes: the model's shape, from a pretrain recipe "
                   "or a HF config.json / model folder (default: the parent's recipe beside it, else the parent run's "
                   "model/config.json)")
    p.add_argument("--prompt-len", metavar="L", help="PPO recipes: prompt tokens before the completion "
                   "(default 512)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key, e.g. model.num_kv_heads=16 (repeatable)")


def _plan(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .plan import plan_file, print_any_plan, warn

    plan = plan_file(args.recipe, args.set, tokens=args.tokens, gpu=args.gpu, gpus=args.gpus, days=args.days,
                     mfu=args.mfu, price=args.price, seq_len=args.seq_len, vocab=args.vocab, model=args.model,
                     prompt_len=args.prompt_len, runs_dir=ctx.root)
    if ctx.json:
        warn(plan)
        print(json.dumps(plan, indent=2))
    else:
        print_any_plan(plan)
    return 0


def _burnin(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .burnin import command

    return command(args, ctx)


def _doctor(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .doctor import command

    return command(args, ctx)


def _ablate(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .ablate.command import command

    return command(args, extras, ctx)


# the ops tools, in --help order (handlers above import their tool when they run)
TOOLS = (
    dict(
        name="lr-find", help="learning-rate range test on a pretrain or SFT recipe: loss vs LR plot, a suggested LR",
        handler=_lr_find, arguments=_arguments_of("smolforge.ops.lr_find.command"),
        description="One short run of the recipe's stage whose LR grows by a constant factor every step, --min to "
        "--max;\nit stops when the smoothed loss exceeds 4x its minimum or turns NaN. Prints a suggested LR and "
        "the rule\nthat gave it (one tenth of the LR at the smoothed loss's minimum; steepest descent as a "
        "cross-check),\nfor SFT also the playbook's 1/10-1/5-of-pretraining window. Writes runs/lrfind-<recipe "
        "name>/ (lr_find.svg,\nlr_find.json), replacing the previous sweep of that recipe. See docs/pretraining.md.",
        examples=["smolforge lr-find --config recipes/demo/pretrain.yaml",
                  "smolforge lr-find --config recipes/demo/sft.yaml --min 1e-6 --max 1 --steps 100 --json"]),
    dict(
        name="plan", help="plan a run or a folder of recipes (FLOPs, GPU-hours, days, cost, memory)", handler=_plan,
        arguments=_plan_arguments,
        description="Plan a pretraining run from a pretrain recipe: parameters (counted on the meta device),\n"
        "training FLOPs (6·N·D + attention), GPU-hours, GPUs for --days or days on --gpus at an MFU,\nthe MFU "
        "that --gpus and --days require, cost, memory per GPU for ZeRO 0-3 and the KV cache.\nA PPO recipe "
        "gets its memory per GPU on --gpus (policy + value model, reference, activations,\nrollout), the model's "
        "shape from --model. SFT and DPO recipes plan as pretraining does, from\nthe parent's recipe beside them; a folder "
        "plans every recipe on --gpus. Numbers take k/M/B/T suffixes (11T = 11e12).\nSee docs/planner.md.",
        examples=["smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11e12 --gpus 384 --days 24",
                  "smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11T --mfu 0.3 --days 24 --price 2.5 "
                  "--json",
                  "smolforge plan recipes/smollm3-3b/ppo.yaml --model recipes/smollm3-3b/pretrain.yaml --gpus 8",
                  "smolforge plan recipes/smollm3-3b --gpus 384"]),
    dict(
        name="burnin", help="check every rank's hardware before a long run (matmul, memory, all-reduce, NVML)",
        handler=_burnin, arguments=_arguments_of("smolforge.ops.burnin"),
        description="Measure every rank at once: matmul TFLOP/s against the device's peak, a memory pattern test,\n"
        "all-reduce bus bandwidth (nccl-tests' algbw × 2(n-1)/n) and, with pynvml on a GPU, temperature, clocks\n"
        "and ECC errors. A rank --margin below the median matmul throughput (or above the median all-reduce\n"
        "time), memory mismatches or uncorrected ECC errors are flagged: exit 1; healthy: exit 0.\n"
        "--processes N starts N ranks through torchrun; under a launcher (RANK set) each process is a rank.\n"
        "See docs/pretraining.md.",
        examples=["smolforge burnin --processes 2", "smolforge burnin --processes 8 --seconds 300 --json",
                  "torchrun --nproc_per_node 8 -m smolforge burnin"]),
    dict(
        name="doctor", help="diagnose a training run from its metrics (the playbook's troubleshooting table)",
        handler=_doctor, arguments=_arguments_of("smolforge.ops.doctor"),
        description="Read a run's metrics.jsonl and run.json and look for the playbook's symptoms: a NaN/inf loss,\n"
        "memory above 90 % of the device, a sudden throughput drop (the logged wait for batches says whether\n"
        "the loader did it), a noisier loss (naming the mixture phase to inspect), grad-norm jumps >= 3x, low\n"
        "MFU. Each finding names its steps, values, likely cause and fix. Exit 0, also with findings;\n"
        "--strict: exit 1 when there are findings. See docs/pretraining.md.",
        examples=["smolforge doctor pretrain-demo", "smolforge doctor pretrain-demo --json",
                  "smolforge doctor pretrain-big --device-memory 80 --strict"]),
    dict(
        name="ablate", help="ablation: a baseline recipe, variants that change one key, seeds; a table and "
        "plots with verdicts beyond the seed noise", handler=_ablate,
        arguments=_arguments_of("smolforge.ops.ablate.command"),
        description="Train the baseline and every variant once per seed (from scratch, or annealing a main "
        "run's model\nwith mode: anneal) through the pipeline runner, audit the eval tasks on the baseline's "
        "seeds,\nscore every run's final model, and compare each variant with the baseline per task: a "
        "verdict\nonly where the difference exceeds 2x the seed noise. Done runs with the same recipe are "
        "reused.\nWrites the run ablate-<name>: ablation.json, table.txt, plots/<task>.svg. See docs/reports.md.",
        examples=["smolforge ablate --config recipes/demo/ablate-lr.yaml",
                  "smolforge ablate --config recipes/demo/ablate-anneal.yaml --set seeds=[0,1]",
                  "smolforge ablate --config recipes/demo/ablate-lr.yaml --write-pipeline lr.yaml  "
                  "# then: smolforge launch pipeline --config lr.yaml"]),
)


def register(cli: Commands) -> None:
    for tool in TOOLS:
        cli.tool(**tool)
