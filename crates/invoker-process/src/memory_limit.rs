//! An invoker that offers what its pod is given. On Kubernetes a pod's memory can be resized in
//! place (`pods/<name>/resize`): the kubelet writes the container's new limit into its cgroup,
//! and an invoker told to follow that file (`memory_limit_file`) offers the limit less its own
//! share (`own_memory_mb`), read again every [`POLL`]. A standby invoker's pod holds only that
//! share, so it offers nothing (and stays out of the cluster: `crate`'s registration), until
//! the capacity manager grows it.

use std::path::Path;
use std::time::Duration;

/// How often the limit is read again: a resize is seen within this.
pub const POLL: Duration = Duration::from_millis(100);

/// Limits at or above this many bytes are none (cgroup v1 writes its largest page-aligned
/// number for "no limit").
const UNLIMITED_BYTES: u64 = 1 << 60;

/// What a limit file's `text` leaves for actions beyond `own_mb`, in MB: `None` when it sets no
/// limit (cgroup v2's `max`). An error says what the text was.
pub fn offered_mb(text: &str, own_mb: u64) -> Result<Option<u64>, String> {
    let text = text.trim();
    if text == "max" {
        return Ok(None);
    }
    let bytes: u64 = text.parse().map_err(|_| format!("not a number of bytes nor `max`: {text:.40?}"))?;
    if bytes >= UNLIMITED_BYTES {
        return Ok(None);
    }
    Ok(Some((bytes >> 20).saturating_sub(own_mb)))
}

/// Reads `path` (at most 64 bytes of it: a limit is one number) and answers [`offered_mb`].
pub fn read(path: &Path, own_mb: u64) -> Result<Option<u64>, String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64).read_to_string(&mut text))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    offered_mb(&text, own_mb).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads `path` every [`POLL`] on a thread of its own and hands each figure to `apply` (`None`
/// limits are `unlimited_mb`), until `apply` answers `false` (its factory is gone). A read that
/// fails is logged once per run of failures, and the last figure stays.
pub fn follow(path: &Path, own_mb: u64, unlimited_mb: u64, apply: impl Fn(u64) -> bool + Send + 'static) {
    let path = path.to_path_buf();
    let spawned = std::thread::Builder::new().name("memory-limit".into()).spawn(move || {
        let mut failing = false;
        loop {
            std::thread::sleep(POLL);
            match read(&path, own_mb) {
                Ok(mb) => {
                    failing = false;
                    if !apply(mb.unwrap_or(unlimited_mb)) {
                        return;
                    }
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!("reading the pod's memory limit: {e}; the invoker offers what it read last");
                }
                Err(_) => {}
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("no thread to follow the memory limit ({e}): the invoker offers what it read at its start");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_less_the_invokers_own_share_is_offered() {
        assert_eq!(offered_mb("1342177280\n", 256), Ok(Some(1024)));
        assert_eq!(offered_mb("33554432", 32), Ok(Some(0)), "a standby pod: its own share only");
        assert_eq!(offered_mb("16777216", 32), Ok(Some(0)), "below its own share: nothing, not a wrap");
        assert_eq!(offered_mb("max\n", 256), Ok(None));
        assert_eq!(offered_mb("9223372036854771712", 0), Ok(None), "cgroup v1's no limit");
        assert!(offered_mb("", 0).unwrap_err().contains("not a number"));
        assert!(offered_mb("-1", 0).is_err());
        assert!(offered_mb("1G", 0).is_err());
    }

    #[test]
    fn a_file_that_changes_is_followed_until_its_factory_goes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("memory.max");
        std::fs::write(&file, "33554432").unwrap();
        assert_eq!(read(&file, 32), Ok(Some(0)));
        assert!(read(&dir.path().join("none"), 32).unwrap_err().contains("none"));
        let (seen, rx) = std::sync::mpsc::channel();
        follow(&file, 32, 4096, move |mb| seen.send(mb).is_ok());
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(0));
        std::fs::write(&file, (1056u64 << 20).to_string()).unwrap();
        let grown = (0..100).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).find(|&mb| mb != 0);
        assert_eq!(grown, Some(1024));
        std::fs::write(&file, "max").unwrap();
        let unlimited = (0..100).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).find(|&mb| mb != 1024);
        assert_eq!(unlimited, Some(4096));
        drop(rx);
    }
}
