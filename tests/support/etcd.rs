//! A real etcd for the cluster tests: one member per test on free loopback ports, with a data
//! dir that survives a stop and a start.

use invoker_etcd::client::Etcd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port free now, below the kernel's ephemeral range (32768 up here): a member stopped and
/// started again (`resume`) finds it still free, where a port the kernel chose could be handed
/// meanwhile to any other test's listener or connection (etcd then fails to bind while the
/// squatter answers the readiness check). Tried from a point of its own for each call.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let seed =
        std::process::id().wrapping_mul(2_654_435_761) ^ CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(40_503);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let (low, span) = (20_000u32, 12_000u32);
    let start = (seed ^ nanos) % span;
    (0..span)
        .map(|i| (low + (start + i * 7_919) % span) as u16)
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .unwrap_or_else(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port())
}

/// One etcd member on loopback, with a data dir that survives a stop and a start.
pub struct EtcdServer {
    dir: tempfile::TempDir,
    client: u16,
    peer: u16,
    child: Option<Child>,
    name: String,
    /// `--initial-cluster`: this member alone, or every member of a cluster.
    cluster: String,
}

impl EtcdServer {
    /// `None` (the test is skipped) when no etcd is installed, outside CI.
    pub fn start() -> Option<EtcdServer> {
        Self::start_cluster(1).map(|mut members| members.remove(0))
    }

    /// `size` members of one cluster, each on ports of its own, all started.
    pub fn start_cluster(size: usize) -> Option<Vec<EtcdServer>> {
        if Command::new("etcd").arg("--version").output().is_err() {
            assert!(std::env::var("CI").is_err(), "no etcd binary under CI: scripts/etcd.sh installs it");
            eprintln!("skipped: no etcd binary (scripts/etcd.sh installs one)");
            return None;
        }
        // Free ports are only free when chosen: another test's process may take one before
        // etcd binds it, and etcd then exits. So a start that fails that way is tried again on
        // fresh ports.
        for _ in 0..3 {
            let mut members: Vec<EtcdServer> = (0..size)
                .map(|i| EtcdServer {
                    dir: tempfile::Builder::new().prefix("invoker-etcd-").tempdir().unwrap(),
                    client: free_port(),
                    peer: free_port(),
                    child: None,
                    name: format!("m{i}"),
                    cluster: String::new(),
                })
                .collect();
            let cluster =
                members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer)).collect::<Vec<_>>().join(",");
            for member in &mut members {
                member.cluster = cluster.clone();
                member.spawn();
            }
            if members.iter_mut().all(|m| m.listening()) {
                // Serving, not only listening: a member stopped before its first election was
                // written down restarts with no voters and never serves (`resume`).
                let deadline = Instant::now() + Duration::from_secs(20);
                while !members.iter().all(EtcdServer::healthy) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if members.iter().all(EtcdServer::healthy) {
                    return Some(members);
                }
                eprintln!("etcd listened but did not serve within 20 s: {}", members[0].log_tail());
                continue;
            }
            eprintln!("etcd exited before it listened (a port taken meanwhile?): {}", members[0].log_tail());
        }
        panic!("etcd did not start in three tries");
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }

    pub fn resume(&mut self) {
        self.spawn();
        self.wait_listening();
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let child = Command::new("etcd")
            .args(["--name", &self.name, "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.url(), "--advertise-client-urls", &self.url()])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.cluster])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("etcd.log")).unwrap())
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Whether it accepts connections within 20 s; `false` at once if it exited.
    fn listening(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.client)).is_err() {
            let exited = self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited || Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Whether it answers `GET /health` with a leader (its bootstrap written down).
    fn healthy(&self) -> bool {
        use std::io::{Read as _, Write as _};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.client)) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        if stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    fn wait_listening(&mut self) {
        assert!(self.listening(), "etcd did not start: {}", self.log_tail());
    }

    /// The end of its log, for a failure's message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stopped, its data gone, and started again: an etcd that restarts empty (a member
    /// replaced, a volume lost), its revision back at 1.
    pub fn wipe(&mut self) {
        self.stop();
        std::fs::remove_dir_all(self.dir.path().join("data")).unwrap();
        self.resume();
    }

    /// SIGSTOP: etcd hangs as in a long fsync stall or a partition, its connections open.
    pub fn freeze(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// SIGCONT after `freeze`.
    pub fn thaw(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("etcd runs");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    }

    pub fn kv(&self) -> Etcd {
        Etcd::new(&[self.url()]).unwrap()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // A frozen member would not die of SIGKILL until continued.
        if self.child.is_some() {
            self.thaw();
        }
        self.stop();
    }
}
