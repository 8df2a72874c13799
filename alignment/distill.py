"""Knowledge distillation on TRL's DistillationTrainer: a student run learns a teacher run's token distribution.

    smolforge distill --config recipes/demo/distill.yaml
    smolforge distill --config recipes/demo/distill.yaml --set divergence=reverse_kl --set trainer.max_steps=20

On-policy (Agarwal et al. 2024, "On-Policy Distillation of Language Models", which TRL 1.16's
DistillationTrainer implements): the student answers the training prompts (``data``: a data run's prompts
or a ``.jsonl`` of ``{"prompt"}`` rows), the teacher scores every position of those answers, and the
student moves toward the teacher's distribution by ``divergence`` (:mod:`smolforge.alignment.distill_math`):
``forward_kl`` (KL(teacher || student): cover the teacher's mass), ``reverse_kl`` (KL(student ||
teacher): its modes) or ``jsd`` (the generalized JSD at beta 0.5); ``trainer.beta`` follows it. Both
models must share a tokenizer's vocabulary (checked before any run exists): the teacher's logits are
compared token for token. A teacher behind an endpoint (only top-k log-probs) or with another
tokenizer cannot give that; distil from such a teacher by sequence-level distillation instead: its
answers as SFT data (``smolforge synth`` with the teacher as generator, then ``sft``).

Held out (``heldout_fraction`` of the prompts, seeded): the teacher's greedy answers, fixed before
training, and the student's mean per-token divergence to the teacher on them before and after:
``distill/heldout_divergence_before`` / ``_after`` in run.json, the stage's measure of success.
``trainer:`` takes any ``trl.DistillationConfig`` field.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from trl import DistillationConfig

from smolforge.errors import RecipeError
from smolforge.determinism import DeterminismSpec
from smolforge.profiling import ProfileSpec, check_profile
from smolforge.recipe import FRACTION
from smolforge.runs import Run, Runs
from smolforge.tracking import TrackingSpec

from .common import check_determinism, check_tracking, quiet_tracking, trainer_defaults
from .distill_math import DIVERGENCES

log = logging.getLogger(__name__)


def defaults() -> dict:
    """Trainer values for the CPU demo: short answers, a learning rate a tiny student moves with."""
    return {"trainer": trainer_defaults(max_steps=40, per_device_train_batch_size=8, max_completion_length=24,
                                        learning_rate=5e-4, lr_scheduler_type="constant", temperature=1.0,
                                        logging_steps=5)}


@dataclass
class Recipe:
    name: str = "distill-demo"        # run name
    student: str = "pretrain-demo"    # run whose model/ learns (the new run's parent)
    teacher: str = "sft-demo"         # run whose model/ teaches (the same vocabulary as the student's)
    data: str = "data-demo"           # data run (its prompts) or a .jsonl of {"prompt"} rows
    divergence: str = "jsd"           # forward_kl | reverse_kl | jsd (sets trainer.beta: 0, 1, 0.5)
    heldout_fraction: float = field(default=0.2, metadata=FRACTION)  # prompts kept out to measure the divergence
    heldout_tokens: int = 32          # length of the teacher's greedy held-out answers
    chat_prompts: bool = False        # plain-text prompts become a user turn (both models need a chat template)
    tracking: TrackingSpec = field(default_factory=quiet_tracking)
    profile: ProfileSpec = field(default_factory=ProfileSpec)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)  # seed, fixed threads, deterministic kernels (null: on for CPU runs)
    trainer: DistillationConfig = field(default_factory=lambda: DistillationConfig(**defaults()["trainer"]))


def _vocabulary(model_dir) -> dict[str, int]:
    from smolforge.generation.prompts import load_tokenizer

    return load_tokenizer(model_dir).get_vocab()


def validate(recipe: Recipe, runs: Runs) -> None:
    """The runs, their shared vocabulary, the divergence and the prompts, before any run folder exists."""
    from .common import model_parent
    from .online import load_prompts

    check_tracking(recipe)
    check_profile(recipe.profile, recipe.trainer.max_steps)
    check_determinism(recipe)
    if recipe.divergence not in DIVERGENCES:
        raise RecipeError(f"divergence must be one of {', '.join(DIVERGENCES)}, got {recipe.divergence!r}")
    if not 0 < recipe.heldout_fraction < 1 or recipe.heldout_tokens < 1:
        raise RecipeError(f"heldout_fraction must be between 0 and 1 and heldout_tokens >= 1, got "
                          f"{recipe.heldout_fraction} and {recipe.heldout_tokens}")
    student, teacher = model_parent(runs, recipe.student), model_parent(runs, recipe.teacher)
    if _vocabulary(student.model_dir) != _vocabulary(teacher.model_dir):
        raise RecipeError(f"teacher '{teacher.name}' and student '{student.name}' have different tokenizer "
                          "vocabularies; token-level distillation compares their distributions token for token "
                          "(distil across tokenizers through the teacher's answers: smolforge synth, then sft)")
    _, _, train, _ = load_prompts(recipe, runs, recipe.trainer.seed)
    if len(train) < recipe.trainer.per_device_train_batch_size:
        raise RecipeError(f"only {len(train)} training prompts; need at least trainer.per_device_train_batch_size "
                          f"({recipe.trainer.per_device_train_batch_size})")


def teacher_answers(teacher: Any, tokenizer: Any, prompts: list, max_new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """``[(prompt ids, greedy answer ids)]`` of the teacher: the fixed held-out text both models are measured on."""
    from smolforge.generation.hf import HFSampler
    from smolforge.generation.prompts import encode_prompts

    samples = HFSampler(teacher, tokenizer).sample(prompts, max_new_tokens=max_new_tokens, temperature=0.0)
    return [(ids, sample.token_ids) for ids, sample in zip(encode_prompts(tokenizer, prompts), samples)]


def heldout_divergence(student: Any, teacher: Any, texts: list[tuple[list[int], list[int]]], beta: float,
                       temperature: float = 1.0) -> float:
    """The student's mean per-token divergence to the teacher over the answer tokens of ``texts``."""
    import torch

    from .distill_math import generalized_jsd

    total, count = 0.0, 0
    device = next(student.parameters()).device
    for prompt, answer in texts:
        if not answer:
            continue
        ids = torch.tensor([prompt + answer], device=device)
        with torch.no_grad():
            # the logits that predict each answer token: positions len(prompt) - 1 … end - 1
            span = slice(len(prompt) - 1, len(prompt) + len(answer) - 1)
            s_logits, t_logits = (m(input_ids=ids).logits[0, span] for m in (student, teacher))
        per_token = generalized_jsd(s_logits, t_logits, beta, temperature)
        total, count = total + float(per_token.sum()), count + per_token.numel()
    return total / count if count else 0.0


