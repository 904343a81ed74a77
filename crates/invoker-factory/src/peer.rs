//! Who answers when the invoker connects to a container. The invoker runs as root on the host;
//! a container's runtime listens on a socket in a directory its action can write, and its
//! action can kill the runtime and listen there itself. So nothing about the path is trusted:
//!
//! - the socket's directory is opened before the container starts ([`ContainerSocket`]): a
//!   directory the action renames or replaces later is not the one connected through;
//! - the socket is opened without following links (`O_PATH | O_NOFOLLOW`), must be a socket,
//!   and the connection goes to that very file (`/proc/self/fd/N`): a link the action put in
//!   its place, to another tenant's socket, is refused, never followed;
//! - every new connection's peer ([`Peer`], from `SO_PEERCRED`) must be the container's own:
//!   its uid (no other container has it), or a process of its cgroup;
//! - the runtime process the factory started must still be alive: once it exited, whatever
//!   listens in its place answers for nothing.
//!
//! A refusal is the action's doing (a developer error): its container is removed and the
//! record says why.

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Why a connection to a container was not used.
#[derive(Debug, thiserror::Error)]
pub enum StrangerError {
    #[error("its runtime socket {0} is no longer a socket (a link or a file was put in its place)")]
    NotASocket(PathBuf),
    #[error("its runtime socket was answered by uid {found}, not by the container's own uid {expected}")]
    Uid { found: u32, expected: u32 },
    #[error("its runtime socket was answered by a process outside the container ({0})")]
    Outside(String),
    #[error("the runtime process the invoker started has exited")]
    RuntimeExited,
    #[error("its runtime socket {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// A unix socket named `name` in a directory held open since before its container started.
#[derive(Debug)]
pub struct ContainerSocket {
    dir: Arc<OwnedFd>,
    name: OsString,
    /// The directory's path when it was opened, for messages.
    shown: PathBuf,
}

impl PartialEq for ContainerSocket {
    fn eq(&self, other: &Self) -> bool {
        self.shown == other.shown && self.name == other.name
    }
}

impl Eq for ContainerSocket {}

impl ContainerSocket {
    /// `name` in `dir`; `dir` is opened now, so call this before the container can touch it.
    pub fn in_dir(dir: &Path, name: impl Into<OsString>) -> std::io::Result<Self> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(dir, flags, Mode::empty())?;
        Ok(ContainerSocket { dir: Arc::new(fd), name: name.into(), shown: dir.to_path_buf() })
    }

    /// Another name in the same directory (the sibling an Fn listener links to).
    pub fn sibling(&self, name: impl Into<OsString>) -> Self {
        ContainerSocket { dir: self.dir.clone(), name: name.into(), shown: self.shown.clone() }
    }

    /// Where it was, for messages and logs.
    pub fn path(&self) -> PathBuf {
        self.shown.join(&self.name)
    }

    /// A connection to the socket that is there now, if it is a socket: never through a link.
    pub async fn connect(&self) -> Result<tokio::net::UnixStream, StrangerError> {
        let io = |source: std::io::Error| StrangerError::Io { path: self.path(), source };
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd =
            nix::fcntl::openat(&*self.dir, self.name.as_os_str(), flags, Mode::empty()).map_err(|e| io(e.into()))?;
        let stat = nix::sys::stat::fstat(&fd).map_err(|e| io(e.into()))?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
            return Err(StrangerError::NotASocket(self.path()));
        }
        tokio::net::UnixStream::connect(format!("/proc/self/fd/{}", fd.as_raw_fd())).await.map_err(io)
    }

    /// What `name` is in the directory now, without following it.
    pub fn kind_of(&self, name: &OsStr) -> std::io::Result<SFlag> {
        let stat = nix::sys::stat::fstatat(&*self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
        Ok(SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT)
    }

    /// Where the link `name` in the directory points.
    pub fn link_target(&self, name: &OsStr) -> std::io::Result<PathBuf> {
        Ok(nix::fcntl::readlinkat(&*self.dir, name)?.into())
    }
}

/// The process a factory started for a container: once it exited, the container is over,
/// whatever listens where it did.
#[derive(Debug)]
pub struct RuntimeLife {
    pid: i32,
    exited: AtomicBool,
    /// A process this one did not fork (a fork server's child): its pidfd, readable once it
    /// exited, which no later process with the same pid can answer for.
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl RuntimeLife {
    /// `pid` must be a child of this process.
    pub fn new(pid: i32) -> Self {
        RuntimeLife { pid, exited: AtomicBool::new(false), pidfd: None }
    }

    /// A process another one forked, known by its pidfd (`pidfd_open(2)`).
    pub fn of_pidfd(pid: i32, pidfd: std::os::fd::OwnedFd) -> Self {
        RuntimeLife { pid, exited: AtomicBool::new(false), pidfd: Some(pidfd) }
    }

    /// Said by whoever waited for the child.
    pub fn mark_exited(&self) {
        self.exited.store(true, Ordering::Release);
    }

    /// Whether it exited, asked of the kernel (a child that died a moment ago is a zombie until
    /// it is waited for; `WNOWAIT` leaves that to its owner).
    pub fn exited(&self) -> bool {
        if self.exited.load(Ordering::Acquire) {
            return true;
        }
        if let Some(pidfd) = &self.pidfd {
            use std::os::fd::AsFd as _;
            let mut fds = [nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN)];
            return nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO)
                .is_ok_and(|_| fds[0].revents().is_some_and(|r| !r.is_empty()));
        }
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match nix::sys::wait::waitid(Id::Pid(nix::unistd::Pid::from_raw(self.pid)), flags) {
            Ok(WaitStatus::StillAlive) => false,
            Ok(_) | Err(nix::errno::Errno::ECHILD) => true,
            Err(_) => false,
        }
    }
}

