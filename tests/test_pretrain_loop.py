"""Pretraining the playbook's way on tiny models: staged mixtures, spike guard, exact resume after a
real SIGKILL, corrupt-checkpoint fallback, and 2-process ZeRO-2/ZeRO-3 runs over gloo."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import QUIET, REPO, ZERO_TRAIN, events, losses, run_stage, tiny_recipe
from conftest import write_pretrain_recipe as write_recipe
from smolforge import cli
from smolforge.pretrain import stage as pretrain_stage
from smolforge.pretrain.mixture import MixtureSampler, Phase
from smolforge.errors import RecipeError
from smolforge.runs import Run


# -- mixtures ----------------------------------------------------------------------------------
def test_sampler_realises_weights_deterministically_and_resumes_exactly():
    phases = [Phase(until=1.0, weights={"web": 0.7, "math": 0.3})]
    a = MixtureSampler({"web": 50, "math": 20}, phases, total_steps=300, rows_per_step=16, seed=3)
    batches = [a.next_batch(step) for step in range(1, 201)]
    assert abs(a.realised_mix()["0"]["web"] - 0.7) < 0.03
    b = MixtureSampler({"web": 50, "math": 20}, phases, total_steps=300, rows_per_step=16, seed=3)
    assert [b.next_batch(step) for step in range(1, 201)] == batches
    c = MixtureSampler({"web": 50, "math": 20}, phases, total_steps=300, rows_per_step=16, seed=3)
    c.load_state_dict(json.loads(json.dumps(a.state_dict())))  # through JSON, as in a checkpoint
    assert [c.next_batch(s) for s in range(201, 211)] == [a.next_batch(s) for s in range(201, 211)]
    # within a domain, an epoch visits every row once
    web_rows = [i for batch in batches for d, i in batch if d == "web"][:50]
    assert sorted(web_rows) == list(range(50))


def test_pretrain_follows_the_mixture_phases_and_reports_the_realised_mix(runs, data_run):
    mixture = [{"until": 0.5, "weights": {"facts": 1.0}}, {"until": 1.0, "weights": {"facts": 0.0, "math": 1.0}}]
    run = run_stage("pretrain", runs, name="pretrain-mix", mixture=mixture, train={"max_steps": 8},
                    checkpoint={"every_steps": 0}, **QUIET)
    assert run.metrics["train/mix/phase0/facts"] == 1.0
    assert run.metrics["train/mix/phase1/math"] == 1.0
    assert "train/mix/phase0/math" not in run.metrics


def test_mixture_naming_an_unknown_domain_is_refused(runs, data_run):
    recipe = tiny_recipe("pretrain", mixture=[{"until": 1.0, "weights": {"web": 1.0}}])
    with pytest.raises(RecipeError, match="unknown domain.*web; the data has facts, long, math"):
        pretrain_stage.validate(recipe, runs)


# -- spike guard -------------------------------------------------------------------------------
SPIKE_MIXTURE = [{"until": 0.6, "weights": {"clean": 1.0}},           # steps 1-14
                 {"until": 0.65, "weights": {"clean": 0.0, "noise": 1.0}},  # step 15: a batch of noise
                 {"until": 1.0, "weights": {"clean": 1.0}}]


def spiky_run(runs, name, action, **extra):
    return run_stage("pretrain", runs, name=name, data="data-spiky", mixture=SPIKE_MIXTURE,
                     train={"max_steps": 24, "log_every": 1, "learning_rate": 1e-2, "warmup_steps": 2},
                     spike={"action": action, "factor": 3.0, "window": 5, "min_history": 5}, **QUIET, **extra)


def test_spike_guard_skips_a_bad_batch_without_moving_the_weights(runs, spiky_data):
    skipped = spiky_run(runs, "pretrain-skip", "skip", checkpoint={"every_steps": 0})
    spikes = events(skipped.path, "spike")
    assert [(e["step"], e["action"]) for e in spikes] == [(15, "skip")]
    assert spikes[0]["reason"].startswith("loss ")
    assert skipped.metrics["train/spikes"] == 1
    # without the guard the same batch is trained on: the runs agree up to step 15, then part
    control = spiky_run(runs, "pretrain-noguard", "off", checkpoint={"every_steps": 0})
    assert events(control.path, "spike") == []
    guarded, unguarded = losses(skipped.path), losses(control.path)
    assert [guarded[s] for s in range(1, 16)] == [unguarded[s] for s in range(1, 16)]
    assert guarded[16] != unguarded[16]


def test_a_skipped_step_leaves_the_weights_exactly_as_they_were(runs, spiky_data):
    from transformers import AutoModelForCausalLM

    common = {"data": "data-spiky", "checkpoint": {"every_steps": 0}, **QUIET,
              "spike": {"action": "skip", "factor": 3.0, "window": 5, "min_history": 5}}
    train = {"log_every": 1, "learning_rate": 1e-2, "warmup_steps": 2, "schedule": "constant"}
    clean = run_stage("pretrain", runs, name="pretrain-14", train={**train, "max_steps": 14},
                      mixture=[{"until": 1.0, "weights": {"clean": 1.0}}], **common)
    spiked = run_stage("pretrain", runs, name="pretrain-14-plus-noise", train={**train, "max_steps": 15},
                       mixture=[{"until": 0.94, "weights": {"clean": 1.0}},
                                {"until": 1.0, "weights": {"clean": 0.0, "noise": 1.0}}], **common)
    assert [e["step"] for e in events(spiked.path, "spike")] == [15]
    a = AutoModelForCausalLM.from_pretrained(clean.model_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(spiked.model_dir).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_spike_guard_rewinds_to_the_last_checkpoint_and_skips_the_window(runs, spiky_data):
    rewound = spiky_run(runs, "pretrain-rewind", "rewind", checkpoint={"every_steps": 5})
    spikes = events(rewound.path, "spike")
    assert [(e["step"], e["action"], e["to_step"], e["skipped_steps"]) for e in spikes] == [(15, "rewind", 10, 5)]
    assert rewound.status == "done"


# -- checkpoints and exact resume --------------------------------------------------------------
@pytest.mark.slow
def test_continued_pretraining_from_a_parent_resumes_exactly_after_sigkill(runs, data_run, pretrain_run, tmp_path):
    """Continued pretraining (init: the session's pretrain run) at a longer context with a raised
    RoPE base: SIGKILLed after a checkpoint, the same command resumes and every step's loss equals
    an uninterrupted run's; the model keeps the parent's weights as its start and records the change."""
    from transformers import AutoConfig

    from smolforge.recipe import build_stage_recipe, load_recipe

    train = {"max_steps": 24, "log_every": 1, "micro_batch_size": 8, "seq_len": 128, "warmup_steps": 2}
    changes = dict(init=pretrain_run.name, context={"max_position_embeddings": 256, "rope_theta": 40000.0},
                   train=train, checkpoint={"every_steps": 8, "keep": 2})
    write_recipe(tmp_path / "ref.yaml", runs, "pretrain-reference", data_run.name, **changes)
    _, reference = load_recipe(tmp_path / "ref.yaml")               # the uninterrupted run, in this process
    pretrain_stage.run(build_stage_recipe(pretrain_stage, reference, source="ref.yaml"), runs)

    killed = write_recipe(tmp_path / "kill.yaml", runs, "pretrain-killed", data_run.name, **changes)
    run_dir = runs.root / "pretrain-killed"
    proc = subprocess.Popen([sys.executable, *killed], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (run_dir / "checkpoints" / "step-8").exists() and time.time() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert Run(run_dir).status == "running"  # killed mid-training: not done, no model
    assert not (run_dir / "model").exists()
    assert max(losses(run_dir)) < 24

    assert cli.main(killed[2:]) == 0          # the same command resumes (in this process: imports paid)
    run = Run(run_dir)
    assert run.status == "done" and run.parents == [data_run.name, pretrain_run.name]   # lineage: the parent
    [resume] = events(run_dir, "resume")
    assert resume["step"] >= 8
    assert losses(run_dir) == losses(runs.root / "pretrain-reference")  # every step, bit for bit
    config = AutoConfig.from_pretrained(run_dir / "model")
    assert (config.max_position_embeddings, config.rope_parameters["rope_theta"]) == (256, 40000.0)
    assert config.hidden_size == pretrain_run.info["recipe"]["model"]["hidden_size"]
    # it starts where the parent ended, not from a fresh initialisation
    parent_losses = losses(pretrain_run.path)
    assert losses(run_dir)[1] < parent_losses[min(parent_losses)] - 0.5, (losses(run_dir)[1], parent_losses)


@pytest.mark.slow
def test_the_long_context_step_trains_whole_documents_at_the_new_length(runs, data_run, pretrain_run):
    """Continued pretraining at 4x the parent's length on whole long documents: the rows it trains on
    keep each document in one piece, and in the trained model every document of a packed row at the
    new length gets the logits it gets alone (per-document positions, no attention across documents)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from smolforge.pretrain.batches import load_domains

    run = run_stage("pretrain", runs, name="pretrain-longctx", init=pretrain_run.name,
                    context={"max_position_embeddings": 1024, "rope_theta": 40000.0},
                    train={"max_steps": 4, "seq_len": 768, "micro_batch_size": 2, "whole_documents": True,
                           "log_every": 1}, checkpoint={"every_steps": 0},
                    mixture=[{"until": 1.0, "weights": {"long": 0.5, "facts": 0.5}}], **QUIET)
    assert run.status == "done" and len(losses(run.path)) == 4
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    rows = load_domains(data_run.path, tokenizer, 768, whole_documents=True)[0]["long"]
    model = AutoModelForCausalLM.from_pretrained(run.model_dir).eval()
    assert model.config.max_position_embeddings == 1024 > pretrain_run.info["recipe"]["model"]["max_position_embeddings"]
    row = rows.read([0])
    ids, positions = row["input_ids"][0], row["position_ids"][0]
    starts = [i for i, p in enumerate(positions.tolist()) if p == 0]
    documents = [(a, b) for a, b in zip(starts, starts[1:] + [768]) if b - a > 1]   # pads are 1-token "documents"
    assert len(documents) >= 2 and max(b - a for a, b in documents) > 128       # positions past the parent's length
    sep = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert all(ids[b - 1].item() == sep for a, b in documents)                  # each document whole, to its end
    with torch.no_grad():
        together = model(input_ids=ids[None], position_ids=positions[None], use_cache=False).logits[0]
        for a, b in documents:
            alone = model(input_ids=ids[None, a:b], use_cache=False).logits[0]
            assert (together[a:b] - alone).abs().max().item() <= 1e-4, (a, b)


def test_continued_pretraining_refuses_what_cannot_continue(runs, data_run, pretrain_run):
    for changes, message in [
        ({"init": data_run.name}, "has no model/ to continue from"),
        ({"context": {"rope_theta": 20000.0}}, "needs init"),
        ({"init": pretrain_run.name, "train": {"seq_len": 512}}, "exceeds the model's max_position_embeddings 128 "
                                                                  r"\(set context.max_position_embeddings"),
        ({"init": pretrain_run.name, "context": {"rope_theta": -1.0}}, "context.rope_theta must be >= 0, got -1.0"),
    ]:
        with pytest.raises(RecipeError, match=message):
            pretrain_stage.validate(tiny_recipe("pretrain", name="pretrain-refused", **changes), runs)
    assert not (runs.root / "pretrain-refused").exists()


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(runs, data_run, caplog):
    name = "pretrain-corrupt"
    original = run_stage("pretrain", runs, name=name, train={"max_steps": 12, "log_every": 1},
                         checkpoint={"every_steps": 4, "keep": 3}, **QUIET)
    before = losses(original.path)
    assert sorted(p.name for p in original.checkpoints_dir.iterdir()) == ["step-12", "step-4", "step-8"]
    # simulate a crash during step 12's write being noticed later: newest checkpoint damaged
    victim = max((p for p in (original.checkpoints_dir / "step-12").rglob("*.pt")), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    info = json.loads((original.path / "run.json").read_text())
    (original.path / "run.json").write_text(json.dumps({**info, "status": "failed", "error": "node lost"}))

    recipe = tiny_recipe("pretrain", name=name, train={"max_steps": 12, "log_every": 1},
                         checkpoint={"every_steps": 4, "keep": 3}, **QUIET)
    with caplog.at_level("WARNING"):
        resumed = pretrain_stage.run(recipe, runs)
    assert "step-12 is unusable (checksum mismatch" in caplog.text
    assert [e["checkpoint"] for e in events(resumed.path, "resume")] == ["step-8"]
    assert resumed.status == "done" and losses(resumed.path) == before


def test_resuming_is_refused_when_asked_never(runs, data_run):
    name = "pretrain-never"
    run_stage("pretrain", runs, name=name, train={"max_steps": 4}, checkpoint={"every_steps": 2}, **QUIET)
    path = runs.root / name / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "status": "failed"}))
    recipe = tiny_recipe("pretrain", name=name, checkpoint={"every_steps": 2, "resume": "never"}, **QUIET)
    with pytest.raises(Exception, match="exists unfinished"):
        pretrain_stage.run(recipe, runs)


