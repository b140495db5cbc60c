#!/usr/bin/env bash
# Install Debian's dnsmasq-base (the dnsmasq binary alone, no service) where dnsmasq is missing:
# the `dns:` discovery tests run it on a loopback port as their DNS server
# (tests/support/dnsmasq.py). Idempotent; prints DNSMASQ=<path of the binary> on its last line.
# scripts/test runs it beside setup-prometheus.sh, whose `apt-get update` may hold apt's lock
# a moment: each apt step waits for the lock and is tried again.
set -euo pipefail
find_dnsmasq() { command -v dnsmasq || { [ -x /usr/sbin/dnsmasq ] && echo /usr/sbin/dnsmasq; }; }
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
if ! find_dnsmasq >/dev/null; then
  apt install -y --no-install-recommends dnsmasq-base 2>/dev/null || {
    apt update
    apt install -y --no-install-recommends dnsmasq-base
  }
fi
bin=$(find_dnsmasq)
"$bin" --version >/dev/null
echo "DNSMASQ=$bin"
