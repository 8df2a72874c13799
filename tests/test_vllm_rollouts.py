"""The vLLM server path for RL rollouts (generation/vllm_server.py, generation/rollouts.py).

Runs a real vLLM server (the CPU build, fp32) on the tiny SFT model of the session chain.
"""
from __future__ import annotations

import json

import pytest
import torch

from conftest import needs_vllm
from smolforge.errors import RecipeError, ServiceError

pytestmark = pytest.mark.slow  # real servers or whole pipelines: tens of seconds (make test-fast skips them)

PROMPTS = [[{"role": "user", "content": "Add 1 and 2."}], [{"role": "user", "content": "What is 3 plus 4?"}],
           [{"role": "user", "content": "Name the food that Bo eats."}]]



def hf_greedy(model, tokenizer, prompt_ids, max_new_tokens):
    """Greedy ids and the log-prob of each chosen token, one prompt at a time (no padding)."""
    from smolforge.generation.prompts import cut_at_eos

    results = []
    for ids in prompt_ids:
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, top_k=None,
                             top_p=None, temperature=None, output_scores=True, return_dict_in_generate=True,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        new = cut_at_eos(out.sequences[0, len(ids):].tolist(), {tokenizer.eos_token_id})
        logprobs = [torch.log_softmax(score[0].float(), -1)[token].item() for score, token in zip(out.scores, new)]
        results.append((new, logprobs))
    return results


def test_a_folder_without_config_is_refused_before_starting_anything(tmp_path):
    from smolforge.generation.vllm_server import VLLMServer

    server = VLLMServer(tmp_path / "missing")
    with pytest.raises(ServiceError, match="not a model folder"):
        server.start()
    assert server.process is None


def test_a_start_in_the_background_that_fails_raises_at_the_first_use(tmp_path):
    from smolforge.generation.rollouts import ServerRollouts

    rollouts = ServerRollouts(tmp_path / "missing", tmp_path / "rollouts").start_in_background()
    try:
        with pytest.raises(ServiceError, match="not a model folder"):
            rollouts.generate([[1, 2, 3]], max_tokens=2)
        assert rollouts.ready() is rollouts            # reported once; the server never started
    finally:
        rollouts.stop()
    assert rollouts.server.process is None


def test_backend_choice_follows_head_size_and_refuses_an_impossible_vllm(tmp_path, monkeypatch):
    from smolforge.generation import backends

    monkeypatch.setattr(backends, "vllm_importable", lambda: True)   # the CPU build's rule, on any machine
    monkeypatch.setattr(backends, "cuda_present", lambda: False)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    assert backends.pick_backend("hf", tmp_path) == "hf"
    assert backends.pick_backend("auto", tmp_path) == "hf"                 # head size 16: CPU attention lacks it
    with pytest.raises(RecipeError, match="does not support head size 16"):
        backends.pick_backend("vllm", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2}))
    assert backends.pick_backend("auto", tmp_path) == "vllm-server"
    monkeypatch.setattr(backends, "vllm_importable", lambda: False)
    with pytest.raises(RecipeError, match="vLLM is not installed"):
        backends.pick_backend("vllm", tmp_path)


@pytest.fixture(scope="module")
def policy_server(sft_run, tmp_path_factory):
    """ONE vLLM server holding the tiny SFT model for this file's stage runs (each stage would start its
    own): the stages get it through their factories, with start and stop made no-ops there; stopped,
    by PID, after the module."""
    from smolforge.generation.rollouts import ServerRollouts

    rollouts = ServerRollouts(sft_run.model_dir, tmp_path_factory.mktemp("policy-server"), seed=0,
                              gpu_memory_utilization=0.3).start()    # on a GPU, the trainers share the card
    yield rollouts
    rollouts.stop()
    assert rollouts.server.process.poll() is not None
    assert not list(rollouts.workdir.glob("weights-*"))


def lend(rollouts, monkeypatch):
    """``rollouts`` as a stage's own server: already started, not stopped by the stage, back on the SFT weights."""
    monkeypatch.setattr(rollouts, "start", lambda: rollouts)
    monkeypatch.setattr(rollouts, "start_in_background", lambda: rollouts)
    monkeypatch.setattr(rollouts, "stop", lambda: None)
    return rollouts


