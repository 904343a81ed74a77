//! The uids local containers run as: one per live container, from a configured range, never
//! given out while any process of it lives, on this machine, whichever invoker asks.
//!
//! A uid is taken with an exclusive `flock` on its file under `LOCK_DIR` (released by the
//! kernel when the holder dies, so a crashed invoker's uids come back) and only when no process
//! on the machine runs as it (one left by a crashed invoker, still running until the restart
//! kills its cgroup).

use nix::fcntl::{Flock, FlockArg};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

const LOCK_DIR: &str = "/run/invoker-uids";

/// A uid held for one container; dropping it gives it back.
#[derive(Debug)]
pub struct HeldUid {
    pub uid: u32,
    _lock: Flock<std::fs::File>,
}

#[derive(Debug)]
pub struct UidRange {
    base: u32,
    count: u32,
    /// Where the next search starts: uids are handed out round the range, so a freed one is
    /// the last to be reused.
    next: parking_lot::Mutex<u32>,
    dir: PathBuf,
    /// The uids processes ran as, and when that was read (see [`RUNNING_FRESH`]).
    running: parking_lot::Mutex<Option<(std::time::Instant, std::collections::HashSet<u32>)>>,
}

/// How long one read of the uids processes run as serves. Reading them means a `stat` of
/// every process on the machine: in a burst of cold starts, hundreds per container, on the
/// thread that serves the API. An older read is as safe: a uid with a process seen running is
/// skipped, and a process cannot start as a uid nobody holds except as a child of one already
/// seen (a crashed invoker's leftovers), so a read can only be stale the safe way.
const RUNNING_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

impl UidRange {
    pub fn new(base: u32, count: u32) -> std::io::Result<Self> {
        let dir = PathBuf::from(LOCK_DIR);
        std::fs::create_dir_all(&dir)?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(UidRange { base, count, next: parking_lot::Mutex::new(0), dir, running: parking_lot::Mutex::new(None) })
    }

    /// A uid no other container and no process holds.
    pub fn take(&self) -> Result<HeldUid, UidsError> {
        let mut read = self.running.lock();
        let running = match &*read {
            Some((at, uids)) if at.elapsed() < RUNNING_FRESH => uids,
            _ => &read.insert((std::time::Instant::now(), uids_running())).1,
        };
        let mut next = self.next.lock();
        for step in 0..self.count {
            let offset = (*next + step) % self.count;
            let uid = self.base + offset;
            if running.contains(&uid) {
                continue;
            }
            let path = self.dir.join(uid.to_string());
            let file = match std::fs::File::options().create(true).truncate(false).write(true).open(&path) {
                Ok(file) => file,
                Err(e) if out_of_descriptors(&e) => return Err(UidsError::OutOfDescriptors(e)),
                Err(_) => continue,
            };
            if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                *next = (offset + 1) % self.count;
                return Ok(HeldUid { uid, _lock: lock });
            }
        }
        Err(UidsError::AllInUse { base: self.base, end: u64::from(self.base) + u64::from(self.count) })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UidsError {
    #[error("the invoker is out of file descriptors ({0})")]
    OutOfDescriptors(std::io::Error),
    #[error("every uid of {base}..{end} is in use")]
    AllInUse { base: u32, end: u64 },
}

/// Whether `e` says this process (EMFILE) or the machine (ENFILE) has no descriptor left: not
/// a uid in use, and worth saying as what it is.
pub fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// The uids of every process on the machine (the owner of its `/proc` entry).
fn uids_running() -> std::collections::HashSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Default::default() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    /// A uid some process runs as (a crashed invoker's leftover) is skipped, by the read of the
    /// running uids and by the same read served again; two takes never give one uid twice.
    #[test]
    #[cfg_attr(invoker_without_root, ignore = "needs root: a process run as another uid (run by .ci/run)")]
    fn a_uid_a_process_runs_as_is_never_given_out() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // A range of its own, far from the defaults (the lock files are the machine's).
        let base = 3_900_000 + std::process::id() % 10_000 * 4;
        let mut leftover = std::process::Command::new("sleep").arg("30").uid(base).gid(base).spawn().unwrap();
        let range = UidRange::new(base, 3).unwrap();
        let first = range.take().unwrap();
        let second = range.take().unwrap();
        let _ = leftover.kill();
        let _ = leftover.wait();
        assert_ne!(first.uid, base, "the leftover's uid");
        assert_ne!(second.uid, base, "the leftover's uid, from the read served again");
        assert_ne!(first.uid, second.uid);
    }
}
