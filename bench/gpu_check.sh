#!/usr/bin/env bash
# The GPU paths, proved on one machine with an NVIDIA GPU (≤ 8 minutes on one H200, after `make setup`,
# which installs vLLM's CUDA build there). Offline: the data is the embedded default.
#
#   bash bench/gpu_check.sh            # prints progress on stderr and ONE JSON line on stdout
#
#   1. collectives    NCCL refuses a CPU tensor; smolforge's collectives put theirs on cuda:LOCAL_RANK
#   2. pretrain       a ~1B SmolLM3 shape (recipes/smollm3-1b's trunk), 1 rank on NCCL, bf16, a few
#                     steps: tokens/s and MFU from metrics.jsonl
#   3. sft-zero3      one SFT run of that model under accelerate + DeepSpeed ZeRO-3 (bf16); model/ is
#                     reloaded and compared with the weights rebuilt from the checkpoint's ZeRO shards
#   4. grpo-colocate  one GRPO step with TRL's vLLM colocate mode (an engine inside the trainer process)
#   5. serve-bf16     `smolforge serve` in bf16; greedy tokens and log-probs against HF generate in bf16
#   6. yarn-vllm      the in-process vLLM (CUDA) engine with YaRN through hf_overrides against HF with YaRN
#                     in its config: per-document log-likelihoods on the embedded facts task
#
# Exit status 0 only when every part passed; the JSON says which did not and why.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ROOT=$(mktemp -d /tmp/smolforge-gpu-check.XXXXXX)
LOG="$ROOT/log.txt"
START=$(date +%s)
declare -A RESULT
SF=("$PY" -m smolforge --runs-dir "$ROOT/runs")

say() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" >&2; }
part() {  # part NAME COMMAND...: run it, keep its last lines when it fails
  local name=$1; shift
  say "$name"
  if "$@" >>"$LOG" 2>&1; then RESULT[$name]=ok; else RESULT[$name]="failed: $(tail -n 3 "$LOG" | tr '\n"\\' '   ' | cut -c1-400)"; fi
}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo '{"bench": "gpu_check", "error": "no CUDA device visible to torch"}'; exit 1
fi

# 1. collectives -------------------------------------------------------------------------------
cat >"$ROOT/collectives.py" <<'EOF'
import os, torch, torch.distributed as dist
from smolforge.pretrain.distributed import comm_device, mean_across_ranks, broadcast
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
try:
    dist.all_reduce(torch.ones(1))              # the bug this guards against: NCCL refuses host tensors
    raise SystemExit("NCCL accepted a CPU tensor; the check proves nothing here")
except (RuntimeError, ValueError):
    pass
assert comm_device() == torch.device("cuda", int(os.environ["LOCAL_RANK"])), comm_device()
value = torch.tensor([2.0], device=comm_device()); dist.all_reduce(value); assert value.item() == 2.0
dist.get_world_size = lambda *a, **k: 2          # take the multi-rank branches on this one rank
assert abs(mean_across_ranks(3.0) - 1.5) < 1e-9 and broadcast({"step": 3}) == {"step": 3}
dist.destroy_process_group()
EOF
part collectives "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 "$ROOT/collectives.py"

# 2. pretrain a ~1B shape on one GPU ---------------------------------------------------------------
part data "${SF[@]}" data --config recipes/demo/data.yaml --set name=data-gpu --set progress=false
part pretrain "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 -m smolforge --runs-dir "$ROOT/runs" \
  pretrain --config recipes/demo/pretrain.yaml --set name=pretrain-1b --set data=data-gpu \
  --set model.hidden_size=2048 --set model.intermediate_size=8192 --set model.num_layers=16 \
  --set model.num_heads=16 --set model.num_kv_heads=4 --set model.max_position_embeddings=4096 \
  --set train.seq_len=2048 --set train.micro_batch_size=4 --set train.max_steps=8 --set train.log_every=4 \
  --set train.warmup_steps=2 --set train.precision=bf16 --set train.learning_rate=3e-4 --set tracking.report_to=[none]
PRETRAIN=$("$PY" - "$ROOT/runs/pretrain-1b" <<'EOF' 2>>"$LOG"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"loss"' in l]
info = json.load(open(sys.argv[1] + "/run.json"))["metrics"]
last = lines[-1]
print(json.dumps({"params": info.get("train/params"), "tokens_per_s": last.get("tokens_per_s"), "mfu": last.get("mfu"),
                  "loss_first": lines[0]["loss"], "loss_last": last["loss"]}))
EOF
) || PRETRAIN=null

# 3. SFT under ZeRO-3, model/ reloaded against the shards -------------------------------------------
cat >"$ROOT/zero3.json" <<'EOF'
{"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true},
 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
 "train_micro_batch_size_per_gpu": "auto"}
EOF
cat >"$ROOT/accelerate.yaml" <<EOF
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
num_machines: 1
num_processes: 1
mixed_precision: bf16
deepspeed_config: {deepspeed_config_file: $ROOT/zero3.json, zero3_init_flag: true}
EOF
part sft_zero3 "$PY" -m accelerate.commands.launch --config_file "$ROOT/accelerate.yaml" -m smolforge \
  --runs-dir "$ROOT/runs" sft --config recipes/demo/sft.yaml --set name=sft-1b --set parent=pretrain-1b \
  --set data=data-gpu --set eval_fraction=0 --set early_stopping_patience=0 --set trainer.max_steps=2 \
  --set trainer.save_steps=2 --set trainer.per_device_train_batch_size=8 --set trainer.max_length=256
