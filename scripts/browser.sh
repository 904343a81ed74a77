#!/usr/bin/env bash
# What the live view's browser test needs (tests/live_browser.rs): Debian's Chromium, and
# playwright-core (tests/ui/package.json) to drive it from node. Installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
    echo "installing chromium for the live view's browser test" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
fi
if [ ! -d tests/ui/node_modules/playwright-core ]; then
    echo "installing playwright-core for the live view's browser test" >&2
    npm install --prefix tests/ui --no-audit --no-fund --silent >&2
fi
