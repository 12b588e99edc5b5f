#!/usr/bin/env bash
# Fetches CUDA's compiler from PyPI into .cache/cuda (pinned: 13.0 matches the test
# card's driver 580 and writes PTX ISA 9.0, which that driver's JIT accepts) and prints
# the exports that point a build at it:
#
#   eval "$(scripts/cuda-toolkit.sh)"    # then: cargo build --release --features cuda
#
# No GPU and no driver are needed to build: the kernels compile to PTX here, and the
# CUDA libraries (libcuda, cuBLAS) are opened at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${TOKENROUTER_CUDA_CACHE:-$PWD/.cache/cuda}"
HOME_DIR="$ROOT/nvidia/cu13"
if [ ! -x "$HOME_DIR/bin/nvcc" ]; then
    mkdir -p "$ROOT"
    python3 -m pip install --quiet --no-deps --target "$ROOT" \
        nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 >&2
fi
test -x "$HOME_DIR/bin/nvcc" || { echo "nvcc missing under $HOME_DIR" >&2; exit 1; }
echo "export CUDA_HOME='$HOME_DIR'"
echo "export PATH='$HOME_DIR/bin':\"\$PATH\""
