"""A plan (what :func:`~smolforge.ops.plan.plan_file` returns) as tables and warnings.

    print_any_plan(plan)     # smolforge plan: the printer below that fits the plan's stage
    print_plan(plan)         # a pretrain, sft or dpo recipe: summary table, memory per ZeRO stage
    print_ppo_plan(plan)     # a PPO recipe: its settings, memory per GPU by part
    print_merge_plan(plan)   # a merge recipe: the models it loads
    print_folder_plan(plan)  # a folder: one line per recipe, the total
    warn(plan)               # smolforge plan --json: only the warnings, on stderr

    >>> warn({"warnings": ["this plan assumes an MFU of 70% (> 60%)"]}, file=sys.stdout)
    warning: this plan assumes an MFU of 70% (> 60%)
"""
from __future__ import annotations

import sys
from typing import Any, TextIO

from .memory import MEMORY_HEADROOM

__all__ = ["summary_rows", "memory_rows", "print_plan", "warn", "ppo_rows", "print_ppo_plan", "print_merge_plan",
           "folder_rows", "print_folder_plan", "print_any_plan"]


def _si(x: float | None, unit: str = "") -> str:
    """3.075B, 11T, 2.43e+23 — short human numbers.

    >>> _si(3075098624), _si(11e12), _si(950), _si(2.43e23)
    ('3.075B', '11T', '950', '2.43e+23')
    """
    if x is None:
        return "-"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            if abs(x) >= 1000 * 1e12:
                return f"{x:.3g}{unit}"
            return f"{x / scale:.4g}{suffix}{unit}"
    return f"{x:.4g}{unit}"


def _gib(x: float) -> float:
    return round(x / 2**30, 2)


def summary_rows(plan: dict) -> list[list[str]]:
    """The (quantity, value, how) rows of the plan table."""
    p = plan
    seq, vocab = p["seq_len"], p["vocab_size"]
    act = p["activations_bytes"]
    days_how = f"for --days {p['days']:g}" if p["days"] is not None else "give --days D"
    rows = [["stage", p["stage"], f"model: {p['model_source']}"]] if "model_source" in p else []
    rows += [
        ["parameters", _si(p["params"]), f"counted on the meta device, vocab {vocab}"],
        ["non-embedding parameters", _si(p["non_embedding_params"]),
         f"minus {_si(p['embedding_params'])} embedding"],
        ["tokens", _si(p["tokens"]), p["tokens_source"]],
        ["FLOPs per token", f"{p['flops_per_token']:.4g}",
         f"6 × matmul params + {p['attention_flops_per_token']:.3g} attention (seq {seq}"
         f"{', causal halved' if p['causal_attention_halved'] else ', full square'})"],
        ["training FLOPs", f"{p['train_flops']:.4g}", p.get("train_flops_how", "FLOPs per token × tokens")],
        ["peak per GPU", f"{p['peak_flops_per_gpu'] / 1e12:.4g} TFLOP/s", f"{p['gpu']}: {p['peak_source']}"],
        ["MFU assumed", f"{p['mfu_assumed']:.1%}", p["mfu_source"]],
        ["MFU required", "-" if p["mfu_required"] is None else f"{p['mfu_required']:.1%}",
         "by --gpus × --days" if p["mfu_required"] is not None else "give --gpus G and --days D"],
        ["tokens/s per GPU", _si(p["tokens_per_second_per_gpu"]), "peak × MFU ÷ FLOPs per token"],
        ["GPU-hours", _si(p["gpu_hours"]), "training FLOPs ÷ (peak × MFU) ÷ 3600"],
        ["GPUs needed", "-" if p["gpus_needed"] is None else str(p["gpus_needed"]), days_how],
        ["days", "-" if p["days_needed"] is None else f"{p['days_needed']:.1f}",
         f"on --gpus {p['gpus']}" if p["gpus"] is not None else "give --gpus G"],
        ["cost", "-" if p["cost_usd"] is None else f"${_si(p['cost_usd'])}",
         f"GPU-hours × ${p['price_usd_per_gpu_hour']:g}" if p["cost_usd"] is not None
         else "give --price USD_PER_GPU_HOUR"],
        ["KV cache per token", f"{p['kv_cache_bytes_per_token']} B",
         "layers × kv_heads × head_dim × 2 (K, V) × 2 B (bf16)"],
        ["activations / micro-batch", f"{_gib(act['full'])} GiB",
         f"{act['micro_batch_size']} × {seq} tokens, fused attention; eager attention "
         f"{_gib(act['full_eager_attention'])} GiB"],
    ]
    return rows


def memory_rows(plan: dict) -> list[list[Any]]:
    """One row per ZeRO stage of the memory table, in GiB; ``*`` marks the recipe's stage."""
    rows = []
    for stage, m in plan["memory_per_gpu_bytes"].items():
        fits = "-" if m["fits"] is None else ("yes" if m["fits"] else
                                              ("ckpt" if m["fits_checkpointed"] else "no"))
        mark = "*" if str(plan.get("recipe_zero_stage")) == stage else ""
        reference = [_gib(m["reference"])] if "reference" in m else []
        rows.append([f"{stage}{mark}", _gib(m["weights"]), _gib(m["grads"]), _gib(m["optimizer"]), *reference,
                     _gib(m["activations"]), _gib(m["activations_checkpointed"]), _gib(m["total"]),
                     _gib(m["total_checkpointed"]), fits])
    return rows


