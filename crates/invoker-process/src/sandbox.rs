//! `invoker sandbox`: what the process factory runs for each container, as root, before the
//! kind's runtime command. In this order, before anything of the action runs:
//!
//! 1. it joins the container's cgroups (memory, pids, freezer), so that every process it ever
//!    starts is in them and removal can kill them all;
//! 2. it enters new mount and IPC namespaces and, unless the kind's network is `host`, a new
//!    network namespace with nothing but loopback;
//! 3. it builds a root of its own and pivots into it: the system's read-only directories
//!    (`/usr`, `/lib*`, `/bin`, the parts of `/etc` interpreters read), a `/tmp` and a
//!    `/dev/shm` of the container's own disk, the few devices a program needs, a `/proc` that hides other users' processes,
//!    the runtime binary, and the container's own directory. Nothing else of the host exists
//!    there: not the config, not the store, not another container's directory, whatever
//!    their permission bits say. Forked by the fork server, it copies its kind's template of
//!    all but the container's own parts (`sandbox_template.rs`) and adds those, rather than
//!    building the root whole;
//! 4. it drops to the container's own uid and gid (no supplementary groups, no capabilities)
//!    with `PR_SET_NO_NEW_PRIVS`, so nothing it executes can gain a privilege back;
//! 5. it executes the runtime command; when that is this binary's own `action-runtime`, it
//!    runs the runtime in place instead (the same code and environment, one exec of this
//!    large binary fewer per cold start).
//!
//! Without isolation (`[factory.process] unprivileged = false`, or an invoker that is not
//! root) only step 1 and 5 happen.

use clap::Args;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::unistd::{Gid, Uid};
use std::ffi::OsString;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};

/// The directories of the host a container sees, read-only (where they exist; a symlink such
/// as a merged `/usr`'s `/bin -> usr/bin` is recreated as it is).
const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// What of `/etc` the runtimes and interpreters read: the dynamic linker, users and name
/// resolution, time zones, certificates, the alternatives links Debian's binaries go through.
const ETC_ENTRIES: &[&str] = &[
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "group",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "protocols",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "resolv.conf",
    "services",
    "ssl",
    "timezone",
];

const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];

/// The `PATH` every action gets: system directories only.
pub const ACTION_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// `invoker sandbox [OPTIONS] -- COMMAND...`
#[derive(Args, Debug, Clone, Default)]
pub struct SandboxArgs {
    /// A cgroup's `tasks` (v1) or `cgroup.procs` (v2) file this process joins by writing `0`,
    /// before anything else.
    #[arg(long = "cgroup-procs")]
    pub cgroup_procs: Vec<PathBuf>,
    /// Build the container's own root, network and user (otherwise: cgroups only).
    #[arg(long)]
    pub isolate: bool,
    /// The uid and gid the container runs as.
    #[arg(long, default_value_t = 0)]
    pub uid: u32,
    /// Keep the host's network (the kind's `network = "host"`).
    #[arg(long)]
    pub host_network: bool,
    /// An empty directory (root's) where the container's root is built.
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// The container's own directory (its socket and work dir), writable, at the same path.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The runtime's working directory (inside `--dir`).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// A file or directory (the runtime binary, a runtime's installation) visible read-only at
    /// the same path.
    #[arg(long = "bind-file")]
    pub bind_files: Vec<PathBuf>,
    /// A host file or directory visible read-only at another path: pairs of HOST and AT.
    #[arg(long = "bind-at", num_args = 2, value_names = ["HOST", "AT"])]
    pub bind_at: Vec<PathBuf>,
    /// A path hidden even if it lies in a directory the container sees (the config file).
    #[arg(long)]
    pub mask: Vec<PathBuf>,
    /// The container's own directories bound at `/tmp` and at `/dev/shm` (on its disk, see
    /// `own_disk.rs`); required when isolating.
    #[arg(long)]
    pub tmp: Option<PathBuf>,
    #[arg(long)]
    pub shm: Option<PathBuf>,
    /// The command to run inside.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

impl SandboxArgs {
    /// The arguments of `invoker sandbox` that make this, after the subcommand's name.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut pair = |flag: &str, value: OsString| {
            args.push(flag.into());
            args.push(value);
        };
        for p in &self.cgroup_procs {
            pair("--cgroup-procs", p.into());
        }
        pair("--uid", self.uid.to_string().into());
        if let Some(root) = &self.root {
            pair("--root", root.into());
        }
        if let Some(dir) = &self.dir {
            pair("--dir", dir.into());
        }
        if let Some(dir) = &self.work_dir {
            pair("--work-dir", dir.into());
        }
        for f in &self.bind_files {
            pair("--bind-file", f.into());
        }
        for m in &self.mask {
            pair("--mask", m.into());
        }
        if let Some(dir) = &self.tmp {
            pair("--tmp", dir.into());
        }
        if let Some(dir) = &self.shm {
            pair("--shm", dir.into());
        }
        for pair_at in self.bind_at.chunks(2) {
            args.push("--bind-at".into());
            args.extend(pair_at.iter().map(OsString::from));
        }
        if self.isolate {
            args.push("--isolate".into());
        }
        if self.host_network {
            args.push("--host-network".into());
        }
        args.push("--".into());
        args.extend(self.command.iter().cloned());
        args
    }
}

