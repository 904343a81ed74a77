//! A pod's log followed into its container's `LogBuffer`, line by line (Kubernetes merges
//! stdout and stderr into one log). The stream asks for timestamps, so that one cut short (an
//! API server restarting, a proxy's timeout) resumes from the last line read, with nothing
//! lost and nothing twice, for as long as the container is live.

use super::pod::CONTAINER;
use futures_util::AsyncBufReadExt as _;
use invoker_factory::logs::LogBuffer;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::chrono::{DateTime, Utc};
use kube::api::LogParams;
use kube::Api;
use std::sync::Arc;
use std::time::Duration;

/// A log line longer than this is cut into pieces (a runaway action writes without newlines).
const MAX_LINE: usize = 64 * 1024;
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Follows `name`'s log into `logs` while `live` says the container is; then closes `logs`.
pub async fn follow(pods: Api<Pod>, name: String, logs: Arc<LogBuffer>, live: impl Fn() -> bool) {
    let mut read = Position::default();
    let mut backoff = Duration::from_millis(50);
    loop {
        let params = LogParams {
            follow: true,
            timestamps: true,
            since_time: read.at,
            container: Some(CONTAINER.into()),
            ..LogParams::default()
        };
        match pods.log_stream(&name, &params).await {
            Ok(stream) => {
                backoff = Duration::from_millis(50);
                read.resume();
                read_lines(stream, |line| {
                    if let Some((text, at)) = read.take(&line) {
                        // The kubelet's stamp: a function without sentinels has its lines
                        // attributed by it (a piece of a cut line keeps its line's).
                        let at = at.or(read.at).map(std::time::SystemTime::from);
                        logs.push_merged(text.to_string(), at);
                    }
                })
                .await;
            }
            Err(e) => tracing::warn!(pod = %name, "kubernetes: following the pod's log: {e}"),
        }
        if !live() {
            break;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    logs.close();
}

/// How far a pod's log was read: the newest stamp, and how many lines carried it. A stream
/// resumed from that stamp (inclusive) comes with those lines again: they, and what is older,
/// are skipped until a line not read before. Within one stream nothing is skipped: lines the
/// kubelet read at once may carry one stamp.
#[derive(Default)]
struct Position {
    at: Option<DateTime<Utc>>,
    same: usize,
    /// Resumed: the lines still to skip at `at`, until one not read before came.
    resuming: Option<usize>,
}

impl Position {
    fn resume(&mut self) {
        self.resuming = self.at.map(|_| self.same);
    }

    /// The text and stamp of a `<RFC 3339 timestamp> <text>` line not read before; a line
    /// without a timestamp (a piece of a cut line) is all text.
    fn take<'a>(&mut self, line: &'a str) -> Option<(&'a str, Option<DateTime<Utc>>)> {
        let Some((stamp, text)) = line.split_once(' ') else { return Some((line, None)) };
        let Ok(at) = DateTime::parse_from_rfc3339(stamp) else { return Some((line, None)) };
        let at = at.with_timezone(&Utc);
        if let (Some(skip), Some(read)) = (self.resuming, self.at) {
            if at < read || (at == read && skip > 0) {
                self.resuming = Some(skip.saturating_sub(usize::from(at == read)));
                return None;
            }
            self.resuming = None;
        }
        match self.at {
            Some(read) if at == read => self.same += 1,
            Some(read) if at < read => {}
            _ => (self.at, self.same) = (Some(at), 1),
        }
        Some((text, Some(at)))
    }
}

/// Calls `each` with every line of `stream` (without its newline), until the stream ends.
async fn read_lines(stream: impl futures_util::AsyncBufRead, mut each: impl FnMut(String)) {
    let mut reader = std::pin::pin!(stream);
    let mut line = Vec::new();
    loop {
        let (taken, ended) = match reader.as_mut().fill_buf().await {
            Ok([]) | Err(_) => return,
            Ok(buf) => {
                let room = MAX_LINE - line.len();
                match buf.iter().take(room).position(|&b| b == b'\n') {
                    Some(i) => {
                        line.extend_from_slice(&buf[..i]);
                        (i + 1, true)
                    }
                    None => {
                        let n = buf.len().min(room);
                        line.extend_from_slice(&buf[..n]);
                        (n, line.len() >= MAX_LINE)
                    }
                }
            }
        };
        reader.as_mut().consume(taken);
        if ended {
            each(String::from_utf8_lossy(&line).trim_end_matches('\r').to_string());
            line.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_stream_skips_what_was_read_and_keeps_what_was_not() {
        let mut read = Position::default();
        let text = |taken: Option<(&'static str, Option<DateTime<Utc>>)>| taken.map(|(t, _)| t);
        read.resume();
        assert_eq!(text(read.take("2026-01-01T00:00:00.000000001Z hello")), Some("hello"));
        assert_eq!(text(read.take("2026-01-01T00:00:00.000000002Z world")), Some("world"));
        // Lines the kubelet read at once, one stamp: none is lost within the stream.
        assert_eq!(text(read.take("2026-01-01T00:00:00.000000002Z again")), Some("again"));
        // Resumed from the last stamp (inclusive): the two lines read at it come again.
        read.resume();
        assert_eq!(text(read.take("2026-01-01T00:00:00.000000001Z hello")), None);
        assert_eq!(text(read.take("2026-01-01T00:00:00.000000002Z world")), None);
        assert_eq!(text(read.take("2026-01-01T00:00:00.000000002Z again")), None);
        assert_eq!(text(read.take("2026-01-01T00:00:00.000000002Z third at it")), Some("third at it"));
        assert_eq!(text(read.take("2026-01-01T00:00:00.000000003Z next")), Some("next"));
        assert_eq!(text(read.take("no timestamp here")), Some("no timestamp here"));
    }

    #[tokio::test]
    async fn lines_are_split_at_newlines_and_cut_when_too_long() {
        let long = "x".repeat(MAX_LINE + 10);
        let text = format!("one\r\ntwo\n{long}\n");
        let mut lines = Vec::new();
        read_lines(futures_util::io::Cursor::new(text.into_bytes()), |l| lines.push(l)).await;
        assert_eq!(&lines[..2], ["one", "two"]);
        assert_eq!((lines[2].len(), lines[3].len()), (MAX_LINE, 10), "cut at the bound, the rest its own line");
        assert_eq!(lines.len(), 4);
    }
}
