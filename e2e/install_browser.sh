#!/usr/bin/env bash
# Install the headless browser the e2e tests drive: Debian's chromium and its matching
# chromedriver (same package version, so driver and browser always agree). Idempotent.
set -euo pipefail

if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
    SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo "sudo")
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver
fi
/usr/bin/chromium --version 2>/dev/null
/usr/bin/chromedriver --version
