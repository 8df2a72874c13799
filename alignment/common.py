"""Helpers every TRL-driven stage shares: trainer defaults, parent models, logging into the run.

    >>> defaults = trainer_defaults(max_steps=10)
    >>> defaults["max_steps"], defaults["report_to"]
    (10, 'none')
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smolforge.determinism import DeterminismSpec, check_spec
from smolforge.errors import RecipeError, RunError
from smolforge.generation.prompts import load_tokenizer
from smolforge.model_folder import check_model_folder
from smolforge.profiling import StepProfiler, check_profile
from smolforge.recipe import FRACTION, to_dict
from smolforge.runs import Run, Runs
from smolforge.tracking import TrackingSpec

from .eval_watch import check_eval_watch, eval_watch


@dataclass
class LoraSpec:
    r: int = 16                       # adapter rank
    alpha: int = 32                   # scaling numerator (scale = alpha / r)
    dropout: float = field(default=0.05, metadata=FRACTION)            # adapter dropout (DPO's disable_dropout, on by default, zeroes it)
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"])  # modules to adapt


def check_lora(spec: LoraSpec | None) -> None:
    if spec is not None and (spec.r < 1 or spec.alpha <= 0 or not spec.target_modules):
        raise RecipeError("lora: r must be >= 1, alpha > 0 and target_modules non-empty")


def lora_config(spec: LoraSpec, task_type: str = "CAUSAL_LM"):
    """PEFT's LoraConfig from the recipe's ``lora:`` (``SEQ_CLS`` also trains a new score head fully)."""
    from peft import LoraConfig

    return LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                      target_modules=list(spec.target_modules), task_type=task_type)


def export_merged(trainer, run: Run):
    """Keep the adapter in ``adapter/`` and return the base model with the adapter merged in."""
    trainer.model.save_pretrained(run.adapter_dir, safe_serialization=True)
    return trainer.model.merge_and_unload()


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def load_trainable(model_dir: str | Path, *, auto_class: Any = None, **kwargs) -> Any:
    """The model a stage trains, loaded from ``model_dir`` in float32 whatever the checkpoint's dtype.

    These weights are the optimizer's master copy. transformers 5 loads a checkpoint in its own
    dtype, so a bf16 parent (pretraining with ``train.precision: bf16``) would have AdamW update
    bf16 weights directly, where small updates round away. HF Trainer's ``bf16`` without
    DeepSpeed is autocast over these fp32 weights; DeepSpeed's bf16 casts the module itself and
    keeps its own fp32 master copy, so fp32 is the right start there too (the planner counts both
    so: ``ppo_state_bytes_per_param``). ``auto_class`` defaults to ``AutoModelForCausalLM``;
    ``kwargs`` go to its ``from_pretrained`` (e.g. ``attn_implementation``).
    """
    import torch
    from transformers import AutoModelForCausalLM

    return (auto_class or AutoModelForCausalLM).from_pretrained(model_dir, dtype=torch.float32, **kwargs)


def frozen_dtype(bf16: bool) -> str:
    """The dtype of a frozen model beside a trainer (DPO's and PPO's reference): bf16 when training
    is bf16, else float32.

    It gets no optimizer updates, so it needs no fp32 master copy; under bf16 its matmuls run in
    bf16 anyway (autocast, or DeepSpeed's bf16 engine), and bf16 halves its memory (the planner
    counts a reference at 2 bytes a parameter in bf16, 4 in fp32).

    >>> frozen_dtype(bf16=True), frozen_dtype(bf16=False)
    ('bfloat16', 'float32')
    """
    return "bfloat16" if bf16 else "float32"


def load_frozen(model_dir: str | Path, *, bf16: bool, **kwargs) -> Any:
    """A frozen causal LM from ``model_dir`` (a reference model): :func:`frozen_dtype`, no gradients, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, frozen_dtype(bf16)), **kwargs)
    model.requires_grad_(False)
    return model.eval()


