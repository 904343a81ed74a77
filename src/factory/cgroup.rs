//! Memory limits for local processes with the cgroup memory controller, v2 or v1, whichever
//! this machine lets us write. (`RLIMIT_AS` is no substitute: runtimes such as node reserve far
//! more address space than they use.)

use crate::pool::core::ContainerId;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

#[derive(Debug)]
pub struct MemoryCgroups {
    /// This invoker's own group; each container gets a child group in it.
    base: PathBuf,
    version: Version,
}

impl MemoryCgroups {
    /// Finds a writable memory controller and makes this invoker's group in it.
    pub fn detect(root: Option<&Path>, invoker_id: &str) -> Result<Self, String> {
        let group = format!("invoker-{invoker_id}");
        let mut tried = Vec::new();
        for (version, parent) in candidates(root) {
            let base = parent.join(&group);
            match std::fs::create_dir_all(&base) {
                Ok(()) if version == Version::V2 => {
                    let _ = std::fs::write(base.join("cgroup.subtree_control"), "+memory");
                    let enabled = std::fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
                    if enabled.contains("memory") {
                        return Ok(MemoryCgroups { base, version });
                    }
                    tried.push(format!("{}: memory controller not delegated", base.display()));
                }
                Ok(()) => return Ok(MemoryCgroups { base, version }),
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
        let v = match self.version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        };
        format!("the cgroup {v} memory controller under {}", self.base.display())
    }

    fn dir(&self, id: ContainerId) -> PathBuf {
        self.base.join(format!("c{}", id.0))
    }

    /// Puts `pid` (and so everything it spawns) under a limit of `memory_mb`, without swap.
    pub fn confine(&self, id: ContainerId, memory_mb: u32, pid: u32) -> std::io::Result<()> {
        let dir = self.dir(id);
        std::fs::create_dir_all(&dir)?;
        let bytes = (u64::from(memory_mb) * 1024 * 1024).to_string();
        match self.version {
            Version::V2 => {
                std::fs::write(dir.join("memory.max"), &bytes)?;
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            }
            Version::V1 => {
                std::fs::write(dir.join("memory.limit_in_bytes"), &bytes)?;
                let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), &bytes);
            }
        }
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
    }

    pub fn oom_killed(&self, id: ContainerId) -> bool {
        let file = match self.version {
            Version::V2 => "memory.events",
            Version::V1 => "memory.oom_control",
        };
        let text = std::fs::read_to_string(self.dir(id).join(file)).unwrap_or_default();
        text.lines().any(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0) > 0)
    }

    /// Removes a container's group once its processes are gone (the kernel refuses before).
    pub async fn remove(&self, id: ContainerId) {
        let dir = self.dir(id);
        for _ in 0..50 {
            if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!(dir = %dir.display(), "could not remove a container's cgroup");
    }

    /// Removes the groups an earlier run left (their processes were killed just before).
    pub fn remove_all_blocking(&self) {
        let Ok(entries) = std::fs::read_dir(&self.base) else { return };
        for entry in entries.flatten().filter(|e| e.path().is_dir()) {
            for _ in 0..50 {
                if std::fs::remove_dir(entry.path()).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Where to try, best first: the configured root, then v2, then v1, each first under the
/// group this process already runs in (a container or a systemd slice), then at the top.
fn candidates(root: Option<&Path>) -> Vec<(Version, PathBuf)> {
    if let Some(root) = root {
        let version = if root.join("cgroup.controllers").exists() { Version::V2 } else { Version::V1 };
        return vec![(version, root.to_path_buf())];
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut out = Vec::new();
    for (version, mount, controller) in [
        (Version::V2, "/sys/fs/cgroup", ""),
        (Version::V2, "/sys/fs/cgroup/unified", ""),
        (Version::V1, "/sys/fs/cgroup/memory", "memory"),
    ] {
        let mount = Path::new(mount);
        let usable = match version {
            Version::V2 => {
                std::fs::read_to_string(mount.join("cgroup.controllers")).is_ok_and(|c| c.contains("memory"))
            }
            Version::V1 => mount.join("memory.limit_in_bytes").exists(),
        };
        if !usable {
            continue;
        }
        let own_path = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches = if controller.is_empty() {
                controllers.is_empty()
            } else {
                controllers.split(',').any(|c| c == controller)
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
