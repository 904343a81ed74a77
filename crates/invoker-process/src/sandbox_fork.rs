//! The sandbox's fork server, `invoker sandbox-server`: a container's first process forked from
//! a process that has already loaded this binary, rather than the binary executed again for
//! each container. Executing the invoker's binary (150 MB, 23,000 relocations) and parsing its
//! command line cost a cold start ~5 ms of its ~12 ms create here, and as much CPU again in a
//! burst; a fork of this small single-threaded process costs a fraction of a millisecond. The
//! child then does exactly what `invoker sandbox` does (`sandbox::enter`): the sandbox is the
//! same code, only its start differs.
//!
//! The invoker talks to the server over a `SOCK_SEQPACKET` socket pair made when it starts it
//! (its fd 0): no path in the file system, so nothing a container runs can ask it for a fork.
//! A request is one message: the sandbox's arguments and the environment (see [`encode`]),
//! with four descriptors: the child's stdout and stderr (pipes the invoker reads), one end of a
//! socket pair of the request's own, on which the server answers `pid N` once forked and `exit
//! STATUS` when that child exits (the invoker is not its parent and cannot wait for it), and
//! the writing end of a pipe our runtime writes a byte to once it listens (the invoker waits on
//! it rather than polling for the socket; a child that executes another command closes it).
//! The server ends when the invoker does (its end of the pair closes); the containers it forked
//! go with the invoker, as any: the watchdog removes them.

use crate::sandbox::SandboxArgs;
use crate::sandbox_template::{RootTemplate, Templates};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};

/// The largest request: a sandbox's arguments and a runtime's environment are a few KB.
const MAX_REQUEST: usize = 256 * 1024;

