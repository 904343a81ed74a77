//! Each local container's cgroups: its memory limit, its pids limit, and the freezer that lets
//! removal kill every process in it, whatever the action did to escape its process group
//! (setsid, a double fork). cgroup v2 or v1, whichever this machine lets us write. (`RLIMIT_AS`
//! is no substitute for the memory limit: runtimes such as node reserve far more address space
//! than they use.)
//!
//! The runtime joins the groups before it runs anything (the sandbox writes its own pid into
//! each `cgroup.procs`), so every process of the container is in them from its first
//! instruction; the groups' files are root's, so an action cannot move itself out.

use invoker_ids::ContainerId;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

#[derive(Debug)]
pub struct ContainerCgroups {
    version: Version,
    /// This invoker's group in the memory hierarchy (v2: the unified one); each container gets
    /// a child group in it.
    memory: PathBuf,
    /// v1 only: this invoker's group in the pids and freezer hierarchies, where mounted.
    pids: Option<PathBuf>,
    freezer: Option<PathBuf>,
}

/// How long removal waits for a container's processes to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);

impl ContainerCgroups {
    /// Finds a writable memory controller (and, on v1, the pids and freezer hierarchies) and
    /// makes this invoker's groups in them.
    pub fn detect(root: Option<&Path>, invoker_id: &str) -> Result<Self, String> {
        let group = format!("invoker-{invoker_id}");
        let mut tried = Vec::new();
        for (version, parent) in candidates(root, "memory") {
            let base = parent.join(&group);
            match make_base(version, &base) {
                Ok(()) if version == Version::V2 => {
                    let enabled = std::fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
                    if enabled.contains("memory") {
                        return Ok(ContainerCgroups { version, memory: base, pids: None, freezer: None });
                    }
                    tried.push(format!("{}: memory controller not delegated", base.display()));
                }
                Ok(()) => {
                    let other = |controller: &str| {
                        candidates(None, controller).into_iter().filter(|(v, _)| *v == Version::V1).find_map(
                            |(_, p)| {
                                let dir = p.join(&group);
                                std::fs::create_dir_all(&dir).ok().map(|_| dir)
                            },
                        )
                    };
                    let (pids, freezer) = if root.is_some() { (None, None) } else { (other("pids"), other("freezer")) };
                    return Ok(ContainerCgroups { version, memory: base, pids, freezer });
                }
                Err(e) => tried.push(format!("{}: {e}", base.display())),
            }
        }
        if tried.is_empty() {
            Err("no cgroup memory controller is mounted".into())
        } else {
            Err(format!("no writable cgroup memory controller ({})", tried.join("; ")))
        }
    }

    pub fn describe(&self) -> String {
        match self.version {
            Version::V1 => format!(
                "cgroup v1 (memory under {}, pids {}, freezer {})",
                self.memory.display(),
                self.pids.as_deref().map_or("not mounted".into(), |p| p.display().to_string()),
                self.freezer.as_deref().map_or("not mounted".into(), |p| p.display().to_string()),
            ),
            Version::V2 => format!("cgroup v2 (memory and pids under {})", self.memory.display()),
        }
    }

    fn name(id: ContainerId) -> String {
        format!("c{}", id.0)
    }

    /// Where the container's processes are listed (its memory group's `cgroup.procs`).
    pub fn procs_file(&self, id: ContainerId) -> PathBuf {
        self.memory.join(Self::name(id)).join("cgroup.procs")
    }

    /// The container's groups, memory first (where its processes are listed).
    fn dirs(&self, name: &str) -> Vec<PathBuf> {
        let mut dirs = vec![self.memory.join(name)];
        dirs.extend([&self.pids, &self.freezer].into_iter().flatten().map(|base| base.join(name)));
        dirs
    }

