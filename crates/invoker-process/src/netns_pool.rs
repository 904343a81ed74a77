//! Network namespaces made ahead of the containers that take them. A new network namespace
//! costs ~1 ms of CPU at `unshare` (its loopback device, its sysctl tables, its `/proc`
//! entries: the largest single step of a sandbox's set-up), on the path of every cold start and
//! of every start in a burst. So the fork server keeps a few ready, each with its loopback
//! up, and a forked sandbox that finds one enters it (`setns`) instead of making its own.
//!
//! They are made by a process of their own, the maker, forked from the server and running as
//! `SCHED_IDLE`: it uses only CPU nothing else wants, so making the next namespace never
//! competes with the cold start that took the last one, and never delays the server (which
//! must stay free to fork). The server asks it for one namespace per byte written on their
//! socket pair and receives each as a descriptor (SCM_RIGHTS); a namespace lives while a
//! descriptor of it is open, and is given to one container only, never used twice. The maker
//! ends when the server does (its end of the pair closes); if it fails, sandboxes make their own
//! namespace, as they did before.

use nix::sys::socket::{recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned};
use nix::sys::socket::{MsgFlags, SockFlag, SockType};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd};

/// How many namespaces wait ready: the first cold starts of a burst take them.
pub const READY_NETNS: usize = 8;

/// The server's side: the namespaces ready, and how many it asked for that have not come.
pub struct NetnsPool {
    maker: Option<OwnedFd>,
    ready: Vec<OwnedFd>,
    asked: usize,
}

impl NetnsPool {
    /// Forks the maker. Call it from the single-threaded fork server.
    pub fn start() -> std::io::Result<NetnsPool> {
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
        // SAFETY: the fork server is single-threaded, so the child may run any code; it never
        // returns (`make` exits).
        #[allow(unsafe_code)]
        match unsafe { nix::unistd::fork() }? {
            nix::unistd::ForkResult::Child => {
                drop(ours);
                make(theirs)
            }
            nix::unistd::ForkResult::Parent { .. } => {
                let mut pool = NetnsPool { maker: Some(ours), ready: Vec::new(), asked: 0 };
                pool.ask();
                Ok(pool)
            }
        }
    }

    /// What the server polls for the maker's namespaces (`None` once the maker is gone).
    pub fn maker(&self) -> Option<BorrowedFd<'_>> {
        self.maker.as_ref().map(|fd| fd.as_fd())
    }

    /// One namespace in from the maker (its socket is readable); a maker gone or failed is
    /// dropped, and sandboxes make their own from then on.
    pub fn receive(&mut self) {
        let Some(maker) = &self.maker else { return };
        let mut byte = [0u8; 1];
        let mut iov = [IoSliceMut::new(&mut byte)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let received = recvmsg::<()>(maker.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC);
        let mut namespaces = Vec::new();
        if let Ok(message) = &received {
            for cmsg in message.cmsgs().into_iter().flatten() {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    // SAFETY: the kernel just installed these descriptors in this process.
                    #[allow(unsafe_code)]
                    namespaces.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
        }
        match received {
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
            Ok(_) if !namespaces.is_empty() => {
                self.asked = self.asked.saturating_sub(1);
                self.ready.extend(namespaces);
            }
            _ => self.maker = None,
        }
    }

    /// A namespace for one container, if one is ready; the maker is asked for the next.
    pub fn take(&mut self) -> Option<OwnedFd> {
        let taken = self.ready.pop();
        self.ask();
        taken
    }

    fn ask(&mut self) {
        let Some(maker) = &self.maker else { return };
        while self.ready.len() + self.asked < READY_NETNS {
            let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
            if nix::sys::socket::send(maker.as_raw_fd(), b"n", flags).is_err() {
                return;
            }
            self.asked += 1;
        }
    }
}

/// The maker's loop: one namespace per byte the server writes, until it closes its end.
fn make(control: OwnedFd) -> ! {
    let kept = control.as_raw_fd();
    // Nothing of the server's: not its requests (fd 0), not its children's sockets.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
    }
    crate::sandbox_fork::close_from(3, &[kept]);
    let _ = set_idle();
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(&control, &mut byte) {
            Ok(0) => std::process::exit(0),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => std::process::exit(1),
        }
        let made = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)
            .and_then(|()| crate::sandbox::loopback_up())
            .and_then(|()| std::fs::File::open("/proc/thread-self/ns/net"));
        let Ok(namespace) = made else { std::process::exit(1) };
        let fds = [namespace.as_raw_fd()];
        let sent =
            sendmsg::<()>(kept, &[IoSlice::new(b"n")], &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None);
        if sent.is_err() {
            std::process::exit(0);
        }
    }
}

/// `sched_setscheduler(0, SCHED_IDLE)` (no crate in the tree wraps it): the maker runs only on
/// CPU nothing else wants.
#[allow(unsafe_code)]
fn set_idle() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` that outlives the call, which only reads it;
    // pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
