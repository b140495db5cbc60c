#!/usr/bin/env bash
# Install Debian's chromium and chromium-driver where either is missing: the status page's
# browser tests (tests/integration/test_status_browser.py) drive a headless chromium through
# selenium and the system chromedriver. DejaVu fonts come along, so a bare image renders the
# page's text; the recommends (a sandbox helper, desktop services) are left out. One
# `apt-get update`, then the install. Idempotent; prints CHROMIUM=<path> and
# CHROMEDRIVER=<path> on its last lines. scripts/test runs it beside the other apt steps: each
# apt step waits for apt's lock and is tried again.
set -euo pipefail
. "$(dirname "$0")/apt.sh"  # apt: apt-get with its lock waited for, tried again
if ! command -v chromium >/dev/null || [ ! -x /usr/bin/chromedriver ]; then
  apt update
  apt install -y --no-install-recommends chromium chromium-driver fonts-dejavu-core
fi
chromium --version >/dev/null 2>&1
/usr/bin/chromedriver --version >/dev/null
echo "CHROMIUM=$(command -v chromium)"
echo "CHROMEDRIVER=/usr/bin/chromedriver"
