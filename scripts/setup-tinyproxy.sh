#!/usr/bin/env bash
# Install Debian's tinyproxy where it is missing: tests/integration/test_proxy.py runs it on a
# loopback port, with a config each test writes, as the forward proxy its probes go through
# (tests/support/proxy.py). Its service is never started (the package's own start is denied
# where no init runs, and the tests need none). Idempotent; prints TINYPROXY=<binary> last.
# scripts/test runs it beside the other set-up steps: each apt step waits for apt's lock and
# is tried again, as setup-dnsmasq.sh's.
set -euo pipefail
. "$(dirname "$0")/apt.sh"  # apt: apt-get with its lock waited for, tried again
if ! command -v tinyproxy >/dev/null; then
  apt update  # once: the package lists of a fresh machine may not hold it yet
  apt install -y --no-install-recommends tinyproxy
fi
bin=$(command -v tinyproxy)
"$bin" -v >/dev/null
echo "TINYPROXY=$bin"
