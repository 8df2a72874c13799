"""Issue 34: every trainer keeps fp32 master weights whatever dtype its parent's checkpoint holds, and
the online-RL stages put the policy and the rollout vLLM server on the device in the right order.

Each trainer is built exactly as its stage builds it (the stage's own factory), never trained:
``create_optimizer()`` is enough to see what AdamW would update.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from datasets import Dataset

from conftest import tiny_recipe
from smolforge.alignment import common, dpo, grpo, online, orpo, sft
from smolforge.alignment.common import trained_dtypes
from smolforge.errors import ServiceError
from smolforge.generation.prompts import load_tokenizer
from smolforge.generation.rollouts import ServerRollouts
from smolforge.generation.vllm_server import checkpoint_dtype

ROWS = 8   # a few rows: building a trainer tokenizes its dataset


@pytest.fixture(scope="module")
def bf16_parent(runs, sft_run):
    """The session SFT run with its model/ saved in bf16, as pretraining with ``precision: bf16`` saves it."""
    from transformers import AutoModelForCausalLM

    name = "sft-bf16"
    if not (runs.root / name).exists():
        shutil.copytree(sft_run.path, runs.root / name, ignore=shutil.ignore_patterns("checkpoints"))
        info = runs.root / name / "run.json"
        info.write_text(json.dumps({**json.loads(info.read_text()), "name": name}))
        model = AutoModelForCausalLM.from_pretrained(sft_run.model_dir).to(torch.bfloat16)
        model.save_pretrained(runs.root / name / "model", safe_serialization=True)
    parent = runs.get(name)
    assert checkpoint_dtype(parent.model_dir) == "bfloat16"
    return parent


def recipe_for(stage: str, parent, data_run, tmp_path):
    """The tiny demo recipe of ``stage`` on the bf16 parent, in bf16 as on a GPU (CPU autocast here)."""
    return tiny_recipe(stage, name=f"{stage}-bf16", parent=parent.name, data=data_run.name,
                       trainer={"output_dir": str(tmp_path), "bf16": True})


def build_sft(recipe, runs):
    parent, _, _, rows = common.load_inputs("sft", recipe, runs)
    tokenizer = load_tokenizer(parent.model_dir)
    rows = sft.prepare_rows(recipe)(rows[:ROWS], tokenizer)
    return sft.trainer_factory(recipe)(parent.model_dir, Dataset.from_list(rows), tokenizer, [])


def build_dpo(recipe, runs):
    parent, _, _, rows = common.load_inputs("dpo", recipe, runs)
    make_trainer = dpo.trainer_factory(recipe, dpo.reference_dir(recipe, runs))
    return make_trainer(parent.model_dir, Dataset.from_list(rows[:ROWS]), load_tokenizer(parent.model_dir), [])


def build_orpo(recipe, runs):
    parent, _, _, rows = common.load_inputs("orpo", recipe, runs)
    return orpo.trainer_factory(recipe)(parent.model_dir, Dataset.from_list(rows[:ROWS]),
                                        load_tokenizer(parent.model_dir), [])


def build_grpo(recipe, runs):
    from smolforge.devices import local_device

    parent = common.model_parent(runs, recipe.parent)
    _, _, train, _ = online.load_prompts(recipe, runs, recipe.trainer.seed)
    policy = online.load_policy(parent.model_dir, online.policy_device(local_device(), use_cpu=recipe.trainer.use_cpu))
    return grpo.trainer_factory(recipe)(policy, Dataset.from_list(train[:ROWS]), load_tokenizer(parent.model_dir),
                                        online.reward_functions(recipe.rewards, runs), [], None)


@pytest.mark.parametrize("stage, build", [("sft", build_sft), ("dpo", build_dpo), ("orpo", build_orpo),
                                          ("grpo", build_grpo)])
def test_a_bf16_parent_trains_fp32_master_weights(stage, build, bf16_parent, runs, data_run, tmp_path):
    trainer = build(recipe_for(stage, bf16_parent, data_run, tmp_path), runs)
    assert trainer.args.bf16                     # bf16 training: autocast over the weights as loaded
    trainer.create_optimizer()
    trainable = {name: p.dtype for name, p in trainer.model.named_parameters() if p.requires_grad}
    updated = [p.dtype for group in trainer.optimizer.param_groups for p in group["params"]]
    assert trainable and set(trainable.values()) == {torch.float32}, {n: d for n, d in trainable.items()
                                                                       if d != torch.float32}
    assert len(updated) == len(trainable) and set(updated) == {torch.float32}
    assert trained_dtypes(trainer.model, trainer.optimizer) == {"train/weight_dtype": "float32",
                                                                "train/master_dtype": "float32"}   # run.json's record
    if stage == "dpo":   # the frozen reference: bf16 beside bf16 training, no gradients
        assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.bfloat16}
        assert not any(p.requires_grad for p in trainer.ref_model.parameters())


def test_the_policy_answers_held_out_prompts_on_the_device_it_trains_on():
    """What a GPU rank's values give, and this machine's: a CPU-only trainer stays on the CPU."""
    from smolforge.devices import local_device

    card = torch.device("cuda", 1)   # local rank 1 of a node: cuda:1, where HF Trainer puts the model
    assert online.policy_device(card, use_cpu=False) == card
    assert online.policy_device(card, use_cpu=True) == torch.device("cpu")
    assert online.policy_device(local_device(), use_cpu=False).type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("cuda", [True, False])
def test_the_rollout_server_is_ready_before_the_policy_touches_a_gpu(cuda, tmp_path):
    """A start that fails (a folder with no model) shows the order: on a GPU the caller gets the
    failure before it goes on to load the policy; on CPU start_rollouts returns at once (vLLM boots
    while the policy loads) and the failure waits for the first use."""
    rollouts = ServerRollouts(tmp_path / "no-model", tmp_path / "rollouts")
    try:
        if cuda:
            with pytest.raises(ServiceError, match="not a model folder"):
                online.start_rollouts(rollouts, cuda=True)
        else:
            assert online.start_rollouts(rollouts, cuda=False) is rollouts
            with pytest.raises(ServiceError, match="not a model folder"):
                rollouts.ready()
    finally:
        rollouts.stop()