def trainer_defaults(**overrides) -> dict:
    """TrainingArguments values that work on the demo (CPU, tiny model) and on a GPU.

    On CPU: ``use_cpu`` and fp32 without gradient checkpointing (bf16 autocast and checkpointing
    made tiny models 2-8x slower there). On a GPU: bf16 and checkpointing, TRL's own defaults.
    A checkpoint every 100 steps (the newest two kept) lets an interrupted stage resume.
    """
    on_gpu = cuda_available()
    values = {"use_cpu": not on_gpu, "bf16": on_gpu, "gradient_checkpointing": on_gpu,
              "report_to": "none", "save_strategy": "steps", "save_steps": 100, "save_total_limit": 2,
              "logging_steps": 10, "seed": 0,
              "dataloader_num_workers": 0, "include_num_input_tokens_seen": "non_padding"}
    values.update(overrides)
    return values


def model_parent(runs: Runs, ref: str) -> Run:
    """The parent run whose ``model/`` a stage starts from (done, with a model)."""
    parent = runs.get(ref)
    if not (parent.model_dir / "config.json").is_file():
        raise RunError(f"parent run '{parent.name}' (stage {parent.stage}) has no model/ to start from")
    check_model_folder(parent.model_dir, f"parent run '{parent.name}'")
    return parent


def lineage_fingerprints(parents: list[Run], own: dict[str, list[Path]]) -> dict[str, str]:
    """The parents' data fingerprints plus those of the files this stage reads itself (several
    files, e.g. a data run's shards, get one fingerprint: sha256 of their bytes in order)."""
    from smolforge.data.shards import files_fingerprint

    merged: dict[str, str] = {}
    for parent in parents:
        merged.update(parent.info.get("data_fingerprints") or {})
    merged.update({label: files_fingerprint(paths) for label, paths in own.items()})
    return merged


def quiet_tracking() -> TrackingSpec:
    """The TRL stages' default ``tracking:``: metrics.jsonl only, until a recipe names a reporter."""
    return TrackingSpec(report_to=["none"])


def check_determinism(recipe) -> None:
    """RecipeError, before any run exists, when the recipe's ``determinism:`` cannot be applied."""
    check_spec(getattr(recipe, "determinism", None) or DeterminismSpec())


def check_tracking(recipe) -> None:
    """RecipeError, before any run exists, when ``tracking.report_to`` names an unknown or missing reporter."""
    from smolforge.tracking import resolve_report_to

    resolve_report_to(recipe.tracking.report_to)


def open_tracker(run: Run, recipe, main: bool = True):
    """The recipe's :class:`~smolforge.tracking.Tracker` on the main process (a context manager;
    ``None`` inside it elsewhere): for a stage with its own loop, as PPO's."""
    import contextlib

    if not main:
        return contextlib.nullcontext(None)
    from smolforge.tracking import Tracker

    return Tracker(run.path, run.name, to_dict(recipe), recipe.tracking.report_to, recipe.tracking.prometheus_port)


def run_logger(run: Run, recipe):
    """A TrainerCallback that appends every Trainer log line to the run's metrics.jsonl and, on the
    main process, mirrors it to the recipe's ``tracking:`` reporters (TensorBoard, wandb, trackio,
    a Prometheus endpoint) through the same :class:`~smolforge.tracking.Tracker` pretraining uses."""
    from transformers import TrainerCallback

    class RunLogger(TrainerCallback):
        tracker = None

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero and self.tracker is None:
                self.tracker = open_tracker(run, recipe)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and state.is_world_process_zero:
                numbers = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
                run.log(state.global_step, **numbers)
                if self.tracker is not None:
                    self.tracker.log(state.global_step, numbers)

        def on_train_end(self, args, state, control, **kwargs):
            if self.tracker is not None:
                self.tracker.close()
                self.tracker = None

    return RunLogger()


