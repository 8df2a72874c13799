"""The ppo stage (alignment/ppo/stage.py) and its generation backend on the tiny session chain."""
from __future__ import annotations

import json
import math

import pytest
import torch

from smolforge.errors import DataError, RecipeError, SmolforgeError
from smolforge.recipe import build_stage_recipe, deep_merge, load_recipe
from smolforge.registry import load_stage

from conftest import DEMO

# A few seconds of PPO on the tiny world: short completions, small batches.
TINY_PPO = {"ppo": {"steps": 2, "batch_size": 8, "mini_batch_size": 4, "ppo_epochs": 2, "max_new_tokens": 8,
                    "learning_rate": 1e-3},
            "eval_max_new_tokens": 8, "generation": "hf"}


def word_overlap(prompts, completions, answer, **kwargs):
    """Test verifier with partial credit: the share of the answer's words the completion contains.

    Dense on purpose: the tiny SFT model rarely gets an answer right, and PPO needs differing
    scores within a batch to have anything to learn from.
    """
    scores = []
    for completion, gold in zip(completions, answer):
        words = set(completion[0]["content"].lower().replace(".", "").split())
        gold_words = gold.lower().replace(".", "").split()
        scores.append(sum(w in words for w in gold_words) / len(gold_words))
    return scores


def one_value(prompts, completions, **kwargs):
    return [1.0]


def ppo_recipe(**changes):
    _, data = load_recipe(DEMO / "ppo.yaml")
    data = deep_merge(deep_merge(data, TINY_PPO), {"rewards": [word_overlap]})
    return build_stage_recipe(load_stage("ppo"), deep_merge(data, changes), source="ppo (test)")


@pytest.fixture(scope="module")
def ppo_run(runs, sft_run, data_run):
    module = load_stage("ppo")
    recipe = ppo_recipe(name="ppo-test")
    module.validate(recipe, runs)
    return module.run(recipe, runs, overwrite=True)


def test_ppo_stage_trains_logs_and_writes_a_loadable_model(ppo_run, sft_run):
    from transformers import AutoModelForCausalLM

    from smolforge.generation.prompts import load_tokenizer

    assert ppo_run.status == "done" and ppo_run.stage == "ppo"
    lines = [json.loads(line) for line in ppo_run.metrics_path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for key in ("reward", "kl", "kl_coef", "clipfrac", "policy_loss", "value_loss", "entropy", "approx_kl",
                "rewards/word_overlap"):
        assert all(key in line for line in lines), key
    metrics = ppo_run.metrics
    for key in ("rl/heldout_reward_before", "rl/heldout_reward_after"):
        assert 0.0 <= metrics[key] <= 1.0
    assert metrics["train/steps"] == 2 and metrics["rl/heldout_prompts"] >= 1
    assert (ppo_run.path / "rl" / "heldout.jsonl").is_file()
    assert ppo_run.info["parents"] == [sft_run.name, "data-demo"]

    policy = AutoModelForCausalLM.from_pretrained(ppo_run.model_dir)
    parent = AutoModelForCausalLM.from_pretrained(sft_run.model_dir)
    moved = [name for name, p in policy.state_dict().items() if not torch.equal(p, parent.state_dict()[name])]
    assert moved, "the policy saved in model/ is still the parent"
    tokenizer = load_tokenizer(ppo_run.model_dir)
    ids = tokenizer("Add 1 and 2.", return_tensors="pt").input_ids
    assert policy.generate(ids, max_new_tokens=3, do_sample=False).shape[1] > ids.shape[1]


def test_reference_stays_frozen_while_the_policy_moves(runs, sft_run, data_run):
    from smolforge.alignment import online
    from smolforge.alignment.ppo import math as ppo_math, models as ppo_models, step as ppo_step

    recipe = ppo_recipe()
    spec = recipe.ppo
    models = ppo_models.build_models(sft_run.model_dir, spec)
    _, _, train, _ = online.load_prompts(recipe, runs, spec.seed)
    ref_before = {k: v.clone() for k, v in models.ref.state_dict().items()}
    policy_before = {k: v.clone() for k, v in models.policy.state_dict().items()}
    metrics = ppo_step.step(models, spec, train[:spec.batch_size], [word_overlap], ppo_math.KLController(spec.kl_coef))
    assert all(torch.equal(v, ref_before[k]) for k, v in models.ref.state_dict().items())
    assert not any(p.requires_grad for p in models.ref.parameters())
    assert any(not torch.equal(v, policy_before[k]) for k, v in models.policy.state_dict().items())
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-5)  # the first rollout is the reference's own policy
    assert 0.0 <= metrics["clipfrac"] <= 1.0