/// Who may answer a new connection to a container. The default checks nothing (a backend
/// whose containers the invoker reaches at an address they cannot move, a pod's IP).
#[derive(Debug, Default)]
pub struct Peer {
    /// The container's own uid: no other container's process has it.
    pub uid: Option<u32>,
    /// Where the container's processes are listed (its cgroup's `cgroup.procs`), for
    /// containers that share the invoker's uid.
    pub procs: Option<PathBuf>,
    /// A name the peer's `/proc/<pid>/cgroup` must hold (a Docker container's id).
    pub cgroup_name: Option<String>,
    /// The runtime process the factory started.
    pub runtime: Option<Arc<RuntimeLife>>,
}

impl Peer {
    /// `cred`: the peer of a unix socket; `None` on TCP, where only the runtime's life counts.
    pub fn check(&self, cred: Option<tokio::net::unix::UCred>) -> Result<(), StrangerError> {
        if self.runtime.as_ref().is_some_and(|r| r.exited()) {
            return Err(StrangerError::RuntimeExited);
        }
        let Some(cred) = cred else { return Ok(()) };
        if let Some(expected) = self.uid {
            if cred.uid() != expected {
                return Err(StrangerError::Uid { found: cred.uid(), expected });
            }
        }
        if self.procs.is_none() && self.cgroup_name.is_none() {
            return Ok(());
        }
        let pid = cred.pid().filter(|&p| p > 0).ok_or_else(|| StrangerError::Outside("no pid".into()))?;
        if let Some(procs) = &self.procs {
            let listed = std::fs::read_to_string(procs).unwrap_or_default();
            if !listed.lines().any(|l| l.trim().parse() == Ok(pid)) {
                return Err(StrangerError::Outside(format!("pid {pid}, not in {}", procs.display())));
            }
        }
        if let Some(name) = &self.cgroup_name {
            let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if !groups.contains(name.as_str()) {
                return Err(StrangerError::Outside(format!("pid {pid}, whose cgroups do not name {name}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::os::unix::net::UnixListener;

    #[tokio::test]
    async fn a_socket_is_reached_and_a_link_in_its_place_is_refused_not_followed() {
        let (mine, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let _own = UnixListener::bind(mine.path().join("sock")).unwrap();
        let _other = UnixListener::bind(theirs.path().join("sock")).unwrap();
        let socket = ContainerSocket::in_dir(mine.path(), "sock").unwrap();
        assert!(socket.connect().await.is_ok());

        std::fs::remove_file(mine.path().join("sock")).unwrap();
        symlink(theirs.path().join("sock"), mine.path().join("sock")).unwrap();
        assert!(matches!(socket.connect().await, Err(StrangerError::NotASocket(_))));
        std::fs::remove_file(mine.path().join("sock")).unwrap();
        std::fs::write(mine.path().join("sock"), "").unwrap();
        assert!(matches!(socket.connect().await, Err(StrangerError::NotASocket(_))));
    }

    #[tokio::test]
    async fn a_directory_swapped_after_it_was_opened_is_not_the_one_connected_through() {
        let parent = tempfile::tempdir().unwrap();
        let (dir, other) = (parent.path().join("iofs"), parent.path().join("other"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&other).unwrap();
        let socket = ContainerSocket::in_dir(&dir, "sock").unwrap();
        std::fs::rename(&dir, parent.path().join("moved")).unwrap();
        symlink(&other, &dir).unwrap();
        let _other = UnixListener::bind(other.join("sock")).unwrap();
        assert!(socket.connect().await.is_err(), "the other directory's socket is never reached");
    }

    #[tokio::test]
    async fn a_peer_of_another_uid_or_outside_the_listed_processes_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::UnixListener::bind(dir.path().join("sock")).unwrap();
        let stream = tokio::net::UnixStream::connect(dir.path().join("sock")).await.unwrap();
        let _accepted = listener.accept().await.unwrap();
        let cred = stream.peer_cred().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        assert!(Peer { uid: Some(me), ..Peer::default() }.check(Some(cred)).is_ok());
        let other = Peer { uid: Some(me + 1), ..Peer::default() };
        assert!(matches!(other.check(Some(cred)), Err(StrangerError::Uid { .. })));

        let procs = dir.path().join("cgroup.procs");
        std::fs::write(&procs, format!("1\n{}\n", std::process::id())).unwrap();
        assert!(Peer { procs: Some(procs.clone()), ..Peer::default() }.check(Some(cred)).is_ok());
        std::fs::write(&procs, "1\n").unwrap();
        assert!(matches!(
            Peer { procs: Some(procs), ..Peer::default() }.check(Some(cred)),
            Err(StrangerError::Outside(_))
        ));
    }

    #[tokio::test]
    async fn a_runtime_that_exited_answers_for_nothing_even_before_it_is_waited_for() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let life = RuntimeLife::new(child.id() as i32);
        let peer = Peer { runtime: Some(Arc::new(life)), ..Peer::default() };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while peer.check(None).is_ok() {
            assert!(std::time::Instant::now() < deadline, "the exit was never seen");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(matches!(peer.check(None), Err(StrangerError::RuntimeExited)));
        child.wait().unwrap();
        assert!(peer.check(None).is_err(), "still, once it was waited for");
    }
}
