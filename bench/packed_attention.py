"""Attention over a packed row: flex_attention's document BlockMask vs sdpa's dense block mask.

    .venv/bin/python bench/packed_attention.py                   # one 4,096-token row, 3 rounds
    .venv/bin/python bench/packed_attention.py --tokens 8192 --rounds 5

One packed row as TRL's padding-free SFT collator and the pretraining loop hand it to the model:
documents of 32-512 tokens back to back, ``position_ids`` restarting at each, ``attention_mask``
None, no cache. A small SmolLM3 (hidden 256, 4 heads of 64, 2 KV heads, 2 layers), fp32. The same
weights run with ``attn_implementation`` ``sdpa`` (transformers builds a dense length² per-document
mask) and ``flex_attention`` (a BlockMask from the packed-sequence ids: what ``auto`` takes for
packed rows on CUDA). On CUDA each step is forward + backward; on CPU forward only, because
PyTorch's FlexAttention has no backward pass there. Flex compiles (Inductor) on its first call:
that warm-up is timed apart. Then rounds alternate (sdpa, flex, sdpa, …). Peak memory is the rise
over one step of CUDA's peak allocation, or on CPU of the process's peak RSS (reset through
/proc/self/clear_refs after malloc_trim returns freed memory). Ends with one JSON line; ``ratio`` =
flex ÷ sdpa tokens/s (> 1: the varlen path is faster).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from smolforge.table import render_table

PATHS = ("sdpa", "flex_attention")


def packed_row(tokens: int, vocab: int, seed: int) -> tuple[dict, int]:
    """One row of ``tokens`` from documents of 32-512 tokens (pretraining's packing), and how many it holds."""
    import torch

    from smolforge.data.packing import pack_documents

    rng = random.Random(seed)
    docs, total = [], 0
    while total < tokens:
        docs.append([rng.randrange(4, vocab) for _ in range(rng.randint(32, 512) - 1)] + [0])
        total += len(docs[-1])
    [row] = pack_documents(docs, seq_len=tokens)
    return {k: torch.tensor([row[k]]) for k in ("input_ids", "position_ids", "labels")}, row["position_ids"].count(0)


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_rise_mib(step, cuda: bool) -> float:
    """MiB the peak memory rises above the current while ``step()`` runs (CUDA allocations, else RSS)."""
    gc.collect()
    if cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base = rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    step()
    return (rss_kib("VmHWM") - base) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096, help="length of the packed row")
    parser.add_argument("--steps", type=int, default=3, help="forward+backward steps per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from smolforge.pretrain.model import ModelShape, build_model

    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    backward = cuda  # FlexAttention has no backward on CPU
    vocab = 1000
    shape = ModelShape(hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                       max_position_embeddings=args.tokens)
    model = build_model(shape, vocab).to(device).train(backward)
    batch, documents = packed_row(args.tokens, vocab, seed=0)
    batch = {k: v.to(device) for k, v in batch.items()}

    def step() -> torch.Tensor:
        if not backward:
            with torch.no_grad():
                return model(**batch, use_cache=False).logits
        model.zero_grad(set_to_none=True)
        out = model(**batch, use_cache=False)
        out.loss.backward()
        return out.logits.detach()

    def timed(path: str, steps: int) -> tuple[float, torch.Tensor]:
        model.set_attn_implementation(path)
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            logits = step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - started, logits

    warmup = {path: timed(path, 1) for path in PATHS}  # flex compiles its kernels and the mask builder here
    diff = (warmup["sdpa"][1] - warmup["flex_attention"][1]).abs().max().item()
    tps: dict[str, list[float]] = {p: [] for p in PATHS}
    peak: dict[str, list[float]] = {p: [] for p in PATHS}
    for round_ in range(args.rounds):
        for path in PATHS:
            seconds, _ = timed(path, args.steps)
            tps[path].append(args.steps * args.tokens / seconds)
            peak[path].append(peak_rise_mib(step, cuda))
        print(f"round {round_ + 1}: sdpa {tps['sdpa'][-1]:,.0f} tok/s, flex {tps['flex_attention'][-1]:,.0f} tok/s",
              flush=True)

    median = {p: statistics.median(tps[p]) for p in PATHS}
    mib = {p: max(peak[p]) for p in PATHS}
    mode = "forward+backward" if backward else "forward (no flex backward on CPU)"
    print(render_table(["attention", f"tokens/s, {mode} (median)", "peak memory rise a step (MiB)", "first step (s)",
                        "rounds"],
                       [[p, f"{median[p]:,.0f}", f"{mib[p]:,.1f}", f"{warmup[p][0]:.1f}", args.rounds] for p in PATHS]))
    print(f"one row of {args.tokens} tokens, {documents} documents, {device}; "
          f"max |logit diff| flex vs sdpa {diff:.2e}")
    print(json.dumps({"bench": "packed_attention", "flex_tokens_per_s": round(median["flex_attention"], 1),
                      "sdpa_tokens_per_s": round(median["sdpa"], 1),
                      "ratio": round(median["flex_attention"] / median["sdpa"], 3),
                      "flex_peak_mib": round(mib["flex_attention"], 1), "sdpa_peak_mib": round(mib["sdpa"], 1),
                      "flex_first_step_s": round(warmup["flex_attention"][0], 2),
                      "sdpa_first_step_s": round(warmup["sdpa"][0], 2), "max_logit_diff": diff,
                      "tokens": args.tokens, "documents": documents, "device": device, "backward": backward, "steps": args.steps, "rounds": args.rounds,
                      "threads": args.threads, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
