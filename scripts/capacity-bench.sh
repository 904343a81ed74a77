#!/usr/bin/env bash
# How long the local control plane takes to answer a burst: from a burst's first waiting
# activation (one the running invokers have no room for) to the first activation served by a new
# invoker, 10 times. Starts its own etcd, a scheduler and `invoker capacity` on
# config/cluster.toml (the shipped tick, refresh and process factory), with the group `default`
# at min 1, max 2, 256 MB per invoker, and scale-down after 3 s, so that each sample begins
# with one invoker. Prints each sample and the p50 (the start of the activation on the new
# invoker, from its record, minus when it was sent), and first what the cluster at rest asks of
# etcd per second (etcd's own request counters over 10 s). Stops by itself (about 2 minutes).
#
#   scripts/capacity-bench.sh        # release build
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin invoker >&2
# Short: the invokers' runtime sockets live below it.
work=$(mktemp -d /tmp/icb-XXXXXX)
trap 'pkill -P $$ 2>/dev/null || true; for f in "$work"/capacity/invokers/*.pid; do [ -f "$f" ] && kill "$(cut -d" " -f1 "$f")" 2>/dev/null; done; [ -f "$work/etcd/etcd.pid" ] && kill "$(cat "$work/etcd/etcd.pid")" 2>/dev/null; sleep 1; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
etcd=$(INVOKER_ETCD_DIR="$work/etcd" bash scripts/etcd.sh | tail -1 | cut -d= -f2)
python3 - "${CARGO_TARGET_DIR:-target}/release/invoker" "$work" "$etcd" <<'PY'
import json, re, sys, threading, time, urllib.request
sys.path.insert(0, "scripts")
from cluster_harness import Cluster, free_port, request

exe, work, etcd = sys.argv[1:4]
group = ("[capacity.groups.default]\nmin = 1\nmax = 2\ninvoker_memory_mb = 256\n"
         "scale_down_after = \"3s\"\ndrain_deadline = \"10s\"\npredictor = \"conservative\"\n")
config = re.sub(r"\[capacity\.groups\.default\]\n(?:[^\[\n].*\n|\n)*", group, open("config/cluster.toml").read())
cluster = Cluster(exe, work, etcd, config)

ports = {"sched": free_port(), "capacity": free_port()}
procs = {"sched": cluster.start("sched", ["scheduler"], ports["sched"]),
         "capacity": cluster.start("capacity", ["capacity"], ports["capacity"])}
base = f"http://127.0.0.1:{ports['sched']}"
capacity_key = cluster.admin_key("capacity")

def active():
    status, _, body = request("GET", f"http://127.0.0.1:{ports['capacity']}/v1/capacity", key=capacity_key, timeout=5)
    groups = json.loads(body)["groups"] if status == 200 else []
    return groups[0]["counts"] if groups else {}

def wait_for(pred, what, bound=60):
    deadline = time.time() + bound
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.1)
    sys.exit("not within %d s: %s" % (bound, what))

cluster.admin_key("sched")
code = "import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'ok': True}\n"
wait_for(lambda: active().get("active") == 1, "one invoker (min 1)")
for name in ("hold", "burst"):
    status, _, body = request("PUT", base + f"/api/v1/namespaces/_/actions/{name}?overwrite=true",
                           {"exec": {"kind": "python:3", "code": code}, "limits": {"memory": 256}})
    assert status == 200, body
# Warm the running invoker with both actions, so that the sample measures the new invoker only.
for name in ("hold", "burst"):
    request("POST", base + f"/api/v1/namespaces/_/actions/{name}?blocking=true", {})

def etcd_requests():
    """etcd's requests so far, by gRPC method (the JSON gateway's calls included)."""
    counts = {}
    for line in urllib.request.urlopen(etcd + "/metrics", timeout=5).read().decode().splitlines():
        m = re.match(r'grpc_server_started_total\{.*grpc_method="(\w+)".*\} (\S+)', line)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + float(m.group(2))
    return counts

# The cluster at rest (one invoker, the scheduler, the manager, nothing running): what it asks
# of etcd by itself, over 10 s.
wait_for(lambda: active() == {"provisioning": 0, "active": 1, "draining": 0, "removing": 0}, "one invoker at rest")
before, rest_started = etcd_requests(), time.time()
time.sleep(10)
after, rest_took = etcd_requests(), time.time() - rest_started
at_rest = {m: round((after.get(m, 0) - before.get(m, 0)) / rest_took, 1) for m in after if after.get(m, 0) > before.get(m, 0)}
print(f"etcd requests per second at rest, by method: {at_rest}", file=sys.stderr)

samples = []
for i in range(10):
    wait_for(lambda: active() == {"provisioning": 0, "active": 1, "draining": 0, "removing": 0}, "back to one invoker")
    time.sleep(1.5)  # the scheduler reads the one invoker's room again
    holder = threading.Thread(target=request, args=("POST", base + "/api/v1/namespaces/_/actions/hold?blocking=true", {"sleep": 8}))
    holder.start()
    time.sleep(0.5)  # the hold runs; the invoker's record shows it full
    sent = time.time()
    status, _, body = request("POST", base + "/api/v1/namespaces/_/actions/burst?blocking=true", {})
    record = json.loads(body)
    ran_on = next((a["value"] for a in record.get("annotations", []) if a["key"] == "invoker"), None)
    if status != 200 or ran_on == "default-0":
        sys.exit(f"sample {i}: {status} on {ran_on}: {body[:300]}")
    took = record["start"] / 1000.0 - sent
    samples.append(took)
    print(f"sample {i}: {took * 1000:.0f} ms from the waiting activation to its start on {ran_on}", file=sys.stderr)
    holder.join()

samples.sort()
p50 = (samples[4] + samples[5]) / 2
print(json.dumps({"burst_to_new_invoker_ms_p50": round(p50 * 1000), "samples_ms": [round(s * 1000) for s in samples],
                  "etcd_at_rest_requests_per_s": round(sum(at_rest.values()), 1), "etcd_at_rest_by_method": at_rest}))
for p in procs.values():
    p.terminate()
    p.wait(timeout=30)
PY
