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
