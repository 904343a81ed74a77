#!/usr/bin/env bash
# Licences and sources of every dependency (deny.toml), with cargo-deny: installed from
# crates.io the first time (a few minutes), then run. Advisories are not checked: their
# database is a git repository this machine cannot reach.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "deny.sh: installing cargo-deny from crates.io (once)"
  cargo install cargo-deny --locked --quiet
fi
cargo deny --log-level warn check licenses sources bans