def test_batched_logprobs_match_one_sequence_at_a_time(sft_run):
    """Left-padded prompts + right-padded completions give each token the log-prob it has alone."""
    from transformers import AutoModelForCausalLM

    from smolforge.alignment.ppo import step as ppo_step

    model = AutoModelForCausalLM.from_pretrained(sft_run.model_dir).eval()
    queries, completions = [[1, 40, 41, 42, 43, 44], [1, 50]], [[60, 61, 2], [62, 63, 64, 65, 2]]
    rollout = ppo_step.make_rollout(queries, completions, pad_id=3, device="cpu")
    with torch.no_grad():
        logits = model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask,
                       position_ids=rollout.position_ids).logits[:, -rollout.response_length - 1:-1]
        batched = ppo_step.token_logprobs(logits, rollout.response_ids, temperature=1.0)
        for i, (query, completion) in enumerate(zip(queries, completions)):
            alone = model(input_ids=torch.tensor([query + completion])).logits[0, len(query) - 1:-1]
            expected = torch.log_softmax(alone, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
            assert torch.allclose(batched[i, :len(completion)], expected, atol=1e-4)
            assert rollout.response_mask[i].sum() == len(completion)


def test_mini_batch_size_must_divide_batch_size(runs, sft_run, data_run):
    recipe = ppo_recipe(ppo={"batch_size": 8, "mini_batch_size": 3})
    with pytest.raises(RecipeError, match=r"ppo.mini_batch_size \(3\) must divide ppo.batch_size \(8\)"):
        load_stage("ppo").validate(recipe, runs)


@pytest.mark.parametrize("changes, message", [
    ({"ppo": {"kl_coef": -0.1}}, "ppo.kl_coef must be >= 0"),
    ({"ppo": {"cliprange": 0}}, "ppo.cliprange must be > 0"),
    ({"ppo": {"kl_estimator": "k2"}}, "kl_estimator must be k1 or k3"),
    ({"rewards": []}, "name at least one reward"),
    ({"reward_weights": [1.0, 2.0]}, "one weight per reward"),
    ({"rewards": ["answer_mach"]}, "did you mean 'answer_match'"),
    ({"parent": "no-such-run"}, "no-such-run"),
    ({"ppo": {"precision": "fp16"}}, "ppo.precision must be one of auto, fp32, bf16, got 'fp16'"),
    ({"ppo": {"deepspeed": "no/such/zero3.json"}}, "ppo.deepspeed: no/such/zero3.json not found"),
    ({"ppo": {"vllm_gpu_memory_utilization": 1.5}}, "ppo.vllm_gpu_memory_utilization must be <= 1, got 1.5"),
    ({"ppo": {"vllm_gpu_memory_utilization": 0}}, "between 0 and 1"),
])
def test_bad_recipes_fail_before_any_work(runs, sft_run, data_run, changes, message):
    with pytest.raises(SmolforgeError, match=message):     # when the recipe is built, or by validate
        recipe = ppo_recipe(**changes)
        load_stage("ppo").validate(recipe, runs)
    assert not (runs.root / load_recipe(DEMO / "ppo.yaml")[1]["name"]).exists()


def test_reward_returning_the_wrong_length_is_named(runs, sft_run, data_run):
    from smolforge.alignment.ppo import stage as ppo

    recipe = ppo_recipe(rewards=[one_value])
    with pytest.raises(DataError, match="reward function 'one_value' returned 1 values for 2 completions"):
        ppo.validate(recipe, runs)
    # an unchecked callable handed to the scoring step directly gets the same diagnosis
    rows = [{"prompt": "a", "answer": "x"}, {"prompt": "b", "answer": "y"}]
    with pytest.raises(RecipeError, match="'one_value' returned 1 values for 2 completions"):
        ppo.score_completions([one_value], None, rows, ["x", "y"], [[], []])


def full_marks(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def test_a_completion_that_stops_at_the_generation_configs_end_token_has_ended():
    """A chat model stops at an end-of-turn token only its generation_config names (the samplers stop
    there too): that completion has ended and gets no missing_eos_penalty."""
    from types import SimpleNamespace

    from smolforge.alignment.ppo import scoring as ppo_scoring

    tokenizer = SimpleNamespace(eos_token_id=2)
    policy = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[2, 7]))
    rows = [{"prompt": "Add 1 and 2.", "answer": "3"}] * 4
    # end-of-turn (generation_config only), the tokenizer's eos, cut off by max_new_tokens, empty
    completion_ids = [[5, 7], [5, 2], [5, 6], []]
    scores = ppo_scoring.score(rows, ["3"] * 4, completion_ids, [full_marks], None, tokenizer, policy,
                               missing_eos_penalty=0.5)
    assert scores.ended == [True, True, False, False]
    assert scores.total == [1.0, 1.0, 0.5, 0.5]


