#!/usr/bin/env bash
# Instructions the python launcher executes per run of a no-op action, counted by valgrind's
# callgrind (a figure that does not move with the machine's load). The launcher reads one /run
# body per line on stdin; it is fed 1,000 and then 3,000 bodies, and the difference divided by
# 2,000 is the cost of one run, without python's start-up. Two kinds of bodies: the same
# context every time, and a new activation id, transaction id and deadline per run (what an
# invoker sends).
#
#   scripts/launcher-instructions.sh [launcher.py]   # the repository's by default
set -euo pipefail
cd "$(dirname "$0")/.."
launcher="$(realpath "${1:-crates/invoker-runtime/src/launchers/python.py}")"
command -v valgrind >/dev/null || apt-get install -y valgrind >&2
# The interpreter itself, not a shim script that would exec it (valgrind would count the shim).
python="$(python3 -c 'import sys; print(sys.executable)')"
work="$(mktemp -d /tmp/launcher-callgrind-XXXXXX)"
trap 'rm -rf "$work"' EXIT
printf 'def main(a):\n    return {}\n' >"$work/__main__.py"
count() { # count RUNS UNIQUE: the instructions of the whole process
    python3 - "$1" "$2" >"$work/in.txt" <<'PY'
import json, sys
runs, unique = int(sys.argv[1]), sys.argv[2] == "1"
for n in range(runs):
    k = n if unique else 0
    print(json.dumps({"value": {}, "namespace": "guest", "action_name": "/guest/noop", "action_version": "0.0.1",
                      "activation_id": "%032x" % k, "transaction_id": "tx%d" % k, "deadline": str(1800000000000 + k)}))
PY
    (cd "$work" && valgrind --tool=callgrind --callgrind-out-file=/dev/null --log-file="$work/vg.log" \
        "$python" -u "$launcher" main <in.txt 3>/dev/null >/dev/null 2>&1)
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$work/vg.log"
}
for unique in 0 1; do
    small="$(count 1000 "$unique")" large="$(count 3000 "$unique")"
    label="the same context every run"
    [ "$unique" = 1 ] && label="a new id and deadline every run"
    echo "$(( (large - small) / 2000 )) instructions per run: $label"
done