/// Sets the container up and executes its command; returns only on failure. With `tree` (a
/// copy of the fork server's template, `sandbox_template.rs`), the container's root is that
/// tree with the container's own parts added, rather than built whole. `ready` is written once
/// our runtime listens (`invoker_runtime::run_telling`); a command of another kind never gets
/// it (close-on-exec).
pub fn enter(args: SandboxArgs, tree: Option<OwnedFd>, ready: Option<OwnedFd>) -> std::io::Error {
    let own = own_runtime(&args.command);
    match setup(&args, tree) {
        Ok(()) if own.is_some() => {
            // A uid change made the process undumpable (its /proc files root's); an exec would
            // have reset that, and nothing of root's is left to protect.
            let _ = nix::sys::prctl::set_dumpable(true);
            match invoker_runtime::run_telling(own.expect("checked"), ready) {
                Ok(()) => std::process::exit(0),
                Err(e) => e,
            }
        }
        Ok(()) => {
            let mut command = std::process::Command::new(&args.command[0]);
            command.args(&args.command[1..]);
            let e = command.exec();
            std::io::Error::new(e.kind(), format!("{}: {e}", Path::new(&args.command[0]).display()))
        }
        Err(e) => e,
    }
}

/// The runtime's options when `command` is this binary's `action-runtime` (and parses).
fn own_runtime(command: &[OsString]) -> Option<invoker_runtime::RuntimeOptions> {
    #[derive(clap::Parser)]
    struct ActionRuntime {
        #[command(flatten)]
        options: invoker_runtime::RuntimeOptions,
    }
    let exe = std::env::current_exe().ok()?;
    let (program, rest) = command.split_first()?;
    if Path::new(program) != exe || rest.first().is_none_or(|a| a != "action-runtime") {
        return None;
    }
    <ActionRuntime as clap::Parser>::try_parse_from(rest).ok().map(|a| a.options)
}

fn step<T, E: std::fmt::Display>(what: &str, result: Result<T, E>) -> std::io::Result<T> {
    result.map_err(|e| std::io::Error::other(format!("sandbox: {what}: {e}")))
}

fn setup(args: &SandboxArgs, tree: Option<OwnedFd>) -> std::io::Result<()> {
    // `0`: this process, single-threaded here (see `ContainerCgroups::create`).
    for procs in &args.cgroup_procs {
        step(&procs.display().to_string(), std::fs::write(procs, "0"))?;
    }
    step("open files limit", bound_open_files())?;
    if !args.isolate {
        return enter_work_dir(args);
    }
    let mut flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWIPC;
    if !args.host_network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    step("unshare", nix::sched::unshare(flags))?;
    if !args.host_network {
        step("loopback up", loopback_up())?;
    }
    let root = args.root.as_deref().ok_or_else(|| std::io::Error::other("sandbox: --root is required"))?;
    match tree {
        Some(tree) => step("filesystem", enter_tree(tree, root, args))?,
        None => step("filesystem", build_root(root, args))?,
    }
    step("chdir /", std::env::set_current_dir("/"))?;
    drop_privileges(args.uid)?;
    enter_work_dir(args)
}

