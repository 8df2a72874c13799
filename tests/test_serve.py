"""``smolforge serve RUN``: a real vLLM server (CPU build) for a run's model, driven through the CLI."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
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


@needs_vllm
def test_serve_answers_health_models_and_completions_then_stops_on_sigterm(runs, sft_run):
    cli = smolforge(runs.root, "serve", sft_run.name, "--max-model-len", "128")
    try:
        line = cli.stdout.readline()                     # blocks until ready (or the CLI ends)
        assert re.match(rf"serving {sft_run.name} as '{sft_run.name}' at http://127\.0\.0\.1:\d+/v1", line), \
            line + cli.stderr.read()
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])   # picked below the ephemeral range
        assert port < ephemeral_range()[0]
        server_pid = int(line.split("(pid ")[1].split(",")[0])
        status, _ = get_json(f"http://127.0.0.1:{port}/health")
        assert status == 200
        _, models = get_json(f"http://127.0.0.1:{port}/v1/models")
        assert [m["id"] for m in models["data"]] == [sft_run.name]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"model": sft_run.name, "prompt": "Bo eats", "max_tokens": 4, "temperature": 0}).encode())
        with urllib.request.urlopen(request, timeout=60) as reply:
            assert json.loads(reply.read())["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        cli.send_signal(signal.SIGTERM)
        code = cli.wait(timeout=60)
    assert code == 0
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)                           # the server went with the command
    assert (sft_run.path / "serve" / "vllm.log").stat().st_size > 0


@needs_vllm
def test_a_model_vllm_cannot_load_fails_clearly_within_the_readiness_timeout(runs, sft_run, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(sft_run.path, root / "broken", ignore=shutil.ignore_patterns("checkpoints"))
    config = json.loads((root / "broken" / "model" / "config.json").read_text())
    (root / "broken" / "model" / "config.json").write_text(json.dumps({**config, "model_type": "no_such_model",
                                                                       "architectures": ["NoSuchModel"]}))
    cli = smolforge(root, "serve", "broken", "--ready-timeout", "240")
    out, err = cli.communicate(timeout=300)
    assert cli.returncode == 2
    # the server's own exit ended the wait (not the 240 s readiness timeout), and its log explains it
    assert "ServiceError: vLLM server for" in err and "exited with code" in err and "before it was ready" in err, \
        err[-2000:]
    assert "end of " in err and "serve/vllm.log" in err and "no_such_model" in err
    assert "not ready after" not in err


def test_serving_a_run_without_a_model_is_a_run_error(runs, data_run):
    cli = smolforge(runs.root, "serve", data_run.name)
    _, err = cli.communicate(timeout=120)
    assert cli.returncode == 2 and f"RunError: run '{data_run.name}' (stage data) has no model/ to serve" in err
