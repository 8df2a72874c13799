"""Supervised fine-tuning of a run's model on chat conversations with TRL's SFTTrainer.

    smolforge sft --config recipes/demo/sft.yaml
    smolforge sft --config recipes/demo/sft.yaml --set trainer.max_steps=20 --learning_rate 3e-4
    smolforge sft --config recipes/demo/sft.yaml --set lora.r=16 --set name=sft-lora

Reads a parent run (``model/``) and chat data (a data run's ``sft`` shards or a JSONL file of
``{"messages": [...]}`` rows) and trains with assistant-only loss through the tokenizer's chat
template (or ``chat_template:`` from the recipe). Templates without ``{% generation %}`` markers (most
released ones: SmolLM2, Qwen2.5, Llama 3, Gemma, Mistral) get their assistant tokens derived from the
rendered conversation (:mod:`.assistant_spans`), checked before a run exists. Writes a run whose ``model/`` is a plain HF
model. ``trainer:`` takes any ``trl.SFTConfig`` field. What smolforge adds, as the playbook
advises:

- **held-out split** (``eval_fraction``, 20 % by default): eval loss every ``trainer.eval_steps``,
  early stopping after ``early_stopping_patience`` evaluations without improvement, and the best
  checkpoint is the one exported;
- **learning rate relative to pretraining**: left at TRL's default, ``trainer.learning_rate``
  becomes ``lr_vs_pretrain`` (0.2) × the peak LR of the pretraining run in the lineage; a value
  you set outside 1/10–1/5 of it gets a warning;
- **LoRA** (``lora:``): PEFT adapters; the adapter is kept in ``adapter/`` and merged into
  ``model/``, so downstream stages, vLLM and lm-eval see a plain model.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field

from trl import SFTConfig

from smolforge.attention import check_choice
from smolforge.recipe import FRACTION
from smolforge.errors import RecipeError, RunError
from smolforge.determinism import DeterminismSpec
from smolforge.eval_watch import EvalWhileTraining
from smolforge.profiling import ProfileSpec
from smolforge.runs import Run, Runs

from .common import (LoraSpec, TrackingSpec, check_lora, export_merged, load_trainable, lora_config, quiet_tracking,
                     train_from_parent, trainer_defaults, validate_inputs)

log = logging.getLogger(__name__)
TRL_DEFAULT_LR = SFTConfig.__dataclass_fields__["learning_rate"].default


def defaults() -> dict:
    """Recipe values applied beneath the YAML.

    Packing is on only with a GPU: TRL's padding-free packing flattens a batch into one row,
    and without flash-attention's varlen kernels SDPA then computes the whole (batch x length)^2
    attention under a mask. On this CPU that was 5x slower per token than padded batches
    (1.05 s vs 0.15 s a step, 3.4k vs 16.6k tokens/s, tiny demo model).
    """
    from .common import cuda_available

    return {"trainer": trainer_defaults(max_steps=300, per_device_train_batch_size=64,
                                        lr_scheduler_type="cosine", warmup_steps=10, weight_decay=0.0,
                                        packing=cuda_available(), assistant_only_loss=True, max_length=256,
                                        eval_steps=50, per_device_eval_batch_size=64)}


@dataclass
class Recipe:
    name: str = "sft-demo"            # run name
    parent: str = "pretrain-demo"     # run whose model/ is fine-tuned
    data: str = "data-demo"           # data run (its sft shards) or a .jsonl of {"messages"} rows
    eval_fraction: float = field(default=0.2, metadata=FRACTION)       # held-out conversations for eval loss and early stopping (0 = off)
    early_stopping_patience: int = 3  # evaluations without a better eval loss before stopping (0 = off)
    lr_vs_pretrain: float = 0.2       # LR = this x the lineage's pretraining peak LR, when trainer.learning_rate is unset
    chat_template: str | None = None  # a Jinja chat template replacing the tokenizer's
    attn_implementation: str = "auto"  # auto | sdpa | flex_attention | flash_attention_2 | flash_attention_3 | eager: auto
                                       # takes a varlen kernel for packed/padding-free rows on a GPU (smolforge/attention.py)
    lora: LoraSpec | None = None      # PEFT LoRA adapters, merged into model/ at the end
    trainer: SFTConfig = field(default_factory=lambda: SFTConfig(**defaults()["trainer"]))  # any trl.SFTConfig field
    tracking: TrackingSpec = field(default_factory=quiet_tracking)  # report_to: tensorboard | trackio | wandb; prometheus_port
    profile: ProfileSpec = field(default_factory=ProfileSpec)  # torch.profiler trace of a step range into profile/ (off)
    eval_while_training: EvalWhileTraining = field(default_factory=EvalWhileTraining)  # {every: N, suites, stop_on}:
                                      #   checkpoints scored while training; a breach stops it (smolforge.eval_watch)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # seed, fixed threads, deterministic kernels (null: on for CPU runs)


def pretraining_lr(runs: Runs, ref: str) -> float | None:
    """The peak learning rate of the first pretraining run among ``ref`` and its ancestors (continued
    pretraining runs, with ``init:``, are looked past: the playbook's ratio is to the main pretraining)."""
    queue, seen = [ref], set()
    while queue:
        name = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        try:
            run = runs.get(name)
        except RunError:
            continue
        if run.stage == "pretrain" and not run.info["recipe"].get("init"):  # continued pretraining: look past it
            return float(run.info["recipe"]["train"]["learning_rate"])
        queue += run.parents
    return None


def resolve_learning_rate(recipe: Recipe, runs: Runs) -> None:
    """Set or check ``trainer.learning_rate`` against the lineage's pretraining LR."""
    base = pretraining_lr(runs, recipe.parent)
    lr = recipe.trainer.learning_rate
    if lr == TRL_DEFAULT_LR:
        if base is None:
            log.info("sft: no pretraining run in the lineage of '%s'; trainer.learning_rate stays %g",
                     recipe.parent, lr)
            return
        recipe.trainer.learning_rate = recipe.lr_vs_pretrain * base
        log.info("sft: learning_rate %g = %g x pretraining peak %g", recipe.trainer.learning_rate,
                 recipe.lr_vs_pretrain, base)
    elif base is not None and not base / 10 * 0.999 <= lr <= base / 5 * 1.001:
        log.warning("sft: trainer.learning_rate %g is outside 1/10-1/5 of the pretraining peak %g "
                    "(the playbook's range: %g-%g)", lr, base, base / 10, base / 5)


def _with_early_stopping(recipe: Recipe) -> SFTConfig:
    """The trainer config with evaluation, best-checkpoint tracking and export of the best."""
    t = recipe.trainer
    if recipe.eval_fraction <= 0:
        return t
    changes = {"eval_strategy": "steps", "eval_steps": t.eval_steps or 50}
    if recipe.early_stopping_patience > 0:
        changes.update(save_strategy="steps", save_steps=changes["eval_steps"], save_total_limit=1,
                       load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False)
    return dataclasses.replace(t, **changes)


def validate(recipe: Recipe, runs: Runs) -> None:
    if not 0 <= recipe.eval_fraction < 1:
        raise RecipeError(f"eval_fraction must be in [0, 1), got {recipe.eval_fraction}")
    if recipe.early_stopping_patience < 0:
        raise RecipeError(f"early_stopping_patience must be >= 0, got {recipe.early_stopping_patience}")
    if recipe.early_stopping_patience and not recipe.eval_fraction:
        raise RecipeError("early_stopping_patience needs a held-out split: set eval_fraction > 0 (or patience 0)")
    if not 0 < recipe.lr_vs_pretrain <= 1:
        raise RecipeError(f"lr_vs_pretrain must be in (0, 1], got {recipe.lr_vs_pretrain}")
    t = recipe.trainer
    if t.padding_free and not t.packing and t.max_length is not None:
        raise RecipeError("trainer.padding_free without trainer.packing does not cut rows at trainer.max_length "
                          f"({t.max_length}), which TRL refuses: set trainer.max_length: null (rows as they are) "
                          "or trainer.packing: true (rows packed to max_length)")
    check_choice(recipe.attn_implementation)
    check_lora(recipe.lora)
    validate_inputs("sft", recipe, runs)
    attention(recipe, runs)
    check_chat_template(recipe, runs)


def attention(recipe: Recipe, runs: Runs) -> str:
    """The attention implementation the run loads its model with: ``attn_implementation`` resolved for
    this machine and these batches (packed or padding-free rows are one flattened row per batch: without a
    varlen kernel, sdpa computes them under a dense (batch x length)^2 mask); RecipeError when the asked
    one cannot run here."""
    import json

    from smolforge.attention import resolve_attention

    from .common import model_parent

    t = recipe.trainer
    config = json.loads((model_parent(runs, recipe.parent).model_dir / "config.json").read_text())
    return resolve_attention(recipe.attn_implementation, packed=bool(t.packing or t.padding_free),
                             half_precision=bool(t.bf16 or t.fp16), dropout=float(config.get("attention_dropout") or 0.0))


def _summary(trainer) -> dict:
    state = trainer.state
    out = {"train/attn_implementation": trainer.model.config._attn_implementation}
    evals = [h["eval_loss"] for h in state.log_history if "eval_loss" in h]
    if evals:
        out["sft/heldout_loss"] = round(min(evals), 5)
        out["sft/evaluations"] = len(evals)
    if state.best_model_checkpoint:
        out["sft/best_step"] = int(state.best_model_checkpoint.rstrip("/").rsplit("-", 1)[-1])
    out["sft/stopped_early"] = state.global_step < state.max_steps
    return out


def _template(recipe: Recipe, tokenizer) -> str | None:
    return recipe.chat_template or getattr(tokenizer, "chat_template", None)


def derives_masks(recipe: Recipe, tokenizer) -> bool:
    """Whether smolforge derives the assistant masks itself (assistant-only loss, a template without
    ``{% generation %}`` markers); RecipeError when there is no chat template at all."""
    from .assistant_spans import has_generation_markers

    if not recipe.trainer.assistant_only_loss:
        return False
    template = _template(recipe, tokenizer)
    if not template:
        raise RecipeError(f"sft: the parent '{recipe.parent}' has no chat template to train conversations with: "
                          "set chat_template: in the recipe (a Jinja string)")
    return not has_generation_markers(template)


def check_chat_template(recipe: Recipe, runs: Runs) -> None:
    """Render the first conversations with the template the run will use; RecipeError with the choices
    (``chat_template:`` or ``trainer.assistant_only_loss: false``) when assistant spans cannot be derived."""
    from smolforge.data.schemas import load_many, resolve_data
    from smolforge.generation.prompts import load_tokenizer

    from .assistant_spans import CHECK_ROWS, check_template
    from .common import model_parent

    tokenizer = load_tokenizer(model_parent(runs, recipe.parent).model_dir)
    if recipe.chat_template:
        tokenizer.chat_template = recipe.chat_template
    if derives_masks(recipe, tokenizer):
        paths, _ = resolve_data(recipe.data, runs, "sft")
        check_template(tokenizer, load_many(paths, "chat")[:CHECK_ROWS])


def trainer_factory(recipe: Recipe, attn_implementation: str | None = None):
    """``make_trainer(model_dir, dataset, tokenizer, callbacks, eval_dataset=None)``: TRL's SFTTrainer as
    this recipe trains (``trainer:`` as its args, the chat template, early stopping, LoRA); :func:`run`
    and the LR range test (:mod:`smolforge.ops.lr_find.sft`) build their trainers with it;
    ``attn_implementation`` as :func:`attention` resolved it (None: transformers' default)."""
    from transformers import EarlyStoppingCallback
    from trl import SFTTrainer

    peft_config = lora_config(recipe.lora) if recipe.lora is not None else None

    def make_trainer(model_dir, dataset, tokenizer, callbacks, eval_dataset=None):
        if recipe.chat_template:
            tokenizer.chat_template = recipe.chat_template
        args = recipe.trainer
        if "assistant_masks" in dataset.column_names:  # pre-tokenized by prepare_rows: TRL builds labels from them
            args = dataclasses.replace(args, assistant_only_loss=False)
        if eval_dataset is not None and recipe.early_stopping_patience > 0:
            callbacks = callbacks + [EarlyStoppingCallback(early_stopping_patience=recipe.early_stopping_patience)]
        loading = {"attn_implementation": attn_implementation} if attn_implementation else {}
        return SFTTrainer(model=load_trainable(model_dir, **loading), args=args,
                          train_dataset=dataset, eval_dataset=eval_dataset, processing_class=tokenizer,
                          callbacks=callbacks, peft_config=peft_config)

    return make_trainer


def with_tool_schemas(rows: list) -> list:
    """Rows whose ``tools`` name tools (``["calculator"]``, the world's tool conversations) or carry
    schemas get their JSON schemas as one JSON string (TRL's SFT renders them into the prompt); every
    row gets the column once one has it (a dataset's columns come from its first row).

    >>> rows = with_tool_schemas([{"messages": []}, {"messages": [], "tools": ["calculator"]}])
    >>> rows[0]["tools"], json.loads(rows[1]["tools"])[0]["function"]["name"]
    (None, 'calculator')
    """
    if not any(row.get("tools") for row in rows):
        return rows
    from smolforge.generation.tool_loop import tool_schemas

    rendered: dict[str, str] = {}
    out = []
    for row in rows:
        tools = row.get("tools")
        if tools:
            key = json.dumps(tools, sort_keys=True)
            if key not in rendered:
                rendered[key] = json.dumps(tool_schemas(tools if isinstance(tools, list) else [tools]))
            tools = rendered[key]
        out.append({**row, "tools": tools or None})
    return out


def prepare_rows(recipe: Recipe):
    """``prepare(rows, tokenizer)`` for :func:`train_from_parent`: the recipe's chat template on the
    tokenizer, and, where smolforge derives the masks, every conversation pre-tokenized with its
    ``assistant_masks`` (a row that fails names itself; no run exists yet)."""
    from .assistant_spans import tokenize_rows

    figures: dict = {}

    def prepare(rows: list, tokenizer) -> list:
        if recipe.chat_template:
            tokenizer.chat_template = recipe.chat_template
        rows = with_tool_schemas(rows)
        if not derives_masks(recipe, tokenizer):
            return rows
        if any(row.get("tools") for row in rows):
            raise RecipeError("rows with tools need a chat template with {% generation %} markers (TRL renders the "
                              "tools into the prompt); this template has none, so smolforge would derive the "
                              "assistant masks without them")
        tokenized, fraction = tokenize_rows(tokenizer, rows)
        log.info("sft: the chat template has no {%% generation %%} markers; assistant tokens derived from the "
                 "rendered conversations (%d rows, %.1f %% of tokens trained on)", len(rows), 100 * fraction)
        figures.update({"sft/derived_assistant_masks": True, "sft/assistant_token_fraction": round(fraction, 4)})
        return tokenized

    prepare.figures = figures
    return prepare


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    resolve_learning_rate(recipe, runs)
    recipe.trainer = _with_early_stopping(recipe)
    prepare = prepare_rows(recipe)
    make_trainer = trainer_factory(recipe, attention(recipe, runs))
    return train_from_parent("sft", recipe, runs, make_trainer, overwrite=overwrite,
                             summarize=lambda trainer: {**_summary(trainer), **prepare.figures},
                             eval_fraction=recipe.eval_fraction, prepare=prepare,
                             export=export_merged if recipe.lora is not None else None)