def run(recipe: Recipe, runs: Runs, *, overwrite: bool = False) -> Run:
    import torch
    from datasets import Dataset
    from trl import DistillationTrainer

    from smolforge.devices import local_device
    from smolforge.generation.prompts import load_tokenizer

    from .common import (lineage_fingerprints, load_trainable, model_parent, reproducible_training, run_logger,
                         step_profiler, train_summary)
    from .online import load_policy, load_prompts, policy_device
    from .ranks import full_weights, save_trained, start_run, stop_on_request

    recipe.trainer.beta = DIVERGENCES[recipe.divergence]
    student_run, teacher_run = model_parent(runs, recipe.student), model_parent(runs, recipe.teacher)
    paths, data_run, train, heldout = load_prompts(recipe, runs, recipe.trainer.seed)
    parents = [student_run, teacher_run] + ([data_run] if data_run else [])
    device = policy_device(local_device(), use_cpu=recipe.trainer.use_cpu)
    with start_run(runs, "distill", recipe, parents, lineage_fingerprints(parents, {"prompts": paths}),
                   overwrite=overwrite) as (run, resume_from), reproducible_training(run, recipe, recipe.trainer.seed):
        recipe.trainer.output_dir = str(run.checkpoints_dir)
        tokenizer = load_tokenizer(student_run.model_dir)
        student = load_policy(student_run.model_dir, device)
        teacher = load_trainable(teacher_run.model_dir).to(device).eval()
        texts = teacher_answers(teacher, tokenizer, [row["prompt"] for row in heldout], recipe.heldout_tokens)
        beta, temperature = recipe.trainer.beta, recipe.trainer.temperature
        with full_weights(student):
            before = heldout_divergence(student, teacher, texts, beta, temperature)
        log.info("distill: held-out %s of the student to the teacher %.4f on %d answers", recipe.divergence, before,
                 len(texts))
        callbacks = [run_logger(run, recipe), stopper := stop_on_request(), profiler := step_profiler(run, recipe)]
        trainer = DistillationTrainer(model=student, teacher_model=teacher, args=recipe.trainer,
                                      train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in train]),
                                      processing_class=tokenizer, callbacks=callbacks)
        with profiler:
            result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        stopper.raise_if_stopped()
        trained = trainer.accelerator.unwrap_model(trainer.model)
        with full_weights(trained), torch.no_grad():
            after = heldout_divergence(trained, teacher, texts, beta, temperature)
        save_trained(trainer, run, tokenizer)
        if not trainer.accelerator.is_main_process:
            return run
        summary = {**train_summary(trainer, result), **profiler.metrics}
        summary.update({"distill/heldout_divergence_before": round(before, 6),
                        "distill/heldout_divergence_after": round(after, 6), "distill/divergence": recipe.divergence,
                        "distill/beta": beta, "distill/teacher": teacher_run.name, "distill/heldout_prompts": len(texts),
                        "distill/train_prompts": len(train)})
        run.finish(metrics=summary)
    return run