SFT=$("$PY" - "$ROOT/runs/sft-1b" <<'EOF' 2>>"$LOG"
import json, sys, torch
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
from transformers import AutoModelForCausalLM
run = sys.argv[1]
saved = AutoModelForCausalLM.from_pretrained(run + "/model", dtype=torch.float32).state_dict()
shards = get_fp32_state_dict_from_zero_checkpoint(run + "/checkpoints/checkpoint-2")
worst = max(((saved[k] - shards[k]).abs().max() / shards[k].abs().max().clamp_min(1e-12)).item()
            for k in shards if k in saved)
empty = [k for k, v in saved.items() if v.numel() == 0]
print(json.dumps({"tensors": len(shards), "max_rel_diff": worst, "empty_tensors": len(empty),
                  "ok": not empty and worst < 1e-2}))  # bf16 rounding of the fp32 master weights
EOF
) || SFT=null

# 4. one GRPO step with vLLM colocate ----------------------------------------------------------------
part grpo_colocate "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 -m smolforge --runs-dir "$ROOT/runs" \
  grpo --config recipes/demo/grpo.yaml --set name=grpo-1b --set parent=sft-1b --set data=data-gpu \
  --set trainer.use_vllm=true --set trainer.vllm_mode=colocate --set trainer.vllm_gpu_memory_utilization=0.3 \
  --set trainer.max_steps=1 --set trainer.per_device_train_batch_size=8 --set trainer.num_generations=4 \
  --set trainer.max_completion_length=32 --set eval_max_new_tokens=16
GRPO=$("$PY" -c "import json,sys; m=json.load(open(sys.argv[1]))['metrics']; print(json.dumps({k: m.get(k) for k in ('rl/generation','train/steps','rl/heldout_reward_after')}))" "$ROOT/runs/grpo-1b/run.json" 2>>"$LOG") || GRPO=null

# 5. smolforge serve in bf16 against HF in bf16 ------------------------------------------------------
PORT=$("$PY" -c "from smolforge.processes import free_port; print(free_port())")
"${SF[@]}" serve sft-1b --port "$PORT" --max-model-len 1024 -- --dtype bfloat16 >>"$LOG" 2>&1 &
SERVE_PID=$!
say "serve-bf16 (pid $SERVE_PID, port $PORT)"
SERVE=$("$PY" - "$ROOT/runs/sft-1b" "$PORT" <<'EOF' 2>>"$LOG"
import json, sys, time, urllib.request, torch
from transformers import AutoModelForCausalLM
from smolforge.generation.prompts import load_tokenizer
run, port = sys.argv[1], sys.argv[2]
url = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        urllib.request.urlopen(url + "/health", timeout=2); break
    except OSError:
        time.sleep(0.5)
tok = load_tokenizer(run + "/model")
model = AutoModelForCausalLM.from_pretrained(run + "/model", dtype=torch.bfloat16).cuda().eval()
prompts = ["The capital of", "Add 3 and 4.", "Bo eats", "Question: what is 2 plus 2?", "Once upon a time",
           "The sky is", "Name a fruit:", "Count: one, two,"]
agree, total, worst = 0, 0, 0.0
for text in prompts:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=16, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    hf_ids = out.sequences[0, len(ids):].tolist()
    hf_lp = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, hf_ids)]
    body = json.dumps({"model": "sft-1b", "prompt": ids, "max_tokens": 16, "temperature": 0, "logprobs": 1,
                       "ignore_eos": True, "return_tokens_as_token_ids": True}).encode()
    reply = json.load(urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body,
                                             {"Content-Type": "application/json"}), timeout=120))
    choice = reply["choices"][0]["logprobs"]
    vl_ids = [int(t.split(":")[1]) for t in choice["tokens"]]
    for a, b, la, lb in zip(hf_ids, vl_ids, hf_lp, choice["token_logprobs"]):
        total += 1
        if a != b:
            break  # after the first different token the continuations are not comparable
        agree += 1
        worst = max(worst, abs(la - lb))
print(json.dumps({"tokens_compared": total, "first_tokens_agree": agree / max(total, 1), "max_logprob_diff": worst,
                  "ok": agree / max(total, 1) >= 0.9 and worst < 0.1}))
EOF
) || SERVE=null
kill -TERM "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null

# 6. YaRN on vLLM's CUDA engine against HF (the CPU build is checked by tests/test_eval_backends.py) -----
part yarn_vllm "${SF[@]}" eval sft-1b --backend vllm --check-parity hf --limit 16 --tasks "[facts]" \
  --set "rope_scaling={rope_type: yarn, factor: 2}"

# the one JSON line ----------------------------------------------------------------------------------
"$PY" - "$START" "$PRETRAIN" "$SFT" "$GRPO" "$SERVE" "$LOG" \
  "${RESULT[collectives]:-not run}" "${RESULT[data]:-not run}" "${RESULT[pretrain]:-not run}" \
  "${RESULT[sft_zero3]:-not run}" "${RESULT[grpo_colocate]:-not run}" "${RESULT[yarn_vllm]:-not run}" <<'EOF'
import json, sys, time
start, pretrain, sft, grpo, serve, log = sys.argv[1:7]
parts = dict(zip(["collectives", "data", "pretrain", "sft_zero3", "grpo_colocate", "yarn_vllm"], sys.argv[7:]))
figures = {"pretrain": json.loads(pretrain), "sft_zero3": json.loads(sft), "grpo_colocate": json.loads(grpo),
           "serve_bf16": json.loads(serve)}
ok = all(v == "ok" for v in parts.values()) and all(f is not None and f.get("ok", True) for f in figures.values())
ok = ok and (figures["grpo_colocate"] or {}).get("rl/generation") == "trl-vllm"
print(json.dumps({"bench": "gpu_check", "ok": ok, "seconds": round(time.time() - int(start)), "parts": parts,
                  **figures, "log": log}))
sys.exit(0 if ok else 1)
EOF
