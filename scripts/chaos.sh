#!/usr/bin/env bash
# The cluster under faults, as an operator meets them: starts its own etcd (scripts/etcd.sh in a
# directory of its own), two invokers and a scheduler on config/cluster.toml (loopback only), runs
# a bounded load of blocking invokes through the scheduler (6 callers, a 50 ms python action), and
# injects one fault per run:
#   etcd frozen 20 s          SIGSTOP, then SIGCONT (a partition or a long fsync stall looks the same)
#   one invoker frozen 15 s   SIGSTOP, then SIGCONT (a GC pause, a stalled disk)
#   one invoker cut from etcd 25 s   its path to etcd alone black-holed, past its lease and the
#                             scheduler's grace (a partition between it and etcd), then healed
#   scheduler killed          SIGKILL, and started again at once on the same port and data
# and prints a table per fault: requests, succeeded, 503s, failed records (an activation that
# ran, or may have, ended in error), accepted without a record, and seconds in which no request
# succeeded. Every run stops by itself (about 3 minutes in all).
#
#   scripts/chaos.sh           # release build; as root the invokers isolate their containers
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin invoker >&2
work=$(mktemp -d /tmp/invoker-chaos-XXXXXX)
trap 'pkill -P $$ 2>/dev/null || true; [ -f "$work/etcd/etcd.pid" ] && kill -CONT "$(cat "$work/etcd/etcd.pid")" 2>/dev/null; [ -f "$work/etcd/etcd.pid" ] && kill "$(cat "$work/etcd/etcd.pid")" 2>/dev/null; rm -rf "$work"' EXIT
etcd=$(INVOKER_ETCD_DIR="$work/etcd" bash scripts/etcd.sh | tail -1 | cut -d= -f2)
python3 - "${CARGO_TARGET_DIR:-target}/release/invoker" "$work" "$etcd" <<'PY'
import json, os, select, signal, socket, sys, threading, time
sys.path.insert(0, "scripts")
from cluster_harness import Cluster, free_port, request

exe, work, etcd = sys.argv[1:4]
cluster = Cluster(exe, work, etcd, open("config/cluster.toml").read())
start = cluster.start

class Partition:
    """A loopback path to etcd for one process, that can be cut: cut, nothing moves and nothing
    closes (a network dropping packets; new connections are taken and left hanging); healed,
    the connections held through the cut close and new ones go through."""

    def __init__(self, target):
        self.target = target
        self.cut, self.epoch, self.held = False, 0, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.sock.accept()
            if self.cut:
                self.held.append(client)
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self.carry, args=(client, server, self.epoch), daemon=True).start()

    def carry(self, client, server, epoch):
        peer = {client: server, server: client}
        while epoch == self.epoch:
            if self.cut:
                time.sleep(0.01)
                continue
            ready, _, _ = select.select([client, server], [], [], 0.05)
            for s in ready:
                data = s.recv(65536)
                if not data:
                    epoch = None
                    break
                peer[s].sendall(data)
        client.close(); server.close()

    def heal(self):
        self.epoch += 1
        held, self.held = self.held, []
        for c in held:
            c.close()
        self.cut = False

etcd_host, etcd_port = etcd.rsplit("/", 1)[-1].rsplit(":", 1)
partition = Partition((etcd_host, int(etcd_port)))

ports = {"inv0": free_port(), "inv1": free_port(), "sched": free_port()}
procs = {}
procs["inv0"] = start("inv0", ["--invoker-id", "inv0"], ports["inv0"])
# inv1 reaches etcd through the partition, open until its fault.
procs["inv1"] = start("inv1", ["--invoker-id", "inv1"], ports["inv1"], etcd=partition.url)
procs["sched"] = start("sched", ["scheduler", "--scheduler-id", "chaos"], ports["sched"])
base = f"http://127.0.0.1:{ports['sched']}"

def wait_healthy(count, bound=60):
    key = cluster.admin_key("sched")
    deadline = time.time() + bound
    while time.time() < deadline:
        status, _, body = request("GET", base + "/v1/invokers", key=key, timeout=5)
        # Healthy, and its headroom published (the record an invoker claims its key with has none).
        ready = [i for i in json.loads(body) if i.get("health") == "healthy" and i.get("nodes")] if status == 200 else []
        if len(ready) == count:
            return
        time.sleep(0.2)
    sys.exit("the invokers never all registered healthy")