def test_a_split_that_leaves_no_training_prompt_is_refused(runs, sft_run, tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"prompt": "Add 1 and 2.", "answer": "3"}) + "\n")
    with pytest.raises(RecipeError, match="1 prompt rows leave none for training"):
        load_stage("ppo").validate(ppo_recipe(data=str(path)), runs)


@pytest.mark.parametrize("content, message", [
    ("{\"zero_optimization\": {\"stage\": 3},", "is not JSON"),
    ('{"train_batch_size": "auto"}', "must be a JSON object with a zero_optimization section"),
    ('{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 3}',
     r"train_micro_batch_size_per_gpu is 3 but PPO steps on ppo.mini_batch_size=4 rollouts"),
    ('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}', "bf16.enabled=true but ppo.precision is fp32"),
])
def test_a_bad_deepspeed_file_is_named_before_any_work(runs, sft_run, data_run, tmp_path, content, message):
    path = tmp_path / "ds.json"
    path.write_text(content)
    recipe = ppo_recipe(ppo={"deepspeed": str(path), "precision": "fp32"})
    with pytest.raises(RecipeError, match=message) as error:
        load_stage("ppo").validate(recipe, runs)
    assert "ppo.deepspeed" in str(error.value) or str(path) in str(error.value)


def test_the_3b_recipe_passes_its_own_checks(monkeypatch):
    """recipes/smollm3-3b/ppo.yaml: ZeRO-3 JSON found from the repo root, "auto" micro-batch, bf16."""
    from smolforge.alignment.ppo import stage as ppo

    from conftest import REPO

    monkeypatch.chdir(REPO)  # recipes name files from the repo root
    path = REPO / "recipes" / "smollm3-3b" / "ppo.yaml"
    stage, data = load_recipe(path)
    recipe = build_stage_recipe(load_stage(stage), data, source=str(path))
    ppo._check_numbers(recipe)
    spec = recipe.ppo
    assert (spec.precision, spec.deepspeed, spec.gradient_checkpointing) == (
        "bf16", "recipes/smollm3-3b/zero3.json", True)
    assert spec.vllm_gpu_memory_utilization == 0.3
    assert (REPO / spec.deepspeed).is_file()
    config = json.loads((REPO / spec.deepspeed).read_text())
    assert config["zero_optimization"]["stage"] == 3 and config["train_micro_batch_size_per_gpu"] == "auto"


def test_defaults_train_in_fp32_without_deepspeed_on_cpu():
    from smolforge.alignment.ppo import stage as ppo

    spec = ppo.PPOSpec()
    assert (spec.precision, spec.deepspeed, spec.gradient_checkpointing) == ("auto", None, False)
    assert ppo.resolved_precision(spec.precision, cuda=False) == "fp32"
    assert ppo.resolved_precision(spec.precision, cuda=True) == "bf16"


def test_gradient_checkpointing_trains_both_backbones(runs, sft_run, data_run):
    """ppo.gradient_checkpointing: policy and value trunks recompute in backward, and one PPO step
    still moves the policy (generation turns it off and back on around sampling)."""
    from smolforge.alignment import online
    from smolforge.alignment.ppo import math as ppo_math, models as ppo_models, step as ppo_step

    recipe = ppo_recipe(ppo={"gradient_checkpointing": True, "batch_size": 4, "mini_batch_size": 2,
                             "ppo_epochs": 1})
    spec = recipe.ppo
    models = ppo_models.build_models(sft_run.model_dir, spec)
    unwrapped = models.accelerator.unwrap_model(models.model)
    assert unwrapped.policy.is_gradient_checkpointing and unwrapped.value_model.backbone.is_gradient_checkpointing
    assert next(models.ref.parameters()).dtype == torch.float32  # fp32 training: an fp32 reference
    _, _, train, _ = online.load_prompts(recipe, runs, spec.seed)
    before = {k: v.clone() for k, v in models.policy.state_dict().items()}
    metrics = ppo_step.step(models, spec, train[:spec.batch_size], [word_overlap],
                            ppo_math.KLController(spec.kl_coef))
    assert unwrapped.policy.is_gradient_checkpointing  # back on after sampling
    assert all(math.isfinite(metrics[k]) for k in ("policy_loss", "value_loss"))
    assert any(not torch.equal(v, before[k]) for k, v in models.policy.state_dict().items())


