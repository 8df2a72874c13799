#!/usr/bin/env bash
# The GPU paths, checked on one GPU node that may be air-gapped: no package registry, a preinstalled
# CUDA PyTorch and transformers, and the wheels bench/gpu_kit.sh built carried in .whl/.
#
#   bash bench/gpu_kit.sh                       # here, with PyPI: the kit into .whl/ (about 20 MiB)
#   bash bench/gpu_check.sh --out "$OUT"        # there: installs the kit when needed, runs every part
#   bash bench/gpu_check.sh --cpu               # here: the same parts, plumbing and summary on the CPU
#
# The parts, their time limits and what each proves are in bench/gpu_check.py (--help). The summary
# (OUT/summary.json) and each part's log land in --out DIR (default: $OUT when set, else a new folder,
# printed); the last stdout line is the summary as one JSON object. Exit 0 only when no part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
KIT=${SMOLFORGE_KIT:-.whl}
CPU=0
for arg in "$@"; do [ "$arg" = --cpu ] && CPU=1; done
if [ -z "${PY:-}" ]; then
  PY=python3
  [ -x .venv/bin/python ] && PY=.venv/bin/python   # a `make setup` environment has everything
fi
# found, not imported: importing them costs a process ~3 CPU-s and each part imports them anyway (a
# broken install then fails in the part's log, with its traceback, instead of installing the kit over it)
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in
    ('smolforge.pretrain', 'trl', 'deepspeed', 'datasets')))" 2>/dev/null; then
  # an image without the training stack: install the carried kit, no index, no dependency resolution
  if ! ls "$KIT"/*.whl >/dev/null 2>&1; then
    echo "{\"bench\": \"gpu_check\", \"ok\": false, \"error\": \"$PY lacks smolforge/TRL/DeepSpeed/datasets and $KIT/ holds no wheels: build the kit with bash bench/gpu_kit.sh where PyPI is reachable\"}"
    exit 1
  fi
  SITE=${SMOLFORGE_KIT_SITE:-/tmp/smolforge-kit-site}
  echo "[gpu_check] installing the kit from $KIT into $SITE" >&2
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$KIT"/*.whl >&2 || {
    echo '{"bench": "gpu_check", "ok": false, "error": "the kit did not install (pip install --no-index --no-deps --target)"}'; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$SITE/bin:$PATH"
fi
[ "$CPU" = 1 ] && export CUDA_VISIBLE_DEVICES=""
exec "$PY" bench/gpu_check.py "$@"
