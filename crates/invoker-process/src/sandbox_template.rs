//! A container's root copied from a template rather than built whole. Built whole, a root takes
//! ~60 mounts (the system's directories, each chosen file of `/etc`, the devices, the masks,
//! the kind's files) and as many files made to mount them on: 2–4 ms of a cold start here, and
//! CPU that a burst of cold starts waits for. All of it is alike for every container of a kind.
//!
//! So the fork server builds that part once ([`fill_shared`]) in an empty tmpfs, takes a
//! detached copy of the whole tree (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`) and detaches
//! what it built: the host's mount table keeps nothing of it. Each forked sandbox copies the
//! detached tree (one call), enters its new mount namespace, attaches the copy at its root
//! (`move_mount`) and adds only its own parts (`sandbox::fill_own`: its `/tmp`, `/dev/shm`,
//! `/proc` and directory), about 6 mounts.
//!
//! What the copies share, the template's tmpfs file systems (the root's top, `/dev`, the
//! masks), is read-only (`seal`): no container can write what another sees. Every mount point
//! a container's own part needs was made in the template; its directory's, which is per
//! container, goes in a tmpfs of its own mounted on the parent.
//!
//! A template binds the host's files as they were when it was built: a file replaced since
//! (`/etc/resolv.conf` rewritten) shows its old content until the template is built again,
//! [`TEMPLATE_LIFE`] later at most. A kernel that cannot copy a detached tree (before Linux 6.15
//! a copy must be made from an attached mount) builds each root whole, as before.

use crate::sandbox::{fill_shared, own_parent, template_serves, SandboxArgs};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::collections::HashMap;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a template serves before it is built again.
pub const TEMPLATE_LIFE: Duration = Duration::from_secs(60);

/// The most templates a server keeps: one per kind's set of files in practice.
const MAX_TEMPLATES: usize = 64;

const OPEN_TREE_CLONE: u32 = 1;

/// The shared part of a root, detached from every mount namespace.
pub struct RootTemplate {
    tree: OwnedFd,
    made: Instant,
}

impl RootTemplate {
    /// Builds the shared part of `args`'s root in a tmpfs at `at` (an empty directory of the
    /// invoker's), takes a detached copy and detaches what was built at `at`.
    pub fn build(at: &Path, args: &SandboxArgs) -> std::io::Result<RootTemplate> {
        std::fs::create_dir_all(at)?;
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount(Some("tmpfs"), at, Some("tmpfs"), flags, Some("size=1m,mode=0755"))?;
        let tree = fill_shared(at, args).and_then(|()| seal(at)).and_then(|()| {
            let flags = OPEN_TREE_CLONE | libc::AT_RECURSIVE as u32 | libc::O_CLOEXEC as u32;
            open_tree(Some(at), None, flags)
        });
        let _ = umount2(at, MntFlags::MNT_DETACH);
        let template = RootTemplate { tree: tree?, made: Instant::now() };
        // A kernel that cannot copy a detached tree says so here, once, not at each container.
        drop(template.copy()?);
        Ok(template)
    }

    /// A detached copy of the tree, for one container. Only in the mount namespace the
    /// template was built in: a forked sandbox calls this first, before its `unshare`.
    pub fn copy(&self) -> std::io::Result<OwnedFd> {
        let flags = OPEN_TREE_CLONE | libc::AT_RECURSIVE as u32 | libc::AT_EMPTY_PATH as u32 | libc::O_CLOEXEC as u32;
        open_tree(None, Some(&self.tree), flags)
    }

    fn fresh(&self) -> bool {
        self.made.elapsed() < TEMPLATE_LIFE
    }
}

/// Every tmpfs of the tree at `at` made read-only: the copies share them.
fn seal(at: &Path) -> std::io::Result<()> {
    let none: Option<&str> = None;
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    for point in invoker_factory::own_disk::mounts_of_type_under(at, "tmpfs") {
        mount(none, &point, none, flags, none)
            .map_err(|e| std::io::Error::other(format!("{} read-only: {e}", point.display())))?;
    }
    Ok(())
}

/// What sets one template apart from another: all that [`fill_shared`] reads.
#[derive(Hash, PartialEq, Eq)]
struct Key {
    bind_files: Vec<PathBuf>,
    bind_at: Vec<PathBuf>,
    mask: Vec<PathBuf>,
    own_parent: Option<PathBuf>,
}

impl Key {
    fn of(args: &SandboxArgs) -> Key {
        Key {
            bind_files: args.bind_files.clone(),
            bind_at: args.bind_at.clone(),
            mask: args.mask.clone(),
            own_parent: own_parent(args).map(Path::to_path_buf),
        }
    }
}

/// The fork server's templates, built where it was asked for one, on the first container of
/// each kind and again once older than [`TEMPLATE_LIFE`].
pub struct Templates {
    /// Where a template is built before it is detached (in the invoker's own directory).
    at: PathBuf,
    built: HashMap<Key, RootTemplate>,
    /// The first failure to build one: the kernel (or the host) cannot, and roots are built
    /// whole from then on.
    refused: Option<String>,
}

impl Templates {
    pub fn new(at: PathBuf) -> Templates {
        Templates { at, built: HashMap::new(), refused: None }
    }

    /// The template for `args`, if a fresh one is built.
    pub fn get(&self, args: &SandboxArgs) -> Option<&RootTemplate> {
        if !template_serves(args) {
            return None;
        }
        self.built.get(&Key::of(args)).filter(|template| template.fresh())
    }

    /// Builds the template for `args` where none fresh is (after its container was forked: the
    /// first container of a kind does not wait for it).
    pub fn prepare(&mut self, args: &SandboxArgs) {
        if self.refused.is_some() || !template_serves(args) || self.get(args).is_some() {
            return;
        }
        self.built.retain(|_, template| template.fresh());
        if self.built.len() >= MAX_TEMPLATES {
            return;
        }
        match RootTemplate::build(&self.at, args) {
            Ok(template) => {
                self.built.insert(Key::of(args), template);
            }
            Err(e) => {
                eprintln!("invoker sandbox-server: no root templates ({e}); each container's root is built whole");
                self.refused = Some(e.to_string());
            }
        }
    }
}

/// `open_tree(2)`: a detached copy of the tree at `path` or at `fd` (no crate in the tree wraps
/// it).
#[allow(unsafe_code)]
fn open_tree(path: Option<&Path>, fd: Option<&OwnedFd>, flags: u32) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(path.map_or(&b""[..], |p| p.as_os_str().as_bytes()))?;
    let dirfd = fd.map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd());
    // SAFETY: open_tree reads the NUL-terminated path (alive for the call) and returns a new
    // descriptor or -1.
    let opened = unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) };
    if opened < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor of this process, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(opened as RawFd) })
}
