"""Reward model training on preference pairs with TRL's RewardTrainer.

    smolforge reward --config recipes/demo/reward.yaml
    smolforge reward --config recipes/demo/reward.yaml --set lora=null --set trainer.learning_rate=3e-4

Reads a parent run (usually the SFT model: the playbook initialises the reward model from it) and
preference pairs (a data run's ``data/prefs/`` shards or a JSONL file of
``{"prompt","chosen","rejected"}`` rows, plain or conversational). Holds out ``eval_fraction`` of
the pairs (pairs that share a prompt stay on one side; deterministic for ``split_seed``), trains
an ``AutoModelForSequenceClassification`` head (one label) on the rest, and writes a run whose
``model/`` scores a prompt+completion (load it with ``smolforge.alignment.rewards.RewardModelScorer``, or
name it ``run:<name>`` as an RL reward). run.json holds ``reward/heldout_accuracy`` (share of
held-out pairs with score(chosen) > score(rejected)) and ``reward/heldout_margin``, computed
here on every held-out pair (ties count as wrong). ``lora:`` trains PEFT adapters plus the score
head instead of all weights; the adapter is kept in ``adapter/`` and merged into ``model/``.
``trainer:`` takes any ``trl.RewardConfig`` field; note that RewardTrainer silently drops training
pairs longer than ``trainer.max_length`` (counted here as ``train/pairs_too_long``).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from trl import RewardConfig

from smolforge.errors import DataError, RecipeError
from smolforge.determinism import DeterminismSpec
from smolforge.profiling import ProfileSpec, check_profile
from smolforge.runs import Run, Runs

from .common import (LoraSpec, TrackingSpec, check_determinism, check_lora, check_tracking, lineage_fingerprints,
                     load_tokenizer, lora_config, model_parent, quiet_tracking, reproducible_training, run_logger,
                     step_profiler, train_summary, trainer_defaults)


def defaults() -> dict:
    """Recipe values applied beneath the YAML: full fine-tuning of the SFT model plus the new score
    head at TRL's usual reward-model LR scale; recipes/demo/reward.yaml adds LoRA (see there)."""
    return {"trainer": trainer_defaults(max_steps=300, per_device_train_batch_size=16, learning_rate=3e-4,
                                        lr_scheduler_type="cosine", warmup_steps=10, weight_decay=0.0,
                                        max_length=256)}


@dataclass
class Recipe:
    name: str = "reward-demo"         # run name
    parent: str = "sft-demo"          # run whose model/ initialises the reward model (a score head is added)
    data: str = "data-demo"           # data run (its data/prefs/ shards) or a .jsonl of preference rows
    eval_fraction: float = field(default=0.2, metadata={"max": 0.5})       # share of pairs held out for the accuracy in run.json, in (0, 0.5]
    split_seed: int = 0               # seed of the held-out split (apart from trainer.seed: same pairs across reruns)
    lora: LoraSpec | None = None      # LoRA adapters (the score head trains fully); merged into model/ at the end
    trainer: RewardConfig = field(default_factory=lambda: RewardConfig(**defaults()["trainer"]))  # any trl.RewardConfig field
    tracking: TrackingSpec = field(default_factory=quiet_tracking)  # report_to: tensorboard | trackio | wandb; prometheus_port
    profile: ProfileSpec = field(default_factory=ProfileSpec)  # torch.profiler trace of a step range into profile/ (off)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # seed, fixed threads, deterministic kernels (null: on for CPU runs)


