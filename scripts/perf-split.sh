#!/usr/bin/env bash
# Where the time goes, by process and by symbol, in the benchmark's c=K slices: records every
# core with `perf record -e cpu-clock` while `invoker-bench` runs one round, then prints, per
# request, each process group's CPU (the load generator, the invoker, the runtimes, python, the
# idle cores) on the direct side and on the invoker side, and the symbols of the runtimes and
# of python whose cost differs most between the two sides, then the invoker's own top symbols.
# The same runtime binary and the same python serve both sides, so a symbol that costs more on
# the invoker side costs more because of how it is called, not because of what it runs.
#
#   scripts/perf-split.sh          # builds the release binaries first; installs perf if missing
#   SLICE=5 TOP=30 scripts/perf-split.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v perf >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null
fi
cargo build --release --bins -p invoker -p invoker-bench --features invoker/test-util >&2
bin="${CARGO_TARGET_DIR:-target}/release"
work="$(mktemp -d /tmp/perf-split-XXXXXX)"
trap 'rm -rf "$work"' EXIT
k="${K:-8}" slice="${SLICE:-3}" hz=4999

# perf names a sample's process but not its parent, and the runtimes of both sides run the same
# binary: a sampler notes each process's parent and command line while the benchmark runs.
touch "$work/running"
python3 - "$work" <<'PY' &
import json, os, sys, time
work, seen = sys.argv[1], {}
while os.path.exists(f"{work}/running"):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if pid not in seen:
            try:
                parent = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
                seen[pid] = (parent, open(f"/proc/{pid}/cmdline").read().replace("\0", " "))
            except (OSError, IndexError, ValueError):
                pass
    time.sleep(0.2)
json.dump(seen, open(f"{work}/processes.json", "w"))
PY
sampler=$!
perf record -q -a -F "$hz" -e cpu-clock -o "$work/perf.data" -- \
  "$bin/invoker-bench" --k "$k" --slice "$slice" --rounds 1 --cold 1 2>"$work/bench.txt" >/dev/null
rm -f "$work/running"
wait "$sampler"
grep -E "^c=$k " "$work/bench.txt" | grep "req/s"
perf script -i "$work/perf.data" -F pid,time,ip,sym,dso 2>/dev/null >"$work/samples.txt"

python3 - "$work" "$k" "$slice" "$hz" "${TOP:-20}" <<'PY'
import collections, json, re, sys
work, k, slice_s, hz, top = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
processes = json.load(open(f"{work}/processes.json"))
bench = open(f"{work}/bench.txt").read()
rps = {side: float(re.search(rf"^c={k}\s+{side}\s+(\d+) req/s", bench, re.M).group(1)) for side in ("direct", "invoker")}

def group(pid):
    """(side, group) of a process; a python exec'd by a runtime keeps the runtime's child pid."""
    if pid == 0:
        return ("both", "idle")
    parent, cmd = processes.get(str(pid), (0, ""))
    parent_cmd = processes.get(str(parent), (0, ""))[1]
    side = lambda c: "direct" if "invoker-bench-direct" in c else "invoker"
    if "action-runtime" in cmd:
        return (side(cmd), "runtime")
    if "action-runtime" in parent_cmd:
        return (side(parent_cmd), "python")
    if "invoker --config" in cmd:
        return ("invoker", "invoker")
    if "invoker-bench" in cmd:
        return ("both", "load generator")
    return ("both", "other")

line = re.compile(r"^\s*(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")
samples = []
for text in open(f"{work}/samples.txt"):
    m = line.match(text)
    if m:
        pid, t, sym, dso = m.groups()
        kernel = dso.startswith("[kernel")
        samples.append((float(t), group(int(pid)), sym, "kernel" if kernel else dso.rsplit("/", 1)[-1]))
t0 = samples[0][0]

# The slices: runs of 100 ms where one side's runtimes and pythons take nearly all the samples.
busy = collections.defaultdict(collections.Counter)
for t, (side, name), _, _ in samples:
    if name in ("runtime", "python"):
        busy[int((t - t0) * 10)][side] += 1
slices = []
for tick in sorted(busy):
    d, i = busy[tick]["direct"], busy[tick]["invoker"]
    side = "direct" if d > 20 and d > 3 * i else "invoker" if i > 20 and i > 3 * d else None
    if side and slices and slices[-1][0] == side and tick - slices[-1][2] <= 3:
        slices[-1][2] = tick
    elif side:
        slices.append([side, tick, tick])
slices = [s for s in slices if s[2] - s[1] >= slice_s * 5]
last = {s[0]: s for s in slices}  # the c=K slices come after the c=1 ones
if set(last) != {"direct", "invoker"}:
    sys.exit(f"perf-split: could not find both c={k} slices in the samples ({slices})")

us = 1e6 / hz
per_request = {}
for side, (_, lo, hi) in last.items():
    start, end = t0 + lo / 10, t0 + (hi + 1) / 10
    requests = rps[side] * (end - start)
    groups, symbols = collections.Counter(), collections.Counter()
    for t, (owner, name), sym, dso in samples:
        if start <= t < end and owner in (side, "both"):
            where = "kernel" if dso == "kernel" else "user"
            groups[(name, where)] += 1
            symbols[(name, dso, sym)] += 1
    per_request[side] = ({g: n * us / requests for g, n in groups.items()}, {s: n * us / requests for s, n in symbols.items()}, requests)

print(f"\nc={k}, µs of CPU per request (perf cpu-clock at {hz} Hz; {int(per_request['direct'][2])} direct and {int(per_request['invoker'][2])} invoker requests)")
print(f"{'':18} {'direct':>22} {'invoker side':>22}")
for name in ("load generator", "invoker", "runtime", "python", "idle", "other"):
    cells = []
    for side in ("direct", "invoker"):
        g = per_request[side][0]
        user, kernel = g.get((name, "user"), 0), g.get((name, "kernel"), 0)
        cells.append(f"{user + kernel:6.1f} ({user:5.1f} + {kernel:5.1f})" if user + kernel >= 0.05 else f"{'—':>22}")
    print(f"{name:18} {cells[0]:>22} {cells[1]:>22}")
print(" " * 19 + "total (user + kernel)")

def table(title, keys, sides):
    print(f"\n{title}")
    for key in keys:
        cells = "".join(f"{per_request[s][1].get(key, 0):9.2f}" for s in sides)
        print(f"{cells}  {key[0]:8} {key[1][:14]:14} {key[2][:70]}")

d, i = per_request["direct"][1], per_request["invoker"][1]
shared = [key for key in set(d) | set(i) if key[0] in ("runtime", "python")]
shared.sort(key=lambda key: d.get(key, 0) - i.get(key, 0))
table("runtime and python symbols costing more on the invoker side (direct, invoker side):", shared[:top], ("direct", "invoker"))
own = sorted((key for key in i if key[0] == "invoker"), key=lambda key: -i[key])
table("the invoker's own top symbols:", own[:top], ("invoker",))
PY