/// One request's bytes: `ARGC ENVC\n`, then each argument and each `NAME=value` ended by a NUL
/// (none of them can hold one: they become a command line and an environment).
pub fn encode(args: &[OsString], env: &[(String, String)]) -> Vec<u8> {
    let mut out = format!("{} {}\n", args.len(), env.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(arg.as_bytes());
        out.push(0);
    }
    for (name, value) in env {
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

/// A request's arguments, and its environment's names and values.
pub type Request = (Vec<OsString>, Vec<(OsString, OsString)>);

/// A request, or why it is not one.
pub fn decode(bytes: &[u8]) -> Result<Request, String> {
    let end = bytes.iter().position(|&b| b == b'\n').ok_or("no counts")?;
    let counts = std::str::from_utf8(&bytes[..end]).map_err(|_| "counts are not text")?;
    let (argc, envc) = counts.split_once(' ').ok_or("two counts")?;
    let (argc, envc): (usize, usize) =
        (argc.parse().map_err(|_| "argument count")?, envc.parse().map_err(|_| "environment count")?);
    // Every field ends with its NUL: the body without the last NUL splits into exactly them.
    let body = &bytes[end + 1..];
    let fields: Vec<&[u8]> = match body.split_last() {
        None => Vec::new(),
        Some((0, fields)) => fields.split(|&b| b == 0).collect(),
        Some(_) => return Err("a field without its NUL".into()),
    };
    if fields.len() != argc + envc {
        return Err(format!("{} fields where {argc} arguments and {envc} variables were counted", fields.len()));
    }
    let args = fields[..argc].iter().map(|f| OsString::from_vec(f.to_vec())).collect();
    let mut env = Vec::with_capacity(envc);
    for entry in &fields[argc..] {
        let at = entry.iter().position(|&b| b == b'=').ok_or("a variable without '='")?;
        env.push((OsString::from_vec(entry[..at].to_vec()), OsString::from_vec(entry[at + 1..].to_vec())));
    }
    Ok((args, env))
}

/// Sends one request on `control` (the invoker's end of the server's pair): `request` with the
/// child's `stdout` and `stderr`, `answer` (the server's end of the request's own pair) and
/// `ready`'s writing end.
pub fn send(control: &OwnedFd, request: &[u8], fds: [&OwnedFd; 4]) -> std::io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let sent = sendmsg::<()>(control.as_raw_fd(), &[IoSlice::new(request)], &rights, MsgFlags::empty(), None)?;
    if sent != request.len() {
        return Err(std::io::Error::other("the request went out in part"));
    }
    Ok(())
}

/// The server's loop on `control` (its fd 0); returns when the invoker closed its end. Its
/// root templates are built in `pid_dir` (see `sandbox_template.rs`).
pub fn serve(control: OwnedFd, pid_dir: &std::path::Path) -> std::io::Result<()> {
    let mut templates = Templates::new(pid_dir.join("template"));
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block()?;
    let children_exit = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    // Each child's answer socket, until it exits.
    let mut answers: HashMap<i32, OwnedFd> = HashMap::new();
    let mut buffer = vec![0u8; MAX_REQUEST];
    loop {
        let (control_ready, exited) = {
            let mut fds = [
                PollFd::new(control.as_fd(), PollFlags::POLLIN),
                PollFd::new(children_exit.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
            let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if exited {
            while children_exit.read_signal().ok().flatten().is_some() {}
            reap(&mut answers);
        }
        if control_ready {
            match receive(&control, &mut buffer) {
                Ok(Some((request, fds))) => fork_one(&request, fds, &mut answers, &mut templates),
                Ok(None) => return Ok(()),
                // Nothing taken: the request is read at the next turn.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// One request, or `None` once the invoker closed its end.
fn receive(control: &OwnedFd, buffer: &mut [u8]) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(buffer)];
    let message = recvmsg::<()>(control.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for cmsg in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY (of the wrap): the kernel just installed these descriptors in this process
            // for this message; nothing else owns them.
            #[allow(unsafe_code)]
            fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let (len, truncated) = (message.bytes, message.flags.contains(MsgFlags::MSG_TRUNC));
    if len == 0 && fds.is_empty() {
        return Ok(None);
    }
    if truncated {
        return Ok(Some((Vec::new(), fds)));
    }
    Ok(Some((buffer[..len].to_vec(), fds)))
}

/// Forks the request's child, and answers its pid (or why none) on its answer socket; then
/// builds the template its kind's next containers are made from, if none fresh is.
fn fork_one(request: &[u8], fds: Vec<OwnedFd>, answers: &mut HashMap<i32, OwnedFd>, templates: &mut Templates) {
    let Ok::<[OwnedFd; 4], _>([stdout, stderr, answer, ready]) = fds.try_into() else { return };
    let (args, env) = match decode(request) {
        Ok(decoded) => decoded,
        Err(why) => return say(&answer, &format!("refused {why}")),
    };
    let parsed = <Sandbox as clap::Parser>::try_parse_from(std::iter::once(OsString::from("sandbox")).chain(args));
    let args = match parsed {
        Ok(sandbox) => sandbox.args,
        Err(e) => return say(&answer, &format!("refused sandbox arguments: {}", e.to_string().replace('\n', " "))),
    };
    // SAFETY: this process is single-threaded (its one thread runs this loop), so the child may
    // run any code; it never returns into the loop (`child` exits).
    #[allow(unsafe_code)]
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => child(&args, env, [stdout, stderr, ready], templates.get(&args)),
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            say(&answer, &format!("pid {child}"));
            answers.insert(child.as_raw(), answer);
            templates.prepare(&args);
        }
        Err(e) => say(&answer, &format!("refused fork: {e}")),
    }
}

/// Tells each exited child's invoker how it ended.
fn reap(answers: &mut HashMap<i32, OwnedFd>) {
    loop {
        let (pid, status) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, format!("exit status: {code}")),
            Ok(WaitStatus::Signaled(pid, signal, _)) => (pid, format!("signal: {} ({signal})", signal as i32)),
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        };
        if let Some(answer) = answers.remove(&pid.as_raw()) {
            say(&answer, &format!("exit {status}"));
        }
    }
}

/// One line to the invoker, never waiting; one that stopped listening (it gave the container
/// up) misses it.
fn say(answer: &OwnedFd, line: &str) {
    let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
    let _ = nix::sys::socket::send(answer.as_raw_fd(), format!("{line}\n").as_bytes(), flags);
}

/// The forked child: the invoker's pipes as its output, nothing else of the server's open, its
/// own process group, the requested environment, and then the sandbox as `invoker sandbox`
/// runs it. Never returns.
fn child(
    args: &SandboxArgs,
    env: Vec<(OsString, OsString)>,
    [stdout, stderr, ready]: [OwnedFd; 3],
    template: Option<&RootTemplate>,
) -> ! {
    // A template's tree can be copied only in the namespace it was made in, the server's: now.
    // Should the copy fail, the root is built whole.
    let tree = template.and_then(|template| template.copy().ok());
    let keep = [Some(ready.as_raw_fd()), tree.as_ref().map(|t| t.as_raw_fd())];
    let entered = become_container(env, stdout, stderr, &keep)
        .map(|()| crate::sandbox::enter(args.clone(), tree, Some(ready)).to_string());
    let (Ok(why) | Err(why)) = entered;
    // Its stderr: the invoker's pipe, where `invoker sandbox` says why too.
    eprintln!("{why}");
    std::process::exit(126)
}

/// What `Command` gives an executed child, here without the exec: its stdin `/dev/null`, its
/// stdout and stderr the invoker's pipes, nothing else of the server open but `keep`, no signal
/// blocked, its own process group and only the requested environment.
fn become_container(
    env: Vec<(OsString, OsString)>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    keep: &[Option<RawFd>],
) -> Result<(), String> {
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    nix::unistd::dup2_stdin(&null).map_err(|e| format!("stdin: {e}"))?;
    nix::unistd::dup2_stdout(&stdout).map_err(|e| format!("stdout: {e}"))?;
    nix::unistd::dup2_stderr(&stderr).map_err(|e| format!("stderr: {e}"))?;
    drop((null, stdout, stderr));
    close_from(3, keep);
    SigSet::all().thread_unblock().map_err(|e| format!("the signal mask: {e}"))?;
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0)).map_err(|e| format!("setpgid: {e}"))?;
    let inherited: Vec<OsString> = std::env::vars_os().map(|(name, _)| name).collect();
    for name in inherited {
        std::env::remove_var(name);
    }
    for (name, value) in env {
        std::env::set_var(name, value);
    }
    Ok(())
}

/// A pidfd of `pid` (no crate in the tree wraps `pidfd_open(2)`), taken as soon as the server
/// answered. Should the child have exited and been reaped already (its pid free for another
/// process), the server's exit line says so, and that marks its life over first.
#[allow(unsafe_code)]
fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; the
    // descriptor is owned by nothing else.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor of this process (just checked).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[derive(clap::Parser)]
struct Sandbox {
    #[command(flatten)]
    args: SandboxArgs,
}

/// Closes every descriptor from `first` up but those in `keep` (the request's ready pipe, the
/// copy of a root template): the child runs in place of the server, without an exec to close
/// what is close-on-exec (other children's answer sockets, the signalfd, the templates).
#[allow(unsafe_code)]
fn close_from(first: RawFd, keep: &[Option<RawFd>]) {
    for (low, high) in ranges_to_close(first, keep) {
        // SAFETY: close_range(2) only closes descriptors; none in the range is used again by
        // this process (the child keeps 0, 1, 2 and `keep`).
        unsafe {
            libc::syscall(libc::SYS_close_range, low as u32, high as u32, 0);
        }
    }
}

/// The ranges `[low, high]` from `first` to the last descriptor that hold none of `keep`.
fn ranges_to_close(first: RawFd, keep: &[Option<RawFd>]) -> Vec<(RawFd, RawFd)> {
    let mut kept: Vec<RawFd> = keep.iter().flatten().copied().filter(|&fd| fd >= first).collect();
    kept.sort_unstable();
    let mut ranges = Vec::with_capacity(kept.len() + 1);
    let mut low = first;
    for fd in kept {
        if fd > low {
            ranges.push((low, fd - 1));
        }
        let Some(next) = fd.checked_add(1) else { return ranges };
        low = low.max(next);
    }
    ranges.push((low, RawFd::MAX));
    ranges
}

/// The invoker's side: the server's process and the invoker's end of its pair. A server that
/// died is started again at the next fork.
pub struct ForkServer {
    executable: std::path::PathBuf,
    invoker_id: String,
    pid_dir: std::path::PathBuf,
    running: parking_lot::Mutex<Option<Running>>,
}

struct Running {
    process: std::process::Child,
    control: std::sync::Arc<OwnedFd>,
}

/// A forked sandbox: its pid (its process group's too) and pidfd, the read ends of its stdout
/// and stderr, the read end of its ready pipe (a byte once our runtime listens; the end of the
/// file, with none, from a child that executed another command or died), and where its exit
/// is said.
pub struct Forked {
    pub pid: u32,
    pub pidfd: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub ready: OwnedFd,
    pub exit: ForkedExit,
}

/// The answer socket's last line: how the forked sandbox ended.
pub struct ForkedExit(tokio::io::BufReader<tokio::net::UnixStream>);

impl ForkedExit {
    /// How it ended (`exit status: N`, `signal: N (SIG...)`), once it has; a server gone first
    /// says so.
    pub async fn status(mut self) -> String {
        use tokio::io::AsyncBufReadExt as _;
        let mut line = String::new();
        match self.0.read_line(&mut line).await {
            Ok(n) if n > 0 => line.trim_end().strip_prefix("exit ").unwrap_or(line.trim_end()).to_string(),
            _ => "its fork server is gone".to_string(),
        }
    }
}

/// `invoker sandbox-server --pid-dir DIR`, its stdin the invoker's end of the pair.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// The invoker's record of its containers (`data_dir/processes/<invoker_id>`), where root
    /// templates are built. On the command line also because a forked sandbox keeps the
    /// server's, so that each container's processes name the invoker they belong to (`ps`), as
    /// an executed `invoker sandbox` did.
    #[arg(long)]
    pub pid_dir: std::path::PathBuf,
}

