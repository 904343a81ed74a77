//! The project's own action runtime, `invoker action-runtime`: speaks the OpenWhisk runtime
//! protocol (`POST /init` once, then `POST /run`) on the address or unix socket it is given,
//! and runs the action as one long-lived child through the actionloop protocol.
//!
//! It writes nothing of its own to stdout or stderr but the sentinels (and an init failure):
//! both streams are the action's logs.

// One audited exception: `sched` (a `sched_setscheduler` call no crate in the tree wraps).
#![deny(unsafe_code)]

mod action;
pub mod launchers;
mod sched;
mod server;

mod handlers;
mod options;
mod sentinels;
mod stream;
mod string_frame;

pub use action::NODE_SNAPSHOT;
pub use options::{Launcher, Listen, RuntimeOptions};
pub use sched::{policy_of, SchedPolicy};

use handlers::Runtime;
use options::PARENT_CHECK;
use std::rc::Rc;
use std::sync::OnceLock;

/// Sends this process's stdout and stderr, and so its action's (which inherits them), to the
/// named pipes in `dir`. Opened without waiting: no reader means the invoker that made them is
/// gone, and the runtime stops rather than hang. Writes then wait for room, as on any pipe.
fn output_to(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let [stdout, stderr] = invoker_wire::runtime::OUTPUT_PIPES.map(|name| {
        let path = dir.join(name);
        let opened = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&path);
        opened.map_err(|e| std::io::Error::new(e.kind(), format!("--output {}: {e}", path.display())))
    });
    let (stdout, stderr) = (stdout?, stderr?);
    for pipe in [&stdout, &stderr] {
        nix::fcntl::fcntl(pipe, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()))?;
    }
    nix::unistd::dup2_stdout(&stdout)?;
    nix::unistd::dup2_stderr(&stderr)?;
    Ok(())
}

/// Runs the runtime until it is killed or its invoker dies.
pub fn run(options: RuntimeOptions) -> std::io::Result<()> {
    run_telling(options, None)
}

/// [`run`], writing one byte to `ready` and closing it once the runtime listens: the invoker
/// that made the container waits on it rather than polling for the socket (the process
/// factory passes it through its fork server). Close-on-exec: no action process holds it.
pub fn run_telling(options: RuntimeOptions, ready: Option<std::os::fd::OwnedFd>) -> std::io::Result<()> {
    if let Some(dir) = &options.output {
        output_to(dir)?;
    }
    options.sched.apply().map_err(|e| std::io::Error::new(e.kind(), format!("--sched: {e}")))?;
    let (work, _temp) = match &options.work_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let temp = tempfile::Builder::new().prefix("invoker-action-").tempdir()?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    // One thread: the runtime serves one invoker, and its action runs in other processes.
    let reactor = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    // Bound before the runtime listens: when the invoker sees it ready, the zygote's launcher
    // may connect.
    let adopt = match &options.adopt {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            let _entered = reactor.enter();
            Some(tokio::net::UnixListener::bind(path)?)
        }
        None => None,
    };
    let runtime = Rc::new(Runtime {
        launcher: options.launcher,
        work: work.clone(),
        initializing: tokio::sync::Mutex::new(()),
        action: OnceLock::new(),
        adopt,
        idle: parking_lot::Mutex::new(Vec::new()),
        tag_logs: std::cell::Cell::new(false),
        prestarted: parking_lot::Mutex::new(None),
    });
    let result = local.block_on(&reactor, async {
        // Python without a zygote to fork one, and node: the launcher starts now, before
        // `/init`. One that cannot start is not an error here: `/init` starts one and says why
        // it failed.
        if matches!(options.launcher, Launcher::Python | Launcher::Nodejs) && runtime.adopt.is_none() {
            *runtime.prestarted.lock() = action::ActionProcess::prestart(options.launcher, &work).await.ok();
        }
        let listener = match &options.listen {
            Listen::Tcp(addr) => server::Listener::Tcp(tokio::net::TcpListener::bind(addr).await?),
            Listen::Unix(path) => {
                let _ = std::fs::remove_file(path);
                server::Listener::Unix(tokio::net::UnixListener::bind(path)?)
            }
        };
        if let Some(ready) = ready {
            // An invoker that gave the container up reads nothing: its polls or its exit watch
            // decide then, so a failed write changes nothing here.
            let _ = nix::unistd::write(&ready, b"r");
        }
        if let Some(pid) = options.parent_pid {
            tokio::task::spawn_local(exit_with_parent(pid, runtime.clone()));
        }
        server::serve(listener, runtime.clone()).await;
        Ok(())
    });
    runtime.kill_all();
    if options.work_dir.is_some() {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

/// Polls for the invoker: a runtime outliving it (SIGKILL) would be an orphan.
async fn exit_with_parent(pid: i32, runtime: Rc<Runtime>) {
    let parent = nix::unistd::Pid::from_raw(pid);
    let first_ppid = nix::unistd::getppid();
    loop {
        tokio::time::sleep(PARENT_CHECK).await;
        let gone = nix::sys::signal::kill(parent, None) == Err(nix::errno::Errno::ESRCH);
        if gone || nix::unistd::getppid() != first_ppid {
            runtime.kill_all();
            let _ = std::fs::remove_dir_all(&runtime.work);
            // Busy action processes too: when the runtime leads its own process group (as the
            // process factory starts it), the whole group goes, this process with it.
            if nix::unistd::getpgrp() == nix::unistd::getpid() {
                let _ = nix::sys::signal::killpg(nix::unistd::getpgrp(), nix::sys::signal::Signal::SIGKILL);
            }
            std::process::exit(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    /// The process factory waits on the byte rather than polling: it must come only once the
    /// socket takes connections, and the runtime must let the pipe go then (the end of the
    /// file follows), so that nothing it starts later holds it.
    #[test]
    fn the_runtime_says_it_listens_once_it_does_and_lets_the_pipe_go() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("runtime.sock");
        let options = RuntimeOptions {
            listen: Listen::Unix(socket.clone()),
            launcher: Launcher::Native,
            work_dir: Some(dir.path().join("work")),
            parent_pid: None,
            sched: SchedPolicy::default(),
            adopt: None,
            output: None,
        };
        std::fs::create_dir(dir.path().join("work")).unwrap();
        let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        std::thread::spawn(move || run_telling(options, Some(writer)));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut said = Vec::new();
            let _ = tx.send(std::fs::File::from(reader).read_to_end(&mut said).map(|_| said));
        });
        let said = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the pipe let go within 10 s");
        assert_eq!(said.unwrap(), b"r", "one byte, then the end of the file");
        std::os::unix::net::UnixStream::connect(&socket).expect("it listens once it said so");
    }
}
