#!/usr/bin/env bash
# The cluster under faults, as an operator meets them: starts its own etcd (one member, loopback
# only, data under a directory of its own), two invokers and a scheduler on config/cluster.toml,
# runs a bounded load of blocking invokes through the scheduler (6 callers, a 50 ms python
# action), and injects one fault per run:
#   etcd frozen 20 s          SIGSTOP, then SIGCONT (a partition or a long fsync stall looks the same)
#   one invoker frozen 15 s   SIGSTOP, then SIGCONT (a GC pause, a stalled disk)
#   one invoker cut from etcd 25 s   its path to etcd alone black-holed, past its lease and the
#                             scheduler's grace (a partition between it and etcd), then healed
#   scheduler killed          SIGKILL, and started again at once on the same port and data
#   one invoker killed        SIGKILL under load, started again 10 s later on the same data
#   etcd restarted empty      an operator drains inv1, then etcd loses its data and restarts
# and prints a table per fault: requests, succeeded, 503s (nothing ran: safe to retry), 502s (it
# may have run), failed records (an activation that ran, or may have, ended in error), guesses
# still standing at the end (records written without seeing the end, not replaced by the
# invoker's own), accepted without a record, activations that started on an invoker an operator
# had drained, and seconds in which no request succeeded.
# Then a second cluster on a 3-member etcd: the member that serves the scheduler's watches is
# frozen 30 s while an operator drains one invoker (through a live member), a new invoker
# starts and another is SIGKILLed; it prints how many activations started on the drained
# invoker after its drain, and when the scheduler saw the new invoker and lost the killed one.
# Last, two capacity managers on one data dir hand the lead back and forth: the leader frozen
# 30 s, the standby leads and drains one of the invokers (busy, so it stays draining), which is
# SIGKILLed; the first is thawed, then the second SIGKILLed. It prints the zombies left, whether
# the dead invoker's files went, and the counts of `GET /v1/capacity` against the processes and
# the registrations at the end.
# Then the durable queue of asynchronous calls (scripts/chaos_queue.py): on one invoker a burst
# of ten times what it runs, a SIGKILL with calls queued and running, calls past their maximum
# age to the dead-letter list and driven again; then a scheduler in front of two invokers, one
# SIGKILLed mid-burst (what it held unstarted runs on the other).
# Every run stops by itself (about 10 minutes in all).
#
#   scripts/chaos.sh           # release build; as root the invokers isolate their containers
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v etcd >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
fi
cargo build --release --bin invoker >&2
work=$(mktemp -d /tmp/invoker-chaos-XXXXXX)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT
python3 - "${CARGO_TARGET_DIR:-target}/release/invoker" "$work" <<'PY'
import json, os, select, signal, socket, sys, threading, time
sys.path.insert(0, "scripts")
from cluster_harness import GUEST, Cluster, EtcdMembers, free_port, request

exe, work = sys.argv[1:3]
etcd_members = EtcdMembers(work, 1)
etcd = etcd_members.urls()
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


def invokers(base, name):
    status, _, body = request("GET", base + "/v1/invokers", key=cluster.admin_key(name), timeout=5)
    return json.loads(body) if status == 200 else []


def wait_healthy(count, base=base, name="sched", bound=60):
    deadline = time.time() + bound
    while time.time() < deadline:
        # Healthy, and its headroom published (the record an invoker claims its key with has none).
        ready = [i for i in invokers(base, name) if i.get("health") == "healthy" and i.get("nodes") and not i.get("drained")]
        if len(ready) == count:
            return
        time.sleep(0.2)
    sys.exit("the invokers never all registered healthy")


def put_action(base):
    code = "import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'ok': True}\n"
    status, _, body = request("PUT", base + "/api/v1/namespaces/_/actions/chaos?overwrite=true",
                              {"exec": {"kind": "python:3", "code": code}, "limits": {"memory": 128}})
    assert status == 200, body


def annotation(record, key):
    return next((a.get("value") for a in record.get("annotations", []) if a.get("key") == key), None)


wait_healthy(2)
put_action(base)
drained = {}  # invoker -> when an operator drained it (a record that started after it is a defect)


def restart_scheduler():
    procs["sched"].kill(); procs["sched"].wait()
    procs["sched"] = start("sched", ["scheduler", "--scheduler-id", "chaos"], ports["sched"])


def kill_inv0():
    os.killpg(procs["inv0"].pid, signal.SIGKILL); procs["inv0"].wait()