    /// Makes the container's groups with a limit of `memory_mb` (without swap) and `pids_max`
    /// processes; returns the files its first process joins them through, by writing `0`
    /// (itself) into each: on v1 `tasks`, which moves the calling thread without the global
    /// lock a `cgroup.procs` write takes (that lock waits for an RCU grace period: 5 to 40 ms
    /// here, most of a cold start). A process that is still single-threaded (the sandbox, a
    /// freshly forked child) is its thread. v2 has only `cgroup.procs`.
    pub fn create(&self, id: ContainerId, memory_mb: u32, pids_max: u32) -> std::io::Result<Vec<PathBuf>> {
        // Gone if an earlier run's watchdog removed it as this run started (`remove_own`).
        if !self.memory.exists() {
            make_base(self.version, &self.memory)?;
        }
        let name = Self::name(id);
        let dirs = self.dirs(&name);
        for dir in &dirs {
            std::fs::create_dir_all(dir)?;
        }
        let memory = &dirs[0];
        let bytes = (u64::from(memory_mb) * 1024 * 1024).to_string();
        match self.version {
            Version::V2 => {
                std::fs::write(memory.join("memory.max"), &bytes)?;
                let _ = std::fs::write(memory.join("memory.swap.max"), "0");
                std::fs::write(memory.join("pids.max"), pids_max.to_string())?;
            }
            Version::V1 => {
                std::fs::write(memory.join("memory.limit_in_bytes"), &bytes)?;
                let _ = std::fs::write(memory.join("memory.memsw.limit_in_bytes"), &bytes);
                if let Some(pids) = &self.pids {
                    std::fs::write(pids.join(&name).join("pids.max"), pids_max.to_string())?;
                }
            }
        }
        let join = match self.version {
            Version::V1 => "tasks",
            Version::V2 => "cgroup.procs",
        };
        Ok(dirs.iter().map(|d| d.join(join)).collect())
    }

