#!/usr/bin/env bash
# Fetch Debian's `prometheus` package and unpack prometheus + promtool into the cache,
# without installing anything system-wide. Idempotent; prints the bin folder on its last line.
set -euo pipefail
CACHE="${LLMPROBER_CACHE:-$HOME/.cache/llm-prober}"
bin="$CACHE/prometheus/bin"
if [ ! -x "$bin/promtool" ] || [ ! -x "$bin/prometheus" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 || \
      { apt-get update >/dev/null && apt-get download prometheus >/dev/null; }; })
  dpkg -x "$work"/prometheus_*.deb "$work/root"
  mkdir -p "$bin"
  cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$bin/"
fi
"$bin/promtool" --version >/dev/null
echo "PROMETHEUS_BIN=$bin"