def restart_inv0():
    procs["inv0"] = start("inv0", ["--invoker-id", "inv0"], ports["inv0"])


def drain_inv1_then_wipe_etcd():
    status, _, body = request("POST", base + "/v1/invokers/inv1/drain", key=cluster.admin_key("sched"))
    assert status == 200, body
    drained["inv1"] = time.time()
    time.sleep(2)
    etcd_members.wipe()


def activate_inv1():
    request("POST", base + "/v1/invokers/inv1/activate", key=cluster.admin_key("sched"))
    drained.pop("inv1", None)


faults = [
    ("etcd frozen 20 s", lambda: etcd_members.freeze(0), 20, lambda: etcd_members.thaw(0), 12),
    ("one invoker frozen 15 s", lambda: os.killpg(procs["inv0"].pid, signal.SIGSTOP), 15,
     lambda: os.killpg(procs["inv0"].pid, signal.SIGCONT), 12),
    ("one invoker cut from etcd 25 s", lambda: setattr(partition, "cut", True), 25, partition.heal, 15),
    ("scheduler killed, restarted", restart_scheduler, 0, lambda: None, 15),
    ("one invoker killed, restarted", kill_inv0, 10, restart_inv0, 15),
    ("etcd restarted empty, drained", drain_inv1_then_wipe_etcd, 15, lambda: None, 5),
]


def load(base, callers, results, lock, stop):
    def caller():
        while not stop.is_set():
            started = time.time()
            status, aid, body = request("POST", base + "/api/v1/namespaces/_/actions/chaos?blocking=true", {"sleep": 0.05})
            with lock:
                results.append((started, time.time(), status, aid, body))
            if status in (0, 502, 503):
                time.sleep(0.05)  # a refused caller does not spin
    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads: t.start()
    return threads


rows = []
for name, inject, held, undo, after in faults:
    wait_healthy(2)
    results, lock, stop = [], threading.Lock(), threading.Event()
    began = time.time()
    threads = load(base, 6, results, lock, stop)
    time.sleep(5); inject(); time.sleep(held); undo(); time.sleep(after)
    stop.set()
    for t in threads: t.join()
    ended = time.time()
    ok = sum(1 for r in results if r[2] == 200)
    refused = sum(1 for r in results if r[2] == 503)
    maybe = sum(1 for r in results if r[2] == 502)
    failed, unrecorded, guesses, on_drained = 0, 0, 0, 0
    for r in results:
        if r[3] is None:
            continue
        status, _, body = request("GET", base + f"/api/v1/namespaces/_/activations/{r[3]}", timeout=10)
        if status != 200:
            unrecorded += 1
            continue
        record = json.loads(body)
        if record["response"]["statusCode"] != 0 and annotation(record, "rejected") is None:
            failed += 1
        if annotation(record, "guess") is not None:
            guesses += 1
        ran_on = annotation(record, "invoker")
        if ran_on in drained and record["start"] / 1000 > drained[ran_on] + 1:
            on_drained += 1
    activate_inv1()
    seconds = int(ended - began)
    dark = sum(1 for s in range(seconds) if not any(r[2] == 200 and began + s <= r[1] < began + s + 1 for r in results))
    rows.append((name, len(results), ok, refused, maybe, failed, guesses, unrecorded, on_drained, dark))
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
print(f"{'fault':<31} {'requests':>8} {'succeeded':>9} {'503s':>5} {'502s':>5} {'failed records':>14} "
      f"{'guesses':>7} {'no record':>9} {'on drained':>10} {'s without success':>17}")
for row in rows:
    print(f"{row[0]:<31} {row[1]:>8} {row[2]:>9} {row[3]:>5} {row[4]:>5} {row[5]:>14} {row[6]:>7} {row[7]:>9} "
          f"{row[8]:>10} {row[9]:>17}")
cluster.stop_all()  # every process this section started (those stopped before are skipped)