@needs_vllm
def test_ppo_rolls_out_through_the_vllm_server_which_samples_what_hf_would_and_follows_weight_updates(
        runs, sft_run, data_run, policy_server, monkeypatch):
    """The PPO stage pushes the policy to its vLLM server before each rollout and measures the log-prob gap;
    then the rollouts themselves are checked against HF, token for token in fp32."""
    from transformers import AutoModelForCausalLM

    from test_ppo_stage import ppo_recipe

    from smolforge.alignment.ppo import stage as ppo
    from smolforge.generation.prompts import encode_prompts, load_tokenizer

    built = []
    monkeypatch.setattr(ppo, "server_rollouts",
                        lambda model_dir, workdir, spec: (built.append(model_dir), lend(policy_server, monkeypatch))[1])
    recipe = ppo_recipe(name="ppo-vllm", generation="auto" if torch.cuda.is_available() else "vllm")
    ppo.validate(recipe, runs)
    syncs = policy_server.syncs
    run = ppo.run(recipe, runs, overwrite=True)
    assert run.status == "done" and run.metrics["rl/generation"] != "hf" and built == [sft_run.model_dir]
    steps = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(s["completion_length"] >= 1 for s in steps)
    assert policy_server.syncs - syncs == 2                           # pushed before each of the 2 rollouts
    # the engine's log-probs of what it sampled against the policy's old log-probs, every step: fp32 both sides
    gaps = [s["parity/logprob_gap_mean"] for s in steps]
    assert len(gaps) == 2 and all(0 <= g < 1e-3 for g in gaps), gaps
    assert run.metrics["parity/steps_measured"] == 2 and run.metrics["parity/steps_over_max_gap"] == 0
    log = policy_server.server.log_path.read_text()
    assert "Application startup complete" in log
    if not torch.cuda.is_available():   # conftest's one thread per process: the engine's one thread, unpinned
        environ = open(f"/proc/{policy_server.server.process.pid}/environ", "rb").read().split(b"\0")
        assert b"VLLM_CPU_OMP_THREADS_BIND=nobind" in environ and b"OMP_NUM_THREADS=1" in environ

    rollouts = policy_server
    tokenizer = load_tokenizer(sft_run.model_dir)
    model = AutoModelForCausalLM.from_pretrained(sft_run.model_dir).eval()
    prompt_ids = encode_prompts(tokenizer, PROMPTS)
    assert rollouts.server.url.startswith("http://127.0.0.1:")
    rollouts.sync(model)                                              # back from PPO's policy to the SFT model
    served = rollouts.generate(prompt_ids, max_tokens=8, temperature=0.0)
    expected = hf_greedy(model, tokenizer, prompt_ids, 8)
    assert [ids for ids, _ in served] == [ids for ids, _ in expected]              # fp32: token for token
    for (_, got), (_, want) in zip(served, expected):
        assert got == pytest.approx(want, abs=1e-4)

    with torch.no_grad():                                                         # a different policy
        torch.manual_seed(0)
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    moved = hf_greedy(model, tokenizer, prompt_ids, 8)
    assert [ids for ids, _ in moved] != [ids for ids, _ in expected]
    rollouts.sync(model)
    after = rollouts.generate(prompt_ids, max_tokens=8, temperature=0.0)
    assert [ids for ids, _ in after] == [ids for ids, _ in moved]

    sampled = rollouts.generate(prompt_ids[:1] * 2, max_tokens=8, temperature=1.0, n=4)
    assert len(sampled) == 8 and all(1 <= len(ids) <= 8 and len(lps) == len(ids) for ids, lps in sampled)
    assert len({tuple(ids) for ids, _ in sampled}) > 1      # identical prompts still sample differently


