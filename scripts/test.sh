#!/usr/bin/env bash
# The README's test command: installs what the tests need when it is missing, then runs them.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v node >/dev/null 2>&1 || need+=(nodejs)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} for the action kinds' tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

cargo test --all-targets "$@"
