"""bench/gpu_check.sh on this CPU (the same parts, plumbing and summary a GPU node runs), the kit
bench/gpu_kit.sh builds for an air-gapped node, and the accelerate config the check writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402


def check(out: Path, *args: str, timeout: int = 900) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu", "--out", str(out), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert done.stdout.strip(), done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary == json.loads((out / "summary.json").read_text())   # the last stdout line is the summary file
    return done, summary


@pytest.mark.slow
def test_gpu_check_runs_every_part_on_the_cpu(tmp_path):
    done, summary = check(tmp_path / "out")
    parts = summary["parts"]
    assert done.returncode == 0 and summary["ok"], json.dumps(parts, indent=1)[-4000:]
    assert list(parts) == ["data", "collectives", "pretrain", "sft_packed", "sft_zero3", "trainers", "vllm"]
    assert summary["parts_forked"] is True      # the CPU run imports the stack once and forks every part from it
    skipped = gpu_check.vllm_missing(cpu=True)   # a GPU machine's vLLM is the CUDA build: no CPU run of it
    assert all(p["status"] == "ok" for name, p in parts.items() if name != "vllm"), parts
    assert parts["vllm"]["status"] == (skipped or "ok")
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    ran = [name for name, p in parts.items() if not p["status"].startswith("skipped")]
    assert files == sorted(["summary.json"] + [f"{name}.log" for name in ran])     # at most 8 files, all small
    assert all((tmp_path / "out" / f).stat().st_size <= gpu_check.LOG_LIMIT + 64 for f in files)

    collectives = parts["collectives"]["figures"]
    burnin = collectives["burnin"]
    assert (collectives["world"], collectives["backend"]) == (2, "gloo")
    assert (burnin["world_size"], burnin["device"], burnin["dtype"]) == (2, "cpu", "float32")
    assert all(t > 0 for t in burnin["matmul_tflops"]) and len(burnin["busbw_gbps"]) >= 2
    assert all(bw > 0 for bw in burnin["busbw_gbps"])
    pretrain = parts["pretrain"]["figures"]
    # one training process, as on a one-GPU node: ZeRO-1 asked, ZeRO-0 run (nothing to shard), recorded so
    assert (pretrain["ranks"], pretrain["zero_stage"], pretrain["resumed_from"]) == (1, 0, "step-1")
    assert pretrain["tokens_per_s"] > 0 and len(pretrain["losses"]) == 2
    packed = parts["sft_packed"]["figures"]
    assert packed["max_rel_diff"] <= packed["tolerance"] and set(packed["tokens_per_s"]) == {"padded", "varlen", "blockmask"}
    zero3 = parts["sft_zero3"]["figures"]
    assert zero3["empty_tensors"] == 0 and zero3["compared"] == zero3["tensors"] > 0
    dtypes = parts["trainers"]["figures"]["dtypes"]
    assert {stage: (d["weights"], d["master"]) for stage, d in dtypes.items()} == \
        {stage: ("float32", "float32") for stage in ("sft", "dpo", "grpo")}
    if not skipped:
        serve = parts["vllm"]["figures"]["serve"]
        assert serve["agree"] >= 0.9 and serve["max_logprob_diff"] <= serve["tolerance"]


def test_a_part_over_its_time_limit_is_cut_off_and_the_check_goes_on(tmp_path):
    """One hang loses one part: it is killed at its limit with everything it started, what needs it is
    skipped, the other parts still run, and the summary says which part failed and why."""
    done, summary = check(tmp_path / "out", "--parts", "pretrain,collectives", "--limit", "data=0.5",
                          "--limit", "collectives=1", timeout=120)
    parts = summary["parts"]
    assert done.returncode == 1 and summary["ok"] is False
    assert list(parts) == ["data", "pretrain", "collectives"]
    assert parts["data"]["status"] == "timeout: over its 0.5 s limit" and "log_tail" in parts["data"]
    assert parts["pretrain"]["status"] == "skipped: the data step failed"
    assert parts["collectives"]["status"] == "timeout: over its 1 s limit"   # the check went on after the first
    assert summary["parts_forked"] is False     # one part that imports the stack: a fresh process, no preload
    work = summary["work"].removesuffix(" (removed)")
    leftover = subprocess.run(["pgrep", "-f", work], capture_output=True, text=True).stdout.split()
    assert leftover == []


def forked_part(tmp_path, monkeypatch, body) -> tuple[dict, Path]:
    """Part ``probe`` (``body(ctx)``) forked from this process as the CPU check forks its parts: its result."""
    monkeypatch.setitem(gpu_check.PARTS, "probe", gpu_check.Part("probe", body, 2, 2))
    monkeypatch.setattr(gpu_check, "PRELOADED", True)
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(parents=True), out.mkdir(parents=True)
    return gpu_check.start_part("probe", gpu_check.Context(work, cpu=True), out, limit=2), work


def test_a_forked_part_reports_its_figures_and_its_error_from_its_own_folder_and_log(tmp_path, monkeypatch):
    def works(ctx):
        print("working in", os.getcwd(), flush=True)
        return {"cwd": os.getcwd(), "cuda_visible": os.environ["CUDA_VISIBLE_DEVICES"], "session": os.getsid(0)}

    result, work = forked_part(tmp_path, monkeypatch, works)
    assert result["status"] == "ok" and result["figures"]["cwd"] == str(work)
    assert result["figures"]["cuda_visible"] == "" and result["figures"]["session"] != os.getsid(0)
    assert f"working in {work}" in (tmp_path / "out" / "probe.log").read_text()

    def fails(ctx):
        gpu_check.expect(False, "loss 7.0 > 5.0")

    result, _ = forked_part(tmp_path / "again", monkeypatch, fails)
    assert result["status"] == "failed: loss 7.0 > 5.0" and "figures" not in result


def test_a_forked_part_over_its_limit_is_killed_with_what_it_started(tmp_path, monkeypatch):
    def hangs(ctx):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(ctx.work)])
        time.sleep(600)

    started = time.monotonic()
    result, work = forked_part(tmp_path, monkeypatch, hangs)
    assert result["status"] == "timeout: over its 2 s limit" and time.monotonic() - started < 20
    leftover = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True).stdout.split()
    assert leftover == []     # the part (its title names the work folder) and the sleeper it started


def test_the_accelerate_config_the_check_writes_passes_accelerates_own_checks(tmp_path, monkeypatch):
    """accelerate launch's own validation and DeepSpeedPlugin's config checks, as they run on the GPU node,
    accept the config; the one the check used to write (``mixed_precision`` beside ``deepspeed_config_file``)
    is refused there."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    def plugin_for(config: Path) -> DeepSpeedPlugin:
        args = launch_command_parser().parse_args(["--config_file", str(config), "-m", "smolforge"])
        args, defaults, mp_from_config = _validate_launch_command(args)
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)   # as accelerate's launch_command sets it
        _, env = prepare_deepspeed_cmd_env(args)
        for key, value in env.items():
            if key.startswith("ACCELERATE_"):
                monkeypatch.setenv(key, value)
        return DeepSpeedPlugin()

    config = gpu_check.accelerate_config(tmp_path, cpu=False, processes=1)
    plugin = plugin_for(config)
    assert plugin.zero_stage == 3 and plugin.hf_ds_config.config["bf16"] == {"enabled": "auto"}
    old = tmp_path / "old.yaml"
    old.write_text(config.read_text() + "mixed_precision: bf16\n")
    with pytest.raises(ValueError, match="deepspeed_config_file"):
        plugin_for(old)


def test_the_kit_builds_offline_within_its_size_and_installs_for_the_nodes_python(tmp_path):
    kit = tmp_path / "kit"
    built = subprocess.run(["bash", "bench/gpu_kit.sh", "--offline", "--out", str(kit)], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = sorted(kit.glob("*.whl"))
    names = {w.name.split("-")[0].lower() for w in wheels}
    assert {"smolforge", "trl", "deepspeed", "datasets", "pydantic_core"} <= names
    size = sum(w.stat().st_size for w in wheels)
    assert size <= 64 * 2**20 and f"kit: {size / 2**20:.2f} MiB in all" in built.stdout
    with zipfile.ZipFile(next(w for w in wheels if w.name.startswith("smolforge-"))) as wheel:
        assert "smolforge/pretrain/stage.py" in wheel.namelist()        # the stages, not only the spine
    # the node's install: no index, no dependency resolution, its Python (3.12) and platform
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                                str(target), "--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
                                "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                                *map(str, wheels)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert (target / "trl" / "__init__.py").is_file() and (target / "smolforge" / "alignment" / "sft.py").is_file()
    assert list(target.glob("pydantic_core/_pydantic_core.cpython-312-*.so"))
