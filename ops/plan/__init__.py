"""Plan a run before paying for it: parameters, FLOPs, GPU-hours, GPUs, cost, memory (``smolforge plan``).

    smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11e12 --gpus 384 --days 24
    smolforge plan recipes/smollm3-3b/pretrain.yaml --tokens 11T --mfu 0.3 --days 24 --price 2.5 --json
    smolforge plan recipes/smollm3-3b/ppo.yaml --model recipes/smollm3-3b/pretrain.yaml --gpus 8 --gpu h100
    smolforge plan recipes/smollm3-3b --gpus 384

:func:`plan_file` reads a recipe and picks its plan; :func:`plan_folder` plans every recipe of a
folder on the same GPUs and sums their GPU-hours. The parts, each importing only those above it in
this list:

- :mod:`.inputs`: numbers as written (``11T``), the device, recipes beside one another, model shapes;
- :mod:`.memory`: bytes per parameter, activations, memory per ZeRO stage, PPO's memory by part;
- :mod:`.numbers`: the arithmetic every plan shares (FLOPs, MFU, GPU-hours, GPUs or days, cost, warnings);
- :mod:`.pretrain`, :mod:`.ppo`, :mod:`.posttrain`: the plan of a pretrain, PPO, or sft/dpo/merge recipe;
- :mod:`.report`: the plans as tables, their warnings.

An MFU above 60 % gets a warning (the playbook: 0.6–0.8 is optimistic for dense training;
SmolLM3's own run implies ≈26–31 %). Memory per GPU is given for ZeRO stages 0–3 with mixed
precision (bf16 weights and grads, fp32 master weights + Adam m and v: 2 + 2 + 12 bytes per
parameter; fp32 recipes: 4 + 4 + 8), sharded over the data-parallel GPUs. Formulas and sources:
docs/planner.md and :mod:`smolforge.pretrain.flops`. The names the parts export are importable from here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError
from smolforge.pretrain.flops import device_key, unknown_device_message

from .inputs import DEFAULT_VOCAB, device_fields, load_pretrain_recipe, parse_count
from .memory import activation_bytes, memory_per_gpu, ppo_memory
from .numbers import DEFAULT_MFU, MFU_WARNING
from .posttrain import make_merge_plan, make_posttrain_plan, recipe_lineage
from .ppo import DEFAULT_PROMPT_LEN, PPO_DEFAULTS, make_ppo_plan
from .pretrain import make_plan
from .report import print_any_plan, print_plan, warn

__all__ = [
    "DEFAULT_MFU", "MFU_WARNING", "DEFAULT_VOCAB", "load_pretrain_recipe", "parse_count",
    "activation_bytes", "memory_per_gpu", "make_plan", "plan_file", "plan_folder", "print_plan", "print_any_plan",
    "warn", "DEFAULT_PROMPT_LEN", "PPO_DEFAULTS", "make_ppo_plan", "ppo_memory", "make_posttrain_plan",
    "make_merge_plan", "PLANNED_STAGES", "NOT_PLANNED_HINTS",
]

PLANNED_STAGES = ("pretrain", "sft", "dpo", "merge")

NOT_PLANNED_HINTS = {   # what to do instead, for the stages a folder plan leaves out
    "ppo": "memory only, one file: smolforge plan {path} --model PRETRAIN_RECIPE --gpus G",
    "data": "CPU (datatrove) work, no GPU-hours",
}


def plan_file(path: str | Path, sets: list[str] | tuple[str, ...] = (), *, runs_dir: str | Path | None = None,
              **options: Any) -> dict:
    """The plan of the recipe at ``path`` (``sets``: ``key=value`` overrides): :func:`make_plan` for a
    pretrain recipe, :func:`make_ppo_plan` for a PPO recipe (``runs_dir``: where its parent run is),
    :mod:`.posttrain`'s plans for sft, dpo and merge recipes, and for a folder :func:`plan_folder`. An
    option the recipe's stage does not take (not None) is a RecipeError, as is a stage no plan is made for.

    Checks the cheap things first (device, numbers) so a typo fails before transformers loads.

    >>> plan_file("recipes/smollm3-3b/pretrain.yaml", gpu="b200")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: unknown GPU 'b200' (did you mean 'h200'?; known: a100, a100-40g, a10g, cpu, h100, h100-pcie, h200, l40s)
    >>> plan_file("recipes/smollm3-3b/ppo.yaml", tokens="1B")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: --tokens is for pretrain, sft and dpo recipes; recipes/smollm3-3b/ppo.yaml is a ppo recipe
    """
    if device_key(options.get("gpu", "h100")) is None:
        raise RecipeError(unknown_device_message(options.get("gpu")))
    from smolforge.recipe import load_recipe

    if Path(path).is_dir():
        if sets:
            raise RecipeError(f"--set changes one recipe; plan the file alone (smolforge plan {path}/FILE.yaml --set ...)")
        return plan_folder(path, runs_dir=runs_dir, **options)
    stage, data = load_recipe(path, sets)
    if stage not in _STAGE_OPTIONS:
        raise RecipeError(f"{path}: recipe is for stage '{stage}'; smolforge plan plans recipes for stage: pretrain, "
                          "sft, dpo, merge (GPU-hours, memory) and ppo (memory, with --model), "
                          "e.g. recipes/smollm3-3b/pretrain.yaml, or a folder of them")
    for key, value in options.items():
        if value is not None and key not in _STAGE_OPTIONS[stage] + _COMMON_OPTIONS:
            takes = [s for s, keys in _STAGE_OPTIONS.items() if key in keys]
            kinds = ", ".join(takes[:-1]) + f" and {takes[-1]}" if len(takes) > 1 else takes[0]
            raise RecipeError(f"--{key.replace('_', '-')} is for {kinds} recipes; {path} is a {stage} recipe")
    options = {k: v for k, v in options.items() if k in _STAGE_OPTIONS[stage] + _COMMON_OPTIONS}
    if stage == "ppo":
        return make_ppo_plan(data, source=str(path), runs_dir=runs_dir, **options)
    if stage in ("sft", "dpo"):
        return make_posttrain_plan(stage, data, source=str(path), runs_dir=runs_dir, **options)
    if stage == "merge":
        return make_merge_plan(data, source=str(path), runs_dir=runs_dir, **options)
    return make_plan(load_pretrain_recipe(path, sets), source=str(path), **options)

_COMMON_OPTIONS = ("gpu", "gpus", "vocab")

_STAGE_OPTIONS = {   # what each stage's plan takes besides the common options
    "pretrain": ("tokens", "days", "mfu", "price", "seq_len"),
    "sft": ("tokens", "days", "mfu", "price", "seq_len", "model"),
    "dpo": ("tokens", "days", "mfu", "price", "seq_len", "model"),
    "merge": (),
    "ppo": ("model", "prompt_len"),
}


# --------------------------------------------------------------------------- a folder


def plan_folder(folder: str | Path, *, gpu: str = "h100", gpus: Any = None, mfu: Any = None, price: Any = None,
                vocab: Any = DEFAULT_VOCAB, runs_dir: Any = None, **per_recipe: Any) -> dict:
    """Plan every pretrain, sft, dpo and merge recipe in ``folder`` on ``gpus`` GPUs, in lineage order,
    with their total; ``not_planned`` lists the other recipes and why.

    >>> plan_folder("recipes/smollm3-3b", gpus=384, tokens="1T")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: --tokens is per recipe: plan one file for it (smolforge plan recipes/smollm3-3b/FILE.yaml --tokens ...)
    """
    for key, value in per_recipe.items():
        if value is not None:
            flag = f"--{key.replace('_', '-')}"
            raise RecipeError(f"{flag} is per recipe: plan one file for it (smolforge plan {folder}/FILE.yaml {flag} ...)")
    if gpus is None:
        raise RecipeError(f"a folder plan needs --gpus G: every recipe in {folder} is planned on G GPUs "
                          "(e.g. --gpus 384, SmolLM3's 48 nodes of 8 H100s)")
    from smolforge.recipe import load_recipe

    rows, skipped, warnings = [], [], []
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            stage, data = load_recipe(path)
        except RecipeError as exc:
            why = "not planned: a pipeline" if "pipeline recipe" in str(exc) else str(exc)
            skipped.append({"recipe": path.name, "stage": None, "why": why})
            continue
        if stage not in PLANNED_STAGES:
            hint = NOT_PLANNED_HINTS.get(stage, "").format(path=path)
            skipped.append({"recipe": path.name, "stage": stage,
                            "why": f"not planned: {stage}" + (f" ({hint})" if hint else "")})
            continue
        try:
            plan = plan_file(path, gpu=gpu, gpus=gpus, mfu=mfu, price=price, vocab=vocab, runs_dir=runs_dir)
        except RecipeError as exc:
            skipped.append({"recipe": path.name, "stage": stage, "why": str(exc)})
            continue
        rows.append(_row(path, stage, data, plan))
        warnings += [f"{path.name}: {w}" for w in plan["warnings"]]
    rows.sort(key=lambda r: (r.pop("_depth"), r["recipe"]))
    device = device_fields(gpu)
    return {"recipe": str(folder), "stage": "folder", "gpu": device["gpu"], "gpus": int(parse_count(gpus, "--gpus")),
            "gpu_memory_bytes": device["gpu_memory_bytes"], "rows": rows,
            "total_gpu_hours": sum(r["gpu_hours"] for r in rows), "total_days": sum(r["days"] or 0.0 for r in rows),
            "total_cost_usd": sum(r["cost_usd"] for r in rows) if price is not None else None,
            "not_planned": skipped, "warnings": warnings}


def _row(path: Path, stage: str, data: dict, plan: dict) -> dict[str, Any]:
    """One recipe's line of a folder plan."""
    lineage = recipe_lineage(path, stage, data) or [(path, stage)]
    row = {"recipe": path.name, "stage": stage, "name": plan.get("name"), "_depth": len(lineage)}
    if stage == "merge":
        return {**row, "tokens": None, "tokens_source": plan["runs_on"], "gpu_hours": 0.0, "days": None,
                "cost_usd": 0.0, "mfu_assumed": None, "zero_stage": None, "activation_checkpointing": None,
                "memory_per_gpu_bytes": plan["memory_bytes"], "memory_on": "host", "fits": None}
    zero, ckpt = plan["recipe_zero_stage"], bool(plan["recipe_activation_checkpointing"])
    memory = plan["memory_per_gpu_bytes"][str(zero)]
    return {**row, "tokens": plan["tokens"], "tokens_source": plan["tokens_source"], "gpu_hours": plan["gpu_hours"],
            "days": plan["days_needed"], "cost_usd": plan["cost_usd"],
            "mfu_assumed": plan["mfu_assumed"], "zero_stage": zero, "activation_checkpointing": ckpt,
            "memory_per_gpu_bytes": memory["total_checkpointed" if ckpt else "total"], "memory_on": "gpu",
            "fits": memory["fits_checkpointed" if ckpt else "fits"]}
