//! A container's stdout or stderr read into its log buffer, line by line: by a task that
//! waits for the pipe, and at once by [`LogBuffer::drain`] when a run's answer came before its
//! last lines were read (a runtime that marks no ends, Fn's, or sentinels the task has not
//! read yet), whose last lines are in the pipe by then and must be the run's, not the next
//! one's. Both read under one lock, without blocking, and stop at a read shorter than asked
//! (the pipe is empty): a warm run costs one read per stream.

use crate::logs::{LineSource, LogBuffer, Stream};
use parking_lot::Mutex;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::io::unix::AsyncFd;

/// Longer lines are cut into pieces of this many bytes.
pub const MAX_LINE: usize = 64 * 1024;
/// Room made for each read.
const READ_CHUNK: usize = 4096;

pub struct PipeLines {
    /// Read by the task through tokio's readiness, and by a drain with a plain `read(2)`:
    /// tokio's own `try_read` answers "would block" without reading while its driver has not
    /// yet seen the pipe readable, which is exactly the moment a drain is for.
    pipe: AsyncFd<OwnedFd>,
    stream: Stream,
    reading: Mutex<Reading>,
}

/// What reads keep between them, under one lock.
struct Reading {
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    /// Where each read lands, zeroed once (a read into `partial`'s own spare room would need
    /// it zeroed before every read).
    scratch: Box<[u8]>,
}

/// What a read of everything the pipe held left behind.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// It is empty now: a later write wakes the task again.
    Emptied,
    /// It is closed (or broken): nothing more will come.
    Closed,
}

impl PipeLines {
    /// Reads `pipe` into `logs` until it closes; [`LogBuffer::drain`] reads it too meanwhile.
    pub fn follow(pipe: OwnedFd, stream: Stream, logs: &Arc<LogBuffer>) -> std::io::Result<()> {
        nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
        // Deprecated for a `T` whose descriptor may be closed or replaced behind tokio's back;
        // an `OwnedFd` it owns keeps its descriptor until the `AsyncFd` drops it.
        #[allow(deprecated)]
        let pipe = AsyncFd::new(pipe)?;
        let reading = Reading { partial: Vec::new(), scratch: vec![0; READ_CHUNK].into_boxed_slice() };
        let source = Arc::new(PipeLines { pipe, stream, reading: Mutex::new(reading) });
        let registered: Arc<dyn LineSource> = source.clone();
        logs.add_source(registered.clone());
        let logs = logs.clone();
        tokio::spawn(async move {
            while let Ok(mut ready) = source.pipe.readable().await {
                match source.read_all(&logs) {
                    Read::Closed => break,
                    // Its readiness goes with what it held, so the next wait sleeps until a
                    // write (the pipe is edge-triggered): without a read that would block, one
                    // syscall fewer for each wake (a warm run wakes this once per stream).
                    Read::Emptied => ready.clear_ready(),
                }
            }
            logs.remove_source(&registered);
        });
        Ok(())
    }

    /// Reads what the pipe holds now into `logs`. A read shorter than asked emptied it (a
    /// pipe gives all it holds, up to the room given), so it stops there rather than read once
    /// more to hear "would block".
    fn read_all(&self, logs: &LogBuffer) -> Read {
        let mut reading = self.reading.lock();
        let Reading { partial, scratch } = &mut *reading;
        loop {
            match nix::unistd::read(self.pipe.get_ref().as_fd(), scratch) {
                Ok(0) => {
                    if !partial.is_empty() {
                        logs.push(self.stream, line_of(partial));
                        partial.clear();
                    }
                    return Read::Closed;
                }
                Ok(n) => {
                    partial.extend_from_slice(&scratch[..n]);
                    self.push_lines(partial, logs);
                    if n < scratch.len() {
                        return Read::Emptied;
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => return Read::Emptied,
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return Read::Closed,
            }
        }
    }

    /// Every ended line, and pieces of `MAX_LINE` bytes of one that runs on.
    fn push_lines(&self, partial: &mut Vec<u8>, logs: &LogBuffer) {
        let mut start = 0;
        while let Some(end) = partial[start..].iter().position(|&b| b == b'\n') {
            logs.push(self.stream, line_of(&partial[start..start + end]));
            start += end + 1;
        }
        while partial.len() - start >= MAX_LINE {
            logs.push(self.stream, line_of(&partial[start..start + MAX_LINE]));
            start += MAX_LINE;
        }
        partial.drain(..start);
    }
}

impl LineSource for PipeLines {
    fn read_now(&self, logs: &LogBuffer) {
        self.read_all(logs);
    }
}

/// A named pipe a container writes and the invoker reads ([`PipeLines::follow`] its
/// `reader`). The invoker holds a writing end too, until the container is gone: the reader
/// sees the stream end only once every writer closed, so dropping `held` ends it whatever the
/// container did (its runtime never opened the pipe, a create that failed; it unlinked or
/// replaced the path, which the invoker therefore never opens again).
pub struct NamedPipe {
    pub reader: OwnedFd,
    pub held: OwnedFd,
}

impl NamedPipe {
    /// Makes the pipe at `path`, which only `owner` (a container's user) may open, and opens
    /// both ends: before the container starts, so that its runtime's opening finds a reader.
    pub fn make(path: &Path, owner: (u32, u32)) -> std::io::Result<NamedPipe> {
        let fifo = |e: nix::errno::Errno| std::io::Error::other(format!("named pipe {}: {e}", path.display()));
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).map_err(fifo)?;
        let (uid, gid) = (nix::unistd::Uid::from_raw(owner.0), nix::unistd::Gid::from_raw(owner.1));
        if nix::unistd::geteuid() != uid {
            nix::unistd::chown(path, Some(uid), Some(gid)).map_err(fifo)?;
        }
        let open = |write: bool| {
            let mut options = std::fs::OpenOptions::new();
            options.read(!write).write(write).custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
            options.open(path).map(OwnedFd::from)
        };
        let reader = open(false)?;
        Ok(NamedPipe { reader, held: open(true)? })
    }
}

fn line_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes.strip_suffix(b"\r").unwrap_or(bytes)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::Ends;
    use std::io::Write;