/// Descriptors a container's processes may hold each, soft and hard (Docker's and OpenWhisk's
/// usual 1024): the invoker raises its own limit to serve many containers, and an action must
/// not inherit that.
pub const CONTAINER_OPEN_FILES: u64 = 1024;

fn bound_open_files() -> std::io::Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let bound = CONTAINER_OPEN_FILES.min(hard);
    Ok(setrlimit(Resource::RLIMIT_NOFILE, bound, bound)?)
}

/// Into the working directory, as the container's own user where it is isolated.
fn enter_work_dir(args: &SandboxArgs) -> std::io::Result<()> {
    match &args.work_dir {
        Some(dir) => step(&format!("chdir {}", dir.display()), std::env::set_current_dir(dir)),
        None => Ok(()),
    }
}

fn drop_privileges(uid: u32) -> std::io::Result<()> {
    if uid == 0 {
        return Err(std::io::Error::other("sandbox: refusing to run a container as uid 0"));
    }
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(uid));
    step("setgroups", nix::unistd::setgroups(&[]))?;
    step("setresgid", nix::unistd::setresgid(gid, gid, gid))?;
    step("setresuid", nix::unistd::setresuid(uid, uid, uid))?;
    step("no_new_privs", nix::sys::prctl::set_no_new_privs())?;
    // A uid change clears every capability; check rather than trust it.
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err(std::io::Error::other("sandbox: could take uid 0 back after dropping it"));
    }
    Ok(())
}

fn bind(source: &Path, target: &Path, read_only: bool) -> nix::Result<()> {
    let none: Option<&str> = None;
    mount(Some(source), target, none, MsFlags::MS_BIND | MsFlags::MS_REC, none)?;
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(none, target, none, flags, none)
}

fn tmpfs(target: &Path, options: &str) -> nix::Result<()> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), target, Some("tmpfs"), flags, Some(options))
}

/// `path` inside `root` (an absolute path's components under it).
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn io(what: impl std::fmt::Display, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{what}: {e}"))
}

/// The directories down to `dir`, those that are missing made 0711: the way to a bound path
/// can be walked but not listed (it would name the invoker's and other containers' paths).
fn create_dirs(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dirs(parent)?;
    }
    std::fs::create_dir(dir).map_err(|e| io(dir.display(), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(|e| io(dir.display(), e))
}

/// An empty file or directory at `target` to mount `source` on.
fn mount_point(source: &Path, target: &Path) -> std::io::Result<()> {
    if source.is_dir() {
        create_dirs(target)
    } else {
        if let Some(parent) = target.parent() {
            create_dirs(parent)?;
        }
        std::fs::write(target, b"").map_err(|e| io(target.display(), e))
    }
}

/// A host path made visible at the same path inside `root`: a symlink recreated, a directory
/// or file bound.
fn expose(root: &Path, host: &Path, read_only: bool) -> std::io::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(host) else { return Ok(()) };
    let target = inside(root, host);
    if meta.file_type().is_symlink() {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent.display(), e))?;
        }
        let link = std::fs::read_link(host).map_err(|e| io(host.display(), e))?;
        return std::os::unix::fs::symlink(link, &target).map_err(|e| io(target.display(), e));
    }
    mount_point(host, &target)?;
    bind(host, &target, read_only).map_err(|e| io(format!("bind {}", host.display()), e))
}

/// A host path made visible read-only at another path inside `root` (a kind's `paths` entry
/// `{ host, at }`). Where `at` is missing and its directory lies in a host tree bound
/// read-only (the system's directories), that directory is shadowed first: a tmpfs over it
/// holding its entries bound again, so the mount point is made there, never in the host's tree.
fn expose_at(root: &Path, host: &Path, at: &Path) -> std::io::Result<()> {
    let target = inside(root, at);
    if std::fs::symlink_metadata(&target).is_err() {
        let existing = target.ancestors().skip(1).find(|a| a.is_dir()).unwrap_or(root);
        let read_only = nix::unistd::access(existing, nix::unistd::AccessFlags::W_OK) == Err(nix::errno::Errno::EROFS);
        if read_only && existing != root {
            shadow(root, existing)?;
        }
        mount_point(host, &target)?;
    }
    bind(host, &target, true).map_err(|e| io(format!("bind {} at {}", host.display(), at.display()), e))
}

