#!/usr/bin/env bash
# Installs Debian's Chromium for the HTML report's browser test (tests/reports/), which
# drives /usr/bin/chromium with Playwright and never downloads a browser of its own.
# Without root or apt-get it only says what to install: the test then fails, saying why.
set -euo pipefail
CHROMIUM=/usr/bin/chromium
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
    exit 0
fi
echo "install_chromium.sh: $CHROMIUM is missing; install Debian's packages as root:" >&2
echo "    apt-get install --no-install-recommends chromium chromium-driver" >&2