def step_profiler(run: Run, recipe):
    """A TrainerCallback recording the recipe's ``profile:`` steps with
    :class:`~smolforge.profiling.StepProfiler` (``on_step_end`` = one optimizer step; each process
    writes its own trace, the main one prints the tables). Also a context manager around
    ``trainer.train()``, so a training that raises stops the profiler; afterwards ``metrics`` holds
    the ``profile/*`` figures for run.json."""
    from transformers import TrainerCallback

    class ProfileSteps(TrainerCallback):
        def __init__(self) -> None:
            self.profiler: StepProfiler | None = None
            self.metrics: dict = {}

        def on_train_begin(self, args, state, control, **kwargs):
            self.close()
            self.profiler = StepProfiler(recipe.profile, run.path, args.process_index, done=state.global_step,
                                         main=state.is_world_process_zero).__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if self.profiler is not None:
                self.profiler.step()

        def on_train_end(self, args, state, control, **kwargs):
            self.close()

        def close(self, exc_type=None, exc=None, tb=None) -> None:
            if self.profiler is not None:
                profiler, self.profiler = self.profiler, None
                profiler.__exit__(exc_type, exc, tb)
                self.metrics = profiler.metrics

        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb) -> None:
            self.close(exc_type, exc, tb)

    return ProfileSteps()


def train_summary(trainer, result) -> dict:
    """Flat ``train/*`` metrics for run.json from a finished Trainer."""
    state = trainer.state
    losses = [h["loss"] for h in state.log_history if "loss" in h]
    summary = {"train/steps": state.global_step, "train/loss": round(result.training_loss, 5),
               "train/seconds": round(result.metrics.get("train_runtime", 0.0), 1),
               "train/tokens": int(state.num_input_tokens_seen or 0)}
    if losses:
        summary["train/first_loss"] = round(losses[0], 5)
        summary["train/last_loss"] = round(losses[-1], 5)
    return {**summary, **trained_dtypes(trainer.model, trainer.optimizer)}


def trained_dtypes(model, optimizer) -> dict:
    """``train/weight_dtype`` and ``train/master_dtype``: what the trainable weights hold and what the
    optimizer updates. Wrappers (accelerate's, DeepSpeed's ZeRO and bf16 optimizers) are unwrapped to the
    torch optimizer inside, whose parameters are the master copy (DeepSpeed's fp32 partitions); a ZeRO-3
    parameter's own dtype is that of its partition (``ds_tensor``).

    >>> import torch
    >>> layer = torch.nn.Linear(2, 2).to(torch.bfloat16)
    >>> trained_dtypes(layer, torch.optim.AdamW(layer.parameters()))
    {'train/weight_dtype': 'bfloat16', 'train/master_dtype': 'bfloat16'}
    """
    def names(tensors) -> str:
        return "+".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors})) or "none"

    inner = optimizer
    while getattr(inner, "optimizer", None) is not None:
        inner = inner.optimizer
    weights = [getattr(p, "ds_tensor", p) for p in model.parameters() if p.requires_grad]
    masters = [p for group in getattr(inner, "param_groups", []) for p in group["params"]]
    return {"train/weight_dtype": names(weights), "train/master_dtype": names(masters)}


# What each TRL stage reads: the data kind (file name in a data run; of several, the first the run has)
# and the row schema. KTO reads a data run's unpaired feedback, else its pairs (two feedback rows each).
STAGE_DATA = {"sft": ("sft", "chat"), "dpo": ("prefs", "preference"), "orpo": ("prefs", "preference"),
              "reward": ("prefs", "preference"), "kto": (("feedback", "prefs"), "feedback"),
              "cpo": ("prefs", "preference")}