# A second cluster on three etcd members. Every process lists them in the same order, so the
# scheduler's watches are on the first; that member is frozen 30 s.
three = EtcdMembers(work, 3, name="etcd3")
ports3 = {"a0": free_port(), "a1": free_port(), "a2": free_port(), "s3": free_port()}
procs3 = {n: start(n, ["--invoker-id", n], ports3[n], etcd=three.urls()) for n in ("a0", "a1")}
procs3["s3"] = start("s3", ["scheduler", "--scheduler-id", "chaos3"], ports3["s3"], etcd=three.urls())
base3 = f"http://127.0.0.1:{ports3['s3']}"
wait_healthy(2, base3, "s3")
put_action(base3)
results, lock, stop = [], threading.Lock(), threading.Event()
threads = load(base3, 6, results, lock, stop)
time.sleep(5)
frozen_at = time.time()
three.freeze(0)
time.sleep(12)
drain_status, _, _ = request("POST", base3 + "/v1/invokers/a1/drain", key=cluster.admin_key("s3"))
drained_at = time.time()
procs3["a2"] = start("a2", ["--invoker-id", "a2"], ports3["a2"], etcd=three.urls())
new_at = time.time()
time.sleep(2)
os.killpg(procs3["a0"].pid, signal.SIGKILL)
killed_at = time.time()
seen_new, lost_killed, thawed = None, None, False
# Watched past the thaw: a killed invoker leaves the view a lease TTL and a grace after its
# last renewal (10 s and 10 s with config/cluster.toml), frozen member or not.
while time.time() < killed_at + 30 and (seen_new is None or lost_killed is None):
    if not thawed and time.time() >= frozen_at + 30:
        three.thaw(0)
        thawed = True
    ids = {i["id"]: i for i in invokers(base3, "s3")}
    if seen_new is None and ids.get("a2", {}).get("nodes"):
        seen_new = time.time() - new_at
    if lost_killed is None and "a0" not in ids:
        lost_killed = time.time() - killed_at
    time.sleep(0.1)
while not thawed and time.time() < frozen_at + 30:
    time.sleep(0.1)
if not thawed:
    three.thaw(0)
time.sleep(5)
stop.set()
for t in threads: t.join()
on_drained = 0
for r in results:
    if r[3] is None or r[0] < drained_at + 1:
        continue
    status, _, body = request("GET", base3 + f"/api/v1/namespaces/_/activations/{r[3]}", timeout=10)
    if status == 200 and annotation(json.loads(body), "invoker") == "a1":
        on_drained += 1
print()
print("3-member etcd, the watches' member frozen 30 s:")
print(f"  requests {len(results)}, succeeded {sum(1 for r in results if r[2] == 200)}; drain answered {drain_status}")
print(f"  activations started on the drained invoker more than 1 s after its drain: {on_drained}")
never = "not within 30 s"
print(f"  a new invoker in the scheduler's view {'%.1f s' % seen_new if seen_new is not None else never} after it started")
print(f"  a SIGKILLed invoker out of the view {'%.1f s' % lost_killed if lost_killed is not None else never} after its kill"
      " (its lease 10 s, then the scheduler's grace 10 s)")
cluster.stop_all()  # every process this section started (those stopped before are skipped)

# Two capacity managers on one data dir (the second's is a link to the first's).
import base64, re, shutil, urllib.request
etcd_cap = EtcdMembers(work, 1, name="etcd-cap")


def manager_config(group):
    text = open("config/cluster.toml").read()
    return re.sub(r"\[capacity\.groups\.default\]\n(?:[^\[\n].*\n|\n)*", "[capacity.groups.default]\n" + group, text)


os.makedirs(os.path.join(work, "cap-a"))
leading = Cluster(exe, os.path.join(work, "cap-a"), etcd_cap.urls(), manager_config("min = 2\nmax = 2\ninvoker_memory_mb = 256\n"))
standby_work = os.path.join(work, "cap-b")
os.makedirs(standby_work)
standby = Cluster(exe, standby_work, etcd_cap.urls(), manager_config(
    "min = 1\nmax = 2\ninvoker_memory_mb = 256\nscale_down_after = \"1s\"\ndrain_deadline = \"60s\"\n"))
os.symlink(os.path.join(work, "cap-a", "a"), os.path.join(standby_work, "b"))
cap_ports = {"a": free_port(), "b": free_port()}
managers = {"a": leading.start("a", ["capacity"], cap_ports["a"])}
invokers_dir = os.path.join(work, "cap-a", "a", "invokers")


def capacity_of(name, owner):
    status, _, body = request("GET", f"http://127.0.0.1:{cap_ports[name]}/v1/capacity", key=owner.admin_key(name), timeout=5)
    return json.loads(body) if status == 200 else {}