/// A tmpfs over `dir` (inside `root`) with what the host has at the same path bound again in
/// it, read-only: the same directory, where new mount points can be made.
fn shadow(root: &Path, dir: &Path) -> std::io::Result<()> {
    let host = Path::new("/").join(dir.strip_prefix(root).unwrap_or(dir));
    let entries: Vec<PathBuf> = std::fs::read_dir(&host)
        .map_err(|e| io(host.display(), e))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    tmpfs(dir, "size=64k,mode=0755").map_err(|e| io(format!("tmpfs {}", dir.display()), e))?;
    for entry in entries {
        expose(root, &entry, true)?;
    }
    Ok(())
}

/// A container's root built whole, in its own mount namespace: what a template holds, then the
/// container's own parts, then the pivot.
fn build_root(root: &Path, args: &SandboxArgs) -> std::io::Result<()> {
    make_mounts_private()?;
    tmpfs(root, "size=1m,mode=0755").map_err(|e| io(format!("tmpfs {}", root.display()), e))?;
    fill_shared(root, args)?;
    fill_own(root, args)?;
    pivot(root)
}

/// Nothing mounted from here on propagates back to the host.
fn make_mounts_private() -> std::io::Result<()> {
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).map_err(|e| io("make / private", e))
}

/// Where a container's own directory goes: a small tmpfs of its own is mounted on its parent,
/// in which its mount point is made. `None` where the directory lies under `/tmp` (made in the
/// container's own `/tmp`) or at the top (`/x`: no template serves it).
pub(crate) fn own_parent(args: &SandboxArgs) -> Option<&Path> {
    let parent = args.dir.as_deref()?.parent()?;
    (parent != Path::new("/") && !under_own_mounts(parent)).then_some(parent)
}

/// Whether a template can serve `args`: its own directory's mount point can be made without
/// writing to the template.
pub(crate) fn template_serves(args: &SandboxArgs) -> bool {
    args.isolate && args.dir.as_deref().is_none_or(|dir| under_own_mounts(dir) || own_parent(args).is_some())
}

/// Whether `path` (as the container sees it) lies in what each container mounts for itself:
/// its `/tmp`, `/dev/shm`, `/proc`.
fn under_own_mounts(path: &Path) -> bool {
    ["/tmp", "/dev/shm", "/proc"].iter().any(|own| path.starts_with(own))
}

/// Whether a bound path goes in each container's own part rather than the shared one.
fn bound_per_container(args: &SandboxArgs, at: &Path) -> bool {
    under_own_mounts(at) || own_parent(args).is_some_and(|parent| at.starts_with(parent))
}

