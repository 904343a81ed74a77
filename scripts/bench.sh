#!/usr/bin/env bash
# The warm path measured side by side with the runtime called directly, in one run, A/B
# alternating; a cold start each way; cold starts by kind (20 new actions each: python forked
# from the zygote, python started in its container, node from its snapshot and plain) and a burst of 50 first calls to 50
# new python actions; the invoker's resident memory; the scheduler hop (a
# scheduler in front of one invoker against that invoker called directly). Each warm path also
# beside its floor, measured in the same rounds (`crates/invoker-bench/src/floor.rs`: hyper in,
# one request to the same runtimes, FDKs or invoker, the answer out, and nothing else). The last
# line printed is one JSON object (see BENCHMARKS.md).
#
#   scripts/bench.sh            # full: 5 s slices, 3 rounds per mode and concurrency, memory
#   scripts/bench.sh --quick    # within 60 s once built: 2 s slices, 2 rounds
#   K=8 scripts/bench.sh        # the concurrency K (and the number of warm containers)
#   scripts/bench.sh --docker   # also an invoker on Docker, in the same run (starts the engine
#                               # with scripts/dockerd.sh and builds the images; needs root)
#   scripts/bench.sh --queue    # only the durable queue's intake: non-blocking calls accepted a
#                               # second from 16 callers for 5 s while it drains into K containers
set -euo pipefail
cd "$(dirname "$0")/.."

quick=false
queue=false
docker=()
for arg in "$@"; do
    case "$arg" in
        --quick) quick=true ;;
        --queue) queue=true ;;
        --docker) docker=(--docker-socket) ;;
        *) echo "usage: scripts/bench.sh [--quick] [--docker] | --queue" >&2; exit 2 ;;
    esac
done

if [ ! -x /usr/bin/python3 ]; then
    echo "installing python3 (the benchmark's no-op action is python)" >&2
    apt-get install -y python3-minimal >&2
fi

# The invoker with the mock factory (the scheduler hop runs on it), and the bench beside it.
features=invoker/test-util
if [ ${#docker[@]} -gt 0 ]; then
    features=invoker/test-util,invoker/docker
fi
cargo build --release --bins -p invoker -p invoker-bench --features "$features" >&2
bin="${CARGO_TARGET_DIR:-target}/release"
k="${K:-8}"
if $queue; then
    exec "$bin/invoker-bench" --k "$k" --queue-only 16 --slice 5
fi
if [ ${#docker[@]} -gt 0 ]; then
    socket=$(scripts/dockerd.sh | tail -1)
    # The images then hold the release binary the invoker runs, as in production.
    INVOKER_DOCKER_SOCKET="$socket" scripts/build-images.sh "$bin/invoker" >&2
    docker+=("$socket")
fi
# The scheduler hop runs against an etcd on loopback (installed and started when missing).
etcd=(--etcd "$(scripts/etcd.sh | tail -1 | cut -d= -f2)")
if $quick; then
    exec "$bin/invoker-bench" --k "$k" --slice 2 --rounds 2 --cold 3 "${docker[@]}" "${etcd[@]}"
else
    exec "$bin/invoker-bench" --k "$k" --slice 5 --rounds 3 --cold 5 --memory "${docker[@]}" "${etcd[@]}"
fi
