"""The durable queue of asynchronous calls under faults, on one invoker (the process factory,
room for two 128 MB containers, a blocking wait of 2 s, retries 200 ms apart). scripts/chaos.sh
runs it last; alone:

    python3 scripts/chaos_queue.py target/release/invoker

  burst      200 non-blocking calls of a 0.1 s action at once: ten times what the pool runs in
             its blocking wait
  SIGKILL    100 calls of 0.3 s, the invoker SIGKILLed 1 s in and started again on its data
  age        five calls that cannot start (another action holds every container) past their
             maximum age of 60 s: dead letters, driven again once there is room
  cluster    a scheduler in front of two invokers (its own etcd): 300 non-blocking calls of
             0.3 s, one invoker SIGKILLed 1 s in and never started again; the calls it held
             unstarted run on the other, those it had started follow their retry policy

Each prints what was accepted, what ended and how, and what was lost (accepted, never ended).
Stops by itself (about three minutes)."""

import json, os, signal, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import GUEST, Cluster, EtcdMembers, free_port, request

exe = sys.argv[1]
work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="invoker-chaos-queue-")
unprivileged = "" if os.geteuid() == 0 else "unprivileged = false\n"
config_path = os.path.join(work, "queue.toml")
with open(config_path, "w") as f:
    f.write(f'invoker_id = "chaosq{os.getpid()}"\n[factory.process]\nuser_memory_mb = 256\n{unprivileged}'
            '[pool]\nwait_deadline = "2s"\n[queue]\nretry_backoff = "200ms"\n')
port = free_port()
base = f"http://127.0.0.1:{port}/api/v1/namespaces/_"
procs = []


def start():
    out = open(os.path.join(work, "queue.out"), "w")
    err = open(os.path.join(work, "queue.err"), "a")
    proc = subprocess.Popen([exe, "--config", config_path, "--listen", f"127.0.0.1:{port}", "--data-dir",
                             os.path.join(work, "data")], stdout=out, stderr=err, start_new_session=True)
    procs.append(proc)
    for _ in range(600):
        if "listening on" in open(os.path.join(work, "queue.out")).read():
            return proc
        time.sleep(0.05)
    sys.exit("the invoker did not start: " + open(os.path.join(work, "queue.err")).read()[-2000:])


def put(name, code, memory=128, timeout=60000, annotations=()):
    body = {"exec": {"kind": "python:3", "code": code}, "limits": {"memory": memory, "timeout": timeout},
            "annotations": [{"key": k, "value": v} for k, v in annotations]}
    status, _, text = request("PUT", f"{base}/actions/{name}?overwrite=true", body)
    assert status == 200, text


