//! A container's own disk: a tmpfs of the action's `limits.disk`, mounted by the invoker (as
//! root) on the container's directory on the host, before the container starts. Everything the
//! container may write lies in it (its working directory with the code, its `/tmp` and
//! `/dev/shm` as the process factory binds them, the Docker factory's socket directory), so a
//! write past the limit fails inside the container with ENOSPC, and nothing it writes reaches
//! the filesystem of `data_dir`, where the store and the other containers live.
//!
//! Why a tmpfs: it needs no device, no mkfs and no quota support from the host's filesystem
//! (a mount costs a few tens of microseconds); its pages are charged to the memory cgroup of
//! the process that writes them, the container's, so what a container writes counts against
//! its memory limit too and the node is never promised more than it has. The cost: written
//! data is memory, and a container fills its disk only as far as its memory allows.
//!
//! The mount lives in the invoker's mount namespace (the host must reach the runtime's socket
//! in the directory); it is detached when the container is removed, and a restart or the
//! watchdog detaches what an earlier run left (`unmount_under`).

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::path::{Path, PathBuf};

/// The files (inodes) a container's disk of `disk_mb` holds: one per 2 KiB of its size (a
/// non-empty file takes a 4 KiB page at least), so a flood of empty files fills it as a large
/// file does; 1,024 at least.
pub fn disk_inodes(disk_mb: u32) -> u64 {
    u64::from(disk_mb).saturating_mul(512).max(1024)
}

/// Whether this process may mount a container's disk (root, in the host's view).
pub fn can_mount() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Mounts a tmpfs of `size_mb` on `dir` (an existing, empty directory), its root owned by
/// `owner` with `mode`. Files are bounded too ([`disk_inodes`]), so a flood of empty
/// files fails as a large file does.
pub fn mount_on(dir: &Path, size_mb: u32, owner: (u32, u32), mode: u32) -> std::io::Result<()> {
    let inodes = disk_inodes(size_mb);
    let options = format!("size={size_mb}m,nr_inodes={inodes},mode={mode:o},uid={},gid={}", owner.0, owner.1);
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some(options.as_str()))
        .map_err(|e| std::io::Error::other(format!("tmpfs of {size_mb} MB on {}: {e}", dir.display())))
}

/// Detaches the disk mounted on `dir`; its pages go once no process of the container holds
/// them. A directory with nothing mounted on it is left as it is.
pub fn unmount(dir: &Path) {
    let _ = umount2(dir, MntFlags::MNT_DETACH);
}

/// Detaches every mount under `parent` (the disks an earlier run left), deepest first; returns
/// how many.
pub fn unmount_under(parent: &Path) -> usize {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return 0 };
    let mut points: Vec<PathBuf> =
        table.lines().filter_map(mount_point).filter(|p| p.starts_with(parent) && p != parent).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.iter().filter(|p| umount2(p.as_path(), MntFlags::MNT_DETACH).is_ok()).count()
}

/// The mount points of file system type `fstype` at `dir` or under it, in the order they were
/// mounted.
pub fn mounts_of_type_under(dir: &Path, fstype: &str) -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let of_type = |line: &&str| line.split_once(" - ").is_some_and(|(_, rest)| rest.split(' ').next() == Some(fstype));
    table.lines().filter(of_type).filter_map(mount_point).filter(|p| p.starts_with(dir)).collect()
}

/// The mount point of one line of `/proc/self/mountinfo` (its fifth field, with the kernel's
/// octal escapes of space, tab, newline and backslash undone).
fn mount_point(line: &str) -> Option<PathBuf> {
    let field = line.split(' ').nth(4)?;
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let escaped =
            bytes[i] == b'\\' && bytes.get(i + 1..i + 4).is_some_and(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if escaped {
            let value = bytes[i + 1..i + 4].iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
            out.push(value as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_point_is_read_with_its_escapes_undone() {
        let line = "36 35 0:30 / /data/pids/a\\040b rw,nosuid shared:1 - tmpfs tmpfs rw,size=65536k";
        assert_eq!(mount_point(line), Some(PathBuf::from("/data/pids/a b")));
        assert_eq!(mount_point("short line"), None);
    }

    /// Needs root; elsewhere there is nothing to mount with.
    #[test]
    #[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
    fn a_write_past_the_size_fails_with_enospc_and_unmounting_under_a_parent_finds_it() {
        if !can_mount() {
            return;
        }
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("1");
        std::fs::create_dir(&dir).unwrap();
        mount_on(&dir, 1, (0, 0), 0o700).unwrap();
        let err = std::fs::write(dir.join("big"), vec![0u8; 2 << 20]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        assert_eq!(unmount_under(parent.path()), 1);
        assert!(!dir.join("big").exists(), "the disk's files went with it");
    }
}
