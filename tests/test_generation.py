"""The generation layer: the HF sampler, the backend choice, and the one HTTP client."""
from __future__ import annotations

import http.server
import json
import socket
import sys
import threading

import pytest
import torch

from smolforge.errors import RecipeError, ServiceError
from smolforge.generation import backends
from smolforge.generation.client import Client


def test_hf_sampler_stops_at_eos_and_returns_the_token_ids(sft_run):
    from smolforge.generation.hf import load_hf_sampler

    sampler = load_hf_sampler(sft_run.model_dir)
    tokenizer = sampler.tokenizer
    prompts = [[{"role": "user", "content": "Add 1 and 2."}], [{"role": "user", "content": "What is 3 plus 4?"}]]
    torch.manual_seed(0)
    outputs = sampler.sample(prompts, max_new_tokens=6, temperature=1.0, n=2)
    assert len(outputs) == 4
    for text, ids, _ in outputs:
        assert 1 <= len(ids) <= 6
        assert tokenizer.eos_token_id not in ids[:-1]                # nothing after the first eos
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
    greedy = sampler.sample(prompts, max_new_tokens=6, temperature=0.0)
    sampler.batch_size = 1
    assert greedy == sampler.sample(prompts, max_new_tokens=6, temperature=0.0)


def test_hf_sampler_stops_at_an_end_token_only_the_generation_config_names(sft_run):
    from smolforge.generation.hf import load_hf_sampler

    sampler = load_hf_sampler(sft_run.model_dir)
    prompts = [[{"role": "user", "content": "Add 1 and 2."}]]
    free_running = sampler.sample(prompts, max_new_tokens=8, temperature=0.0)[0].token_ids
    stop = free_running[1]                                # a token the greedy answer emits early
    assert stop != sampler.tokenizer.eos_token_id
    sampler.model.generation_config.eos_token_id = [sampler.tokenizer.eos_token_id, stop]
    cut = sampler.sample(prompts, max_new_tokens=8, temperature=0.0)[0].token_ids
    assert cut == free_running[:free_running.index(stop) + 1] and len(cut) < len(free_running)


def test_pick_backend_gives_each_name_one_meaning(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 4}))
    monkeypatch.setattr(backends, "vllm_importable", lambda: True)
    monkeypatch.setattr(backends, "cuda_present", lambda: False)
    assert backends.pick_backend("auto", tmp_path) == "vllm-server"            # CPU build: a server process
    assert backends.pick_backend("auto", tmp_path, accepts=("vllm",)) == "hf"  # no engine runs in-process here
    with pytest.raises(RecipeError, match="this step drives only vllm"):
        backends.pick_backend("vllm", tmp_path, accepts=("vllm",))
    monkeypatch.setattr(backends, "cuda_present", lambda: True)
    assert backends.pick_backend("auto", tmp_path) == "vllm"                   # an engine in this process
    assert backends.pick_backend("auto", tmp_path, accepts=("vllm-server",)) == "vllm-server"
    assert backends.pick_backend("hf", tmp_path) == "hf"
    with pytest.raises(RecipeError, match="unknown backend 'vlm'"):
        backends.pick_backend("vlm", tmp_path)


def test_vllm_server_gets_its_gpu_share_only_on_a_gpu(tmp_path):
    """On a GPU vLLM would reserve 0.9 of the card next to the trainer; the CPU build has no such flag."""
    from smolforge.generation.vllm_server import VLLMServer

    server = VLLMServer(tmp_path, port=8000, gpu_memory_utilization=0.3, log_path=tmp_path / "a.log")
    gpu = server.command(cpu=False)
    assert gpu[gpu.index("--gpu-memory-utilization") + 1] == "0.3"
    assert "--gpu-memory-utilization" not in server.command(cpu=True)
    plain = VLLMServer(tmp_path, port=8000, log_path=tmp_path / "b.log")
    assert "--gpu-memory-utilization" not in plain.command(cpu=False)  # vLLM's own default


def test_vllm_server_serves_the_checkpoints_own_dtype_on_a_gpu(tmp_path):
    """vLLM's "auto" would serve an fp32 checkpoint in fp16 on a GPU, off from HF and from training."""
    import json

    from smolforge.generation.vllm_server import VLLMServer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32"}))
    server = VLLMServer(tmp_path, port=8000, log_path=tmp_path / "a.log", extra_args=["--dtype", "bfloat16"])
    gpu = server.command(cpu=False)
    assert gpu[gpu.index("--dtype") + 1] == "float32" and gpu[-2:] == ["--dtype", "bfloat16"]  # the user's wins
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": "bfloat16"}))
    assert server.command(cpu=False)[server.command(cpu=False).index("--dtype") + 1] == "bfloat16"
    assert server.command(cpu=True)[server.command(cpu=True).index("--dtype") + 1] == "float32"