/// What every container of the same kind sees alike, built in an empty tmpfs at `root`: the
/// system's directories, the chosen parts of `/etc`, the masks, `/dev`, the kind's files, and
/// the empty mount points of each container's own parts. A template is this, built once.
pub(crate) fn fill_shared(root: &Path, args: &SandboxArgs) -> std::io::Result<()> {
    for dir in SYSTEM_DIRS {
        expose(root, Path::new(dir), true)?;
    }
    std::fs::create_dir_all(root.join("etc")).map_err(|e| io("etc", e))?;
    for entry in ETC_ENTRIES {
        expose(root, &Path::new("/etc").join(entry), true)?;
    }
    // Only what lies in the host trees just exposed can show: hide it now, before the
    // container's own directory (which may lie under a masked one) is bound.
    for masked in &args.mask {
        let target = inside(root, masked);
        if target.is_dir() {
            tmpfs(&target, "size=4k,mode=0755").map_err(|e| io(format!("mask {}", masked.display()), e))?;
        } else if target.exists() {
            let none: Option<&str> = None;
            mount(Some("/dev/null"), &target, none, MsFlags::MS_BIND, none)
                .map_err(|e| io(format!("mask {}", masked.display()), e))?;
        }
    }
    let dev = root.join("dev");
    std::fs::create_dir_all(&dev).map_err(|e| io("dev", e))?;
    tmpfs(&dev, "size=64k,mode=0755").map_err(|e| io("tmpfs /dev", e))?;
    for device in DEVICES {
        let host = Path::new("/dev").join(device);
        let target = dev.join(device);
        std::fs::write(&target, b"").map_err(|e| io(target.display(), e))?;
        let none: Option<&str> = None;
        mount(Some(&host), &target, none, MsFlags::MS_BIND, none).map_err(|e| io(host.display(), e))?;
    }
    for (name, to) in [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")]
        .into_iter()
        .chain([("stderr", "/proc/self/fd/2")])
    {
        std::os::unix::fs::symlink(to, dev.join(name)).map_err(|e| io(name, e))?;
    }
    for own in [dev.join("shm"), root.join("tmp"), root.join("proc")] {
        std::fs::create_dir_all(&own).map_err(|e| io(own.display(), e))?;
    }
    for file in args.bind_files.iter().filter(|f| !bound_per_container(args, f)) {
        expose(root, file, true)?;
    }
    for pair in args.bind_at.chunks_exact(2).filter(|pair| !bound_per_container(args, &pair[1])) {
        expose_at(root, &pair[0], &pair[1])?;
    }
    if let Some(parent) = own_parent(args) {
        create_dirs(&inside(root, parent))?;
    }
    Ok(())
}

/// What is the container's own, on the mount points [`fill_shared`] made: its `/tmp` and
/// `/dev/shm` (on its disk: what it writes there counts against its disk limit), its `/proc`,
/// its directory, and whatever of the kind's files lies in them. Nothing here writes to what
/// [`fill_shared`] built: a template's tree stays as every container found it.
fn fill_own(root: &Path, args: &SandboxArgs) -> std::io::Result<()> {
    for (own, at) in [(&args.shm, root.join("dev/shm")), (&args.tmp, root.join("tmp"))] {
        let own = own.as_deref().ok_or_else(|| io(at.display(), "--tmp and --shm are required"))?;
        bind(own, &at, false).map_err(|e| io(format!("bind {} at {}", own.display(), at.display()), e))?;
    }
    let proc = root.join("proc");
    // hidepid=2: a process sees only its own user's entries in /proc.
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), &proc, Some("proc"), flags, Some("hidepid=2")).map_err(|e| io("mount /proc", e))?;
    if let Some(parent) = own_parent(args) {
        let target = inside(root, parent);
        tmpfs(&target, "size=16k,mode=0711").map_err(|e| io(format!("tmpfs {}", parent.display()), e))?;
    }
    // After /tmp and the directory's parent: the binary or a kind's file may lie in them.
    for file in args.bind_files.iter().filter(|f| bound_per_container(args, f)) {
        expose(root, file, true)?;
    }
    for pair in args.bind_at.chunks_exact(2).filter(|pair| bound_per_container(args, &pair[1])) {
        expose_at(root, &pair[0], &pair[1])?;
    }
    if let Some(dir) = &args.dir {
        expose(root, dir, false)?;
    }
    Ok(())
}

