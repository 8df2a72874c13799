#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on an air-gapped GPU node whose python3 already holds CUDA
# PyTorch, transformers, accelerate, peft, safetensors, tokenizers, numpy, pandas, pyarrow, aiohttp,
# fsspec, huggingface-hub, pyyaml, rich, tqdm, xxhash, psutil, ninja, py-cpuinfo, msgpack, einops,
# nvidia-ml-py, scipy (the device machine's image; /work/.library/device/KINDS.md lists it): smolforge
# itself, TRL, DeepSpeed, datasets, datasketch and what they need that such an image lacks, at the
# versions installed in .venv (the set the tests ran).
#
#   bash bench/gpu_kit.sh                          # into .whl/ (ignored by git), for CPython 3.12, x86_64
#   bash bench/gpu_kit.sh --out DIR --python-version 3.12
#   bash bench/gpu_kit.sh --offline --out DIR      # from the wheelhouse alone (no network), as the tests do
#
# Downloaded and built wheels are kept in the wheelhouse ($SMOLFORGE_WHEELHOUSE, default
# ~/.cache/smolforge/wheelhouse; `make setup` fills it), so later kits build offline. DeepSpeed
# ships only a source distribution: its wheel is built here (pure Python; ops compile on first use).
# Prints each file and the total; exits 1 when the kit is over 64 MiB (what travels with the tree).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=.whl
PYVER=3.12
OFFLINE=0
LIMIT_MIB=64
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --python-version) PYVER=$2; shift 2 ;;
    --offline) OFFLINE=1; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_kit.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
HOUSE=${SMOLFORGE_WHEELHOUSE:-$HOME/.cache/smolforge/wheelhouse}
mkdir -p "$HOUSE" "$OUT"
rm -f "$OUT"/*.whl

# name==version of each package the image lacks, as installed in this environment
PINS=$("$PY" - <<'EOF'
from importlib.metadata import version
names = ["trl", "datasets", "dill", "multiprocess", "hjson", "pydantic", "pydantic-core", "annotated-types",
         "typing-inspection", "datasketch"]
print(" ".join(f"{n}=={version(n)}" for n in names))
EOF
)
DEEPSPEED="deepspeed==$("$PY" -c 'from importlib.metadata import version; print(version("deepspeed"))')"
INDEX=()
[ "$OFFLINE" = 1 ] && INDEX=(--no-index --find-links "$HOUSE")
PLATFORM=(--only-binary=:all: --python-version "$PYVER" --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)

# the binaries of the node's Python (pydantic-core, multiprocess's pyXY wheel), then pure-Python wheels
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps "${INDEX[@]}" "${PLATFORM[@]}" -d "$HOUSE" $PINS
if ! ls "$HOUSE"/deepspeed-"${DEEPSPEED#deepspeed==}"-*.whl >/dev/null 2>&1; then
  [ "$OFFLINE" = 1 ] && { echo "gpu_kit.sh: no $DEEPSPEED wheel in $HOUSE (run once without --offline)" >&2; exit 1; }
  echo "building the $DEEPSPEED wheel (its only distribution is a source one)" >&2
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$HOUSE" "$DEEPSPEED"
fi
# shellcheck disable=SC2086
for pin in $PINS $DEEPSPEED; do
  name=${pin%%==*}; ver=${pin#*==}
  file=$(ls "$HOUSE"/"${name//-/_}"-"$ver"-*.whl "$HOUSE"/"$name"-"$ver"-*.whl 2>/dev/null | grep -E -- "-((py2\.)?py3|py${PYVER/./}|cp${PYVER/./})-" | head -n 1) || true
  [ -n "$file" ] || { echo "gpu_kit.sh: no wheel of $pin for Python $PYVER in $HOUSE" >&2; exit 1; }
  cp "$file" "$OUT"/
done
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" . >/dev/null   # smolforge itself, from this tree

total=$(du -cb "$OUT"/*.whl | tail -n 1 | cut -f1)
ls -l "$OUT"/*.whl | awk '{printf "%9.2f MiB  %s\n", $5 / 1048576, $NF}'
awk -v t="$total" 'BEGIN {printf "kit: %.2f MiB in all\n", t / 1048576}'
[ "$total" -le $((LIMIT_MIB * 1048576)) ] || { echo "gpu_kit.sh: the kit is over $LIMIT_MIB MiB" >&2; exit 1; }
