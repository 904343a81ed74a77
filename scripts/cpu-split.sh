#!/usr/bin/env bash
# Where the CPU goes, per process, in the benchmark's c=K slices: samples /proc/<pid>/stat of
# every process every 100 ms while `invoker-bench` runs, keeps the intervals where both cores
# were busy and one side's runtimes were working, and prints each process group's share of
# the cores (user and system) for the direct and the invoker slices. Divide a share by the
# slice's req/s (printed above it) for the CPU per request.
#
#   scripts/cpu-split.sh        # builds the release binaries first
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins -p invoker -p invoker-bench --features invoker/test-util >&2
bin="${CARGO_TARGET_DIR:-target}/release"
flag="$(mktemp /tmp/cpu-split-XXXXXX)"
python3 - "$flag" <<'PY' &
import collections, os, sys, time
flag, hz, tick = sys.argv[1], os.sysconf("SC_CLK_TCK"), 0.1

def processes():
    seen = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
        except OSError:
            continue
        seen[int(pid)] = (int(stat[1]), cmd, int(stat[11]), int(stat[12]))
    return seen

def group(pid, seen):
    parent, cmd = seen[pid][0], seen[pid][1]
    direct = "invoker-bench-direct"
    if "action-runtime" in cmd:
        return "runtime (direct)" if direct in cmd else "runtime (invoker's)"
    if "python" in cmd.split(" ")[0]:
        return "python (direct)" if direct in seen.get(parent, (0, ""))[1] else "python (invoker's)"
    if "invoker --config" in cmd:
        return "invoker"
    if "invoker-bench " in cmd:
        return "load generator"
    return None

def cores():
    return [int(x) for x in open("/proc/stat").readline().split()[1:]]

totals = {"direct": collections.Counter(), "invoker": collections.Counter()}
intervals = collections.Counter()
before, before_cores = processes(), cores()
while os.path.exists(flag):
    time.sleep(tick)
    now, now_cores = processes(), cores()
    used = collections.Counter()
    for pid, (_, _, user, system) in now.items():
        name = group(pid, now)
        if name and pid in before:
            used[name + " user"] += user - before[pid][2]
            used[name + " sys"] += system - before[pid][3]
    delta = [b - a for a, b in zip(before_cores, now_cores)]
    busy = (sum(delta) - delta[3] - delta[4]) / hz / tick
    used["cores idle"] = delta[3] + delta[4]
    direct = used["runtime (direct) user"] + used["runtime (direct) sys"]
    invoked = used["runtime (invoker's) user"] + used["runtime (invoker's) sys"]
    side = None
    if busy >= 1.8 and direct > 5 and direct > 4 * invoked:
        side = "direct"
    elif busy >= 1.8 and invoked > 5 and invoked > 4 * direct:
        side = "invoker"
    if side:
        totals[side].update(used)
        intervals[side] += 1
    before, before_cores = now, now_cores
for side, used in totals.items():
    if intervals[side]:
        print(f"{side} slices ({intervals[side]} intervals of {tick} s), cores used:")
        for name, ticks in sorted(used.items()):
            if ticks:
                print(f"  {name:28} {ticks / intervals[side] / hz / tick:.3f}")
PY
monitor=$!
"$bin/invoker-bench" --k "${K:-8}" --slice 4 --rounds 2 --cold 1 2>&1 >/dev/null | grep -E "^c=${K:-8} " || true
rm -f "$flag"
wait "$monitor"