def print_plan(plan: dict, file: TextIO | None = None) -> None:
    """The plan as two tables (summary, memory per ZeRO stage); warnings go to stderr."""
    from smolforge.table import print_table

    out = file or sys.stdout
    title = f"plan for {plan['recipe']}" + (f" ({plan['name']})" if plan.get("name") else "")
    print_table(["quantity", "value", "how"], summary_rows(plan), title=title, file=out)
    print(file=out)
    b = plan["bytes_per_param"]
    mem = plan["gpu_memory_bytes"]
    fits_head = f"fits {mem / 1e9:.0f} GB" if mem else "fits"
    reference = ["reference"] if "reference" in plan["memory_per_gpu_bytes"]["0"] else []
    print_table(
        ["zero", "weights", "grads", "optimizer", *reference, "activations", "act. ckpt", "total", "total ckpt",
         fits_head],
        memory_rows(plan),
        title=(f"memory per GPU (GiB) over {plan['data_parallel_gpus']} data-parallel GPUs, "
               f"{plan['precision']} {b['weights']}+{b['grads']}+{b['optimizer']} bytes/param"),
        file=out)
    print(f"* the recipe's zero_stage; fits: total <= {MEMORY_HEADROOM:.0%} of device memory, "
          "ckpt: only with activation checkpointing", file=out)
    warn(plan)


def warn(plan: dict, file: TextIO | None = None) -> None:
    """Each of the plan's warnings on a ``warning:`` line (stderr unless ``file``)."""
    for line in plan.get("warnings", []):
        print(f"warning: {line}", file=file or sys.stderr)


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def ppo_rows(plan: dict) -> list[list[str]]:
    """The (part, GB, how) rows of a PPO plan's memory table."""
    p, m = plan, plan["memory_per_gpu_bytes"]
    g = p["data_parallel_gpus"]
    zero = p["zero_stage"]
    b = p["bytes_per_param"]
    trained = f"{_si(p['policy_params'] + p['value_params'])} policy + value params"
    ckpt = "checkpointed" if p["gradient_checkpointing"] else "not checkpointed"

    def shard(stage: int) -> str:
        return f" / {g} GPUs (ZeRO-{zero})" if zero >= stage and g > 1 else ""

    rows = [
        ["weights", _gb(m["weights"]), f"{trained} × {b['weights']} B{shard(3)}"],
        ["grads", _gb(m["grads"]), f"× {b['grads']} B{shard(2)}"],
        ["optimizer", _gb(m["optimizer"]),
         f"× {b['optimizer']} B (Adam m, v{' + fp32 master' if b['optimizer'] == 12 else ''}){shard(1)}"],
        ["reference", _gb(m["reference"]), f"{_si(p['reference_params'])} frozen × "
         f"{2 if p['precision'] == 'bf16' else 4} B{shard(3)}"],
        ["resident (states + reference)", _gb(m["resident"]), "held all the time"],
        ["train activations", _gb(m["train_activations"]),
         f"mini-batch {p['mini_batch_size']} × {p['seq_len']} tokens, {ckpt}: policy {_gb(m['activations_policy'])}"
         f" (logits of {p['max_new_tokens'] + 1} positions) + value {_gb(m['activations_value'])}"],
        ["rollout", _gb(m["rollout"]),
         (f"KV cache {p['batch_size']} × {p['seq_len']} tokens × {p['kv_cache_bytes_per_token']} B"
          if p["rollouts"] == "hf" else f"weights sync copy {_gb(m['sync_copy'])}")
         + (f" + gathered policy + value weights {_gb(m['gathered_weights'])}" if m["gathered_weights"] else "")],
    ]
    if m["vllm_server"]:
        rows.append(["vLLM server", _gb(m["vllm_server"]),
                     f"ppo.vllm_gpu_memory_utilization {p['vllm_gpu_memory_utilization']:g} of the GPU, "
                     "holds the rollout KV cache"])
    fits = "-" if m["fits"] is None else ("yes" if m["fits"] else "no")
    rows.append(["peak", _gb(m["peak"]), "resident" + (" + vLLM server" if m["vllm_server"] else "")
                 + " + max(train activations, rollout)"])
    mem = p["gpu_memory_bytes"]
    rows.append([f"fits {mem / 1e9:.0f} GB" if mem else "fits", fits,
                 f"peak <= {MEMORY_HEADROOM:.0%} of device memory"])
    return rows


