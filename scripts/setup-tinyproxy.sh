#!/usr/bin/env bash
# Install Debian's tinyproxy where it is missing: tests/integration/test_proxy.py runs it on a
# loopback port, with a config each test writes, as the forward proxy its probes go through
# (tests/support/proxy.py). Its service is never started (the package's own start is denied
# where no init runs, and the tests need none). Idempotent; prints TINYPROXY=<binary> last.
# scripts/test runs it beside the other set-up steps: each apt step waits for apt's lock and
# is tried again, as setup-dnsmasq.sh's.
set -euo pipefail
apt() {  # apt ARGS...: apt-get as root (sudo where needed), waiting for its lock, 3 tries
  local sudo="" try
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  for try in 1 2 3; do
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=120 "$@" >/dev/null \
      && return 0
    sleep $((try * 5))
  done
  return 1
}
if ! command -v tinyproxy >/dev/null; then
  apt update  # once: the package lists of a fresh machine may not hold it yet
  apt install -y --no-install-recommends tinyproxy
fi
bin=$(command -v tinyproxy)
"$bin" -v >/dev/null
echo "TINYPROXY=$bin"