def read_kind(stage: str, data_run: Run | None, paths: list[Path]) -> str:
    """The kind a stage read: its one kind, or the one whose shards ``paths`` are (a file: the first).

    >>> read_kind("dpo", None, []), read_kind("kto", None, [Path("feedback.jsonl")])
    ('prefs', 'feedback')
    """
    from smolforge.data.shards import kind_files

    kinds = STAGE_DATA[stage][0]
    if isinstance(kinds, str):
        return kinds
    if data_run is None:
        return kinds[0]
    return next(kind for kind in kinds if kind_files(data_run.path, kind) == paths)


# The rows validate_inputs read, handed to the run that follows it in the same process (the data is
# read once), unless a file changed in between (its size or modification time).
_VALIDATED: dict[tuple, list] = {}


def _rows_key(paths: list[Path], schema: str) -> tuple:
    stats = [(str(p), p.stat()) for p in paths]
    return schema, tuple((name, st.st_size, st.st_mtime_ns) for name, st in stats)


def validated_rows(paths: list[Path], schema: str, *, keep: bool) -> list:
    """The rows of ``paths`` as ``schema`` validates them. ``keep=True`` (validation) keeps them for the
    next call; ``keep=False`` (the run) takes kept rows if the files are unchanged, else reads them.

    >>> import json, tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "p.jsonl"
    >>> _ = f.write_text(json.dumps({"prompt": "2+2?", "chosen": "4", "rejected": "5"}) + "\\n")
    >>> checked = validated_rows([f], "preference", keep=True)
    >>> validated_rows([f], "preference", keep=False) is checked, _VALIDATED
    (True, {})
    """
    from smolforge.data.schemas import load_many

    key = _rows_key(paths, schema)
    rows = _VALIDATED.pop(key, None)
    _VALIDATED.clear()        # at most one stage's rows wait, and only until its run takes them
    if rows is None:
        rows = load_many(paths, schema)
    if keep:
        _VALIDATED[key] = rows
    return rows


def validate_inputs(stage: str, recipe, runs: Runs) -> list:
    """The parent has a model and every data row is valid, before any run folder exists; the rows,
    kept for the run that follows."""
    from smolforge.data.schemas import resolve_data

    kind, schema = STAGE_DATA[stage]
    check_tracking(recipe)
    check_profile(recipe.profile, recipe.trainer.max_steps)
    check_determinism(recipe)
    model_parent(runs, recipe.parent)
    check_eval_watch(recipe)
    paths, _ = resolve_data(recipe.data, runs, kind)
    return validated_rows(paths, schema, keep=True)


def load_inputs(stage: str, recipe, runs: Runs) -> tuple[Run, Run | None, list[Path], list]:
    """A TRL stage's inputs: the parent run (with a model), the data run (None for a file), the data
    files and their validated rows (:func:`train_from_parent` and the LR range test read them so)."""
    from smolforge.data.schemas import resolve_data

    kind, schema = STAGE_DATA[stage]
    parent = model_parent(runs, recipe.parent)
    paths, data_run = resolve_data(recipe.data, runs, kind)
    return parent, data_run, paths, validated_rows(paths, schema, keep=False)


def split_heldout(rows: list, fraction: float, seed: int) -> tuple[list, list]:
    """A seeded shuffle, then the last ``fraction`` of the rows (at least one when > 0) is held out.

    >>> train, heldout = split_heldout(list(range(10)), 0.2, seed=0)
    >>> len(train), len(heldout), sorted(train + heldout) == list(range(10))
    (8, 2, True)
    """
    import random

    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_held = max(1, round(len(rows) * fraction)) if fraction > 0 else 0
    cut = len(rows) - n_held
    return [rows[i] for i in order[:cut]], [rows[i] for i in order[cut:]]


