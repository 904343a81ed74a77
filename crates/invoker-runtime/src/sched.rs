//! The scheduling policy an action runtime and its action run under.
//!
//! A runtime is woken by the invoker's write of a `/run`; the kernel places the woken task on
//! the waker's core, and a `SCHED_OTHER` task that wakes there preempts the invoker in the
//! middle of its work (one involuntary switch per activation, the other core idle meanwhile:
//! see BENCHMARKS.md). A `SCHED_BATCH` task never preempts on wake-up: it waits for the
//! current task to block or for the tick, or an idle core takes it. It gets the same CPU share
//! at the same nice value; only the wake-up preemption goes. The invoker is on the path of
//! every activation on the node, so the actions yield to it, not the other way round.
//!
//! The policy is set on the runtime's first thread before it starts any other, so its threads
//! and the action processes it starts inherit it.

use std::io;

/// How the runtime and its action processes are scheduled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedPolicy {
    /// `SCHED_BATCH`: never preempts a running task on wake-up.
    #[default]
    Batch,
    /// `SCHED_OTHER`, as inherited: left unchanged.
    Normal,
}

impl SchedPolicy {
    /// Applies the policy to the calling thread; call it before any other thread exists.
    pub fn apply(self) -> io::Result<()> {
        match self {
            SchedPolicy::Normal => Ok(()),
            SchedPolicy::Batch => set_batch(),
        }
    }
}

/// `sched_setscheduler(0, SCHED_BATCH)`: no crate in the tree wraps it (rustix lists it as not
/// implemented). Moving to `SCHED_BATCH` needs no privilege and keeps the nice value.
#[allow(unsafe_code)]
fn set_batch() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialised `sched_param` that lives across the call, which
    // only reads it; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The policy of a thread or process, from `/proc/<pid>/stat` (field 41): 0 other, 3 batch.
pub fn policy_of(pid: u32) -> io::Result<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces and parentheses: count from its last `)`.
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    after_name
        .split_whitespace()
        .nth(38)
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/stat has no policy field")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn this_thread() -> u32 {
        nix::unistd::gettid().as_raw() as u32
    }

    #[test]
    fn batch_applies_to_the_calling_thread_and_what_it_starts() {
        const BATCH: u32 = libc::SCHED_BATCH as u32;
        let before = policy_of(this_thread()).unwrap();
        std::thread::spawn(|| {
            SchedPolicy::Batch.apply().unwrap();
            assert_eq!(policy_of(this_thread()).unwrap(), BATCH);
            let inherited = std::thread::spawn(|| policy_of(this_thread()).unwrap()).join().unwrap();
            assert_eq!(inherited, BATCH, "a thread started afterwards");
            let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
            let policy = policy_of(child.id());
            let _ = child.kill();
            let _ = child.wait();
            assert_eq!(policy.unwrap(), BATCH, "a process started afterwards");
        })
        .join()
        .unwrap();
        assert_eq!(policy_of(this_thread()).unwrap(), before, "the other threads are untouched");
    }

    #[test]
    fn normal_leaves_the_policy_alone() {
        std::thread::spawn(|| {
            let before = policy_of(this_thread()).unwrap();
            SchedPolicy::Normal.apply().unwrap();
            assert_eq!(policy_of(this_thread()).unwrap(), before);
        })
        .join()
        .unwrap();
    }
}