/// The old root goes: pivot onto `root` with the old stacked under it, then detach it; the
/// new root is read-only (this mount of it: a template's tree is shared).
fn pivot(root: &Path) -> std::io::Result<()> {
    std::env::set_current_dir(root).map_err(|e| io(root.display(), e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| io("pivot_root", e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| io("detach the old root", e))?;
    let none: Option<&str> = None;
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(none, "/", none, flags, none).map_err(|e| io("root read-only", e))
}

/// A container's root from `tree` (a copy of its template), in the container's new mount
/// namespace: the copy attached at `root`, the container's own parts added, the pivot.
fn enter_tree(tree: OwnedFd, root: &Path, args: &SandboxArgs) -> std::io::Result<()> {
    make_mounts_private()?;
    move_mount(&tree, root)
        .map_err(|e| std::io::Error::other(format!("attach the root at {}: {e}", root.display())))?;
    fill_own(root, args)?;
    pivot(root)
}

/// `move_mount(2)`'s flag: the source is the descriptor itself (no crate in the tree names it).
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 4;

/// `move_mount(2)`: attaches the detached tree `tree` at `target`.
#[allow(unsafe_code)]
fn move_mount(tree: &OwnedFd, target: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let target = std::ffi::CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: both paths are NUL-terminated and alive for the call; the descriptor is open.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if moved < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `ip link set lo up` in the new network namespace: SIOCSIFFLAGS on a socket. No crate in
/// the tree wraps the interface ioctls.
#[allow(unsafe_code)]
fn loopback_up() -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // Any socket serves the interface ioctls (the kernel hands them to the device layer).
    let socket = std::os::unix::net::UnixDatagram::unbound()?;
    // SAFETY: `ifreq` is plain old data, zeroed is a valid value; the name is NUL-terminated
    // within its 16 bytes; both ioctls read and write only the `ifreq` passed, which outlives
    // the calls; the fd is a live socket owned by `socket`.
    unsafe {
        let mut request: libc::ifreq = std::mem::zeroed();
        for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Finds an interpreter a container's uid can execute inside its root: the first `name` on
/// the invoker's `PATH` (then the system's) that resolves to a file under a directory the
/// container sees, executable by others, through directories others may search. `Ok(None)`:
/// not installed; `Err`: installed only where a container cannot run it (a shim under a 0700
/// home), naming the paths.
pub fn resolve_interpreter(name: &str) -> Result<Option<PathBuf>, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut unusable = Vec::new();
    for dir in std::env::split_paths(&path).chain(std::env::split_paths(ACTION_PATH)) {
        let candidate = dir.join(name);
        let Ok(resolved) = std::fs::canonicalize(&candidate) else { continue };
        if runnable_by_others(&resolved) && SYSTEM_DIRS.iter().any(|d| resolved.starts_with(d)) {
            return Ok(Some(resolved));
        }
        unusable.push(format!("{} ({})", candidate.display(), resolved.display()));
    }
    if unusable.is_empty() {
        Ok(None)
    } else {
        Err(format!(
            "{name} is installed only where an action's own uid cannot run it: {}; install it under /usr \
             (e.g. apt-get install {name}) or set [factory.process] unprivileged = false",
            unusable.join(", ")
        ))
    }
}

/// Executable by any user, through directories any user may search.
fn runnable_by_others(path: &Path) -> bool {
    let others_x = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    others_x(path) && path.ancestors().skip(1).all(others_x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SandboxArgs,
    }

    #[test]
    fn the_arguments_round_trip() {
        let args = SandboxArgs {
            cgroup_procs: vec!["/sys/fs/cgroup/memory/x/c1/cgroup.procs".into()],
            isolate: true,
            uid: 100_001,
            host_network: false,
            root: Some("/d/1.root".into()),
            dir: Some("/d/1".into()),
            work_dir: Some("/d/1/work".into()),
            bind_files: vec!["/usr/bin/invoker".into()],
            bind_at: vec!["/usr/bin/python3".into(), "/usr/local/bin/python".into()],
            mask: vec!["/etc/invoker.toml".into()],
            tmp: Some("/d/1/tmp".into()),
            shm: Some("/d/1/shm".into()),
            command: vec!["/usr/bin/invoker".into(), "action-runtime".into(), "--listen".into(), "x".into()],
        };
        let mut argv: Vec<OsString> = vec!["sandbox".into()];
        argv.extend(args.to_args());
        let parsed = Cli::parse_from(argv).args;
        assert_eq!(parsed.to_args(), args.to_args());
        assert_eq!(parsed.command.len(), 4);
        assert!(parsed.isolate && !parsed.host_network);
    }

    #[test]
    fn only_this_binarys_own_runtime_runs_in_place() {
        let exe: OsString = std::env::current_exe().unwrap().into();
        let args = |program: &OsString, sub: &str| -> Vec<OsString> {
            [program.clone()]
                .into_iter()
                .chain([sub, "--listen", "unix:/d/1/sock", "--launcher", "python"].map(OsString::from))
                .collect()
        };
        let options = own_runtime(&args(&exe, "action-runtime")).expect("ours");
        assert_eq!(options.launcher, invoker_runtime::Launcher::Python);
        assert!(own_runtime(&args(&"/usr/bin/python3".into(), "action-runtime")).is_none(), "another program");
        assert!(own_runtime(&args(&exe, "sandbox")).is_none(), "another subcommand");
    }

    #[test]
    fn inside_keeps_the_path_under_the_root() {
        assert_eq!(inside(Path::new("/r"), Path::new("/a/b")), Path::new("/r/a/b"));
    }

    #[test]
    fn a_file_in_a_private_directory_is_not_runnable_by_others() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("home");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let tool = private.join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!runnable_by_others(&tool));
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(runnable_by_others(&tool), runnable_by_others(dir.path()));
    }
}
