"""Distillation: the divergences against their formulas on hand-built distributions, then the stage on TRL's
DistillationTrainer with tiny models: a teacher that is the student gives zero loss; a real teacher brings
the student's held-out divergence down; different vocabularies are refused before a run exists."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from conftest import run_stage

from smolforge.alignment.distill_math import generalized_jsd
from smolforge.cli import main


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 1.0])
def test_the_generalized_jsd_is_the_papers_formula(beta):
    student, teacher = [0.5, 0.3, 0.2], [0.7, 0.1, 0.2]
    logits = lambda p: torch.log(torch.tensor([p]))              # softmax(log p) = p
    mixture = [(1 - beta) * s + beta * t for s, t in zip(student, teacher)]
    expected = {0.0: kl(teacher, student), 1.0: kl(student, teacher)}.get(
        beta, beta * kl(teacher, mixture) + (1 - beta) * kl(student, mixture))
    assert float(generalized_jsd(logits(student), logits(teacher), beta)[0]) == pytest.approx(expected, rel=1e-6)
    assert float(generalized_jsd(logits(teacher), logits(teacher), beta)[0]) == pytest.approx(0.0, abs=1e-7)
    # temperature flattens both: at T = 2 the logits are halved before the softmax
    halved = generalized_jsd(logits(student) / 2, logits(teacher) / 2, beta)
    assert torch.allclose(generalized_jsd(logits(student), logits(teacher), beta, temperature=2.0), halved)


def test_jsd_is_bounded_by_ln2_and_symmetric_at_one_half():
    a, b = torch.tensor([[8.0, -8.0]]), torch.tensor([[-8.0, 8.0]])
    jsd = float(generalized_jsd(a, b, 0.5)[0])
    assert jsd == pytest.approx(float(generalized_jsd(b, a, 0.5)[0])) and jsd < math.log(2) and jsd > 0.69
    with pytest.raises(ValueError):
        generalized_jsd(a, b, 1.5)


def test_a_student_distilled_from_itself_has_zero_loss_and_zero_held_out_divergence(runs, pretrain_run, data_run):
    run = run_stage("distill", runs, name="distill-self", student=pretrain_run.name, teacher=pretrain_run.name,
                    data=data_run.name, trainer={"max_steps": 1, "logging_steps": 1, "per_device_train_batch_size": 4,
                                                 "max_completion_length": 8, "bf16": False},   # fp32 on a GPU too
                    heldout_tokens=8)
    metrics = run.metrics
    logged = [json.loads(line) for line in run.metrics_path.read_text().splitlines() if "loss" in json.loads(line)]
    assert run.status == "done" and metrics["train/steps"] == 1 and len(logged) == 1
    # zero loss and a gradient at float noise (Adam would still turn that noise into a full-size step: its
    # update does not scale with the gradient, so a second step starts from a slightly different student)
    assert abs(logged[0]["loss"]) <= 1e-8 and logged[0]["grad_norm"] <= 1e-6, logged[0]
    assert metrics["distill/heldout_divergence_before"] == 0.0
    assert (metrics["distill/beta"], metrics["distill/teacher"]) == (0.5, pretrain_run.name)


def test_distillation_brings_the_students_held_out_divergence_to_the_teacher_down(runs, pretrain_run, sft_run,
                                                                                   data_run):
    run = run_stage("distill", runs, name="distill-sft", student=pretrain_run.name, teacher=sft_run.name,
                    data=data_run.name, divergence="forward_kl", heldout_tokens=12,
                    trainer={"max_steps": 16, "logging_steps": 4, "per_device_train_batch_size": 8,
                             "max_completion_length": 12, "learning_rate": 3e-3})
    metrics = run.metrics
    before, after = metrics["distill/heldout_divergence_before"], metrics["distill/heldout_divergence_after"]
    print(f"\ndistill (forward KL, tiny models): held-out divergence {before:.4f} -> {after:.4f}")
    assert metrics["distill/beta"] == 0.0 and before > 0
    assert after < 0.8 * before, (before, after)
    assert run.info["parents"] == [pretrain_run.name, sft_run.name, data_run.name]     # student first: the lineage
    assert (run.model_dir / "model.safetensors").is_file()


def test_a_teacher_with_another_vocabulary_is_refused_before_a_run_exists(tmp_path, runs, pretrain_run, data_run,
                                                                            capsys):
    from transformers import AutoTokenizer

    from smolforge import import_stage

    folder = tmp_path / "other-vocab"
    shutil.copytree(pretrain_run.model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<extra-token>"])
    tokenizer.save_pretrained(folder)
    import_stage.run(import_stage.Recipe(name="other-vocab", source=str(folder)), runs)
    recipe = tmp_path / "distill.yaml"
    recipe.write_text(json.dumps({"stage": "distill", "name": "distill-refused", "student": pretrain_run.name,
                                  "teacher": "other-vocab", "data": data_run.name}))
    assert main(["--runs-dir", str(runs.root), "distill", "--config", str(recipe)]) == 2
    assert "have different tokenizer vocabularies" in capsys.readouterr().err
    assert not runs.exists("distill-refused")
