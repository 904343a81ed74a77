"""What scripts/chaos.sh and scripts/capacity-bench.sh share: a config file for a one-machine
cluster, processes of the invoker binary on loopback ports, their admin keys, and HTTP calls
with a key. Imported by the python the scripts run from the repository's root."""

import atexit, base64, json, os, signal, socket, subprocess, sys, time, urllib.error, urllib.request

GUEST = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def request(method, url, body=None, key=GUEST, timeout=70):
    """(status, activation id, body); status 0 when no answer came."""
    headers = {"Authorization": "Basic " + base64.b64encode(key.encode()).decode(), "Content-Type": "application/json"}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("x-openwhisk-activation-id"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("x-openwhisk-activation-id"), e.read()
    except Exception as e:
        return 0, None, str(e).encode()


class Cluster:
    """Processes of `exe` in `work`, reading `config` (config/cluster.toml's text, edited),
    against the etcd at `etcd`."""

    def __init__(self, exe, work, etcd, config):
        if os.geteuid() != 0:
            # Not root: the invokers cannot isolate their containers.
            config = config.replace("[factory.process]\n", "[factory.process]\nunprivileged = false\n", 1)
        self.exe, self.work, self.etcd = exe, work, etcd
        self.procs = []
        # However the script ends (a failed step exits early), nothing it started outlives it.
        atexit.register(self.stop_all)
        self.config_path = os.path.join(work, "cluster.toml")
        with open(self.config_path, "w") as f:
            f.write(config)

    def start(self, name, args, port, etcd=None):
        """`invoker <args>` on 127.0.0.1:`port` with the data dir `work/name`; its output in
        `work/name.out` and `.err`."""
        out = open(os.path.join(self.work, name + ".out"), "w")
        err = open(os.path.join(self.work, name + ".err"), "a")
        cmd = [self.exe] + args + ["--config", self.config_path, "--etcd", etcd or self.etcd,
                                   "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(self.work, name)]
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=30)
                except Exception:
                    proc.kill()

    def admin_key(self, name):
        """The admin key process `name` printed (exits when it did not start)."""
        for _ in range(200):
            for line in open(os.path.join(self.work, name + ".out")).read().splitlines():
                if line.startswith("admin auth: "):
                    return line[len("admin auth: "):]
            time.sleep(0.05)
        sys.exit(f"{name} did not start: " + open(os.path.join(self.work, name + ".err")).read()[-2000:])


class EtcdMembers:
    """The members of one etcd cluster on loopback, started here, each with its own data dir
    under `work`: frozen (SIGSTOP), thawed, and (one member alone) wiped and started again
    empty on the same client port, as an etcd that lost its volume."""

    def __init__(self, work, size, name="etcd"):
        self.members = []
        for i in range(size):
            client, peer = free_port(), free_port()
            data = os.path.join(work, f"{name}-m{i}")
            self.members.append({"name": f"m{i}", "client": client, "peer": peer, "dir": data, "proc": None})
        self.cluster = ",".join(f"{m['name']}=http://127.0.0.1:{m['peer']}" for m in self.members)
        atexit.register(self.stop_all)
        for m in self.members:
            self._start(m)
        for m in self.members:
            self._wait(m)

    def urls(self):
        return ",".join(f"http://127.0.0.1:{m['client']}" for m in self.members)

    def _start(self, m):
        os.makedirs(m["dir"], exist_ok=True)
        client, peer = f"http://127.0.0.1:{m['client']}", f"http://127.0.0.1:{m['peer']}"
        cmd = ["etcd", "--name", m["name"], "--data-dir", os.path.join(m["dir"], "data"),
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", self.cluster, "--initial-cluster-state", "new"]
        log = open(os.path.join(m["dir"], "etcd.log"), "a")
        m["proc"] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)

    def _wait(self, m, bound=30):
        deadline = time.time() + bound
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{m['client']}/health", timeout=2) as r:
                    if b'"true"' in r.read():
                        return
            except Exception:
                pass
            time.sleep(0.2)
        sys.exit(f"etcd member {m['name']} did not answer within {bound} s")

    def freeze(self, i):
        os.kill(self.members[i]["proc"].pid, signal.SIGSTOP)

    def thaw(self, i):
        os.kill(self.members[i]["proc"].pid, signal.SIGCONT)

    def wipe(self):
        """The only member stopped, its data removed, and started again: empty, revision 1."""
        assert len(self.members) == 1
        m = self.members[0]
        m["proc"].kill()
        m["proc"].wait()
        subprocess.run(["rm", "-rf", os.path.join(m["dir"], "data")], check=True)
        self._start(m)
        self._wait(m)

    def stop_all(self):
        for m in self.members:
            p = m["proc"]
            if p is not None and p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                    p.wait(timeout=10)
                except Exception:
                    pass