def even_token_reward(prompts, completions, completion_ids, **kwargs):
    """The share of even token ids: sampled answers differ in it, so every group has a spread and every
    step moves the policy (the tiny model's answers all run to the length limit, which a length reward needs)."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


@needs_vllm
def test_a_skipped_weight_sync_is_caught_at_the_next_step(runs, sft_run, data_run, policy_server, monkeypatch):
    """GRPO on the vLLM server measures the engine-vs-policy log-prob gap of every rollout batch. With the
    push after step 1 dropped, step 2 is sampled from the step-0 weights: the gap stops the run there."""
    from transformers import AutoModelForCausalLM

    from conftest import run_stage
    from smolforge.errors import RunError
    from smolforge.generation import rollouts as rollouts_module

    policy_server.sync(AutoModelForCausalLM.from_pretrained(sft_run.model_dir))   # the policy at step 0
    lend(policy_server, monkeypatch)
    monkeypatch.setattr(rollouts_module, "ServerRollouts", lambda *args, **kwargs: policy_server)
    pushes = []
    push = policy_server.sync

    def drop_the_first_push(model):
        pushes.append(model)
        if len(pushes) > 1:
            push(model)

    monkeypatch.setattr(policy_server, "sync", drop_the_first_push)
    with pytest.raises(RunError, match=r"grpo step 2: the inference engine and the trainer disagree .*\(a missed weight sync"):
        run_stage("grpo", runs, name="grpo-skipped-sync", parent=sft_run.name, data=data_run.name, generation="vllm",
                  eval_max_new_tokens=4, parity={"max_gap": 0.01}, rewards=["test_vllm_rollouts:even_token_reward"],
                  trainer={"max_steps": 3, "per_device_train_batch_size": 8, "num_generations": 4,
                           "max_completion_length": 8, "logging_steps": 1, "learning_rate": 1e-3})
    run = runs.get("grpo-skipped-sync", require_done=False)
    assert run.status == "failed" and "step 2" in run.info["error"] and len(pushes) == 1
    logged = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    first = [row["parity/logprob_gap_mean"] for row in logged if "parity/logprob_gap_mean" in row]
    assert len(first) == 1 and first[0] < 1e-3             # step 1, sampled from the weights it trains: in parity
    # TRL's importance-sampling correction is on for the synchronous server path too (its sampling/… figures)
    assert any("sampling/importance_sampling_ratio/mean" in row for row in logged)


@needs_vllm
def test_async_grpo_trains_on_batches_sampled_one_step_ahead(runs, sft_run, data_run, policy_server, monkeypatch):
    """GRPO with ``async: {max_staleness: 1}`` on the vLLM server: each batch after the first is sampled while the
    step before it trains, from weights one step old; TRL's importance-sampling correction takes the stale batches,
    parity (the engine against the weights that sampled) stays in fp32 agreement although the policy moves."""
    import threading

    from transformers import AutoModelForCausalLM

    from conftest import run_stage
    from smolforge.generation import rollouts as rollouts_module

    policy_server.sync(AutoModelForCausalLM.from_pretrained(sft_run.model_dir))   # the policy at step 0
    lend(policy_server, monkeypatch)
    monkeypatch.setattr(rollouts_module, "ServerRollouts", lambda *args, **kwargs: policy_server)
    syncs = policy_server.syncs
    run = run_stage("grpo", runs, name="grpo-async", parent=sft_run.name, data=data_run.name, generation="vllm",
                    eval_max_new_tokens=4, parity={"max_gap": 0.01}, **{"async": {"max_staleness": 1}},
                    rewards=["test_vllm_rollouts:even_token_reward"],
                    trainer={"max_steps": 4, "per_device_train_batch_size": 8, "num_generations": 4,
                             "max_completion_length": 8, "logging_steps": 1, "learning_rate": 1e-3})
    assert run.status == "done" and run.metrics["rl/generation"] == "vllm-server"
    steps = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    steps = [s for s in steps if "async/staleness" in s]
    staleness = [s["async/staleness"] for s in steps]
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and staleness == [0, 1, 1, 1], staleness
    assert all(0 <= s["async/overlap"] <= 1 and s["async/generate_s"] > 0 for s in steps)
    # the engine agrees with the weights that sampled each batch; TRL's own gap (current policy vs engine) holds the drift
    assert all(s["parity/logprob_gap_mean"] < 1e-3 for s in steps)
    drift = [s["sampling/sampling_logp_difference/mean"] for s in steps]
    assert drift[0] < 1e-3 and max(drift[1:]) > 0.01, drift
    assert all("sampling/importance_sampling_ratio/mean" in s for s in steps)
    m = run.metrics
    assert m["rl/is_correction"] == "sequence_mask" and m["rl/async_max_staleness"] == 1
    assert m["rl/async_staleness_max"] == 1 and m["rl/async_staleness_mean"] == 0.75 and m["rl/async_fallbacks"] == 0
    assert 0 <= m["rl/async_overlap_mean"] <= 1 and m["rl/steps_per_s"] > 0
    assert m["parity/steps_measured"] == 4 and m["parity/steps_over_max_gap"] == 0
    assert 1 <= policy_server.syncs - syncs <= 3          # versions 1, 2, 3 pushed (at most), each once
    assert not [t for t in threading.enumerate() if t.name == "async-rollouts"]