    #[tokio::test]
    async fn a_runs_lines_are_read_at_once_when_its_answer_comes_and_long_lines_are_cut() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let logs = Arc::new(LogBuffer::default());
        // On this one-thread runtime the reading task runs only when the test awaits: what the
        // window gets before that, `drain` read.
        PipeLines::follow(read, Stream::Stdout, &logs).unwrap();
        let mut write = std::fs::File::from(write);
        let window = logs.open_sequential(Ends::Time);
        write.write_all(b"one\ntwo\r\nthr").unwrap();
        let lines = window.collect(std::time::Duration::from_secs(5), 1 << 20).await;
        let texts: Vec<&str> = lines.iter().map(|l| l.rsplit_once("stdout: ").unwrap().1).collect();
        assert_eq!(texts, ["one", "two"], "an unended line waits for its end");

        let window = logs.open_sequential(Ends::Time);
        // More than a pipe holds: written from a thread while the reading task reads.
        let writer = std::thread::spawn(move || {
            write.write_all(b"ee\n").unwrap();
            write.write_all(&vec![b'x'; MAX_LINE + 10]).unwrap();
        });
        while !writer.is_finished() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        writer.join().unwrap();
        let lines = window.collect(std::time::Duration::from_secs(5), 1 << 20).await;
        let lengths: Vec<usize> = lines.iter().map(|l| l.rsplit_once("stdout: ").unwrap().1.len()).collect();
        assert_eq!(lengths, [5, MAX_LINE, 10], "three, a full piece, and the rest at the close: {lines:?}");
    }

    /// The reading task ends (and leaves its buffer) once the invoker lets go of its own end
    /// of a named pipe, whether the container's writer came and went or none ever came.
    #[tokio::test]
    async fn a_named_pipes_reader_ends_when_the_invoker_lets_go_of_it_whatever_the_writer_did() {
        let dir = tempfile::tempdir().unwrap();
        let me = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let path = dir.path().join("stdout");
        let logs = Arc::new(LogBuffer::default());
        let pipe = NamedPipe::make(&path, me).unwrap();
        PipeLines::follow(pipe.reader, Stream::Stdout, &logs).unwrap();
        let window = logs.open_sequential(Ends::Time);
        let mut writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        writer.write_all(b"one\ntwo\n").unwrap();
        drop(writer);
        let lines = window.collect(std::time::Duration::from_secs(5), 1 << 20).await;
        let texts: Vec<&str> = lines.iter().map(|l| l.rsplit_once("stdout: ").unwrap().1).collect();
        assert_eq!(texts, ["one", "two"]);
        assert!(!eventually_sourceless_within(&logs, 10).await, "the invoker's own end keeps it open");
        drop(pipe.held);
        assert!(eventually_sourceless(&logs).await, "let go, the task ends");

        let never = dir.path().join("stderr");
        let logs = Arc::new(LogBuffer::default());
        let pipe = NamedPipe::make(&never, me).unwrap();
        PipeLines::follow(pipe.reader, Stream::Stderr, &logs).unwrap();
        assert!(!eventually_sourceless_within(&logs, 10).await, "no writer came: the task waits");
        drop(pipe.held);
        assert!(eventually_sourceless(&logs).await, "let go, the task ends");
    }

    async fn eventually_sourceless(logs: &LogBuffer) -> bool {
        eventually_sourceless_within(logs, 500).await
    }

    async fn eventually_sourceless_within(logs: &LogBuffer, tries: u32) -> bool {
        for _ in 0..tries {
            if logs.source_count() == 0 {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        false
    }
}
