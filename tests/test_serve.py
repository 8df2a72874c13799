"""``smolforge serve RUN``: a real vLLM server (CPU build) for a run's model, driven through the CLI.

A server that exits before it is ready (a model vLLM cannot load) is a ServiceError with the end of
its log: test_generation.py checks that with a stand-in server process; broken model folders are
refused before any server starts (test_bad_input.py)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from smolforge.processes import ephemeral_range

from conftest import needs_vllm  # noqa: E402

pytestmark = pytest.mark.slow  # real servers or whole pipelines: tens of seconds (make test-fast skips them)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smolforge(root, *args, **popen):
    return subprocess.Popen([sys.executable, "-m", "smolforge", "--runs-dir", str(root), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.status, json.loads(reply.read() or b"null")


def score_through(runs, sft_run, endpoint: str) -> None:
    """The embedded suite scored by HF in-process and through ``endpoint``: the parity report's verdict."""
    from smolforge.recipe import build_stage_recipe
    from smolforge.registry import load_stage

    stage = load_stage("eval")
    recipe = build_stage_recipe(stage, {"suite": "embedded", "run": sft_run.name, "limit": 4, "parity": "endpoint",
                                        "endpoint": endpoint}, source="eval (test)")
    stage.validate(recipe, runs)
    stage.run(recipe, runs)


@needs_vllm
def test_serve_on_all_interfaces_requires_its_key_answers_completions_then_stops_on_sigterm(runs, sft_run, tmp_path,
                                                                                          monkeypatch):
    """`smolforge serve` on all interfaces with a key; the eval stage scores the run through it (the key
    from $OPENAI_API_KEY) document for document as HF does in-process; SIGTERM ends both processes."""
    from smolforge.errors import ServiceError

    key_file = tmp_path / "serve-key"
    key_file.write_text("k3y-" + os.urandom(12).hex() + "\n")
    key = key_file.read_text().strip()
    cli = smolforge(runs.root, "serve", sft_run.name, "--max-model-len", "128", "--host", "0.0.0.0",
                    "--api-key-file", str(key_file))
    try:
        line = cli.stdout.readline()                     # blocks until ready (or the CLI ends)
        assert re.match(rf"serving {sft_run.name} as '{sft_run.name}' at http://0\.0\.0\.0:\d+/v1 .*requests "
                        "need the API key", line), line + cli.stderr.read()
        port = int(line.split("http://0.0.0.0:")[1].split("/")[0])   # picked below the ephemeral range
        assert port < ephemeral_range()[0]
        server_pid = int(line.split("(pid ")[1].split(",")[0])
        status, _ = get_json(f"http://127.0.0.1:{port}/health")   # 0.0.0.0 answers on loopback too
        assert status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:   # vLLM's own key check
            get_json(f"http://127.0.0.1:{port}/v1/models")
        assert refused.value.code == 401
        authorised = {"Authorization": f"Bearer {key}"}
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers=authorised),
                                    timeout=30) as reply:
            models = json.loads(reply.read())
        assert [m["id"] for m in models["data"]] == [sft_run.name]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", method="POST",
            headers={"Content-Type": "application/json", **authorised},
            data=json.dumps({"model": sft_run.name, "prompt": "Bo eats", "max_tokens": 4, "temperature": 0}).encode())
        with urllib.request.urlopen(request, timeout=60) as reply:
            assert json.loads(reply.read())["choices"][0]["finish_reason"] in ("stop", "length")

        endpoint = f"http://127.0.0.1:{port}/v1"
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        with pytest.raises(ServiceError, match=r"/v1/completions: .*401"):
            score_through(runs, sft_run, endpoint)
        monkeypatch.setenv("OPENAI_API_KEY", key)
        score_through(runs, sft_run, endpoint)
        report = json.loads((sft_run.eval_dir / "embedded-parity.json").read_text())
        assert (report["first"], report["second"], report["agree"]) == ("hf", "endpoint", True)
        assert set(report["tasks"]) == {"arith", "facts", "instruct", "prefs", "reason"}
        for task in report["tasks"].values():
            assert task["documents"] == 4 and task["documents_differing"] == 0
        margin = report["tasks"]["prefs"]["metrics"]["margin"]
        assert abs(margin["diff"]) < 1e-4 and margin["first"] != 0       # log-likelihoods really compared
        result = json.loads((sft_run.eval_dir / "embedded.json").read_text())
        assert result["backend"] == "hf" and result["settings"]["chat_template"].startswith("sha256:")
        assert result["tasks"]["instruct"]["apply_chat_template"] is True
        assert sft_run.reload().metrics["parity/endpoint/agree"] == 1.0
    finally:
        cli.send_signal(signal.SIGTERM)
        code = cli.wait(timeout=60)
    assert code == 0
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)                           # the server went with the command
    log = (sft_run.path / "serve" / "vllm.log").read_text()
    assert log and key not in log and key not in line


def test_serving_a_run_without_a_model_is_a_run_error(runs, data_run):
    cli = smolforge(runs.root, "serve", data_run.name)
    _, err = cli.communicate(timeout=120)
    assert cli.returncode == 2 and f"RunError: run '{data_run.name}' (stage data) has no model/ to serve" in err


@pytest.mark.parametrize("args, env, expected", [
    (["--host", "0.0.0.0"], {}, "serve --host 0.0.0.0: the server would be open to the network without an API key; "
                                "set SMOLFORGE_SERVE_API_KEY or give --api-key-file FILE"),
    (["--host", "10.0.0.7"], {"SMOLFORGE_SERVE_API_KEY": "hunter2"},
     "API key from $SMOLFORGE_SERVE_API_KEY is 7 characters; use at least 16"),
    (["--host", "0.0.0.0", "--api-key-file", "missing-key"], {}, "missing-key: cannot read the API key"),
    (["--", "--api-key", "visible-in-ps-0123456789"], {}, "pass the key through SMOLFORGE_SERVE_API_KEY"),
])
def test_serve_refuses_a_network_bind_without_a_real_key_before_touching_the_run(args, env, expected, tmp_path,
                                                                                  monkeypatch, capsys):
    from smolforge.cli import main

    monkeypatch.delenv("SMOLFORGE_SERVE_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    assert main(["--runs-dir", str(tmp_path / "runs"), "serve", "sft-demo", *args]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "hunter2" not in err                                    # the key itself is never printed
    assert not (tmp_path / "runs").exists()                        # refused before the run was looked up


def test_insecure_serves_open_on_purpose_with_a_warning(capsys, monkeypatch):
    from smolforge.generation.serve import api_key_for

    monkeypatch.delenv("SMOLFORGE_SERVE_API_KEY", raising=False)
    assert api_key_for("0.0.0.0", key_file=None, insecure=True) is None
    assert "without an API key (--insecure)" in capsys.readouterr().err
    assert api_key_for("127.0.0.1", key_file=None, insecure=False) is None      # loopback: no key needed
