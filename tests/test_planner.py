"""The pretraining planner: SmolLM3-3B's real run, both directions, memory, errors, the CLI edge.

Fast and GPU-free: parameters are counted on the meta device, the CPU peak is a tiny benchmark.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smolforge.pretrain.flops import (DEVICES, attention_flops_per_token, flops_per_token,
                            kv_cache_bytes_per_token, measure_cpu_peak_flops, peak_flops)
from smolforge.pretrain.model import count_parameters
from smolforge.ops.plan import PPO_DEFAULTS, load_pretrain_recipe, make_plan, plan_file
from smolforge.ops.plan.memory import ppo_memory
from smolforge.pretrain.model import ModelShape
from smolforge.cli import main
from smolforge.errors import RecipeError
from smolforge.recipe import build, load_recipe

REPO = Path(__file__).resolve().parents[1]
SMOLLM3_3B = REPO / "recipes" / "smollm3-3b" / "pretrain.yaml"
SMOLLM3_1B = REPO / "recipes" / "smollm3-1b" / "pretrain.yaml"
PPO_3B = REPO / "recipes" / "smollm3-3b" / "ppo.yaml"
N_3B = 3_075_098_624                  # SmolLM3-3B's parameters (tied embeddings, vocab 128256)
RUN = {"tokens": "11e12", "gpu": "h100", "gpus": 384, "days": 24}  # SmolLM3: 11T tokens, 384 H100, 24 days
REQUIRED_KEYS = {"params", "train_flops", "gpu_hours", "gpus_needed", "mfu_required", "cost_usd",
                 "kv_cache_bytes_per_token", "memory_per_gpu_bytes"}
MEMORY_KEYS = {"weights", "grads", "optimizer", "activations", "activations_checkpointed", "total"}


@pytest.fixture(scope="module")
def recipe_3b():
    return load_pretrain_recipe(SMOLLM3_3B)


@pytest.fixture(scope="module")
def backwards(recipe_3b):
    return make_plan(recipe_3b, source=str(SMOLLM3_3B), **RUN)


def smolforge(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "smolforge", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


# --------------------------------------------------------------------------- SmolLM3-3B


def test_smollm3_3b_run_needs_about_30_percent_mfu(backwards, capsys):
    plan = backwards
    assert plan["params"] == pytest.approx(3.08e9, rel=0.01)
    assert plan["non_embedding_params"] == plan["params"] - 128256 * 2048  # tied: one table
    with capsys.disabled():
        print(f"\nSmolLM3-3B, 11T tokens on 384 H100 in 24 days: mfu_required = "
              f"{plan['mfu_required']:.1%} ({plan['tokens_per_second_per_gpu']:.0f} tokens/s/GPU)")
    assert 0.2 < plan["mfu_required"] < 0.4
    assert plan["gpu_hours"] == pytest.approx(384 * 24 * 24)
    assert plan["warnings"] == []


def test_gqa_kv_cache_is_four_times_smaller_than_mha(recipe_3b, backwards):
    assert backwards["kv_cache_bytes_per_token"] == 73728
    mha = dataclasses.replace(recipe_3b.model, num_kv_heads=16)
    assert kv_cache_bytes_per_token(mha) == 294912 == 4 * 73728


def test_forward_and_backwards_directions_agree(recipe_3b, backwards):
    forward = make_plan(recipe_3b, tokens="11e12", gpu="h100", mfu=0.3, days=24)
    assert forward["mfu_required"] is None and forward["mfu_assumed"] == 0.3
    assert forward["gpus_needed"] == pytest.approx(384, rel=0.05)  # 30 % vs the required 30.8 %
    again = make_plan(recipe_3b, tokens="11e12", gpu="h100", mfu=backwards["mfu_required"], days=24)
    assert again["gpus_needed"] == 384
    assert again["gpu_hours"] == pytest.approx(backwards["gpu_hours"])
    on_384 = make_plan(recipe_3b, tokens="11e12", gpu="h100", mfu=backwards["mfu_required"], gpus=384)
    assert on_384["days_needed"] == pytest.approx(24)


def test_train_flops_are_6nd_plus_attention(recipe_3b, backwards):
    shape, n = recipe_3b.model, backwards["params"]
    attention = 12 * 36 * 4096 * 2048
    assert attention_flops_per_token(shape, 4096) == attention
    assert flops_per_token(shape, 128256, 4096, params=n) == 6 * n + attention
    assert flops_per_token(shape, 128256, 4096, params=n, causal=True) == 6 * n + attention / 2
    assert backwards["train_flops"] == pytest.approx((6 * n + attention) * 11e12)
    untied = dataclasses.replace(shape, tie_word_embeddings=False)  # the input lookup is no matmul
    assert flops_per_token(untied, 128256, 4096, params=n + 128256 * 2048) == 6 * n + attention


def test_cost_is_gpu_hours_times_price(recipe_3b):
    plan = make_plan(recipe_3b, **RUN, price=2.5)
    assert plan["cost_usd"] == pytest.approx(384 * 24 * 24 * 2.5)


# --------------------------------------------------------------------------- memory


def test_memory_per_zero_stage_shards_the_16_bytes_per_param(backwards):
    n, g, mem = backwards["params"], 384, backwards["memory_per_gpu_bytes"]
    assert set(mem) == {"0", "1", "2", "3"}
    states = {z: m["weights"] + m["grads"] + m["optimizer"] for z, m in mem.items()}
    assert states["0"] == 16 * n
    assert states["1"] == pytest.approx(2 * n + 2 * n + 12 * n / g, abs=2)
    assert states["2"] == pytest.approx(2 * n + (2 + 12) * n / g, abs=2)
    assert states["3"] == pytest.approx((2 + 2 + 12) * n / g, abs=3)
    for m in mem.values():
        assert MEMORY_KEYS <= set(m)
        assert m["activations_checkpointed"] < m["activations"]
        assert m["total"] == m["weights"] + m["grads"] + m["optimizer"] + m["activations"]
    act = backwards["activations_bytes"]  # Korthikanti et al.: s·b·h·(34 + 5·a·s/h) per layer
    sbh = 4096 * 3 * 2048
    assert act["per_layer_eager_attention"] == sbh * (34 + 5 * 16 * 4096 / 2048)
    assert act["per_layer"] == 34 * sbh and act["per_layer_checkpointed"] == 2 * sbh
    assert mem["1"]["fits"] and not mem["0"]["fits"]  # SmolLM3's ZeRO-1 fits an 80 GB H100


def test_fp32_recipe_uses_4_4_8_bytes_and_warns(recipe_3b):
    fp32 = dataclasses.replace(recipe_3b, train=dataclasses.replace(recipe_3b.train, precision="fp32"))
    plan = make_plan(fp32, **RUN)
    zero0 = plan["memory_per_gpu_bytes"]["0"]
    assert (zero0["weights"], zero0["optimizer"]) == (4 * plan["params"], 8 * plan["params"])
    assert any("fp32" in w for w in plan["warnings"])


# --------------------------------------------------------------------------- devices


def test_peak_table_uses_dense_bf16_figures():
    assert peak_flops("h100") == pytest.approx(989e12, rel=0.01)  # not 3e15
    assert peak_flops("h200") == peak_flops("h100")
    assert peak_flops("a100") == peak_flops("a100-40g") == 312e12
    assert peak_flops("NVIDIA H100 80GB HBM3") == peak_flops("h100")
    assert peak_flops("tpu-v9") is None
    assert all(spec.source for spec in DEVICES.values())


def test_cpu_peak_is_measured():
    measure_cpu_peak_flops.cache_clear()  # how long it takes: bench/cli_startup.py
    flops = measure_cpu_peak_flops()
    assert 1e8 < flops < 1e14
    assert peak_flops("cpu") == flops


# --------------------------------------------------------------------------- the CLI edge


def test_json_is_one_object_with_the_required_keys(capsys):
    assert main(["plan", str(SMOLLM3_3B), "--tokens", "11e12", "--gpus", "384", "--days", "24", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)  # the whole of stdout is one JSON object
    assert isinstance(plan, dict) and REQUIRED_KEYS <= set(plan)
    assert set(plan["memory_per_gpu_bytes"]) == {"0", "1", "2", "3"}
    assert all(MEMORY_KEYS <= set(m) for m in plan["memory_per_gpu_bytes"].values())
    assert 0.2 < plan["mfu_required"] < 0.4 and plan["gpus_needed"] == 384
    assert plan["kv_cache_bytes_per_token"] == 73728


def test_table_is_the_default_output(capsys):
    assert main(["plan", str(SMOLLM3_3B), "--tokens", "11T", "--mfu", "0.3", "--days", "24",
                 "--price", "2"]) == 0
    out = capsys.readouterr().out
    for text in ("parameters", "3.075B", "GPUs needed", "MFU assumed", "30.0%", "memory per GPU",
                 "KV cache per token", "73728 B"):
        assert text in out
    assert not out.lstrip().startswith("{")


@pytest.mark.parametrize("args, says", [
    (["--mfu", "0.7"], "70%"),                          # assumed
    (["--gpus", "384", "--days", "10"], "> 60%"),      # required by a too-short schedule
    (["--gpus", "384", "--days", "5"], "impossible"),  # above the peak
])
def test_mfu_above_60_percent_prints_a_warning(args, says, capsys):
    assert main(["plan", str(SMOLLM3_3B), "--tokens", "11e12", *args]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and says in err


def test_plausible_mfu_prints_no_warning(capsys):
    assert main(["plan", str(SMOLLM3_3B), "--tokens", "11e12", "--mfu", "0.3", "--days", "24"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_unknown_gpu_exits_2_naming_the_close_match(capsys):
    assert main(["plan", str(SMOLLM3_3B), "--gpu", "h10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("RecipeError: unknown GPU 'h10'") and "did you mean 'h100'?" in err
    assert "a10g" in err and "Traceback" not in err


def test_recipe_of_a_stage_without_a_plan_exits_2(capsys):
    grpo = REPO / "recipes" / "demo" / "grpo.yaml"
    assert main(["plan", str(grpo)]) == 2
    err = capsys.readouterr().err
    assert "RecipeError" in err and "stage 'grpo'" in err and "stage: pretrain, sft, dpo, merge" in err


@pytest.mark.parametrize("args, says", [
    (["--gpus", "0", "--days", "24"], "--gpus must be a number > 0"),
    (["--days", "-1"], "--days must be a number > 0"),
    (["--tokens", "lots"], "--tokens must be a number > 0"),
    (["--mfu", "30"], "fraction of peak"),
    (["--price", "0"], "--price must be a number > 0"),
    (["--seq-len", "0"], "--seq-len must be a number > 0"),
    (["--gpus", "1.5"], "whole number"),
    (["--tokns", "5"], "did you mean '--tokens'?"),
])
def test_bad_numbers_exit_2(args, says, capsys):
    assert main(["plan", str(SMOLLM3_3B), *args]) == 2
    assert says in capsys.readouterr().err


def test_errors_are_raised_in_process_too():
    with pytest.raises(RecipeError, match="unknown GPU 'b200'"):
        plan_file(SMOLLM3_3B, gpu="b200")


def test_help_stays_light():
    out = smolforge("--help")  # how fast: bench/cli_startup.py
    assert out.returncode == 0 and "plan" in out.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import smolforge.cli, sys; "
         "print(sorted({'torch', 'transformers', 'smolforge.ops.plan'} & set(sys.modules)))"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=30)
    assert probe.stdout.strip() == "[]"


def test_plan_help_shows_an_example(capsys):
    assert main(["plan", "--help"]) == 0
    assert "example:\n  smolforge plan recipes/smollm3-3b/pretrain.yaml" in capsys.readouterr().out


# --------------------------------------------------------------------------- the recipes


@pytest.mark.parametrize("path", [SMOLLM3_3B, SMOLLM3_1B])
def test_real_scale_recipes_build_into_the_pretrain_recipe(path):
    from smolforge.pretrain.stage import Recipe

    stage, data = load_recipe(path)
    recipe = build(Recipe, data, source=str(path))
    assert stage == "pretrain" and isinstance(recipe, Recipe)
    assert recipe.data == "data-smollm3" and recipe.train.precision == "bf16"
    m = recipe.model
    assert (m.hidden_size, m.num_heads, m.num_kv_heads, m.nope_every, m.tie_word_embeddings) == (
        2048, 16, 4, 4, True)
    assert recipe.train.seq_len == m.max_position_embeddings == 4096


def test_smollm3_3b_recipe_is_the_real_shape(recipe_3b):
    m, t = recipe_3b.model, recipe_3b.train
    assert (m.num_layers, m.intermediate_size, m.rope_theta) == (36, 11008, 50000.0)
    assert (t.micro_batch_size, t.learning_rate, t.schedule, t.warmup_steps, t.decay_fraction,
            t.zero_stage) == (3, 2e-4, "wsd", 2000, 0.1, 1)
    global_batch = t.micro_batch_size * t.grad_accum * t.seq_len * 192  # 192 data-parallel replicas
    assert global_batch == 2_359_296  # SmolLM3's published GBS, ≈2.36M tokens


def test_smollm3_1b_recipe_counts_about_1_2b():
    recipe = load_pretrain_recipe(SMOLLM3_1B)
    assert count_parameters(recipe.model, 128256) == 1_235_814_400  # the figure in its comment



# --------------------------------------------------------------------------- PPO memory


@pytest.fixture(scope="module")
def ppo_3b():
    return plan_file(PPO_3B, model=SMOLLM3_3B, gpus=8, gpu="h100")


def test_smollm3_3b_ppo_recipe_fits_an_80gb_card_on_8_gpus(ppo_3b):
    plan, m = ppo_3b, ppo_3b["memory_per_gpu_bytes"]
    assert (plan["precision"], plan["zero_stage"], plan["gradient_checkpointing"], plan["rollouts"]) == (
        "bf16", 3, True, "hf")
    assert plan["policy_params"] == plan["reference_params"] == N_3B
    assert plan["value_params"] == N_3B + 2048 + 1               # no LM head (tied), plus the scalar head
    trained = 2 * N_3B + 2049
    assert m["states"] == pytest.approx(16 * trained / 8, abs=3)  # 2 + 2 + 12 bytes, all sharded over 8
    assert m["reference"] == 2 * N_3B / 8
    assert m["gathered_weights"] == 2 * trained                  # TRL gathers the whole module to generate
    assert m["kv_cache"] == 64 * (512 + 1024) * 73728
    assert m["peak"] == m["resident"] + max(m["train_activations"], m["rollout"])
    assert m["fits"] and m["peak"] <= 0.9 * 80e9
    assert m["peak"] == pytest.approx(32.6e9, rel=0.01)           # the figure in the recipe's header
    assert plan["warnings"] == []


def test_the_same_recipe_in_fp32_without_deepspeed_needs_about_108_gb():
    plan = plan_file(PPO_3B, ["ppo.precision=fp32", "ppo.deepspeed=null"], model=SMOLLM3_3B, gpus=8)
    m = plan["memory_per_gpu_bytes"]
    trained = 2 * N_3B + 2049
    assert (m["weights"], m["grads"], m["optimizer"]) == (4 * trained, 4 * trained, 8 * trained)  # nothing sharded
    assert m["reference"] == 4 * N_3B
    assert m["resident"] == pytest.approx(108e9, rel=0.03)        # 2 × 3B × 16 B + 12 GB: the figure
    assert m["fits"] is False and m["peak"] > m["resident"]
    assert any("ppo.deepspeed" in w for w in plan["warnings"]) and any("fp32" in w for w in plan["warnings"])


def test_ppo_memory_matches_a_hand_worked_small_case():
    """hidden 64, 2 layers, 2 heads (head_dim 32), 1 KV head, vocab 100; 1000 + 900 trained params,
    bf16 on ZeRO-2 over 4 GPUs; prompt 6 + 2 response tokens, mini-batch 1, batch 2."""
    shape = ModelShape(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    common = dict(policy_params=1000, value_params=900, reference_params=1000, precision="bf16", deepspeed=True,
                  zero_stage=2, dp_gpus=4, prompt_len=6, response_len=2, mini_batch_size=1, batch_size=2,
                  gpu_memory_bytes=100_000)
    m = ppo_memory(shape, 100, gradient_checkpointing=False, **common)
    assert (m["weights"], m["grads"], m["optimizer"]) == (2 * 1900, 2 * 1900 // 4, 12 * 1900 // 4)  # 3800 950 5700
    assert m["reference"] == 2000                                 # bf16, sharded only under ZeRO-3
    sbh = 8 * 1 * 64
    trunk = 2 * 34 * sbh                                          # 34·s·b·h per layer, fused attention
    assert m["activations_value"] == trunk == 34816
    assert m["activations_policy"] == trunk + 4 * 1 * 3 * 100     # fp32 logits of response + 1 positions
    assert m["kv_cache"] == 2 * 8 * (2 * 1 * 32 * 2 * 2) == 4096  # batch × tokens × layers·kv·head_dim·K,V·2 B
    assert m["gathered_weights"] == 0 and m["rollout"] == 4096
    assert m["resident"] == 3800 + 950 + 5700 + 2000 == 12450
    assert m["peak"] == 12450 + 34816 + 36016 == 83282 and m["fits"]  # <= 90 % of 100 000
    ckpt = ppo_memory(shape, 100, gradient_checkpointing=True, **common)
    assert ckpt["activations_value"] == 2 * 2 * sbh + 34 * sbh    # inputs kept + one layer recomputed
    zero3 = ppo_memory(shape, 100, gradient_checkpointing=True, **{**common, "zero_stage": 3})
    assert (zero3["weights"], zero3["reference"], zero3["gathered_weights"]) == (950, 500, 3800)
    assert zero3["rollout"] == 4096 + 3800
    fp32 = ppo_memory(shape, 100, gradient_checkpointing=False, **{**common, "precision": "fp32"})
    assert (fp32["weights"], fp32["reference"], fp32["kv_cache"]) == (4 * 1900, 4000, 8192)


def test_one_gpu_ppo_counts_the_vllm_servers_share(ppo_3b):
    plan = plan_file(PPO_3B, model=SMOLLM3_3B, gpus=1, gpu="h200")
    m = plan["memory_per_gpu_bytes"]
    assert plan["rollouts"] == "vllm-server" and plan["vllm_gpu_memory_utilization"] == 0.3
    assert m["vllm_server"] == pytest.approx(0.3 * 141e9) and m["kv_cache"] == 0
    assert m["peak"] == m["resident"] + m["vllm_server"] + max(m["train_activations"], m["rollout"])
    hf = plan_file(PPO_3B, ["generation=hf"], model=SMOLLM3_3B, gpus=1, gpu="h200")["memory_per_gpu_bytes"]
    assert hf["vllm_server"] == 0 and hf["kv_cache"] > 0


def test_ppo_plan_without_model_or_parent_says_to_pass_model(tmp_path, capsys, monkeypatch):
    with pytest.raises(RecipeError, match="parent run 'dpo-smollm3-3b' has no model/config.json.*pass --model"):
        plan_file(PPO_3B, gpus=8, runs_dir=tmp_path)
    monkeypatch.setenv("SMOLFORGE_RUNS", str(tmp_path))
    assert main(["plan", str(PPO_3B), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("RecipeError:") and "pass --model" in err and "Traceback" not in err


def test_ppo_plan_reads_the_parent_runs_model_config(tmp_path):
    from smolforge.pretrain.model import model_config

    shape = ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1)
    model_dir = tmp_path / "dpo-smollm3-3b" / "model"
    model_dir.mkdir(parents=True)
    model_config(shape, 300).save_pretrained(model_dir)
    plan = plan_file(PPO_3B, gpus=8, gpu="a100-40g", runs_dir=tmp_path)
    assert plan["policy_params"] == count_parameters(shape, 300) and plan["vocab_size"] == 300
    assert plan["model_source"] == str(model_dir / "config.json")
    folder = plan_file(PPO_3B, model=str(model_dir), gpus=8)        # --model as a HF model folder
    assert folder["policy_params"] == plan["policy_params"]


def test_ppo_defaults_here_are_the_stages_own():
    from smolforge.alignment.ppo import PPOSpec

    spec = PPOSpec()
    assert PPO_DEFAULTS == {key: getattr(spec, key) for key in PPO_DEFAULTS}


def test_ppo_plan_cli_table_and_json(capsys):
    args = ["plan", str(PPO_3B), "--model", str(SMOLLM3_3B), "--gpus", "8", "--gpu", "h100"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for text in ("PPO memory plan", "ZeRO-3", "train activations", "rollout", "peak", "fits 80 GB", "yes"):
        assert text in out
    assert main(["--json", *args]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["stage"] == "ppo" and plan["memory_per_gpu_bytes"]["fits"] is True


@pytest.mark.parametrize("args, says", [
    (["--tokens", "11T"], "--tokens is for pretrain, sft and dpo recipes"),
    (["--prompt-len", "0"], "--prompt-len must be a number > 0"),
    (["--model", "no/such/config.json"], "no/such/config.json not found"),
    (["--set", "ppo.precision=fp16"], "ppo.precision must be one of auto, fp32, bf16"),
    (["--set", "ppo.deepspeed=no/such.json"], "ppo.deepspeed: no/such.json not found"),
])
def test_bad_ppo_plan_inputs_exit_2(args, says, capsys):
    assert main(["plan", str(PPO_3B), "--model", str(SMOLLM3_3B), *args]) == 2
    assert says in capsys.readouterr().err


def test_model_is_not_for_pretrain_recipes(capsys):
    assert main(["plan", str(SMOLLM3_3B), "--model", str(SMOLLM3_3B)]) == 2
    assert "--model is for sft, dpo and ppo recipes" in capsys.readouterr().err


def test_pretrain_tokens_default_to_max_steps_times_the_batch_on_gpus():
    midtrain = SMOLLM3_3B.parent / "midtrain-32k.yaml"     # max_steps 3974 at 1 × 32,768 tokens per GPU
    on_384 = plan_file(midtrain, gpus=384)
    assert on_384["tokens"] == 3974 * 32768 * 384 and "train.max_steps 3,974" in on_384["tokens_source"]
    assert plan_file(midtrain, gpus=192)["tokens"] == on_384["tokens"] / 2
    no_gpus = plan_file(midtrain, days=24)                   # the GPUs are what the plan looks for
    assert no_gpus["tokens"] == 20 * no_gpus["params"] and "Chinchilla" in no_gpus["tokens_source"]


def test_post_training_defaults_here_are_the_stages_own():
    from trl import DPOConfig, SFTConfig

    from smolforge.alignment import dpo, sft
    from smolforge.alignment.common import cuda_available
    from smolforge.ops.plan.posttrain import trainer_defaults

    for module, config, ours in ((sft, SFTConfig, trainer_defaults("sft")), (dpo, DPOConfig, trainer_defaults("dpo"))):
        theirs = module.defaults()["trainer"]
        assert theirs["bf16"] == theirs["gradient_checkpointing"] == cuda_available()  # ours: None, by --gpu
        for key, value in ours.items():
            if key not in ("bf16", "gradient_checkpointing"):
                assert value == theirs.get(key, config.__dataclass_fields__[key].default), (module.__name__, key)


def test_continued_pretraining_recipes_plan_with_their_parents_shape(capsys):
    """recipes/smollm3-3b/midtrain-*.yaml name their parent run (init:); the plan takes its shape from
    the pretrain recipe of that name beside them, with the longer context."""
    plans = {}
    for name in ("pretrain", "midtrain-32k", "midtrain-64k"):
        assert main(["plan", str(SMOLLM3_3B.parent / f"{name}.yaml"), "--tokens", "50B", "--gpus", "384", "--json"]) == 0
        plans[name] = json.loads(capsys.readouterr().out)
    assert plans["midtrain-32k"]["params"] == plans["midtrain-64k"]["params"] == plans["pretrain"]["params"]
    assert [plans[n]["seq_len"] for n in plans] == [4096, 32768, 65536]
    hours = [plans[n]["gpu_hours"] for n in plans]
    assert hours[0] < hours[1] < hours[2]   # the same 50B tokens cost more at longer context (attention)
