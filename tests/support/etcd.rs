//! A real etcd for the cluster tests: one member per test on free loopback ports, with a data
//! dir that survives a stop and a start.

use invoker_etcd::client::Etcd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
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
                return Some(members);
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