def etcd_range(prefix):
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                       "range_end": base64.b64encode(end.encode()).decode()}).encode()
    req = urllib.request.Request(etcd_cap.urls().split(",")[0] + "/v3/kv/range", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            kvs = json.loads(r.read()).get("kvs", [])
    except Exception:
        return {}
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode() for kv in kvs}


def serving():
    """The invoker processes of the managers' data dir, by id (from /proc, not the pid files)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and any(invokers_dir.encode() in a for a in args) and b"--invoker-id" in args:
            found[args[args.index(b"--invoker-id") + 1].decode()] = int(pid)
    return found


def zombies_of(pid):
    n = 0
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        n += fields[0] == "Z" and fields[1] == str(pid)
    return n


def until(pred, bound):
    deadline = time.time() + bound
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def counted(status):
    counts = (status.get("groups") or [{}])[0].get("counts", {})
    return sum(counts.get(k, 0) for k in ("provisioning", "active", "draining", "removing")), counts


ok = until(lambda: capacity_of("a", leading).get("groups", [{}])[0].get("counts", {}).get("active") == 2, 60)
if not ok:
    sys.exit("the first capacity manager never had its two invokers")
for value in etcd_range("/invoker/invokers/").values():
    api = json.loads(value)["api"]
    code = "import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'ok': True}\n"
    request("PUT", api + "/api/v1/namespaces/_/actions/busy?overwrite=true",
            {"exec": {"kind": "python:3", "code": code}, "limits": {"memory": 128}})
    request("POST", api + "/api/v1/namespaces/_/actions/busy", {"sleep": 30})
managers["b"] = standby.start("b", ["capacity"], cap_ports["b"])
time.sleep(2)
os.kill(managers["a"].pid, signal.SIGSTOP)
frozen_at = time.time()
drained_id = None
while drained_id is None and time.time() < frozen_at + 25:
    for key, value in etcd_range("/invoker/drain/").items():
        if "capacity" in value:
            drained_id = key.rsplit("/", 1)[-1]
    time.sleep(0.05)
cleaned = "no drain seen"
if drained_id is not None:
    pid = serving().get(drained_id)
    if pid:
        os.kill(pid, signal.SIGKILL)
    killed = time.time()
    gone = until(lambda: not os.path.exists(os.path.join(invokers_dir, drained_id + ".pid"))
                 and not os.path.exists(os.path.join(invokers_dir, drained_id)), 20)
    cleaned = f"removed {time.time() - killed:.1f} s after its kill" if gone else "left behind (20 s)"
b_total, b_counts = counted(capacity_of("b", standby))
b_procs, b_regs = len(serving()), len(etcd_range("/invoker/invokers/"))
while time.time() < frozen_at + 30:
    time.sleep(0.1)
os.kill(managers["a"].pid, signal.SIGCONT)
until(lambda: capacity_of("a", leading).get("leader") is False, 20)
time.sleep(3)
zombies = zombies_of(managers["a"].pid)
managers["b"].kill(); managers["b"].wait()
relead = time.time()
def settled():
    total, counts = counted(capacity_of("a", leading))
    return counts.get("active") == 2 and total == 2 and len(serving()) == 2 and len(etcd_range("/invoker/invokers/")) == 2
settled_in = f"{time.time() - relead:.1f} s" if until(settled, 40) else "not within 40 s"
a_total, a_counts = counted(capacity_of("a", leading))
print()
print("Two capacity managers on one data dir, the leader frozen 30 s, then the standby killed:")
print(f"  the invoker killed while the standby drained it ({drained_id}): its pid file and data {cleaned}")
print(f"  the standby's counts {b_total} ({b_counts}); invoker processes {b_procs}; registrations {b_regs}")
print(f"  zombies of the first manager 3 s after it stepped down: {zombies}")
print(f"  the first leading again: two active, each a process and a registration, after {settled_in}")
print(f"  at the end: counts {a_total} ({a_counts}); processes {len(serving())}; registrations "
      f"{len(etcd_range('/invoker/invokers/'))}; pid files {len([f for f in os.listdir(invokers_dir) if f.endswith('.pid')])}")
for m in managers.values():
    if m.poll() is None:
        os.kill(m.pid, signal.SIGCONT); m.terminate(); m.wait(timeout=30)
for pid in serving().values():
    os.kill(pid, signal.SIGTERM)
PY
mkdir -p "$work/queue"
python3 scripts/chaos_queue.py "${CARGO_TARGET_DIR:-target}/release/invoker" "$work/queue"
