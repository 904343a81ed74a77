//! A container's stdout or stderr read into its log buffer, line by line: by a task that
//! waits for the pipe, and at once by [`LogBuffer::drain`] when a run's answer came from a
//! runtime that marks no ends (Fn's), whose last lines are in the pipe by then and must be the
//! run's, not the next one's. Both read under one lock, without blocking.

use invoker_factory::logs::{LineSource, LogBuffer, Stream};
use parking_lot::Mutex;
use std::io::ErrorKind;
use std::sync::Arc;
use tokio::net::unix::pipe;

/// Longer lines are cut into pieces of this many bytes.
pub const MAX_LINE: usize = 64 * 1024;
/// Room made for each read.
const READ_CHUNK: usize = 4096;

/// How a read reaches the pipe. The reading task goes through tokio, whose readiness it must
/// see cleared when the pipe is empty (or its wait would return at once forever). A drain makes
/// the syscall itself: tokio's `try_read` answers "would block" without reading while its driver
/// has not yet seen the pipe readable, which is exactly the moment a drain is for.
#[derive(Clone, Copy)]
enum Through {
    Tokio,
    Syscall,
}

pub struct PipeLines {
    pipe: pipe::Receiver,
    stream: Stream,
    /// Bytes of a line not yet ended.
    partial: Mutex<Vec<u8>>,
}

impl PipeLines {
    /// Reads `pipe` into `logs` until it closes; [`LogBuffer::drain`] reads it too meanwhile.
    pub fn follow(pipe: pipe::Receiver, stream: Stream, logs: &Arc<LogBuffer>) {
        let source = Arc::new(PipeLines { pipe, stream, partial: Mutex::new(Vec::new()) });
        let registered: Arc<dyn LineSource> = source.clone();
        logs.add_source(registered.clone());
        let logs = logs.clone();
        tokio::spawn(async move {
            while source.pipe.readable().await.is_ok() {
                if source.read_ready(&logs, Through::Tokio) {
                    break;
                }
            }
            logs.remove_source(&registered);
        });
    }

    /// Reads what the pipe holds now into `logs`; true once it is closed (or broken).
    fn read_ready(&self, logs: &LogBuffer, through: Through) -> bool {
        let mut partial = self.partial.lock();
        loop {
            // Straight into the line's buffer (no zeroed scratch buffer per wake-up: a warm run
            // wakes this twice).
            partial.reserve(READ_CHUNK);
            let read = match through {
                Through::Tokio => self.pipe.try_read_buf(&mut *partial),
                Through::Syscall => {
                    let mut buf = [0u8; 1024];
                    let read = nix::unistd::read(&self.pipe, &mut buf).map_err(std::io::Error::from);
                    if let Ok(n) = read {
                        partial.extend_from_slice(&buf[..n]);
                    }
                    read
                }
            };
            match read {
                Ok(0) => {
                    if !partial.is_empty() {
                        logs.push(self.stream, line_of(&partial));
                        partial.clear();
                    }
                    return true;
                }
                Ok(_) => self.push_lines(&mut partial, logs),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return true,
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
        self.read_ready(logs, Through::Syscall);
    }
}

fn line_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes.strip_suffix(b"\r").unwrap_or(bytes)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use invoker_factory::logs::Ends;
    use std::io::Write;

    #[tokio::test]
    async fn a_runs_lines_are_read_at_once_when_its_answer_comes_and_long_lines_are_cut() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let logs = Arc::new(LogBuffer::default());
        // On this one-thread runtime the reading task runs only when the test awaits: what the
        // window gets before that, `drain` read.
        PipeLines::follow(pipe::Receiver::from_owned_fd(read).unwrap(), Stream::Stdout, &logs);
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
}