# -- several processes ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_process_run(runs, data_run, tmp_path_factory):
    """The reference for the ZeRO runs: one process, batch 8 (it runs ZeRO-0: nothing to shard)."""
    recipe = write_recipe(tmp_path_factory.mktemp("zero") / "one.yaml", runs, "pretrain-1p", data_run.name,
                          train={**ZERO_TRAIN, "zero_stage": 2, "micro_batch_size": 8})
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    pretrain_stage.log.addHandler(handler)
    try:
        assert cli.main(recipe[2:]) == 0      # the CLI in this process: its imports are already paid
    finally:
        pretrain_stage.log.removeHandler(handler)
    assert any("running ZeRO-0" in line for line in said), said
    return runs.root / "pretrain-1p"


@pytest.mark.slow
def test_two_process_zero3_run_matches_one_process(runs, one_process_run, deepspeed_zero3_run):
    """Two ranks under the deepspeed launcher, which appends --local_rank=N to every rank's command
    line (the CLI takes it); ZeRO-3's partitions are gathered into one model. The run is the
    session's shared reference: the Slurm test runs the same recipe through srun + torchrun."""
    assert "--local_rank=1" in (deepspeed_zero3_run.path / "launcher.log").read_text()  # rank 1's command
    single, double = losses(one_process_run), losses(deepspeed_zero3_run.path)
    assert list(double) == list(range(1, ZERO_TRAIN["max_steps"] + 1))
    # the stage that ran, not the one asked for: one process has nothing to shard and runs ZeRO-0
    metrics = deepspeed_zero3_run.metrics
    assert (metrics["train/zero_stage"], metrics["train/processes"], metrics["train/launcher"]) == (3, 2, "deepspeed")
    assert runs.get("pretrain-1p").metrics["train/zero_stage"] == 0
    # same global batch each step; only the per-rank loss averaging differs
    np.testing.assert_allclose(list(double.values()), list(single.values()), rtol=1e-3)
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(one_process_run / "model").state_dict()
    b = AutoModelForCausalLM.from_pretrained(deepspeed_zero3_run.model_dir).state_dict()
    assert a.keys() == b.keys()
    for key in a:  # ZeRO-3's partitioned weights were gathered into a complete model
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("train", [
    {"zero_stage": 2, "offload_optimizer": True},   # ZeRO-Offload keeps ZeRO-2 even on one process
    {"activation_checkpointing": True, "schedule": "wsd"},
    {"precision": "bf16", "grad_accum": 2},
], ids=["offload", "checkpointing-wsd", "bf16-accum"])
def test_loop_options_train_and_are_recorded(runs, data_run, train):
    name = "pretrain-" + "-".join(f"{k}{v}" for k, v in train.items()).replace("_", "")
    run = run_stage("pretrain", runs, name=name, train={"max_steps": 10, "log_every": 1, **train},
                    checkpoint={"every_steps": 0}, **QUIET)
    logged = losses(run.path)
    assert len(logged) == 10 and logged[10] < logged[1]
    assert run.metrics["train/zero_stage"] == (2 if train.get("offload_optimizer") else 0)
    assert run.info["recipe"]["train"] | train == run.info["recipe"]["train"]
    lrs = [json.loads(line)["lr"] for line in run.metrics_path.read_text().splitlines() if "lr" in line]
    if train.get("schedule") == "wsd":  # flat at the peak until the decay window (last 20 %)
        assert lrs[2] == lrs[7] == pytest.approx(run.info["recipe"]["train"]["learning_rate"])
        assert lrs[-1] < lrs[7]
