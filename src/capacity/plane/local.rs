//! The local control plane (the embedded default): each invoker is a process of this machine,
//! `invoker serve` from the manager's own binary and config file, with its own data directory
//! under the manager's, its own process group (a terminal's Ctrl-C on the manager does not
//! reach it), and a pid file beside it.
//!
//! The invokers outlive the manager: they are the cluster's capacity, and a manager that stops
//! or is killed must not take the work they run with it. A manager started again reads the
//! pid files, keeps those whose process still runs (the same boot, the same pid, and `serve
//! --invoker-id <id>` on its command line, so that a reused pid is never taken for one), and
//! reports them as [`found`](super::ControlPlane::found): adopted, never started twice, and
//! stopped like the others when removed. No invoker is left behind without a manager that knows it.

use super::{ControlPlane, InvokerSpec, PlaneError};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LocalPlane {
    exe: PathBuf,
    config_file: PathBuf,
    etcd: Vec<String>,
    /// `<manager data dir>/invokers`: `<id>/` (its data), `<id>.pid`, `<id>.log`.
    dir: PathBuf,
    /// How long a stopped invoker has to drain and exit before it is killed.
    stop_grace: Duration,
    boot_id: String,
    procs: Mutex<BTreeMap<String, Proc>>,
}

enum Proc {
    /// Started by this manager: reaped here.
    Child(Child),
    /// Found running at start: a child of the manager before.
    Adopted(Pid),
}

impl LocalPlane {
    /// Adopts the invokers the pid files under `data_dir` name that still run.
    pub fn new(
        exe: PathBuf,
        config_file: PathBuf,
        etcd: Vec<String>,
        data_dir: PathBuf,
        stop_grace: Duration,
    ) -> std::io::Result<LocalPlane> {
        let dir = data_dir.join("invokers");
        std::fs::create_dir_all(&dir)?;
        let plane = LocalPlane {
            exe,
            config_file,
            etcd,
            dir,
            stop_grace,
            boot_id: crate::cluster::boot_id(),
            procs: Mutex::new(BTreeMap::new()),
        };
        plane.adopt()?;
        Ok(plane)
    }

    /// Reads the pid files: the invokers they name that run and this plane does not know are
    /// adopted; the files of those that do not run are removed.
    fn adopt(&self) -> std::io::Result<()> {
        let mut procs = self.procs.lock();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let Some(id) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".pid")) else {
                continue;
            };
            if procs.contains_key(id) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let mut parts = text.split_whitespace();
            let (Some(pid), Some(boot)) = (parts.next().and_then(|p| p.parse::<i32>().ok()), parts.next()) else {
                continue;
            };
            let pid = Pid::from_raw(pid);
            if boot == self.boot_id && is_invoker(pid, id) {
                tracing::info!(invoker = %id, %pid, "an invoker another manager started runs: adopted");
                procs.insert(id.to_string(), Proc::Adopted(pid));
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(())
    }

    fn pid_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.pid"))
    }

    fn pid_of(&self, id: &str) -> Option<Pid> {
        match self.procs.lock().get(id)? {
            Proc::Child(child) => Some(Pid::from_raw(child.id() as i32)),
            Proc::Adopted(pid) => Some(*pid),
        }
    }
}

/// Whether `pid` runs `invoker serve ... --invoker-id <id>` (a reused pid runs something else).
fn is_invoker(pid: Pid, id: &str) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.contains(&&b"serve"[..]) && args.windows(2).any(|w| w[0] == b"--invoker-id" && w[1] == id.as_bytes())
}

impl ControlPlane for LocalPlane {
    async fn provision(&self, spec: &InvokerSpec) -> Result<(), PlaneError> {
        let fail = |reason: String| PlaneError::Start { id: spec.id.clone(), reason };
        let data = self.dir.join(&spec.id);
        std::fs::create_dir_all(&data).map_err(|e| fail(format!("{}: {e}", data.display())))?;
        let log_path = self.dir.join(format!("{}.log", spec.id));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| fail(format!("{}: {e}", log_path.display())))?;
        let err = log.try_clone().map_err(|e| fail(e.to_string()))?;
        let mut command = Command::new(&self.exe);
        command
            .arg("serve")
            .arg("--config")
            .arg(&self.config_file)
            .arg("--etcd")
            .arg(self.etcd.join(","))
            .args(["--invoker-id", &spec.id, "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .arg(format!("--tags={}", spec.tags.join(",")))
            .arg(format!("--memory-mb={}", spec.memory_mb))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().map_err(|e| fail(format!("{}: {e}", self.exe.display())))?;
        let pid_line = format!("{} {}\n", child.id(), self.boot_id);
        std::fs::write(self.pid_file(&spec.id), pid_line).map_err(|e| fail(e.to_string()))?;
        self.procs.lock().insert(spec.id.clone(), Proc::Child(child));
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), PlaneError> {
        if let Some(pid) = self.pid_of(id) {
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + self.stop_grace;
            while self.running(id) == Some(true) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if self.running(id) == Some(true) {
                tracing::warn!(invoker = %id, "still running {:?} after SIGTERM: killed", self.stop_grace);
                let _ = kill(pid, Signal::SIGKILL);
                while self.running(id) == Some(true) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        self.procs.lock().remove(id);
        let _ = std::fs::remove_file(self.pid_file(id));
        let data = self.dir.join(id);
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&data))
            .await
            .map_err(|e| PlaneError::Stop { id: id.to_string(), reason: e.to_string() })?
            .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
            .map_err(|e| PlaneError::Stop { id: id.to_string(), reason: format!("its data: {e}") })
    }

    fn running(&self, id: &str) -> Option<bool> {
        let mut procs = self.procs.lock();
        Some(match procs.get_mut(id)? {
            Proc::Child(child) => matches!(child.try_wait(), Ok(None)),
            Proc::Adopted(pid) => is_invoker(*pid, id),
        })
    }

    fn last_error(&self, id: &str) -> Option<String> {
        // The tail of its log: `invoker serve` ends with `Error: ...` when it cannot start.
        use std::io::{Read as _, Seek as _};
        let mut log = std::fs::File::open(self.dir.join(format!("{id}.log"))).ok()?;
        let len = log.metadata().ok()?.len();
        log.seek(std::io::SeekFrom::Start(len.saturating_sub(64 * 1024))).ok()?;
        let mut tail = String::new();
        log.take(64 * 1024).read_to_string(&mut tail).ok()?;
        tail.lines().rev().find(|l| l.starts_with("Error: ")).map(|l| l.chars().take(500).collect())
    }

    fn found(&self) -> Vec<String> {
        if let Err(e) = self.adopt() {
            tracing::warn!("reading the invokers' pid files: {e}");
        }
        self.procs.lock().iter().filter(|(_, p)| matches!(p, Proc::Adopted(_))).map(|(id, _)| id.clone()).collect()
    }
}
