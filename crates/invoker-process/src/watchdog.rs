//! `invoker watchdog`: a small process the process factory starts beside the invoker, which
//! removes every container the moment the invoker dies, however it dies (SIGKILL included), and
//! whatever the runtimes do. Our own runtime exits with its invoker, but another runtime
//! (OpenWhisk's actionloop proxy, a user's script) knows nothing of the invoker, and what any
//! runtime forked keeps running after the runtime itself is gone.
//!
//! Why not `PR_SET_PDEATHSIG`: it is sent when the *thread* that forked the child exits, not the
//! process (a pool thread that retires would kill healthy containers), a uid change clears it,
//! and it reaches only that one process, not its children. The watchdog holds the read end of
//! a pipe whose only write end is the invoker's (close-on-exec, so no runtime inherits it);
//! the kernel closes it when the invoker is gone, the read returns, and the watchdog kills what
//! the containers' cgroups hold (a freeze first, so nothing forks away) and the process groups
//! the invoker recorded: the same clean-up a restart of the invoker does.
//!
//! A restart kills an earlier run's watchdog with the rest (it is recorded as
//! `watchdog.pid` under the invoker's id), so it cannot outlive its run into the next one.

use crate::cgroup::ContainerCgroups;
use clap::Args;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// `invoker watchdog --invoker-id ID --pid-dir DIR [--cgroup-root DIR]`, its stdin the pipe.
#[derive(Args, Debug, Clone)]
pub struct WatchdogArgs {
    #[arg(long)]
    pub invoker_id: String,
    /// The invoker's record of its containers (`data_dir/processes/<invoker_id>`).
    #[arg(long)]
    pub pid_dir: PathBuf,
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
}

/// Waits for the invoker to be gone (its end of stdin closed), then removes what it left, its
/// own cgroups last.
pub fn watch(args: WatchdogArgs) -> std::io::Result<()> {
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    while stdin.read(&mut buf)? > 0 {}
    let cgroups = ContainerCgroups::detect(args.cgroup_root.as_deref(), &args.invoker_id).ok();
    let killed = remove_left(&args.invoker_id, &args.pid_dir, cgroups.as_ref());
    if killed > 0 {
        eprintln!("invoker watchdog: the invoker {} is gone; removed {killed} of its containers", args.invoker_id);
    }
    for left in cgroups.map(|cg| cg.remove_own()).unwrap_or_default() {
        eprintln!("invoker watchdog: the invoker {}'s cgroup stays: {left}", args.invoker_id);
    }
    Ok(())
}

/// Kills what a run of this invoker left: every process in its containers' cgroups, and the
/// process groups it recorded if they are still its own (their environment names this
/// invoker); then detaches their disks and removes the records and the containers'
/// directories. Returns how many it
/// killed. The calling process itself is spared (the watchdog is recorded there too).
pub fn remove_left(invoker_id: &str, pid_dir: &Path, cgroups: Option<&ContainerCgroups>) -> usize {
    let Ok(entries) = std::fs::read_dir(pid_dir) else { return 0 };
    let marker = format!("INVOKER_ID={invoker_id}");
    let own = std::process::id() as i32;
    let mut killed = 0;
    let mut dirs = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            dirs.push(path);
            continue;
        }
        let pid = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = pid.filter(|&p| p != own) {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if environ.split(|&b| b == 0).any(|v| v == marker.as_bytes()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                killed += 1;
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    // The containers' disks go before their cgroups, where their pages are charged.
    invoker_factory::own_disk::unmount_under(pid_dir);
    if let Some(cg) = cgroups {
        killed += cg.remove_all();
    }
    for dir in dirs {
        let _ = std::fs::remove_dir_all(&dir);
    }
    killed
}

/// The invoker's side: the watchdog's process and the write end of its pipe, held for the
/// invoker's lifetime.
pub struct Watchdog {
    child: Child,
    _pipe: ChildStdin,
}

impl Watchdog {
    /// Starts `invoker watchdog` in a process group of its own (a terminal's Ctrl-C to the
    /// invoker does not take it), recorded in `pid_dir`.
    pub fn start(executable: &Path, args: &WatchdogArgs) -> std::io::Result<Watchdog> {
        let mut command = Command::new(executable);
        command.arg("watchdog").arg("--invoker-id").arg(&args.invoker_id).arg("--pid-dir").arg(&args.pid_dir);
        if let Some(root) = &args.cgroup_root {
            command.arg("--cgroup-root").arg(root);
        }
        command.env_clear().env("INVOKER_ID", &args.invoker_id).stdin(Stdio::piped()).stdout(Stdio::null());
        let mut child = command.process_group(0).spawn()?;
        let pipe = child.stdin.take().ok_or_else(|| std::io::Error::other("no pipe to the watchdog"))?;
        // Not a reason to refuse the start (a full disk): the watchdog ends with this run's pipe
        // anyway, the file only lets a restart after a crash make sure of it.
        if let Err(e) = std::fs::write(args.pid_dir.join("watchdog.pid"), format!("{}\n", child.id())) {
            tracing::warn!("the watchdog's pid could not be recorded in {}: {e}", args.pid_dir.display());
        }
        Ok(Watchdog { child, _pipe: pipe })
    }

    /// False once the watchdog exited (killed by someone); it is then reaped.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}
