//! A container's log lines as they arrive, bounded, read by its proxy up to the sentinels.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::Notify;

/// The line every OpenWhisk runtime writes on stdout and stderr after each activation.
pub const SENTINEL: &str = SENTINEL_LINE.trim_ascii_end();
/// The sentinel as a runtime writes it, newline included, in one `write(2)`.
pub const SENTINEL_LINE: &str = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

#[derive(Debug)]
pub struct LogBuffer {
    lines: Mutex<Inner>,
    arrived: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    lines: VecDeque<(Stream, String)>,
    bytes: usize,
    dropped: usize,
    closed: bool,
    /// Sentinels seen on a merged stream (see `push_merged`).
    merged_sentinels: usize,
}

/// Lines kept between two collections at most (a runaway action cannot exhaust memory).
const BUFFER_BYTES: usize = 16 * 1024 * 1024;

impl Default for LogBuffer {
    fn default() -> Self {
        LogBuffer { lines: Mutex::new(Inner::default()), arrived: Notify::new() }
    }
}

impl LogBuffer {
    pub fn push(&self, stream: Stream, line: String) {
        let mut inner = self.lines.lock();
        inner.bytes += line.len();
        inner.lines.push_back((stream, line));
        while inner.bytes > BUFFER_BYTES {
            let Some((_, old)) = inner.lines.pop_front() else { break };
            inner.bytes -= old.len();
            inner.dropped += 1;
        }
        drop(inner);
        self.arrived.notify_waiters();
    }

    /// A line of one stream that merges stdout and stderr (a Kubernetes pod's log): its lines
    /// count as stdout, and its sentinels as stdout's and stderr's in turn, since a runtime
    /// writes one on each after every activation.
    pub fn push_merged(&self, line: String) {
        let stream = if line.trim_end() == SENTINEL {
            let mut inner = self.lines.lock();
            inner.merged_sentinels += 1;
            if inner.merged_sentinels % 2 == 1 {
                Stream::Stdout
            } else {
                Stream::Stderr
            }
        } else {
            Stream::Stdout
        };
        self.push(stream, line);
    }

    /// The last line on stderr so far (why a runtime exited before it was ready).
    pub fn last_stderr(&self) -> Option<String> {
        let inner = self.lines.lock();
        inner.lines.iter().rev().find(|(s, _)| *s == Stream::Stderr).map(|(_, l)| l.clone())
    }

    /// The streams ended (the container is gone): collectors stop waiting.
    pub fn close(&self) {
        self.lines.lock().closed = true;
        self.arrived.notify_waiters();
    }

    /// Collects the lines of one activation: up to a sentinel on both streams, waiting at most
    /// `wait` for them, keeping at most `limit_bytes` (OpenWhisk's log limit) and noting the cut.
    pub async fn collect(&self, wait: Duration, limit_bytes: usize) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut seen = [false, false];
        let mut out = Vec::new();
        let mut size = 0;
        let mut truncated = false;
        loop {
            let notified = self.arrived.notified();
            let closed = {
                let mut inner = self.lines.lock();
                if inner.dropped > 0 {
                    out.push(format!("{} stderr: [{} log lines dropped]", timestamp(), inner.dropped));
                    inner.dropped = 0;
                }
                while let Some((stream, line)) = inner.lines.pop_front() {
                    inner.bytes -= line.len();
                    if line.trim_end() == SENTINEL {
                        seen[stream as usize] = true;
                        if seen == [true, true] {
                            break;
                        }
                        continue;
                    }
                    if size + line.len() > limit_bytes {
                        truncated = true;
                        continue;
                    }
                    size += line.len();
                    out.push(format!("{} {}: {}", timestamp(), stream.name(), line));
                }
                inner.closed
            };
            if seen == [true, true] || closed {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        if truncated {
            out.push(format!(
                "Logs were truncated because the total bytes size exceeds the limit of {limit_bytes} bytes."
            ));
        }
        out
    }
}

/// RFC 3339 UTC with milliseconds, as OpenWhisk stamps log lines.
pub fn timestamp() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn collects_up_to_both_sentinels_within_the_limit() {
        let buf = LogBuffer::default();
        buf.push(Stream::Stdout, "hello".into());
        buf.push(Stream::Stderr, "oops".into());
        buf.push(Stream::Stdout, SENTINEL.into());
        buf.push(Stream::Stderr, SENTINEL.into());
        buf.push(Stream::Stdout, "next activation".into());
        let lines = buf.collect(Duration::from_secs(1), 1000).await;
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with("stdout: hello") && lines[1].ends_with("stderr: oops"), "{lines:?}");
        buf.push(Stream::Stdout, SENTINEL.into());
        buf.push(Stream::Stderr, SENTINEL.into());
        let lines = buf.collect(Duration::from_secs(1), 5).await;
        assert!(lines.last().unwrap().contains("truncated"), "{lines:?}");
    }

    #[tokio::test]
    async fn a_merged_stream_ends_an_activation_at_its_second_sentinel() {
        let buf = LogBuffer::default();
        for line in ["one", SENTINEL, "two", SENTINEL, "next", SENTINEL, SENTINEL] {
            buf.push_merged(line.into());
        }
        let lines = buf.collect(Duration::from_secs(1), 1000).await;
        assert!(lines.len() == 2 && lines[1].ends_with("stdout: two"), "{lines:?}");
        let lines = buf.collect(Duration::from_secs(1), 1000).await;
        assert!(lines.len() == 1 && lines[0].ends_with("stdout: next"), "{lines:?}");
    }

    #[test]
    fn timestamps_are_iso_8601() {
        let t = timestamp();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'));
    }
}