def fire(name, count, params=lambda n: {}):
    """`count` non-blocking calls at once (20 callers): the ids of those accepted, and refusals."""
    ids, refused, lock = [], [], threading.Lock()
    def caller(ns):
        for n in ns:
            status, id, text = request("POST", f"{base}/actions/{name}", params(n), timeout=30)
            with lock:
                (ids.append(id) if status == 202 else refused.append((status, text[:200])))
    threads = [threading.Thread(target=caller, args=(range(i, count, 20),)) for i in range(20)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return ids, refused


def record(id):
    status, _, text = request("GET", f"{base}/activations/{id}", timeout=10)
    return json.loads(text) if status == 200 else None


def records(ids, bound):
    """Each id's record once all have one, or what there is at `bound` seconds."""
    deadline, found = time.time() + bound, {}
    while time.time() < deadline:
        for id in ids:
            if id not in found:
                r = record(id)
                if r is not None:
                    found[id] = r
        if len(found) == len(ids):
            break
        time.sleep(0.5)
    return found


def said(r, key):
    return next((a["value"] for a in r.get("annotations", []) if a["key"] == key), None)


def final(r, bound=60):
    """The last attempt of the call whose first record is `r`, following `retriedAs`."""
    while said(r, "retriedAs"):
        nxt = records([said(r, "retriedAs")], bound).get(said(r, "retriedAs"))
        if nxt is None:
            return None
        r = nxt
    return r


def table(title, rows):
    print(f"\n{title}")
    for k, v in rows:
        print(f"  {k:<48} {v}")


try:
    inv = start()
    put("quick", "import time\ndef main(a):\n    time.sleep(0.1)\n    return {'n': a.get('n')}")
    put("slow", "import time\ndef main(a):\n    time.sleep(0.3)\n    return {'n': a.get('n')}")

    began = time.time()
    ids, refused = fire("quick", 200, lambda n: {"n": n})
    found = records(ids, 120)
    ok = sum(1 for r in found.values() if r["response"]["statusCode"] == 0)
    table("Durable queue: a burst of 200 non-blocking calls on room for two (0.1 s each, 2 s blocking wait)", [
        ("accepted (202)", len(ids)), ("refused", len(refused)), ("ended with a record", len(found)),
        ("succeeded", ok), ("failed", len(found) - ok), ("lost (accepted, no record)", len(ids) - len(found)),
        ("seconds until the last ended", f"{time.time() - began:.1f}")])

    ids, refused = fire("slow", 100, lambda n: {"n": n})
    time.sleep(1)
    inv.send_signal(signal.SIGKILL)
    inv.wait()
    inv = start()
    found = records(ids, 180)
    guessed = [r for r in found.values() if said(r, "guess") is not None]
    finals = [final(r) for r in found.values()]
    succeeded = sum(1 for r in finals if r and r["response"]["statusCode"] == 0)
    table("Durable queue: 100 calls of 0.3 s, the invoker SIGKILLed 1 s in and started again on its data", [
        ("accepted (202)", len(ids)), ("ended with a record", len(found)),
        ("interrupted (a guess: it may have started)", len(guessed)),
        ("of those, tried again by the policy", sum(1 for r in guessed if said(r, "retriedAs"))),
        ("succeeded in the end (first attempt or a retry)", succeeded),
        ("lost (accepted, no record)", len(ids) - len(found))])

    put("hog", "import time\ndef main(a):\n    time.sleep(a.get('s', 75))\n    return {}", memory=256, timeout=120000)
    put("late", "def main(a):\n    return {'n': a.get('n')}", annotations=[("max-event-age", 60)])
    hog = threading.Thread(target=request, args=("POST", f"{base}/actions/hog?blocking=true", {"s": 75}),
                           kwargs={"timeout": 100})
    hog.start()
    time.sleep(2)
    ids, _ = fire("late", 5, lambda n: {"n": n})
    found = records(ids, 100)
    expired = [r for r in found.values() if "maximum event age" in json.dumps(r["response"]["result"])]
    status, _, text = request("GET", f"{base}/deadletters")
    letters = json.loads(text) if status == 200 else []
    hog.join()
    status, _, text = request("POST", f"{base}/deadletters/redrive")
    driven = json.loads(text).get("redriven", []) if status == 202 else []
    again = records([d["activationId"] for d in driven], 60)
    table("Durable queue: five calls that cannot start within their maximum age (60 s)", [
        ("accepted (202)", len(ids)), ("ended unrun, past their age", len(expired)),
        ("dead letters", len(letters)), ("redriven once there was room", len(driven)),
        ("succeeded when redriven", sum(1 for r in again.values() if r["response"]["statusCode"] == 0))])

    # The cluster: a scheduler keeps each call until an invoker says a container took it.
    key = "c0ffee00-0000-4000-8000-00000000c0de:the-chaos-queue-controller-secret"
    cluster = Cluster(exe, work, EtcdMembers(work, 1, name="queue-etcd").urls(), (
        f'[cluster]\nprefix = "/chaosq"\nlease_ttl = "3s"\npublish_interval = "200ms"\ncontroller_key = "{key}"\n'
        f'[admin]\ncontroller_keys = ["{key}"]\n[factory.process]\nuser_memory_mb = 256\n'
        '[pool]\nwait_deadline = "2s"\n[queue]\nretry_backoff = "200ms"\n'
        '[scheduler]\nrefresh_interval = "50ms"\nhandover_timeout = "1s"\n'))
    ports = {name: free_port() for name in ("qinv0", "qinv1", "qsched")}
    members = {name: cluster.start(name, ["--invoker-id", name], ports[name]) for name in ("qinv0", "qinv1")}
    cluster.start("qsched", ["scheduler", "--scheduler-id", "chaosq"], ports["qsched"])
    front = f"http://127.0.0.1:{ports['qsched']}"
    admin = cluster.admin_key("qsched")
    deadline = time.time() + 60
    while time.time() < deadline:
        status, _, text = request("GET", front + "/v1/invokers", key=admin, timeout=5)
        if status == 200 and len([i for i in json.loads(text) if i.get("nodes")]) == 2:
            break
        time.sleep(0.2)
    else:
        sys.exit("the two invokers never registered with the scheduler")
    base = front + "/api/v1/namespaces/_"
    put("spread", "import time\ndef main(a):\n    time.sleep(0.3)\n    return {'n': a.get('n')}")
    killed = {}
    def kill_one():
        time.sleep(1)
        os.killpg(members["qinv0"].pid, signal.SIGKILL)
        members["qinv0"].wait()
        killed["at"] = time.time()
    killer = threading.Thread(target=kill_one)
    killer.start()
    ids, refused = fire("spread", 300, lambda n: {"n": n})
    killer.join()
    found = records(ids, 240)
    finals = {id: final(r) for id, r in found.items()}
    guessed = [r for r in found.values() if said(r, "guess") is not None]
    first_ok = [r for r in found.values() if r["response"]["statusCode"] == 0]
    status, _, text = request("GET", front + "/metrics", key=admin, timeout=10)
    moved = next((line.split()[-1] for line in text.decode().splitlines()
                  if line.startswith("scheduler_reschedules_total")), "?") if status == 200 else "?"
    table("Durable queue in a cluster: 300 calls of 0.3 s through a scheduler, one of two invokers "
          "SIGKILLed 1 s in", [
        ("accepted (202)", len(ids)), ("refused", len(refused)), ("ended with a record", len(found)),
        ("succeeded at their first attempt", len(first_ok)),
        ("  of those, on the invoker that was killed", sum(1 for r in first_ok if said(r, "invoker") == "qinv0")),
        ("  on the other", sum(1 for r in first_ok if said(r, "invoker") == "qinv1")),
        ("handed over again (refused, or lost unstarted)", moved),
        ("interrupted (started on the killed one: a guess)", len(guessed)),
        ("of those, tried again by the policy", sum(1 for r in guessed if said(r, "retriedAs"))),
        ("succeeded in the end (first attempt or a retry)",
         sum(1 for r in finals.values() if r and r["response"]["statusCode"] == 0)),
        ("lost (accepted, no record)", len(ids) - len(found))])
finally:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
