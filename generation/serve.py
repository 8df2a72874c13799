"""``smolforge serve RUN``: a run's model behind a vLLM OpenAI-compatible server, until stopped.

    smolforge serve sft-demo                      # http://127.0.0.1:<free port>/v1, model "sft-demo"
    smolforge serve dpo-demo --port 8000 --name dpo --max-model-len 512

Prints one line when the server is ready (URL, served name, PID, seconds to ready), then waits.
Ctrl-C or SIGTERM stops the server's whole process group by PID and exits 0. A model vLLM cannot
load ends the command with a ServiceError carrying the end of the server's log, within the
readiness timeout. The server's log is ``<run>/serve/vllm.log``.

    >>> served_name_for("runs/dpo-demo", None), served_name_for("runs/dpo-demo", "dpo")
    ('dpo-demo', 'dpo')
"""
from __future__ import annotations

import sys
from pathlib import Path

from smolforge.errors import RunError, ServiceError
from smolforge.processes import run_until_signal
from smolforge.runs import Runs
from .server import VLLMServer


def served_name_for(run_ref: str, name: str | None) -> str:
    """The model name clients send: ``--name``, else the run's folder name."""
    return name or Path(run_ref).name


def serve(runs: Runs, run_ref: str, *, host: str = "127.0.0.1", port: int | None = None, name: str | None = None,
          max_model_len: int | None = None, ready_timeout: float = 300.0, extra_args: list[str] = ()) -> int:
    """Serve ``run_ref``'s model until SIGINT/SIGTERM; the exit code (0 when stopped by a signal)."""
    run = runs.get(run_ref)
    if not (run.model_dir / "config.json").is_file():
        raise RunError(f"run '{run.name}' (stage {run.stage}) has no model/ to serve")
    server = VLLMServer(run.model_dir, served_name=served_name_for(run.name, name), host=host, port=port,
                        max_model_len=max_model_len, log_path=run.path / "serve" / "vllm.log",
                        ready_timeout=ready_timeout, extra_args=list(extra_args))

    def start() -> None:
        print(f"starting vLLM for {run.name} (log: {server.log_path}) …", file=sys.stderr, flush=True)
        server.start()
        print(f"serving {run.name} as '{server.served_name}' at {server.url}/v1 "
              f"(pid {server.process.pid}, ready in {server.ready_s:.1f} s); Ctrl-C stops it", flush=True)

    def check() -> None:
        if server.process.poll() is not None:
            raise ServiceError(f"the vLLM server for {run.name} exited with code {server.process.returncode}; "
                               f"end of {server.log_path}:\n{server.log_tail()}")

    try:
        return run_until_signal(check, start)
    finally:
        server.stop()
