"""Seconds to ready: the vLLM OpenAI server (``VLLMServer``) vs an in-process engine (``vllm.LLM``).

    .venv/bin/python bench/vllm_startup.py                       # a tiny Llama built in a temp folder
    .venv/bin/python bench/vllm_startup.py --model runs/sft-demo/model --rounds 5
    .venv/bin/python bench/vllm_startup.py --old-command         # also vLLM's plain server module

Server: :class:`~smolforge.generation.vllm_server.VLLMServer` as every stage starts it, from ``Popen``
to the first 200 on ``/health`` (its ``ready_s``; polled every 0.5 s), then the number of
processes in its process group, one greedy completion (a check, not timed) and a stop.
Engine: a fresh ``python`` process (so its imports count, as the server's do) that calls
:func:`~smolforge.generation.inprocess.prepare_process`, imports vLLM and builds
``vllm.LLM(model, **engine_kwargs())``; from ``Popen`` until it prints that the engine exists.
``--old-command`` adds the server as it was started before (``python -m
vllm.entrypoints.openai.api_server`` with vLLM's CPU defaults: API server, spawned engine core,
spawned worker). The arms alternate (engine, server[, old]), after one warm-up of each; the table
gives median, min and max over ``--rounds``. The last line is one JSON object: ``ratio`` = engine
seconds ÷ server seconds (> 1: the server is ready sooner) with both figures and every run.
Target (2 shared CPU cores): the server ready in ≤ 15 s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TARGET_S = 15.0


def build_tiny_model(out: Path) -> Path:
    """A 2-layer Llama (hidden 128, head size 32) with a byte-level BPE tokenizer and a chat template."""
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = "bo eats apples and pears one two three four plus minus add the what is name food".split()
    rng = random.Random(0)
    text = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|eos|>", pad_token="<|pad|>")
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}{% else %}<|assistant|>"
        "{% generation %}{{ m['content'] }}<|eos|>{% endgeneration %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tokenizer.save_pretrained(out)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def engine_worker(model_dir: str, max_model_len: int) -> None:
    """(In the fresh process.) Build the engine; print one JSON line once it exists."""
    began = time.perf_counter()
    from smolforge.generation.inprocess import engine_kwargs, prepare_process

    prepare_process()
    from vllm import LLM

    imported = time.perf_counter()
    LLM(model=model_dir, max_model_len=max_model_len, seed=0, **engine_kwargs())
    built = time.perf_counter()
    print(json.dumps({"ready": True, "import_s": round(imported - began, 2), "engine_s": round(built - imported, 2)}),
          flush=True)
    os._exit(0)  # the figure is taken; skip the engine's teardown


def time_engine(model_dir: Path, max_model_len: int, log_dir: Path) -> dict:
    log_path = log_dir / f"engine-{time.time_ns()}.log"
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--worker", "--model", str(model_dir),
                                 "--max-model-len", str(max_model_len)], stdout=subprocess.PIPE, stderr=log,
                                text=True)
        ready = None
        for line in proc.stdout:
            if line.startswith('{"ready"'):
                ready = time.perf_counter() - started
                inside = json.loads(line)
                break
        proc.communicate(timeout=300)
    if ready is None:
        raise SystemExit(f"the in-process engine failed (exit {proc.returncode}):\n"
                         f"{log_path.read_text(errors='replace')[-3000:]}")
    return {"seconds": ready, "import_s": inside["import_s"], "engine_s": inside["engine_s"]}


def group_size(pgid: int) -> int:
    """Live processes (zombies aside) whose process group is ``pgid``, from /proc."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                count += 1
    return count


