//! The local control plane (the embedded default): each invoker is a process of this machine,
//! `invoker serve` from the manager's own binary and config file, with its own data directory
//! under the manager's, its own process group (a terminal's Ctrl-C on the manager does not
//! reach it), and a pid file beside it.
//!
//! The invokers outlive the manager: they are the cluster's capacity, and a manager that stops
//! or is killed must not take the work they run with it. The pid files are the truth every
//! manager on the data dir shares (a standby that led meanwhile starts and stops invokers too):
//! each time leadership is taken they are read again, and the invokers whose process still runs
//! (the same boot, the same pid, and `serve --invoker-id <id>` on its command line, so that a
//! reused pid is never taken for one) are [`found`](invoker_factory::plane::ControlPlane::found), whoever started
//! them: adopted, never started twice, and stopped like the others when removed. No handle from
//! before is trusted: an invoker is known by its pid and checked in `/proc` each time.
//!
//! A process this manager started is waited for by a thread of its own from its start, so it
//! is reaped the moment it exits, whoever stopped it and whether or not this manager leads: no
//! zombie is left for a manager that lost its leadership. An invoker that died on its own has
//! its pid file and data removed once the manager forgets it.

use invoker_factory::plane::{ControlPlane, InvokerSpec, PlaneError, PlaneFailure};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a local invoker takes from the manager's ask to its registration: its process (on
/// the process factory, the one that takes `--memory-mb`) registers 22 to 29 ms after its spawn
/// on this machine at rest and 48 to 128 ms under `invoker replay`'s load, rounded up. Below [`invoker_core::predictor::QUICK_LEAD`]: groups on this plane follow a
/// rise at once and give an idle invoker back after 2 s (`invoker_core::capacity::default_hold`).
pub const LEAD: Duration = Duration::from_millis(200);

/// The name a gone invoker's data directory takes while it is deleted (no invoker id starts
/// with a dot).
const GONE_PREFIX: &str = ".gone-";

pub struct LocalPlane {
    exe: PathBuf,
    config_file: PathBuf,
    etcd: Vec<String>,
    /// `<manager data dir>/invokers`: `<id>/` (its data), `<id>.pid`, `<id>.log`.
    dir: PathBuf,
    /// How long a stopped invoker has to drain and exit before it is killed.
    stop_grace: Duration,
    boot_id: String,
    /// The invokers known to run, by their pid.
    procs: Mutex<BTreeMap<String, Known>>,
}

/// An invoker as this plane knows it.
#[derive(Clone)]
struct Known {
    pid: Pid,
    /// For a process this manager started: true until its reaper saw it exit (its command line
    /// is not its own yet while the kernel is still in its exec, and a pid is not reused while
    /// it is unreaped). `None`: another's, checked with [`is_invoker`] each time.
    alive: Option<Arc<AtomicBool>>,
}