def test_ppo_rollout_server_reserves_the_recipes_share(tmp_path):
    from smolforge.alignment.ppo.stage import PPOSpec, server_rollouts

    rollouts = server_rollouts(tmp_path, tmp_path / "rollouts", PPOSpec(vllm_gpu_memory_utilization=0.25, seed=3))
    command = rollouts.server.command(cpu=False)
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.25"
    assert command[command.index("--seed") + 1] == "3" and rollouts.server.process is None  # not started
    default = server_rollouts(tmp_path, tmp_path / "r2", PPOSpec()).server.command(cpu=False)
    assert default[default.index("--gpu-memory-utilization") + 1] == "0.3"


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the next (status, body) of ``replies``; records what it was sent."""

    replies: list[tuple[int, dict]] = []
    seen: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        status, reply = type(self).replies.pop(0)
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def scripted_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Scripted.replies, _Scripted.seen = [], []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_client_retries_429_and_5xx_with_backoff_then_answers(scripted_server, monkeypatch):
    monkeypatch.setenv("GEN_TEST_KEY", "sk-secret-1")
    _Scripted.replies = [(503, {"error": "busy"}), (429, {"error": "slow down"}), (200, {"choices": [{"text": "7"}]})]
    client = Client(scripted_server, api_key_env="GEN_TEST_KEY", retries=3, backoff=0.01)
    reply = client.completions({"model": "m", "prompt": "Add 3 and 4."})
    assert reply["choices"][0]["text"] == "7"
    assert [s["path"] for s in _Scripted.seen] == ["/v1/completions"] * 3
    assert all(s["auth"] == "Bearer sk-secret-1" for s in _Scripted.seen)


def test_client_errors_name_the_url_never_the_prompt_or_the_key(scripted_server, monkeypatch):
    monkeypatch.setenv("GEN_TEST_KEY", "sk-secret-2")
    _Scripted.replies = [(400, {"error": "bad request"})]
    client = Client(scripted_server, api_key_env="GEN_TEST_KEY", retries=3, backoff=0.01)
    with pytest.raises(ServiceError) as info:
        client.chat({"model": "m", "messages": [{"role": "user", "content": "my private question"}]})
    text = str(info.value)
    assert text.startswith(f"POST {scripted_server}/chat/completions: HTTP 400")
    assert "private question" not in text and "sk-secret" not in text
    assert len(_Scripted.seen) == 1                                 # a 400 is not retried

    _Scripted.replies = [(500, {"error": "down"})] * 2
    with pytest.raises(ServiceError, match="HTTP 500"):
        Client(scripted_server, retries=1, backoff=0.01).completions({"model": "m", "prompt": [1, 2]})
    assert len(_Scripted.seen) == 3                                 # one try and one retry


def test_client_says_when_nothing_listens():
    with pytest.raises(ServiceError, match=r"^GET http://127.0.0.1:9/v1/models: cannot connect"):
        Client("http://127.0.0.1:9/v1", retries=1, backoff=0.01).get("/models")


class FileServer:
    """A stand-in server process: ``http.server`` serving a folder whose ``health`` file answers 200."""

    def __init__(self, folder):
        self.folder = folder

    def command(self, server):
        return [sys.executable, "-m", "http.server", str(server.port), "--bind", server.host,
                "--directory", str(self.folder)]


def test_vllm_server_picks_another_port_when_its_pick_is_taken_before_it_binds(tmp_path, monkeypatch):
    from smolforge.generation import vllm_server as server_module

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "health").write_text("ok")
    stand_in = FileServer(tmp_path)
    with socket.socket() as holder:               # another process took the port we picked
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        picks = iter([taken, server_module.free_port()])
        monkeypatch.setattr(server_module, "free_port", lambda host="127.0.0.1": next(picks))
        monkeypatch.setattr(server_module.VLLMServer, "command", lambda self, cpu=None: stand_in.command(self))
        server = server_module.VLLMServer(tmp_path, log_path=tmp_path / "server.log", ready_timeout=30)
        assert server.port == taken
        with server:
            assert server.port != taken and server.healthy()
        assert (tmp_path / "server.log").read_text().count("Address already in use") == 1

        # a port the caller asked for stays theirs: the error says why, no second try
        asked = server_module.VLLMServer(tmp_path, port=taken, log_path=tmp_path / "asked.log", ready_timeout=30)
        with pytest.raises(ServiceError, match="Address already in use"):
            asked.start()
