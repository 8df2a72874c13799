"""``smolforge serve RUN``: a run's model behind a vLLM OpenAI-compatible server, until stopped.

    smolforge serve sft-demo                      # http://127.0.0.1:<free port>/v1, model "sft-demo"
    smolforge serve dpo-demo --port 8000 --name dpo --max-model-len 512

Bound to anything but loopback, the server is open to the network, so it needs an API key:
``SMOLFORGE_SERVE_API_KEY`` or ``--api-key-file FILE`` (at least 16 characters). vLLM itself then
answers HTTP 401 to a ``/v1`` request without ``Authorization: Bearer <key>``. Without a key such a
bind is refused unless ``--insecure`` says the open server is meant.

    SMOLFORGE_SERVE_API_KEY=$(cat ~/.serve-key) smolforge serve dpo-demo --host 0.0.0.0 --port 8000

Prints one line when the server is ready (URL, served name, PID, seconds to ready), then waits.
Ctrl-C or SIGTERM stops the server's whole process group by PID and exits 0. A model vLLM cannot
load ends the command with a ServiceError carrying the end of the server's log, within the
readiness timeout. The server's log is ``<run>/serve/vllm.log``.

    >>> served_name_for("runs/dpo-demo", None), served_name_for("runs/dpo-demo", "dpo")
    ('dpo-demo', 'dpo')
    >>> api_key_for("0.0.0.0", key_file=None, insecure=False)
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: serve --host 0.0.0.0: the server would be open to the network without an API key; set SMOLFORGE_SERVE_API_KEY or give --api-key-file FILE (or pass --insecure to serve it open on purpose)
"""
from __future__ import annotations

import sys
from pathlib import Path

from smolforge.access import MIN_SECRET_LENGTH, is_loopback, read_secret
from smolforge.errors import RecipeError, RunError, ServiceError
from smolforge.model_folder import check_model_folder
from smolforge.processes import run_until_signal
from smolforge.runs import Runs
from .vllm_server import VLLMServer


def served_name_for(run_ref: str, name: str | None) -> str:
    """The model name clients send: ``--name``, else the run's folder name."""
    return name or Path(run_ref).name


API_KEY_ENV = "SMOLFORGE_SERVE_API_KEY"


def api_key_for(host: str, *, key_file: str | Path | None, insecure: bool) -> str | None:
    """The API key the server will require (None: none); a RecipeError for an open non-loopback bind."""
    key = read_secret("API key", env=API_KEY_ENV, file=key_file,
                      min_length=0 if is_loopback(host) else MIN_SECRET_LENGTH)
    if key is None and not is_loopback(host):
        if not insecure:
            raise RecipeError(f"serve --host {host}: the server would be open to the network without an API key; "
                              f"set {API_KEY_ENV} or give --api-key-file FILE (or pass --insecure to serve it open "
                              "on purpose)")
        print(f"warning: serving on {host} without an API key (--insecure): anyone who can reach this "
              "machine can use the model", file=sys.stderr, flush=True)
    return key


def serve(runs: Runs, run_ref: str, *, host: str = "127.0.0.1", port: int | None = None, name: str | None = None,
          max_model_len: int | None = None, ready_timeout: float = 300.0, extra_args: list[str] = (),
          api_key_file: str | Path | None = None, insecure: bool = False) -> int:
    """Serve ``run_ref``'s model until SIGINT/SIGTERM; the exit code (0 when stopped by a signal)."""
    if "--api-key" in extra_args:
        raise RecipeError(f"serve: pass the key through {API_KEY_ENV} or --api-key-file, not '-- --api-key' "
                          "(a command line is visible to every user of the machine)")
    api_key = api_key_for(host, key_file=api_key_file, insecure=insecure)
    run = runs.get(run_ref)
    if not (run.model_dir / "config.json").is_file():
        raise RunError(f"run '{run.name}' (stage {run.stage}) has no model/ to serve")
    check_model_folder(run.model_dir, f"run '{run.name}'")
    server = VLLMServer(run.model_dir, served_name=served_name_for(run.name, name), host=host, port=port,
                        max_model_len=max_model_len, log_path=run.serve_log_path,
                        ready_timeout=ready_timeout, api_key=api_key, extra_args=list(extra_args))

    def start() -> None:
        print(f"starting vLLM for {run.name} (log: {server.log_path}) …", file=sys.stderr, flush=True)
        server.start()
        access = "; requests need the API key" if api_key else ""
        print(f"serving {run.name} as '{server.served_name}' at http://{host}:{server.port}/v1 "
              f"(pid {server.process.pid}, ready in {server.ready_s:.1f} s{access}); Ctrl-C stops it", flush=True)

    def check() -> None:
        if server.process.poll() is not None:
            raise ServiceError(f"the vLLM server for {run.name} exited with code {server.process.returncode}; "
                               f"end of {server.log_path}:\n{server.log_tail()}")

    try:
        return run_until_signal(check, start)
    finally:
        server.stop()
