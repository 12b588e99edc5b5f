#!/usr/bin/env bash
# Builds llama.cpp's native llama-server (continuous batching: -np N -cb) and
# llama-bench from the sources vendored in the llama-cpp-python sdist, from PyPI
# only: a venv with cmake, ninja and the GGUF writer's packages, the sdist, and a
# Release build. Everything lives in .cache/llama-cpp/ and reruns skip what is done.
# Prints the folder holding the binaries.
#
#   load/llama-cpp/setup.sh                 # build (or find) the binaries
#   LLAMA_CPP_CACHE=/elsewhere load/llama-cpp/setup.sh
#
# (llama-cpp-python's own Python server serializes requests behind a lock, so it is
# not a fair serving peer; its C++ llama-server is.)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${LLAMA_CPP_CACHE:-$ROOT/.cache/llama-cpp}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
VENV="$CACHE/venv"
SRC="$CACHE/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$CACHE/build-$VERSION"
BIN="$BUILD/bin"
# Other work shares this machine: build at the lowest priority.
NICE=(nice -n 19)

log() { echo "llama-cpp/setup: $*" >&2; }

if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ] \
    && [ -x "$VENV/bin/python" ]; then
    echo "$BIN"
    exit 0
fi

if [ ! -x "$VENV/bin/ninja" ] || ! "$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null; then
    log "creating $VENV (cmake, ninja, scikit-build-core, numpy, safetensors, gguf from PyPI)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet cmake ninja scikit-build-core numpy safetensors gguf
fi

if [ ! -f "$SRC/CMakeLists.txt" ]; then
    log "fetching the llama-cpp-python $VERSION sdist (it vendors llama.cpp)"
    mkdir -p "$CACHE/src"
    # pip reads the sdist's metadata with its build backend: cmake and
    # scikit-build-core from the venv, no isolated build environment, nothing compiled.
    PATH="$VENV/bin:$PATH" "$VENV/bin/pip" download --quiet --no-deps --no-binary :all: \
        --no-build-isolation --dest "$CACHE/src" "llama-cpp-python==$VERSION"
    tar -xzf "$CACHE/src/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE/src"
fi

log "configuring $BUILD"
# No web UI (the prebuilt one would be downloaded), no OpenSSL, no tests or examples.
"${NICE[@]}" "$VENV/bin/cmake" -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_MAKE_PROGRAM="$VENV/bin/ninja" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
log "building llama-server, llama-bench and llama-batched-bench (several minutes on 2 cores)"
"${NICE[@]}" "$VENV/bin/ninja" -C "$BUILD" llama-server llama-bench llama-batched-bench >&2
echo "$BIN"
