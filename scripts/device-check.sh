#!/usr/bin/env bash
# The one prepared run on a GPU machine (from the repository root, with .device/ carried:
# scripts/build-device.sh makes it). Writes everything to $1 (default $OUT):
#   check.log / check.json  every kernel and a model's logits against the CPU, speed of the
#                           Qwen3-8B and -0.6B shapes against the card's copy bandwidth and GEMM rate
#   cuda-tests.log          core/tests/cuda.rs on the card
#   nvidia-smi.txt          the card and driver
set -uo pipefail
OUT_DIR="${1:-${OUT:-/tmp/device-out}}"
mkdir -p "$OUT_DIR"
BIN=.device/tokenrouter
# cuBLAS from the machine's Python environment (PyTorch's nvidia-* packages).
# (CUDA 13's wheels put them under nvidia/cu13/lib, CUDA 12's under nvidia/cublas/lib.)
SITES=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
CUBLAS=$(find $SITES /usr/local/cuda*/lib64 /usr/lib/x86_64-linux-gnu -name 'libcublas.so.13*' 2>/dev/null | head -1)
CUBLAS_DIR=${CUBLAS:+$(dirname "$CUBLAS")}
echo "cuBLAS: ${CUBLAS:-not found}" | tee "$OUT_DIR/libraries.txt"
export LD_LIBRARY_PATH="${CUBLAS_DIR:+$CUBLAS_DIR:}${LD_LIBRARY_PATH:-}"
nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1
status=0
timeout 300 "$BIN" check-device --device cuda:0 --speed qwen3-8b,qwen3-0.6b --prefill 8192 \
    --out "$OUT_DIR/check.json" 2>&1 | tee "$OUT_DIR/check.log" || status=1
# The card's tests (core/tests/cuda.rs): kernels, logits batched and alone, a shared arena.
timeout 150 .device/cuda-tests --test-threads 1 --nocapture 2>&1 | tee "$OUT_DIR/cuda-tests.log" || status=1
exit $status