wait_healthy(2)
code = "import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'ok': True}\n"
status, _, body = request("PUT", base + "/api/v1/namespaces/_/actions/chaos?overwrite=true",
                          {"exec": {"kind": "python:3", "code": code}, "limits": {"memory": 128}})
assert status == 200, body

def etcd_pid():
    return int(open(os.path.join(work, "etcd", "etcd.pid")).read())

def restart_scheduler():
    procs["sched"].kill(); procs["sched"].wait()
    procs["sched"] = start("sched", ["scheduler", "--scheduler-id", "chaos"], ports["sched"])

faults = [
    ("etcd frozen 20 s", lambda: os.kill(etcd_pid(), signal.SIGSTOP), 20, lambda: os.kill(etcd_pid(), signal.SIGCONT), 12),
    ("one invoker frozen 15 s", lambda: os.killpg(procs["inv0"].pid, signal.SIGSTOP), 15,
     lambda: os.killpg(procs["inv0"].pid, signal.SIGCONT), 12),
    ("one invoker cut from etcd 25 s", lambda: setattr(partition, "cut", True), 25, partition.heal, 15),
    ("scheduler killed, restarted", restart_scheduler, 0, lambda: None, 15),
]

rows = []
for name, inject, held, undo, after in faults:
    wait_healthy(2)
    results, lock, stop = [], threading.Lock(), threading.Event()
    def caller():
        while not stop.is_set():
            started = time.time()
            status, aid, body = request("POST", base + "/api/v1/namespaces/_/actions/chaos?blocking=true", {"sleep": 0.05})
            with lock:
                results.append((started, time.time(), status, aid, body))
            if status in (0, 503):
                time.sleep(0.05)  # a refused caller does not spin
    threads = [threading.Thread(target=caller) for _ in range(6)]
    began = time.time()
    for t in threads: t.start()
    time.sleep(5); inject(); time.sleep(held); undo(); time.sleep(after)
    stop.set()
    for t in threads: t.join()
    ended = time.time()
    ok = sum(1 for r in results if r[2] == 200)
    refused = sum(1 for r in results if r[2] == 503)
    failed, unrecorded = 0, 0
    for r in results:
        if r[3] is None:
            continue
        status, _, body = request("GET", base + f"/api/v1/namespaces/_/activations/{r[3]}", timeout=10)
        if status != 200:
            unrecorded += 1
            continue
        record = json.loads(body)
        rejected = any(a.get("key") == "rejected" for a in record.get("annotations", []))
        if record["response"]["statusCode"] != 0 and not rejected:
            failed += 1
    seconds = int(ended - began)
    dark = sum(1 for s in range(seconds) if not any(r[2] == 200 and began + s <= r[1] < began + s + 1 for r in results))
    rows.append((name, len(results), ok, refused, failed, unrecorded, dark))
    reasons = {}
    for r in results:
        if r[2] not in (200,):
            try:
                said = json.loads(r[4])
                said = said.get("error") or said.get("response", {}).get("result", {}).get("error") or str(said)[:120]
            except Exception:
                said = r[4][:120].decode(errors="replace")
            key = (r[2], said[:140])
            first, last, n = reasons.get(key, (r[0], r[0], 0))
            reasons[key] = (min(first, r[0]), max(last, r[0]), n + 1)
    for (status, said), (first, last, n) in sorted(reasons.items(), key=lambda kv: -kv[1][2])[:5]:
        print(f"  {name}: {n} x {status} {said} (from {first - began - 5:.1f} s to {last - began - 5:.1f} s after the fault)",
              file=sys.stderr)

print()
print(f"{'fault':<30} {'requests':>9} {'succeeded':>10} {'503s':>6} {'failed records':>15} {'no record':>10} {'s without success':>18}")
for row in rows:
    print(f"{row[0]:<30} {row[1]:>9} {row[2]:>10} {row[3]:>6} {row[4]:>15} {row[5]:>10} {row[6]:>18}")
for p in procs.values():
    try:
        os.killpg(p.pid, signal.SIGCONT); p.terminate(); p.wait(timeout=30)
    except Exception:
        p.kill()
PY