def split_pairs(rows: list[dict], eval_fraction: float, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)``: about ``eval_fraction`` of the rows held out, rows sharing a prompt together.

    >>> rows = [{"prompt": f"q{i % 5}", "chosen": "a", "rejected": "b"} for i in range(10)]
    >>> train, held = split_pairs(rows, 0.2, seed=0)
    >>> len(train), len(held), {r["prompt"] for r in train} & {r["prompt"] for r in held}
    (8, 2, set())
    >>> split_pairs(rows, 0.2, seed=0) == (train, held)
    True
    """
    def key(row: dict) -> str:
        return json.dumps(row["prompt"], sort_keys=True, ensure_ascii=False)

    counts: dict[str, int] = {}
    for row in rows:
        counts[key(row)] = counts.get(key(row), 0) + 1
    order = list(counts)
    random.Random(seed).shuffle(order)
    target = max(1, round(len(rows) * eval_fraction))
    held_keys: set[str] = set()
    held_count = 0
    for k in order:
        if held_count >= target:
            break
        held_keys.add(k)
        held_count += counts[k]
    train = [r for r in rows if key(r) not in held_keys]
    held = [r for r in rows if key(r) in held_keys]
    return train, held


def _pairs(recipe: Recipe, runs: Runs):
    """(train rows, held-out rows, shard paths, data run or None), validated."""
    from smolforge.data.schemas import load_many, resolve_data

    paths, data_run = resolve_data(recipe.data, runs, "prefs")
    rows = load_many(paths, "preference")
    train, held = split_pairs(rows, recipe.eval_fraction, recipe.split_seed)
    if not train or not held:
        raise DataError(f"{recipe.data}: {len(rows)} preference pairs ({len({json.dumps(r['prompt']) for r in rows})} "
                        f"distinct prompts) are too few to hold out eval_fraction={recipe.eval_fraction} and "
                        "train on the rest; add pairs or change eval_fraction")
    return train, held, paths, data_run


def validate(recipe: Recipe, runs: Runs) -> None:
    if not 0 < recipe.eval_fraction <= 0.5:
        raise RecipeError(f"eval_fraction must be in (0, 0.5] (a held-out share of the pairs), got {recipe.eval_fraction}")
    if recipe.trainer.max_length is not None and recipe.trainer.max_length < 8:
        raise RecipeError(f"trainer.max_length={recipe.trainer.max_length} leaves no room for a prompt and answer")
    check_lora(recipe.lora)
    check_tracking(recipe)
    check_profile(recipe.profile, recipe.trainer.max_steps)
    check_determinism(recipe)
    model_parent(runs, recipe.parent)
    _pairs(recipe, runs)


def _columns(rows: list[dict]) -> list[dict]:
    """The columns RewardTrainer reads (``margin`` only when every row has one)."""
    keep = ("prompt", "chosen", "rejected") + (("margin",) if all("margin" in r for r in rows) else ())
    return [{k: r[k] for k in keep} for r in rows]


def heldout_scores(model, tokenizer, rows: list[dict], batch_size: int = 32) -> dict:
    """Pairwise accuracy and mean margin of ``model`` on preference ``rows`` (ties count as wrong)."""
    from .rewards import score_pairs

    prompts = [r["prompt"] for r in rows]
    chosen = score_pairs(model, tokenizer, prompts, [r["chosen"] for r in rows], batch_size)
    rejected = score_pairs(model, tokenizer, prompts, [r["rejected"] for r in rows], batch_size)
    margins = [c - r for c, r in zip(chosen, rejected)]
    return {"accuracy": round(sum(m > 0 for m in margins) / len(margins), 5),
            "margin": round(sum(margins) / len(margins), 5)}


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    from datasets import Dataset
    from trl import RewardTrainer

    from .ranks import check_exportable, full_weights, save_trained, start_run, stop_on_request

    parent = model_parent(runs, recipe.parent)
    train_rows, held, paths, data_run = _pairs(recipe, runs)
    parents = [parent] + ([data_run] if data_run else [])
    fingerprints = lineage_fingerprints(parents, {"prefs": paths})
    with start_run(runs, "reward", recipe, parents, fingerprints, overwrite=overwrite) as (run, resume_from), \
            reproducible_training(run, recipe, recipe.trainer.seed):
        recipe.trainer.output_dir = str(run.checkpoints_dir)
        tokenizer = load_tokenizer(parent.model_dir)
        # A path, not a model: RewardTrainer then adds the one-label head after set_seed(trainer.seed)
        # (reproducible), in float32, and sets config.pad_token_id from the tokenizer.
        trainer = RewardTrainer(model=str(parent.model_dir), args=recipe.trainer,
                                train_dataset=Dataset.from_list(_columns(train_rows)),
                                eval_dataset=Dataset.from_list(_columns(held)),
                                processing_class=tokenizer,
                                callbacks=[run_logger(run, recipe), stopper := stop_on_request(),
                                           profiler := step_profiler(run, recipe)],
                                peft_config=lora_config(recipe.lora, "SEQ_CLS") if recipe.lora else None)
        check_exportable(trainer, recipe.lora is not None)
        kept = len(trainer.train_dataset)
        if kept == 0:
            raise DataError(f"every training pair is longer than trainer.max_length={recipe.trainer.max_length} "
                            "tokens (RewardTrainer drops those); raise trainer.max_length")
        with full_weights(trainer.model):
            before = heldout_scores(trainer.model, tokenizer, held)
        with profiler:
            result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        stopper.raise_if_stopped()
        trl_eval = trainer.evaluate()
        model = trainer.accelerator.unwrap_model(trainer.model)
        if recipe.lora is not None and trainer.accelerator.is_main_process:  # keep the adapter; model/ is merged
            model.save_pretrained(run.adapter_dir, safe_serialization=True)
            model = model.merge_and_unload()
        with full_weights(model):
            after = heldout_scores(model, tokenizer, held)  # what model/ holds
        save_trained(trainer, run, tokenizer, export=lambda trainer, run: model)
        if not trainer.accelerator.is_main_process:
            return run
        summary = {**train_summary(trainer, result), **profiler.metrics}
        summary.update({"reward/heldout_accuracy": after["accuracy"], "reward/heldout_margin": after["margin"],
                        "reward/heldout_accuracy_before": before["accuracy"], "reward/heldout_pairs": len(held),
                        "train/pairs": len(train_rows), "train/pairs_too_long": len(train_rows) - kept})
        if "eval_accuracy" in trl_eval:
            summary["reward/trl_eval_accuracy"] = round(trl_eval["eval_accuracy"], 5)
        run.finish(metrics=summary)
    return run


def summary(run: Run) -> str:
    """One line for the CLI: the held-out pairwise accuracy and margin."""
    m = run.metrics
    return (f"held-out pairwise accuracy {m.get('reward/heldout_accuracy')} "
            f"(before training {m.get('reward/heldout_accuracy_before')}, {m.get('reward/heldout_pairs')} pairs), "
            f"mean margin {m.get('reward/heldout_margin')}")
