#!/usr/bin/env bash
# Builds the binary that travels to a GPU machine (which has no Rust): the `cuda`
# feature, for a generic x86-64-v3 CPU rather than this machine's (`target-cpu=native`
# in .cargo/config.toml would bring AVX-512 the other machine may lack), into .device/.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/cuda-toolkit.sh)"
RUSTFLAGS="-C target-cpu=x86-64-v3" CARGO_TARGET_DIR="$PWD/target/device" \
    cargo build --release --features cuda --bin tokenrouter
# The card's own test binary (core/tests/cuda.rs), run there directly.
TESTS=$(RUSTFLAGS="-C target-cpu=x86-64-v3" CARGO_TARGET_DIR="$PWD/target/device" \
    cargo test --release -p tokenrouter-core --features cuda --test cuda --no-run --message-format=json \
    | python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda":
        print(m["executable"])')
mkdir -p .device
cp target/device/release/tokenrouter .device/tokenrouter
cp "$TESTS" .device/cuda-tests
strip .device/tokenrouter .device/cuda-tests 2>/dev/null || true
ls -la .device/