ZERO3_STEP = """
import json, sys
from smolforge.alignment.ppo import math as ppo_math, models as ppo_models, stage as ppo, step as ppo_step
from smolforge.processes import release_process_group
spec = ppo.PPOSpec(batch_size=4, mini_batch_size=2, ppo_epochs=1, max_new_tokens=4, learning_rate=1e-4,
                   deepspeed=sys.argv[2], precision=sys.argv[3], gradient_checkpointing=True)
accelerator = ppo.make_accelerator(spec)
models = ppo_models.build_models(sys.argv[1], spec, accelerator)
rows = [{"prompt": f"Add {i} and 1.", "answer": str(i + 1)} for i in range(4)]
metrics = ppo_step.step(models, spec, rows, [lambda prompts, completions, **kw: [float(i % 2) for i in
                        range(len(completions))]], ppo_math.KLController(spec.kl_coef))
config = accelerator.deepspeed_config
print(json.dumps({"zero3": ppo_models.zero3(accelerator), "micro": config["train_micro_batch_size_per_gpu"],
                  "train_batch": config["train_batch_size"], "clip": config["gradient_clipping"],
                  "bf16": config["bf16"]["enabled"], "bucket": config["zero_optimization"]["reduce_bucket_size"],
                  "value_loss": metrics["value_loss"],
                  "sklearn_loaded": "sklearn" in sys.modules, "scipy_optimize_loaded": "scipy.optimize" in sys.modules}))   # smolforge/lean_imports.py: not for a PPO step
release_process_group()   # as the smolforge command does at exit
# the same fresh process (TRL loaded, vLLM not): TRL's online trainers import without vLLM, and
# building TRL's VLLMGeneration (what GRPOTrainer does with use_vllm) loads the real module and vLLM
import inspect
vllm_before = "vllm" in sys.modules
from trl import GRPOTrainer, RLOOTrainer
from trl.generation import vllm_generation
deferred = {"vllm_before": vllm_before, "vllm_at_load": "vllm" in sys.modules,
            "stand_in": getattr(vllm_generation, "_smolforge_stand_in", False)}
try:
    vllm_generation.VLLMGeneration()
except TypeError as error:
    deferred["built"] = str(error)
real = sys.modules["trl.generation.vllm_generation"]
deferred.update(real=not getattr(real, "_smolforge_stand_in", False), vllm="vllm" in sys.modules,
                client=real.VLLMClient.__module__, signature=list(inspect.signature(real.VLLMGeneration).parameters)[:1])
print(json.dumps(deferred))
"""


@pytest.mark.slow
def test_ppo_deepspeed_fills_the_zero3_recipes_auto_values(sft_run, tmp_path, precision="bf16"):
    """ppo.deepspeed with the 3B recipes' own zero3.json (all "auto") on one CPU process: accelerate
    gets the micro-batch (ppo.mini_batch_size) and clipping (ppo.max_grad_norm) from the recipe, the
    bucket sizes from the model's hidden size, bf16 from ppo.precision; one step trains."""
    import importlib.util
    import os
    import subprocess
    import sys

    from conftest import REPO
    from smolforge.processes import free_port

    script = tmp_path / "zero3_step.py"
    script.write_text(ZERO3_STEP)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script), str(sft_run.model_dir), "recipes/smollm3-3b/zero3.json",
                          precision], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found, deferred = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    hidden = json.loads((sft_run.model_dir / "config.json").read_text())["hidden_size"]
    assert found["zero3"] and (found["micro"], found["train_batch"], found["clip"]) == (2, 2, 1.0)
    assert found["bf16"] is (precision == "bf16") and found["bucket"] == hidden * hidden
    assert math.isfinite(found["value_loss"])
    assert found["sklearn_loaded"] is False   # transformers, TRL, accelerate and DeepSpeed loaded; scikit-learn deferred
    assert found["scipy_optimize_loaded"] is False   # and transformers' object-detection losses' scipy.optimize
    # smolforge/lean_imports.py defers trl.generation.vllm_generation (≈5 s of `from trl import GRPOTrainer`)
    assert (deferred["vllm_before"], deferred["vllm_at_load"], deferred["stand_in"]) == (False, False, True)
    assert deferred["built"].startswith("VLLMGeneration.__init__() missing")   # the real class's own __init__
    assert (deferred["real"], deferred["client"], deferred["signature"]) == (True, "trl.generation.vllm_client", ["model"])
    assert deferred["vllm"] is (importlib.util.find_spec("vllm") is not None)