@contextlib.contextmanager
def reproducible_training(run: Run, recipe, seed: int, *, cuda: bool | None = None,
                          nondeterministic: tuple[dict, ...] = ()):
    """The recipe's ``determinism:`` (:func:`smolforge.determinism.reproducible`) around a stage's model
    building and training, its record in run.json's metrics (``determinism/*``, main process only);
    ``nondeterministic``: the parts it cannot fix (:func:`smolforge.determinism.nondeterministic`).
    A GPU run is one where the trainer does not train on the CPU (``trainer.use_cpu``)."""
    from smolforge.determinism import as_metrics, reproducible

    from .ranks import process_state

    if cuda is None:
        cuda = cuda_available() and not getattr(getattr(recipe, "trainer", None), "use_cpu", False)
    with reproducible(getattr(recipe, "determinism", None), seed, cuda=cuda) as record:
        record["nondeterministic"].extend(nondeterministic)
        if process_state().is_main_process:
            run.update_metrics(as_metrics(record))
        yield record


def train_from_parent(stage: str, recipe, runs: Runs, make_trainer: Callable[..., Any], *,
                      overwrite: bool = False, summarize: Callable[[Any], dict] | None = None,
                      eval_fraction: float = 0.0, export: Callable[[Any, Run], Any] | None = None,
                      extra_parents: tuple[Run, ...] = (),
                      prepare: Callable[[list, Any], list] | None = None) -> Run:
    """The shape every TRL stage shares: parent model + data → trainer → ``model/`` + summary.

    ``make_trainer(model_dir, dataset, tokenizer, callbacks)`` builds the TRL trainer (with
    ``eval_fraction > 0`` it also gets ``eval_dataset=``, a seeded held-out split of the rows);
    ``summarize(trainer)`` adds stage-specific figures to the ``train/*`` summary;
    ``export(trainer, run)`` returns the model to save (e.g. LoRA merged into its base);
    ``extra_parents`` are further runs the result depends on (e.g. DPO's reference run);
    ``prepare(rows, tokenizer)`` turns the validated rows into what the trainer reads (e.g. SFT's
    pre-tokenized assistant masks) before any run folder exists, so its errors leave none behind.
    """
    from datasets import Dataset

    from .ranks import check_exportable, save_trained, start_run, stop_on_request

    parent, data_run, paths, rows = load_inputs(stage, recipe, runs)
    kind = read_kind(stage, data_run, paths)
    if data_run is not None and not isinstance(STAGE_DATA[stage][0], str):
        print(f"{stage}: reading data/{kind}/ of data run {data_run.name} ({len(rows)} rows)", file=sys.stderr,
              flush=True)
    parents = [parent] + ([data_run] if data_run else [])
    parents += [extra for extra in extra_parents if extra.name not in {p.name for p in parents}]
    fingerprints = lineage_fingerprints(parents, {kind: paths})
    tokenizer = load_tokenizer(parent.model_dir)
    if prepare is not None:
        rows = prepare(rows, tokenizer)
    with start_run(runs, stage, recipe, parents, fingerprints, overwrite=overwrite) as (run, resume_from), \
            reproducible_training(run, recipe, recipe.trainer.seed):
        recipe.trainer.output_dir = str(run.checkpoints_dir)
        callbacks = [run_logger(run, recipe), stopper := stop_on_request(), profiler := step_profiler(run, recipe)]
        callbacks.append(watcher := eval_watch(run, recipe))
        if eval_fraction > 0:
            train_rows, eval_rows = split_heldout(rows, eval_fraction, recipe.trainer.seed)
            trainer = make_trainer(parent.model_dir, Dataset.from_list(train_rows), tokenizer, callbacks,
                                   eval_dataset=Dataset.from_list(eval_rows))
        else:
            trainer = make_trainer(parent.model_dir, Dataset.from_list(rows), tokenizer, callbacks)
        check_exportable(trainer, export is not None)
        with profiler, watcher:
            result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        stopper.raise_if_stopped()
        watcher.conclude(trainer)
        save_trained(trainer, run, tokenizer, export)
        summary = {**train_summary(trainer, result), **profiler.metrics}
        if summarize is not None:
            summary.update(summarize(trainer))
        if trainer.accelerator.is_main_process:
            run.finish(metrics=summary)
    return run.reload()