def time_server(model_dir: Path, max_model_len: int, old: bool, log_dir: Path) -> dict:
    from smolforge.generation.vllm_server import VLLM_MODULE, VLLMServer

    class OldCommand(VLLMServer):
        """The command before the launcher: vLLM's module, vLLM's process layout."""

        def command(self, *, cpu=None):
            cmd = super().command(cpu=cpu)
            cmd[2] = VLLM_MODULE
            return cmd

    kind = OldCommand if old else VLLMServer
    server = kind(model_dir, served_name="bench", max_model_len=max_model_len, ready_timeout=300,
                  log_path=log_dir / f"{'old' if old else 'server'}-{time.time_ns()}.log")
    with server:
        processes = group_size(server.process.pid)
        reply = server.openai.completions({"model": "bench", "prompt": [[5, 6, 7]], "max_tokens": 4,
                                           "temperature": 0.0})
        assert reply["choices"][0]["finish_reason"] in ("stop", "length"), reply
    time.sleep(0.5)
    left = group_size(server.process.pid)
    return {"seconds": server.ready_s, "processes": processes, "left_after_stop": left}


def summary(runs: list[dict]) -> dict:
    seconds = [r["seconds"] for r in runs]
    return {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds),
            "runs": [round(s, 2) for s in seconds]}


def measure(model_dir: Path, args, log_dir: Path) -> dict:
    arms = ["engine", "server"] + (["old"] if args.old_command else [])

    def once(arm: str) -> dict:
        if arm == "engine":
            return time_engine(model_dir, args.max_model_len, log_dir)
        return time_server(model_dir, args.max_model_len, arm == "old", log_dir)

    for arm in arms:
        warm = once(arm)
        print(f"warm-up {arm:6s} {warm['seconds']:5.1f} s", flush=True)
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for round_ in range(args.rounds):
        for arm in arms:
            results[arm].append(once(arm))
        print(f"round {round_ + 1}: " + ", ".join(f"{arm} {results[arm][-1]['seconds']:.1f} s" for arm in arms),
              flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="an HF model folder (default: a tiny Llama built in a temp folder)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=128)
    parser.add_argument("--old-command", action="store_true",
                        help="also time vLLM's plain server module (the command before the launcher)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        engine_worker(args.model, args.max_model_len)
        return

    from smolforge.table import render_table

    with tempfile.TemporaryDirectory(prefix="bench-vllm-startup-") as tmp:
        model_dir = Path(args.model) if args.model else build_tiny_model(Path(tmp) / "tiny")
        print(f"model {model_dir if args.model else 'tiny Llama (hidden 128, 2 layers, built in a temp folder)'}; "
              f"{args.rounds} rounds after one warm-up each, alternating", flush=True)
        results = measure(model_dir, args, Path(tmp))

    names = {"engine": "in-process engine (vllm.LLM, fresh process)", "server": "server (VLLMServer)",
             "old": "server, vLLM's plain module (old command)"}
    stats = {arm: summary(runs) for arm, runs in results.items()}
    processes = {arm: statistics.median(r["processes"] for r in runs)
                 for arm, runs in results.items() if arm != "engine"}
    print(render_table(["start-up", "median s", "min s", "max s", "processes once ready"],
                       [[names[arm], round(s["median"], 2), round(s["min"], 2), round(s["max"], 2),
                         processes.get(arm)] for arm, s in stats.items()]))
    engine, server = stats["engine"]["median"], stats["server"]["median"]
    figures = {"bench": "vllm_startup", "server_s": round(server, 2), "engine_s": round(engine, 2),
               "ratio": round(engine / server, 3), "server_runs": stats["server"]["runs"],
               "engine_runs": stats["engine"]["runs"], "server_processes": processes["server"],
               "server_left_after_stop": max(r["left_after_stop"] for r in results["server"]),
               "engine_import_s": round(statistics.median(r["import_s"] for r in results["engine"]), 2),
               "engine_build_s": round(statistics.median(r["engine_s"] for r in results["engine"]), 2),
               "target_s": TARGET_S, "target_met": server <= TARGET_S, "rounds": args.rounds,
               "model": args.model or "tiny-llama"}
    if "old" in stats:
        figures.update({"old_server_s": round(stats["old"]["median"], 2), "old_server_runs": stats["old"]["runs"],
                        "old_server_processes": processes["old"],
                        "speedup_vs_old": round(stats["old"]["median"] / server, 3)})
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
