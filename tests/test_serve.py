"""``smolforge serve RUN``: what it refuses before any server starts. A real server on all interfaces with
its API key, scored through and stopped by SIGTERM, is tests/test_real_model_served.py's module fixture (the
released model, shared by every served test). A server that exits before it is ready (a model vLLM cannot
load) is a ServiceError with the end of its log: test_generation.py checks that with a stand-in server
process; broken model folders are refused before any server starts (test_bad_input.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smolforge(root, *args, **popen):
    return subprocess.Popen([sys.executable, "-m", "smolforge", "--runs-dir", str(root), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


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
