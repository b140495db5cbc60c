#!/usr/bin/env bash
# Install Debian's dnsmasq-base (the dnsmasq binary alone, no service) where dnsmasq is missing:
# the `dns:` discovery tests run it on a loopback port as their DNS server
# (tests/support/dnsmasq.py). Idempotent; prints DNSMASQ=<path of the binary> on its last line.
# scripts/test runs it beside setup-prometheus.sh, whose `apt-get update` may hold apt's lock
# a moment: each apt step waits for the lock and is tried again.
set -euo pipefail
find_dnsmasq() { command -v dnsmasq || { [ -x /usr/sbin/dnsmasq ] && echo /usr/sbin/dnsmasq; }; }
. "$(dirname "$0")/apt.sh"  # apt: apt-get with its lock waited for, tried again
if ! find_dnsmasq >/dev/null; then
  apt install -y --no-install-recommends dnsmasq-base 2>/dev/null || {
    apt update
    apt install -y --no-install-recommends dnsmasq-base
  }
fi
bin=$(find_dnsmasq)
"$bin" --version >/dev/null
echo "DNSMASQ=$bin"
