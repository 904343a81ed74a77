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
trap 'kill "$pid" 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$bin" --data-dir "$work/data" \
    --listen 127.0.0.1:0 > "$work/stdout" 2> "$work/stderr" &
pid=$!
for _ in $(seq 600); do
    grep -q "^listening on " "$work/stdout" 2>/dev/null && break
    sleep 0.1
done
addr="$(sed -n 's/^listening on //p' "$work/stdout")"
[ -n "$addr" ] || { cat "$work/stderr" >&2; exit 1; }
auth="$(sed -n 's/^guest auth: //p' "$work/stdout")"
api="http://$addr/api/v1/namespaces/_/actions/noop"
returns='{}'
if [ -n "${ECHO:-}" ]; then returns=a; fi
curl -sf -u "$auth" -X PUT "$api" -d '{"exec":{"kind":"python:3","code":"def main(a):\n    return '"$returns"'"}}' > /dev/null
curl -sf -u "$auth" -X POST "$api?blocking=true" > /dev/null
callgrind_control -z "$pid" > /dev/null
for _ in $(seq "$n"); do
    curl -sf -u "$auth" -X POST "$api?${QUERY:-blocking=true&result=true}" ${BODY:+-d "$BODY"} > /dev/null
done
sleep 0.5  # one more store flush, so its share is counted
callgrind_control -d "$pid" > /dev/null
sleep 1
dump="$(ls "$work"/cg.out.* | head -1)"
total="$(callgrind_annotate "$dump" | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)"
echo "instructions: $total for $n activations, $((total / n)) per activation"
callgrind_annotate --inclusive=yes "$dump" | grep -E '^ *[0-9,]+ \(' | grep 'invoker::' | head -12 | cut -c1-140
