//! A container's output, from Docker's log stream into its log buffer, each line stamped with
//! the time the daemon read it: a function that writes no sentinels has its lines attributed by
//! that stamp against each call's window (`invoker_factory::logs`), so nothing waits for the
//! stream to go quiet before a call is answered. A stream that breaks while the container lives
//! (the daemon restarted, a proxy's timeout) is followed again from the second of the last line
//! read, and what was read before the break is skipped, stream by stream: nothing lost, nothing
//! twice.

use bollard::container::LogOutput;
use futures_util::{Stream as FutureStream, StreamExt};
use invoker_factory::logs::{LogBuffer, Stream};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Longest log line kept whole; longer ones are cut.
const MAX_LINE: usize = 64 * 1024;
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Follows the streams `open(since)` gives (`since`: UNIX seconds to start from, 0 for all)
/// into `logs` while `live()` says the container is; then closes `logs`.
pub(crate) async fn follow<S, E>(mut open: impl FnMut(i32) -> S, logs: Arc<LogBuffer>, live: impl Fn() -> bool)
where
    S: FutureStream<Item = Result<LogOutput, E>>,
{
    let mut lines = Lines::default();
    let mut backoff = Duration::from_millis(50);
    loop {
        let stream = open(lines.since());
        futures_util::pin_mut!(stream);
        while let Some(Ok(chunk)) = stream.next().await {
            let (which, message) = match &chunk {
                LogOutput::StdOut { message } => (Stream::Stdout, message),
                LogOutput::StdErr { message } => (Stream::Stderr, message),
                _ => continue,
            };
            if lines.read(which, message, &logs) {
                backoff = Duration::from_millis(50);
            }
        }
        if !live() {
            break;
        }
        tracing::debug!("docker: a container's log stream broke; following it again");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    lines.flush(&logs);
    logs.close();
}

/// Each stream's line not yet ended, with its stamp, and the stamp of the last message read.
#[derive(Default)]
struct Lines {
    partial: [Vec<u8>; 2],
    stamp: [Option<SystemTime>; 2],
    last: [Option<SystemTime>; 2],
}

impl Lines {
    /// Where a new stream starts: the second of the earlier of the two streams' last messages.
    fn since(&self) -> i32 {
        let earliest = match self.last {
            [Some(a), Some(b)] => Some(a.min(b)),
            [a, b] => a.or(b),
        };
        earliest.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs() as i32)
    }

    /// Reads one chunk of `which`: one message of the daemon's (its stamp, a space, its text,
    /// a piece of a long line without its newline), or several. False when it was all read
    /// before.
    fn read(&mut self, which: Stream, mut chunk: &[u8], logs: &LogBuffer) -> bool {
        let s = which as usize;
        let mut new = false;
        while !chunk.is_empty() {
            let (at, body) = split_stamp(chunk);
            let (text, rest, ended) = match body.iter().position(|&b| b == b'\n') {
                Some(i) => (&body[..i], &body[i + 1..], true),
                None => (body, &body[body.len()..], false),
            };
            chunk = rest;
            if let Some(at) = at {
                if self.last[s].is_some_and(|last| at <= last) {
                    continue;
                }
                self.last[s] = Some(at);
            }
            new = true;
            self.stamp[s] = self.stamp[s].or(at);
            self.partial[s].extend_from_slice(text);
            if ended || self.partial[s].len() > MAX_LINE {
                self.push(which, logs);
            }
        }
        new
    }

    fn push(&mut self, which: Stream, logs: &LogBuffer) {
        let s = which as usize;
        let text = String::from_utf8_lossy(&self.partial[s]);
        logs.push_stamped(which, text.trim_end_matches('\r').to_string(), self.stamp[s].take());
        self.partial[s].clear();
    }

    fn flush(&mut self, logs: &LogBuffer) {
        for which in [Stream::Stdout, Stream::Stderr] {
            if !self.partial[which as usize].is_empty() {
                self.push(which, logs);
            }
        }
    }
}

/// The daemon's RFC 3339 stamp that starts a message, and the rest; none if it has none.
fn split_stamp(message: &[u8]) -> (Option<SystemTime>, &[u8]) {
    let Some(space) = message.iter().take(40).position(|&b| b == b' ') else { return (None, message) };
    let stamp = std::str::from_utf8(&message[..space]).ok().and_then(|s| humantime::parse_rfc3339(s).ok());
    match stamp {
        Some(at) => (Some(at), &message[space + 1..]),
        None => (None, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use invoker_factory::logs::Ends;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn out(text: &str) -> Result<LogOutput, ()> {
        Ok(LogOutput::StdOut { message: Bytes::from(text.to_string()) })
    }

    fn err(text: &str) -> Result<LogOutput, ()> {
        Ok(LogOutput::StdErr { message: Bytes::from(text.to_string()) })
    }

    /// The stream breaks in the middle of a call (and of a long line); the one that follows it
    /// repeats the second it broke in. The call's record holds every line once, in order, each
    /// with the daemon's stamp.
    #[tokio::test]
    async fn a_stream_cut_mid_call_is_followed_again_with_nothing_lost_or_twice() {
        let logs = Arc::new(LogBuffer::default());
        let window = logs.open_sequential(Ends::Time);
        let opened = Arc::new(AtomicUsize::new(0));
        let sinces = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (count, asked) = (opened.clone(), sinces.clone());
        let open = move |since: i32| {
            asked.lock().push(since);
            let chunks = match count.fetch_add(1, Ordering::SeqCst) {
                0 => vec![
                    out("2026-01-01T00:00:00.100000000Z one\n"),
                    err("2026-01-01T00:00:00.200000000Z two\n"),
                    out("2026-01-01T00:00:01.300000000Z a long li"),
                ],
                1 => vec![
                    out("2026-01-01T00:00:00.100000000Z one\n"),
                    err("2026-01-01T00:00:00.200000000Z two\n"),
                    out("2026-01-01T00:00:01.300000000Z a long li"),
                    out("2026-01-01T00:00:01.300000001Z ne\n"),
                    err("2026-01-01T00:00:01.400000000Z three\n"),
                ],
                _ => vec![],
            };
            futures_util::stream::iter(chunks)
        };
        let live = move || opened.load(Ordering::SeqCst) < 2;
        follow(open, logs.clone(), live).await;
        assert_eq!(*sinces.lock(), [0, 1_767_225_600], "followed again from the second it broke in");
        let lines = window.collect(Duration::from_secs(1), 1 << 20).await;
        let texts: Vec<&str> = lines.iter().map(|l| l.split_once(": ").unwrap().1).collect();
        assert_eq!(texts, ["one", "two", "a long line", "three"]);
        assert!(lines[0].starts_with("2026-01-01T00:00:00.100Z stdout"), "{lines:?}");
        assert!(lines[3].starts_with("2026-01-01T00:00:01.400Z stderr"), "{lines:?}");
    }

    #[test]
    fn a_message_without_a_stamp_is_all_text() {
        assert_eq!(split_stamp(b"no stamp here"), (None, &b"no stamp here"[..]));
        let (at, rest) = split_stamp(b"2026-01-01T00:00:00.5Z hi");
        assert!(at.is_some() && rest == b"hi");
    }
}
