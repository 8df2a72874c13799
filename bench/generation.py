"""Generation throughput: vLLM (in-process engine and OpenAI server) vs HF batched ``generate``.

    .venv/bin/python bench/generation.py                          # demo model + a ~100M random model
    .venv/bin/python bench/generation.py --model runs/sft-demo/model --prompts 64 --new-tokens 64
    .venv/bin/python bench/generation.py --skip-big

Same prompts (the embedded suite's chat questions, rendered with the model's chat template), the
same number of new tokens for every prompt (``min_new_tokens`` for HF, ``ignore_eos`` for vLLM,
so every backend produces exactly prompts × new-tokens tokens), greedy decoding, fp32 on CPU.
Each backend runs in its own process (an in-process vLLM engine patches transformers for the
rest of its process), after one warm-up call; the time is the best of ``--repeats`` calls. The
server's start-up time is reported apart from its throughput. The last line is one JSON object
with tokens/s per backend and the ratios vLLM ÷ HF.

The ~100M model is a SmolLM3 config (hidden 768, 16 layers, 12 heads of 64, MLP 2048) with random
weights and the demo tokenizer: sizes where batching and paged KV caches can matter, which a
1M-parameter demo model is too small to show.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def prompts_for(model_dir: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    questions = [json.loads(line)["question"] for line in open(REPO / "evals/suites/embedded/instruct.jsonl")]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.apply_chat_template([{"role": "user", "content": questions[i % len(questions)]}],
                                          tokenize=True, add_generation_prompt=True, return_dict=False)
            for i in range(count)]


def run_hf(model_dir: Path, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from smolforge.generation.prompts import left_pad

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    ids, mask = left_pad(prompts, pad)

    def once() -> float:
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, top_k=None, top_p=None,
                                 temperature=None, pad_token_id=pad)
        assert out.shape[1] - ids.shape[1] == new_tokens
        return time.perf_counter() - started

    once()
    best = min(once() for _ in range(repeats))
    return {"seconds": best, "tokens_per_s": len(prompts) * new_tokens / best}


def run_vllm_engine(model_dir: Path, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    from smolforge.generation.inprocess import engine_kwargs, prepare_process

    prepare_process()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    llm = LLM(model=str(model_dir), max_model_len=512, seed=0, **engine_kwargs())
    startup = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def once() -> float:
        began = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == new_tokens for o in outs)
        return time.perf_counter() - began

    once()
    best = min(once() for _ in range(repeats))
    return {"seconds": best, "tokens_per_s": len(prompts) * new_tokens / best, "startup_s": startup}


def run_vllm_server(model_dir: Path, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    from smolforge.generation.vllm_server import VLLMServer

    with VLLMServer(model_dir, served_name="bench", max_model_len=512) as server:
        payload = {"model": "bench", "prompt": prompts, "max_tokens": new_tokens, "temperature": 0.0,
                   "ignore_eos": True}

        def once() -> float:
            began = time.perf_counter()
            reply = server.openai.completions(payload)
            assert sum(c["finish_reason"] == "length" for c in reply["choices"]) == len(prompts)
            return time.perf_counter() - began

        once()
        best = min(once() for _ in range(repeats))
        return {"seconds": best, "tokens_per_s": len(prompts) * new_tokens / best, "startup_s": server.ready_s}


WORKERS = {"hf": run_hf, "vllm_engine": run_vllm_engine, "vllm_server": run_vllm_server}


def build_big_model(tokenizer_dir: Path, out: Path) -> Path:
    """A ~100M-parameter SmolLM3 with random weights and the demo tokenizer."""
    import torch
    from transformers import AutoTokenizer, SmolLM3Config, SmolLM3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = SmolLM3Config(vocab_size=len(tokenizer), hidden_size=768, intermediate_size=2048, num_hidden_layers=16,
                           num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512,
                           tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    model = SmolLM3ForCausalLM(config)
    print(f"built a random SmolLM3 of {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def measure(model_dir: Path, args) -> dict:
    results: dict = {}
    for name in ("hf", "vllm_engine", "vllm_server"):
        cmd = [sys.executable, __file__, "--worker", name, "--model", str(model_dir), "--prompts", str(args.prompts),
               "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  {name:12s} {results[name]['tokens_per_s']:9.1f} tokens/s"
              + (f"  (start-up {results[name]['startup_s']:.1f} s)" if "startup_s" in results[name] else ""),
              flush=True)
    for name in ("vllm_engine", "vllm_server"):
        results[f"ratio_{name}_vs_hf"] = round(results[name]["tokens_per_s"] / results["hf"]["tokens_per_s"], 3)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO / "runs/sft-demo/model"), help="demo model folder")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-big", action="store_true", help="only the demo model")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model_dir = Path(args.model)
    if args.worker:
        prompts = prompts_for(model_dir, args.prompts)
        print(json.dumps(WORKERS[args.worker](model_dir, prompts, args.new_tokens, args.repeats)))
        return
    summary = {"prompts": args.prompts, "new_tokens": args.new_tokens}
    print(f"demo model {model_dir} ({args.prompts} prompts × {args.new_tokens} new tokens, greedy, fp32)")
    summary["demo"] = measure(model_dir, args)
    if not args.skip_big:
        with tempfile.TemporaryDirectory(prefix="bench-gen-") as tmp:
            big = build_big_model(model_dir, Path(tmp) / "big")
            print(f"~100M random model ({args.prompts} prompts × {args.new_tokens} new tokens)")
            summary["big"] = measure(big, args)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
