#!/usr/bin/env bash
# Instructions the invoker executes per warm activation, counted by valgrind's callgrind: a
# figure that does not move with the machine's load (wall-clock benchmarks on this shared VM
# move by 10 % between runs). Starts the release invoker under callgrind on a free port, warms a
# no-op python action, zeroes the counters, runs N sequential blocking invokes with curl, and
# prints the total and the per-activation count (user space, all the invoker's threads,
# including the store's background flush), then the largest inclusive costs.
#
#   scripts/instructions.sh [N]      # N = 300 by default
#   QUERY=blocking=true scripts/instructions.sh   # the whole record answered, not the result
#   BODY='{"name":"you","n":[1,2,3]}' scripts/instructions.sh   # with these parameters (none by
#                                                                # default)
#   ECHO=1 BODY=... scripts/instructions.sh   # the action answers its parameters (a result of
#                                            # their size, not {})
#   INVOKER_BIN=path scripts/instructions.sh   # that binary, not built here (an older build, to
#                                              # compare alternately with this one)
#   FLOOR=1 scripts/instructions.sh   # the floor instead: the bench's forwarder (`invoker-bench
#                                     # --floor`, no store, pool or record) in front of the same
#                                     # runtime, counted the same way: the least a warm call costs
#   BENCH_BIN=path                    # the floor's binary, not built here
#   SCHEDULER=1 scripts/instructions.sh   # a scheduler's instead, in front of one invoker (not
#                                         # counted) on the etcd scripts/etcd.sh starts
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-300}"
for tool in valgrind curl python3; do
    command -v "$tool" >/dev/null || apt-get install -y "$tool" >&2
done
if [ -n "${INVOKER_BIN:-}" ]; then
    bin="$INVOKER_BIN"
else
    cargo build --release --bin invoker >&2
    bin="${CARGO_TARGET_DIR:-target}/release/invoker"
fi
work="$(mktemp -d /tmp/invoker-callgrind-XXXXXX)"
runtime=""  # what else this starts: a runtime (FLOOR) or an invoker (SCHEDULER)
finish() {
    kill "$pid" $runtime 2>/dev/null || true
    # An invoker removes its containers as it stops (their disks are mounts under $work): the
    # directory goes once it and what it started are gone, within 10 s.
    for _ in $(seq 100); do
        kill -0 "$pid" $runtime 2>/dev/null || break
        sleep 0.1
    done
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap finish EXIT
listening() {  # the address a process writing its output to $1 listens on, once it does
    for _ in $(seq 600); do
        grep -q "^listening on " "$1" 2>/dev/null && break
        sleep 0.1
    done
    sed -n 's/^listening on //p' "$1"
}
returns='{}'
if [ -n "${ECHO:-}" ]; then returns=a; fi
if [ -n "${FLOOR:-}" ]; then
    # The runtime the process factory runs, started and initialised by hand; the floor (not the
    # runtime) under callgrind in front of it.
    if [ -n "${BENCH_BIN:-}" ]; then
        bench="$BENCH_BIN"
    else
        cargo build --release -p invoker-bench >&2
        bench="${CARGO_TARGET_DIR:-target}/release/invoker-bench"
    fi
    INVOKER_PYTHON="$(readlink -f "$(command -v python3)")" "$bin" action-runtime --launcher python \
        --listen "unix:$work/runtime.sock" > "$work/runtime.out" 2>&1 &
    runtime=$!
    for _ in $(seq 100); do [ -S "$work/runtime.sock" ] && break; sleep 0.1; done
    python3 -c 'import json,sys; print(json.dumps({"value": {"name": "noop", "main": "main", "binary": False,
        "env": {}, "code": "def main(a):\n    return " + sys.argv[1]}}))' "$returns" |
        curl -sf --unix-socket "$work/runtime.sock" http://localhost/init -d @- > /dev/null
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$bench" --floor-kind openwhisk --floor \
        "$work/runtime.sock" > "$work/stdout" 2> "$work/stderr" &
elif [ -n "${SCHEDULER:-}" ]; then
    # One invoker and the scheduler in front of it, in a cluster of their own on the etcd.
    etcd="$(bash scripts/etcd.sh | sed -n 's/^ETCD_ENDPOINTS=//p')"
    key="0b0b0b0b-0000-4000-8000-000000000b0b:the-instruction-counts-controller-secret"
    cluster="[cluster]
etcd = [\"$etcd\"]
prefix = \"/instructions$$\"
publish_interval = \"200ms\"
controller_key = \"$key\"
[admin]
controller_keys = [\"$key\"]
[proxy]
pause_grace = \"0s\""
    printf 'invoker_id = "instructions%s"\n%s\n' "$$" "$cluster" > "$work/invoker.toml"
    printf 'invoker_id = "sched%s"\n%s\n[scheduler]\nid = "instructions%s"\n' "$$" "$cluster" "$$" \
        > "$work/scheduler.toml"
    "$bin" --config "$work/invoker.toml" --data-dir "$work/invoker" --listen 127.0.0.1:0 \
        > "$work/invoker.out" 2> "$work/invoker.err" &
    runtime=$!
    [ -n "$(listening "$work/invoker.out")" ] || { cat "$work/invoker.err" >&2; exit 1; }
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$bin" scheduler \
        --config "$work/scheduler.toml" --data-dir "$work/data" --listen 127.0.0.1:0 \
        > "$work/stdout" 2> "$work/stderr" &
else
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$bin" --data-dir "$work/data" \
        --listen 127.0.0.1:0 > "$work/stdout" 2> "$work/stderr" &
fi
pid=$!
addr="$(listening "$work/stdout")"
[ -n "$addr" ] || { cat "$work/stderr" >&2; exit 1; }
if [ -n "${SCHEDULER:-}" ]; then
    admin="$(sed -n 's/^admin auth: //p' "$work/stdout")"
    for _ in $(seq 600); do
        curl -sf -u "$admin" "http://$addr/v1/invokers" | grep -q '"healthy"' && break
        sleep 0.1
    done
fi
api="http://$addr/api/v1/namespaces/_/actions/noop"
auth=()  # the floor asks for none
if [ -z "${FLOOR:-}" ]; then
    auth=(-u "$(sed -n 's/^guest auth: //p' "$work/stdout")")
    curl -sf "${auth[@]}" -X PUT "$api" -d '{"exec":{"kind":"python:3","code":"def main(a):\n    return '"$returns"'"}}' > /dev/null
fi
curl -sf "${auth[@]}" -X POST "$api?blocking=true" > /dev/null
callgrind_control -z "$pid" > /dev/null
for _ in $(seq "$n"); do
    curl -sf "${auth[@]}" -X POST "$api?${QUERY:-blocking=true&result=true}" ${BODY:+-d "$BODY"} > /dev/null
done
sleep 2.5  # one more store flush (records go into redb every 2 s at this pace), so its share is counted
callgrind_control -d "$pid" > /dev/null
sleep 1
dump="$(ls "$work"/cg.out.* | head -1)"
total="$(callgrind_annotate "$dump" | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)"
echo "instructions: $total for $n activations, $((total / n)) per activation"
callgrind_annotate --inclusive=yes "$dump" | grep -E '^ *[0-9,]+ \(' | grep 'invoker::' | head -12 | cut -c1-140
