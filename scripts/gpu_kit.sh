#!/usr/bin/env bash
# `make gpu-kit` (issue 15, docs/gpu.md), run HERE with network: fills the git-ignored .whl/ with
# the wheels a lent GPU machine lacks (CPython 3.12, manylinux x86_64, no index there), at the
# versions of .venv: bitsandbytes trimmed to its CPU library and the CUDA one that machine's
# torch (+cu130) loads, and the pure-Python runtime deps of spectui.engine / spectui.kernels.
# Carry .whl to the GPU machine; scripts/gpu_check.sh installs it there.
#
# Environment: PY (.venv/bin/python), GPU_KIT_CUDA (130: torch.version.cuda there, without the dot).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
KIT=.whl
[ -x "$PY" ] || { echo "gpu_kit: no $PY: run \`make setup\` first (the kit pins .venv's versions)" >&2; exit 1; }
CUDA=${GPU_KIT_CUDA:-130}
LIMIT_MB=25
# platformdirs: spectui.paths; accelerate (+ psutil): transformers' bitsandbytes quantizer;
# gguf: transformers' GGUF loading (the embedded model). torch, triton, transformers, numpy,
# safetensors, tokenizers, huggingface_hub and tqdm are on the GPU machine already.
DEPS=(platformdirs accelerate psutil gguf)
# bitsandbytes/cextension.py loads libbitsandbytes_cuda{torch.version.cuda} when CUDA is there,
# else libbitsandbytes_cpu.so; every other native library is dead weight (40 MB of the wheel).
KEEP=(--keep libbitsandbytes_cpu.so --keep "libbitsandbytes_cuda$CUDA.so")
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64)

pins=$("$PY" - bitsandbytes "${DEPS[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"gpu_kit: {name} is not installed in {sys.prefix}: run `make setup` first")
EOF
)
mapfile -t PINS <<<"$pins"
echo "gpu_kit: ${PINS[*]} (bitsandbytes trimmed to libbitsandbytes_cpu.so, libbitsandbytes_cuda$CUDA.so)"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q --disable-pip-version-check --no-deps "${TARGET[@]}" -d "$TMP/dl" "${PINS[@]}"

mkdir -p "$KIT"
rm -f "$KIT"/*.whl
for wheel in "$TMP"/dl/*.whl; do
    case $(basename "$wheel") in
        bitsandbytes-*) "$PY" scripts/gpu_kit.py trim-wheel "$wheel" "$KIT" "${KEEP[@]}" ;;
        *) cp "$wheel" "$KIT/" ;;
    esac
done

# The GPU machine installs them so: check here that pip takes every one of them.
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile "${TARGET[@]}" \
    --target "$TMP/site" "$KIT"/*.whl
echo "gpu_kit: all $(ls "$KIT"/*.whl | wc -l) wheels install with --no-index --no-deps"

ls -l "$KIT"/*.whl | awk '{printf "%10d  %s\n", $5, $NF}'
total=$(cat "$KIT"/*.whl | wc -c)
echo "gpu_kit: $KIT holds $total bytes ($((total / 1048576)) MiB); carry [\".whl\"] with make gpu-check"
if [ "$total" -gt $((LIMIT_MB * 1048576)) ]; then
    echo "gpu_kit: $KIT is over ${LIMIT_MB} MiB: the repo and the carry must stay under 64 MiB" >&2
    exit 1
fi