def print_ppo_plan(plan: dict, file: TextIO | None = None) -> None:
    """A PPO plan: the settings it read, then memory per GPU by part (GB = 1e9 bytes); warnings on stderr."""
    from smolforge.table import print_table

    out = file or sys.stdout
    p = plan
    title = f"PPO memory plan for {p['recipe']}" + (f" ({p['name']})" if p.get("name") else "")
    deepspeed = f"ZeRO-{p['zero_stage']} from {p['deepspeed']}" if p["deepspeed"] else "none (DDP)"
    rollouts = ("vLLM server (one process)" if p["rollouts"] == "vllm-server"
                else "HF generate" + (" (vLLM serves one process only)" if p["data_parallel_gpus"] > 1 else ""))
    rows = [
        ["model", f"{_si(p['policy_params'])} parameters", p["model_source"]],
        ["precision", p["precision"], p["precision_source"]],
        ["DeepSpeed", deepspeed, "ppo.deepspeed"],
        ["data-parallel GPUs", str(p["data_parallel_gpus"]), f"--gpus, {p['gpu']}"],
        ["sequence", f"{p['seq_len']} tokens", f"--prompt-len {p['prompt_len']} + ppo.max_new_tokens "
         f"{p['max_new_tokens']}"],
        ["batch per process", f"{p['batch_size']} / {p['mini_batch_size']}", "ppo.batch_size / ppo.mini_batch_size"],
        ["rollouts", p["rollouts"], rollouts],
    ]
    print_table(["quantity", "value", "how"], rows, title=title, file=out)
    print(file=out)
    print_table(["part", "GB", "how"], ppo_rows(plan), title="memory per GPU (GB = 1e9 bytes)", file=out)
    warn(plan)


def print_merge_plan(plan: dict, file: TextIO | None = None) -> None:
    """A merge plan: the models it loads and their memory (GB = 1e9 bytes); no GPU-hours."""
    from smolforge.table import print_table

    out = file or sys.stdout
    size = plan["memory_bytes"] / sum(m["params"] for m in plan["models"])
    rows = [[m["run"], _si(m["params"]), _gb(size * m["params"]), m["model_source"]] for m in plan["models"]]
    rows.append(["total", "", _gb(plan["memory_bytes"]), f"at most, in host memory: {plan['dtype']}, {size:g} B/param"])
    title = f"merge plan for {plan['recipe']}" + (f" ({plan['name']}, {plan['method']})" if plan.get("name") else "")
    print_table(["run", "parameters", "GB", "model"], rows, title=title, file=out)
    print(f"runs on: {plan['runs_on']}", file=out)
    warn(plan)


def folder_rows(plan: dict) -> list[list[str]]:
    """The rows of a folder plan's table, its total last."""
    rows = []
    for r in plan["rows"]:
        host = r["memory_on"] == "host"
        fits = "-" if r["fits"] is None else ("yes" if r["fits"] else "no")
        zero = "-" if r["zero_stage"] is None else f"{r['zero_stage']}{' ckpt' if r['activation_checkpointing'] else ''}"
        rows.append([r["recipe"], r["stage"], _si(r["tokens"]), f"{r['gpu_hours']:,.0f}",
                     "-" if r["days"] is None else f"{r['days']:.2f}",
                     f"{_gib(r['memory_per_gpu_bytes'])}{' host' if host else ''}", zero, fits, r["tokens_source"]])
    rows.append(["total", "", _si(sum(r["tokens"] or 0 for r in plan["rows"])), f"{plan['total_gpu_hours']:,.0f}",
                 f"{plan['total_days']:.2f}", "", "", "", "the recipes one after another"])
    return rows


def print_folder_plan(plan: dict, file: TextIO | None = None) -> None:
    """A folder plan: one line per planned recipe and the total; the recipes not planned; warnings on stderr."""
    from smolforge.table import print_table

    out = file or sys.stdout
    mfu = {r["mfu_assumed"] for r in plan["rows"] if r["mfu_assumed"] is not None}
    mem = plan["gpu_memory_bytes"]
    title = (f"plan for {plan['recipe']}: each recipe on {plan['gpus']} × {plan['gpu']}"
             + (f" at {mfu.pop():.0%} MFU" if len(mfu) == 1 else ""))
    print_table(["recipe", "stage", "tokens", "GPU-hours", "days", "GiB/GPU", "zero", f"fits {mem / 1e9:.0f} GB"
                 if mem else "fits", "tokens from"], folder_rows(plan), title=title, file=out)
    if plan["total_cost_usd"] is not None:
        print(f"cost: ${_si(plan['total_cost_usd'])}", file=out)
    print(f"GiB/GPU: memory per GPU at the recipe's ZeRO stage (ckpt: with its activation checkpointing); "
          f"fits: <= {MEMORY_HEADROOM:.0%} of device memory", file=out)
    for skipped in plan["not_planned"]:
        why = skipped["why"] if skipped["why"].startswith("not planned") else f"not planned: {skipped['why']}"
        print(f"{skipped['recipe']}: {why}", file=out)
    warn(plan)


def print_any_plan(plan: dict, file: TextIO | None = None) -> None:
    """The plan, by the printer for its stage (folder, merge, ppo, else pretrain / sft / dpo)."""
    printer = {"folder": print_folder_plan, "merge": print_merge_plan, "ppo": print_ppo_plan}.get(
        plan.get("stage"), print_plan)
    printer(plan, file)
