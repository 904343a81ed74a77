#!/usr/bin/env bash
# The README's test command: installs what the tests need when it is missing, then runs them.
set -euo pipefail
cd "$(dirname "$0")/.."

# The system's own interpreters: an isolated container's uid runs /usr/bin/python3, not a shim
# under a private home (pyenv, nvm).
need=()
[ -x /usr/bin/python3 ] || need+=(python3)
[ -x /usr/bin/node ] || need+=(nodejs)
# The cluster tests start etcd members of their own from Debian's binary.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
# The clock test moves the invoker's wall clock with libfaketime (tests/wall_clock.rs).
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || need+=(libfaketime)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} for the action kinds' and the cluster's tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

# Fn's FDKs from PyPI and npm, for the fn: kinds' tests (tests/fn_protocol.rs).
bash scripts/fdk.sh >/dev/null

# Chromium and playwright-core, for the live view's browser test (tests/live_browser.rs).
bash scripts/browser.sh

# Every backend and the mock factory (cargo features), so that every suite builds and runs.
cargo test --workspace --all-targets --all-features "$@"