impl ForkServer {
    /// Starts `executable sandbox-server`, in a process group of its own (a terminal's Ctrl-C
    /// to the invoker does not take it), with `INVOKER_ID` alone in its environment: what the
    /// watchdog reads in `/proc/<pid>/environ` to know a container's process as this
    /// invoker's, and a forked sandbox's is the server's.
    pub fn start(
        executable: &std::path::Path,
        invoker_id: &str,
        pid_dir: &std::path::Path,
    ) -> std::io::Result<ForkServer> {
        let server = ForkServer {
            executable: executable.to_path_buf(),
            invoker_id: invoker_id.to_string(),
            pid_dir: pid_dir.to_path_buf(),
            running: parking_lot::Mutex::new(None),
        };
        *server.running.lock() = Some(server.spawn()?);
        Ok(server)
    }

    fn spawn(&self) -> std::io::Result<Running> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        use std::os::unix::process::CommandExt as _;
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
        let process = std::process::Command::new(&self.executable)
            .arg("sandbox-server")
            .arg("--pid-dir")
            .arg(&self.pid_dir)
            .env_clear()
            .env("INVOKER_ID", &self.invoker_id)
            .stdin(std::process::Stdio::from(theirs))
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(Running { process, control: std::sync::Arc::new(ours) })
    }

    /// The server's control socket, started again if it died.
    fn control(&self) -> std::io::Result<std::sync::Arc<OwnedFd>> {
        let mut running = self.running.lock();
        if let Some(server) = running.as_mut() {
            if matches!(server.process.try_wait(), Ok(None)) {
                return Ok(server.control.clone());
            }
        }
        tracing::warn!("the sandbox fork server exited; starting it again");
        let server = running.insert(self.spawn()?);
        Ok(server.control.clone())
    }

    /// Forks a sandbox with `args` (`invoker sandbox`'s, after its name) and only `env`.
    pub async fn fork(&self, args: &[OsString], env: &[(String, String)]) -> std::io::Result<Forked> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        use tokio::io::AsyncBufReadExt as _;
        let (stdout, stdout_writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (stderr, stderr_writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (ready, ready_writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (answer, theirs) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?;
        let control = self.control()?;
        let request = encode(args, env);
        // A full queue (ten messages by default) waits for the server, off the async thread.
        // The writing ends go with the task: only the child holds them then.
        let sent = tokio::task::spawn_blocking(move || {
            send(&control, &request, [&stdout_writer, &stderr_writer, &theirs, &ready_writer])
        });
        sent.await.map_err(|_| std::io::Error::other("the request's task failed"))??;
        let answer = std::os::unix::net::UnixStream::from(answer);
        answer.set_nonblocking(true)?;
        let mut answer = tokio::io::BufReader::new(tokio::net::UnixStream::from_std(answer)?);
        let mut line = String::new();
        let bound = std::time::Duration::from_secs(10);
        let read = tokio::time::timeout(bound, answer.read_line(&mut line)).await;
        read.map_err(|_| std::io::Error::other("the sandbox fork server did not answer within 10 s"))??;
        let pid = match line.trim_end().strip_prefix("pid ").map(str::parse::<u32>) {
            Some(Ok(pid)) => pid,
            _ => return Err(std::io::Error::other(format!("the sandbox fork server answered '{}'", line.trim_end()))),
        };
        match pidfd_open(pid) {
            Ok(pidfd) => Ok(Forked { pid, pidfd, stdout, stderr, ready, exit: ForkedExit(answer) }),
            Err(e) => {
                // Not known, not kept: its group goes before the caller starts another sandbox.
                let _ = nix::sys::signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips() {
        let args: Vec<OsString> =
            vec!["--isolate".into(), "".into(), "--".into(), OsString::from_vec(b"/x\xff".to_vec())];
        let env = vec![("A".to_string(), "1=2".to_string()), ("EMPTY".to_string(), String::new())];
        let (a, e) = decode(&encode(&args, &env)).unwrap();
        assert_eq!(a, args);
        assert_eq!(e, env.iter().map(|(n, v)| (OsString::from(n), OsString::from(v))).collect::<Vec<_>>());
    }

    #[test]
    fn a_child_closes_all_but_what_it_keeps() {
        assert_eq!(ranges_to_close(3, &[None, None]), [(3, RawFd::MAX)]);
        assert_eq!(ranges_to_close(3, &[Some(7), Some(4)]), [(3, 3), (5, 6), (8, RawFd::MAX)]);
        assert_eq!(ranges_to_close(3, &[Some(3), Some(3)]), [(4, RawFd::MAX)]);
        assert_eq!(ranges_to_close(3, &[Some(1), Some(RawFd::MAX)]), [(3, RawFd::MAX - 1)]);
    }

    #[test]
    fn a_request_that_is_not_one_is_refused() {
        for bad in [&b""[..], b"1 0", b"x 0\n", b"2 0\na\0", b"0 1\nnoequals\0", b"0 0\nextra\0"] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }
}
