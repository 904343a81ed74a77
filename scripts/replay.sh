#!/usr/bin/env bash
# The replay benchmark: the 50-function Azure sample's first three hours at 60x through a live
# cluster on this machine (its own etcd, a scheduler, the capacity manager and its invokers on
# the process factory), and the simulator on the same calls with the timings the replay
# measured, side by side (BENCHMARKS.md, "The fleet replayed"). About four minutes on 2 cores;
# stops by itself and leaves nothing running. Needs root (the invokers isolate their
# containers) and etcd (installed here when missing).
#
#   scripts/replay.sh                     # scenarios/replay-50.toml, 180 trace minutes at 60x
#   scripts/replay.sh --minutes 60        # any of `invoker replay`'s flags
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v etcd >/dev/null 2>&1; then
    echo "installing etcd-server for the replay's cluster" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >&2
fi
cargo build --release --bin invoker >&2
exec "${CARGO_TARGET_DIR:-target}/release/invoker" replay --scenario scenarios/replay-50.toml --factor 60 "$@"