impl Known {
    fn runs(&self, id: &str) -> bool {
        match &self.alive {
            Some(alive) => alive.load(Ordering::Acquire),
            None => is_invoker(self.pid, id),
        }
    }
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
            boot_id: invoker_etcd::claim::boot_id(),
            procs: Mutex::new(BTreeMap::new()),
        };
        plane.sweep_aside();
        plane.adopt()?;
        Ok(plane)
    }

    /// Reads the pid files again and knows exactly the invokers they name that run; the files
    /// of those that do not run are removed.
    fn adopt(&self) -> std::io::Result<()> {
        let mut now = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let Some(id) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".pid")) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let mut parts = text.split_whitespace();
            let (Some(pid), Some(boot)) = (parts.next().and_then(|p| p.parse::<i32>().ok()), parts.next()) else {
                continue;
            };
            let pid = Pid::from_raw(pid);
            let ours = self.procs.lock().get(id).filter(|k| k.pid == pid && k.runs(id)).cloned();
            if let Some(known) = ours {
                now.insert(id.to_string(), known);
            } else if boot == self.boot_id && is_invoker(pid, id) {
                tracing::info!(invoker = %id, %pid, "an invoker this manager did not start runs: adopted");
                now.insert(id.to_string(), Known { pid, alive: None });
            } else if boot != self.boot_id || !in_exec(pid) {
                let _ = std::fs::remove_file(&path);
            }
        }
        *self.procs.lock() = now;
        Ok(())
    }

    fn pid_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.pid"))
    }

    fn pid_of(&self, id: &str) -> Option<Pid> {
        self.procs.lock().get(id).map(|k| k.pid)
    }

    /// Removes `id`'s pid file and data directory (its log stays, for why it ended). Both are
    /// gone from their names before this returns (the directory renamed aside, then deleted
    /// by the future): a replacement asked for under the same name in the same round creates
    /// its own directory, which a deletion still under way must not take with it.
    fn clean_up(&self, id: &str) -> impl std::future::Future<Output = std::io::Result<()>> + 'static {
        let _ = std::fs::remove_file(self.pid_file(id));
        let data = self.dir.join(id);
        let aside = self.dir.join(format!("{GONE_PREFIX}{id}-{}", std::process::id()));
        let moved = match std::fs::rename(&data, &aside) {
            Ok(()) => Ok(Some(aside)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        };
        async move {
            let Some(aside) = moved? else { return Ok(()) };
            tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&aside))
                .await
                .map_err(std::io::Error::other)?
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
        }
    }

    /// Deletes the directories a clean-up renamed aside and did not finish deleting (its
    /// manager stopped meanwhile).
    fn sweep_aside(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(|n| n.starts_with(GONE_PREFIX)) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Reaps `child` when it exits, on a thread of its own (a process the manager started is its
/// child whoever stops it, and only its parent can reap it); `alive` says false from then on.
fn reap_when_it_exits(mut child: Child, id: String, alive: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new().name(format!("reap-{id}")).spawn(move || {
        match child.wait() {
            Ok(status) => tracing::debug!(invoker = %id, "exited: {status}"),
            Err(e) => tracing::warn!(invoker = %id, "waiting for it: {e}"),
        }
        alive.store(false, Ordering::Release);
    });
    if let Err(e) = spawned {
        tracing::warn!("no thread to reap an invoker with: {e}");
    }
}

/// Whether `pid` is a process whose exec has not set its command line yet (another manager's
/// spawn returns a moment before that): its pid file is left alone until it can be read.
fn in_exec(pid: Pid) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"));
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').and_then(|(_, f)| f.split_whitespace().next().map(str::to_string));
    cmdline.is_ok_and(|c| c.is_empty()) && state.is_some_and(|s| s != "Z" && s != "X")
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
        let fail = |path: &std::path::Path| {
            let id = spec.id.clone();
            let path = path.to_path_buf();
            move |source| PlaneError::Start { id, cause: PlaneFailure::Path { path, source } }
        };
        let data = self.dir.join(&spec.id);
        std::fs::create_dir_all(&data).map_err(fail(&data))?;
        let log_path = self.dir.join(format!("{}.log", spec.id));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).map_err(fail(&log_path))?;
        let err = log.try_clone().map_err(fail(&log_path))?;
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
        let child = command.spawn().map_err(fail(&self.exe))?;
        let pid = Pid::from_raw(child.id() as i32);
        let alive = Arc::new(AtomicBool::new(true));
        reap_when_it_exits(child, spec.id.clone(), alive.clone());
        let pid_line = format!("{pid} {}\n", self.boot_id);
        if let Err(e) = std::fs::write(self.pid_file(&spec.id), pid_line) {
            // Not known by a file, it would be lost to the next manager: it does not run.
            let _ = kill(pid, Signal::SIGKILL);
            return Err(fail(&self.pid_file(&spec.id))(e));
        }
        self.procs.lock().insert(spec.id.clone(), Known { pid, alive: Some(alive) });
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
        let data = self.dir.join(id);
        self.clean_up(id)
            .await
            .map_err(|source| PlaneError::Stop { id: id.into(), cause: PlaneFailure::Path { path: data, source } })
    }

    fn running(&self, id: &str) -> Option<bool> {
        let known = self.procs.lock().get(id).cloned()?;
        Some(known.runs(id))
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
        self.procs.lock().keys().cloned().collect()
    }

    fn forget(&self, id: &str) {
        let Some(known) = self.procs.lock().remove(id) else { return };
        if known.runs(id) {
            self.procs.lock().insert(id.to_string(), known);
            return;
        }
        // Only a pid file that names no running invoker (another manager may have started one
        // under this name meanwhile).
        let named = std::fs::read_to_string(self.pid_file(id)).ok();
        let pid = named.as_deref().and_then(|t| t.split_whitespace().next()?.parse::<i32>().ok()).map(Pid::from_raw);
        if pid.is_some_and(|pid| pid != known.pid && is_invoker(pid, id)) {
            return;
        }
        let (cleaning, id) = (self.clean_up(id), id.to_string());
        tokio::spawn(async move {
            if let Err(e) = cleaning.await {
                tracing::warn!(invoker = %id, "removing what it left: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plane whose "invoker" is a script that keeps running until it is killed.
    fn plane(dir: &std::path::Path) -> LocalPlane {
        let exe = dir.join("fake-invoker");
        std::fs::write(&exe, "#!/bin/sh\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        LocalPlane::new(exe, dir.join("config.toml"), vec![], dir.join("manager"), Duration::from_secs(1)).unwrap()
    }

    fn spec(id: &str) -> InvokerSpec {
        InvokerSpec { id: id.into(), group: "default".into(), tags: vec![], memory_mb: 256 }
    }

    /// An invoker that died is forgotten and, in the same round, replaced under its name (the
    /// lowest free ordinal): the replacement's data directory stays. Before, the forgotten
    /// one's directory was deleted by a task that ran after the replacement had created it,
    /// so a replacement could start without its data (under load, a third start was asked for).
    #[tokio::test]
    async fn a_replacement_under_a_forgotten_invokers_name_keeps_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let plane = plane(dir.path());
        plane.provision(&spec("default-0")).await.unwrap();
        let pid = plane.pid_of("default-0").unwrap();
        kill(pid, Signal::SIGKILL).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while plane.running("default-0") == Some(true) {
            assert!(Instant::now() < deadline, "the killed process was not reaped");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        plane.forget("default-0");
        plane.provision(&spec("default-0")).await.unwrap();
        let data = plane.dir.join("default-0");
        std::fs::write(data.join("written-by-the-replacement"), b"x").unwrap();
        // Whatever the forgotten one's clean-up still had to do, it does now.
        for _ in 0..50 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(data.join("written-by-the-replacement").exists(), "the replacement's data was deleted");
        assert!(plane.pid_file("default-0").exists(), "the replacement's pid file was deleted");
        let aside: Vec<_> = std::fs::read_dir(&plane.dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(GONE_PREFIX))
            .collect();
        assert!(aside.is_empty(), "the forgotten one's data is deleted in the end");
        plane.remove("default-0").await.unwrap();
        assert!(!data.exists());
    }

    /// A directory renamed aside by a manager that stopped before deleting it is deleted when
    /// the next plane starts on the data dir.
    #[test]
    fn directories_left_aside_are_swept_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let left = dir.path().join("manager/invokers/.gone-default-1-42");
        std::fs::create_dir_all(left.join("journal")).unwrap();
        let _plane = plane(dir.path());
        assert!(!left.exists());
    }
}