    pub fn oom_killed(&self, id: ContainerId) -> bool {
        let file = match self.version {
            Version::V2 => "memory.events",
            Version::V1 => "memory.oom_control",
        };
        let text = std::fs::read_to_string(self.memory.join(Self::name(id)).join(file)).unwrap_or_default();
        text.lines().any(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0) > 0)
    }

    /// Kills every process in the container's groups and removes them. Blocking (a few
    /// milliseconds; up to `KILL_WAIT` for processes the kernel is slow to reap).
    pub fn remove(&self, id: ContainerId) {
        self.remove_named(&Self::name(id));
    }

    fn remove_named(&self, name: &str) {
        let dirs = self.dirs(name);
        if !dirs[0].exists() {
            return;
        }
        kill_all(self.version, &dirs[0], self.freezer.as_ref().map(|f| f.join(name)).as_deref());
        for dir in dirs.iter().rev() {
            let deadline = std::time::Instant::now() + KILL_WAIT;
            while dir.exists() && std::fs::remove_dir(dir).is_err() {
                if std::time::Instant::now() >= deadline {
                    tracing::warn!(dir = %dir.display(), "could not remove a container's cgroup");
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// Removes this invoker's own groups, the parents of its containers', when they are empty:
    /// a run that ended leaves nothing behind in the hierarchies (each run of a new invoker id
    /// left three). Returns the groups that could not go (a container's group still in one).
    pub fn remove_own(&self) -> Vec<String> {
        let own = [Some(&self.memory), self.pids.as_ref(), self.freezer.as_ref()];
        let failed = own.into_iter().flatten().map(|dir| (dir, std::fs::remove_dir(dir)));
        let failed = failed.filter(|(_, r)| r.as_ref().is_err_and(|e| e.kind() != std::io::ErrorKind::NotFound));
        failed
            .map(|(dir, r)| format!("{}: {}", dir.display(), r.err().map(|e| e.to_string()).unwrap_or_default()))
            .collect()
    }

    /// Kills what an earlier run left in its containers' groups, and removes them.
    pub fn remove_all(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.memory) else { return 0 };
        let names: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|n| n.starts_with('c'))
            .collect();
        for name in &names {
            self.remove_named(name);
        }
        names.len()
    }
}

/// This invoker's group under one hierarchy: made, and on v2 with the memory and pids
/// controllers delegated to its children (the containers' groups).
fn make_base(version: Version, base: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(base)?;
    if version == Version::V2 {
        let _ = std::fs::write(base.join("cgroup.subtree_control"), "+memory +pids");
    }
    Ok(())
}

fn procs(dir: &Path) -> Vec<i32> {
    let text = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Every process in the group, dead: v2's `cgroup.kill` where the kernel has it; otherwise
/// freeze (no process can fork meanwhile), SIGKILL each, thaw so the kills are delivered.
fn kill_all(version: Version, memory: &Path, freezer: Option<&Path>) {
    let kill = |pids: &[i32]| {
        for &pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    };
    if version == Version::V2 && std::fs::write(memory.join("cgroup.kill"), "1").is_ok() {
        wait_empty(memory);
        return;
    }
    // The file that freezes the group, and its frozen and thawed values.
    let freezer = match (version, freezer) {
        (Version::V2, _) => Some((memory.join("cgroup.freeze"), "1", "0")),
        (Version::V1, Some(f)) => Some((f.join("freezer.state"), "FROZEN", "THAWED")),
        (Version::V1, None) => None,
    };
    let froze = freezer.as_ref().filter(|(file, frozen, _)| std::fs::write(file, frozen).is_ok());
    if let Some((file, _, _)) = froze {
        // v1 reports FREEZING until every task stopped; v2 sets `frozen 1` in cgroup.events.
        let deadline = std::time::Instant::now() + Duration::from_millis(500);
        while std::time::Instant::now() < deadline && !is_frozen(version, memory, file) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // Without a freezer, a forking process may add a child between the read and the kill:
    // repeat (the pids limit bounds how many there can be).
    for _ in 0..if froze.is_some() { 1 } else { 64 } {
        let pids = procs(memory);
        if pids.is_empty() {
            break;
        }
        kill(&pids);
    }
    if let Some((file, _, thawed)) = froze {
        let _ = std::fs::write(file, thawed);
    }
    wait_empty(memory);
}

fn is_frozen(version: Version, memory: &Path, freeze_file: &Path) -> bool {
    match version {
        Version::V1 => std::fs::read_to_string(freeze_file).is_ok_and(|s| s.trim() == "FROZEN"),
        Version::V2 => std::fs::read_to_string(memory.join("cgroup.events")).is_ok_and(|s| s.contains("frozen 1")),
    }
}

fn wait_empty(dir: &Path) {
    let deadline = std::time::Instant::now() + KILL_WAIT;
    while !procs(dir).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Where to try, best first: the configured root, then v2, then v1, each first under the
/// group this process already runs in (a container or a systemd slice), then at the top.
fn candidates(root: Option<&Path>, controller: &str) -> Vec<(Version, PathBuf)> {
    if let Some(root) = root {
        let version = if root.join("cgroup.controllers").exists() { Version::V2 } else { Version::V1 };
        return vec![(version, root.to_path_buf())];
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let v1_mount = format!("/sys/fs/cgroup/{controller}");
    let mut out = Vec::new();
    for (version, mount) in
        [(Version::V2, "/sys/fs/cgroup"), (Version::V2, "/sys/fs/cgroup/unified"), (Version::V1, v1_mount.as_str())]
    {
        let mount = Path::new(mount);
        let usable = match version {
            Version::V2 => {
                std::fs::read_to_string(mount.join("cgroup.controllers")).is_ok_and(|c| c.contains(controller))
            }
            // A v1 hierarchy is mounted at its controller's name (its root has no pids.max or
            // freezer.state: only children do).
            Version::V1 => mount.join("cgroup.procs").exists(),
        };
        if !usable {
            continue;
        }
        let own_path = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches = match version {
                Version::V2 => controllers.is_empty(),
                Version::V1 => controllers.split(',').any(|c| c == controller),
            };
            matches.then(|| path.trim_start_matches('/').to_string())
        });
        if let Some(own_path) = own_path.filter(|p| !p.is_empty()) {
            out.push((version, mount.join(own_path)));
        }
        out.push((version, mount.to_path_buf()));
    }
    out
}
