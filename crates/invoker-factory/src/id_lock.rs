//! One live invoker per invoker id on a machine. A start removes what an earlier run of its id
//! left (its cgroups, the process groups its environment names): a second invoker started with a
//! live one's id would kill the live one's containers, whether etcd could have told it or not (it
//! may be unreachable). So the id is held with an exclusive `flock` on a file of its own under
//! `/run/invoker-ids` before anything is touched; the kernel releases it when the holder dies,
//! so a crashed invoker's restart takes it at once.

use nix::fcntl::{Flock, FlockArg};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::PathBuf;

const LOCK_DIR: &str = "/run/invoker-ids";

#[derive(Debug)]
pub struct IdLock {
    _lock: Flock<std::fs::File>,
}

impl IdLock {
    /// Holds `invoker_id` for this process, or says which live process holds it.
    pub fn take(invoker_id: &str) -> Result<IdLock, IdLockError> {
        let file = lock_dirs().iter().find_map(|dir| open_in(dir, invoker_id).ok());
        let file = match file {
            Some(file) => file,
            None => {
                let dirs: Vec<String> = lock_dirs().iter().map(|d| d.display().to_string()).collect();
                return Err(IdLockError::NoDirectory { id: invoker_id.into(), dirs: dirs.join(", ") });
            }
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                // Who holds it, for the message a second claimant gets (best effort).
                let _ = lock.set_len(0);
                let _ = lock.rewind();
                let _ = write!(lock, "{}", std::process::id());
                Ok(IdLock { _lock: lock })
            }
            Err((mut file, _)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                Err(IdLockError::Held { id: invoker_id.into(), holder: holder.trim().into() })
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IdLockError {
    #[error("no directory of {dirs} takes the lock of invoker id '{id}'")]
    NoDirectory { id: String, dirs: String },
    /// `holder`: the pid the holder wrote in the lock file.
    #[error(
        "invoker id '{id}' is held by a live invoker on this machine (pid {holder}): a second one would remove \
         its containers; give this one another invoker_id, or stop that one first"
    )]
    Held { id: String, holder: String },
}

/// `/run/invoker-ids` (root's), then one beside the system's temporary files for this user (an
/// invoker that is not root can touch only its own user's processes).
fn lock_dirs() -> [PathBuf; 2] {
    let user = nix::unistd::geteuid().as_raw();
    [PathBuf::from(LOCK_DIR), std::env::temp_dir().join(format!("invoker-ids-{user}"))]
}

fn open_in(dir: &std::path::Path, invoker_id: &str) -> std::io::Result<std::fs::File> {
    std::fs::create_dir_all(dir)?;
    // Not a directory someone else made in a shared place.
    use std::os::unix::fs::MetadataExt as _;
    if std::fs::symlink_metadata(dir)?.uid() != nix::unistd::geteuid().as_raw() {
        return Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
    }
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    std::fs::File::options().create(true).truncate(false).read(true).write(true).open(dir.join(invoker_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_held_once_and_free_again_when_its_holder_lets_go() {
        let id = format!("id-lock-test-{}", std::process::id());
        let held = IdLock::take(&id).unwrap();
        let second = IdLock::take(&id).unwrap_err();
        assert!(
            matches!(&second, IdLockError::Held { holder, .. } if *holder == std::process::id().to_string()),
            "{second}"
        );
        drop(held);
        assert!(IdLock::take(&id).is_ok());
    }
}
