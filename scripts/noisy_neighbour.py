"""Issue 60's noisy neighbour, measured on one invoker (the process factory, room for eight
128 MB containers, each namespace's limit eight): tenant `flood` keeps the node full with calls
of a 5 s action for 30 s, tenant `guest` calls a trivial action five times meanwhile, then once
more 6 s after the flood stopped. Run twice: the flood's calls blocking (at its namespace's
limit), then non-blocking (a backlog far longer than the run). Prints each guest call's status
and seconds. Stops by itself (about three minutes).

    python3 scripts/noisy_neighbour.py target/release/invoker"""

import os, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import GUEST, free_port, request

exe = sys.argv[1]
FLOOD = "11111111-2222-3333-4444-555555555555:the-noisy-neighbours-key"
unprivileged = "" if os.geteuid() == 0 else "unprivileged = false\n"


def run(blocking):
    work = tempfile.mkdtemp(prefix="invoker-noisy-")
    config = os.path.join(work, "noisy.toml")
    with open(config, "w") as f:
        f.write(f'invoker_id = "noisy{os.getpid()}"\n[namespaces]\nguest = "{GUEST}"\nflood = "{FLOOD}"\n'
                f'[factory.process]\nuser_memory_mb = 1024\n{unprivileged}[limits]\nnamespace_concurrent = 8\n')
    port = free_port()
    out = open(os.path.join(work, "out"), "w")
    proc = subprocess.Popen([exe, "--config", config, "--listen", f"127.0.0.1:{port}", "--data-dir",
                             os.path.join(work, "data")], stdout=out, stderr=open(os.path.join(work, "err"), "w"),
                            start_new_session=True)
    try:
        for _ in range(600):
            if "listening on" in open(os.path.join(work, "out")).read():
                break
            time.sleep(0.05)
        guest = f"http://127.0.0.1:{port}/api/v1/namespaces/guest"
        flood = f"http://127.0.0.1:{port}/api/v1/namespaces/flood"
        for base, name, code, key in [
            (flood, "slow", "import time\ndef main(a):\n    time.sleep(5)\n    return {}", FLOOD),
            (guest, "quick", "def main(a):\n    return {}", GUEST),
        ]:
            status, _, text = request("PUT", f"{base}/actions/{name}?overwrite=true",
                                      {"exec": {"kind": "python:3", "code": code}, "limits": {"memory": 128}}, key=key)
            assert status == 200, text
        stop = time.time() + 30
        query = "?blocking=true" if blocking else ""

        def flooder():
            while time.time() < stop:
                request("POST", f"{flood}/actions/slow{query}", {}, key=FLOOD, timeout=70)
                if not blocking:
                    time.sleep(0.05)
        threads = [threading.Thread(target=flooder) for _ in range(12 if blocking else 4)]
        [t.start() for t in threads]
        time.sleep(6)
        rows = []
        for i in range(5):
            t0 = time.time()
            status, _, _ = request("POST", f"{guest}/actions/quick?blocking=true", {}, timeout=90)
            rows.append((f"during the flood, call {i + 1}", status, time.time() - t0))
            time.sleep(2)
        [t.join() for t in threads]
        time.sleep(6)
        t0 = time.time()
        status, _, _ = request("POST", f"{guest}/actions/quick?blocking=true", {}, timeout=90)
        rows.append(("6 s after the flood stopped", status, time.time() - t0))
        kind = "blocking, at its limit" if blocking else "non-blocking, a backlog"
        print(f"\nThe flood's calls {kind} (5 s each, the node holds eight):")
        for what, status, seconds in rows:
            print(f"  {what:<36} {status}  {seconds:5.2f} s")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


run(blocking=True)
run(blocking=False)
