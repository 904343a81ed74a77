//! A container's log lines as they arrive, bounded, and how they are attributed to the runs
//! that wrote them.
//!
//! Each run opens a [`LogWindow`] when it is handed to the runtime and collects it when its
//! answer is in. A run's lines are those that arrived in its window, up to its sentinels (one on
//! stdout and one on stderr, which the runtime writes after every activation). Runs on one
//! container may overlap (`limits.concurrency` above 1), and then:
//! - a line that starts with a run's activation id and a space (our runtime writes them so when
//!   runs may overlap) is that run's alone, without the prefix, and so is a sentinel so tagged;
//! - a line without one goes to every run whose window it falls in: a runtime that gives no
//!   way to tell whose it is (OpenWhisk's `app.js` with `__OW_ALLOW_CONCURRENT`) has each of
//!   the overlapping runs show all of it;
//! - untagged sentinels are counted: every run writes one pair, and a run's answer comes when
//!   its pair is written (just before or just after it), so a run whose answer is the n-th
//!   since its window opened has its lines in by the n-th pair after its start. It waits for
//!   that many pairs and no more (never for the sentinel of a run still running), and takes
//!   every pair already in: a sentinel says nothing of whose it is.

use parking_lot::Mutex;
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;

pub use invoker_wire::runtime::SENTINEL;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Something that feeds a buffer and can be read at once (a container's pipe, `pipe_lines.rs`).
pub trait LineSource: Send + Sync {
    /// Pushes into `logs` every line the source holds now, without waiting.
    fn read_now(&self, logs: &LogBuffer);
}

pub struct LogBuffer {
    inner: Mutex<Inner>,
    arrived: Notify,
    /// The pipes read into it, for `drain`.
    sources: Mutex<Vec<Arc<dyn LineSource>>>,
}

impl std::fmt::Debug for LogBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogBuffer").field("inner", &self.inner).finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Line {
    stream: Stream,
    text: String,
    at: SystemTime,
    /// The length of the activation-id prefix (id and space) when the line has one.
    tag: usize,
    sentinel: bool,
}

impl Line {
    fn tagged_by(&self, id: &str) -> bool {
        self.tag > 0 && self.text.as_bytes()[..self.tag - 1] == *id.as_bytes()
    }
}

#[derive(Debug, Default)]
struct Inner {
    lines: VecDeque<Line>,
    /// The sequence number of `lines[0]`.
    first: u64,
    bytes: usize,
    /// Lines before this were dropped for room (not collected).
    dropped_below: u64,
    closed: bool,
    /// Sentinels seen on a merged stream (see `push_merged`).
    merged_sentinels: usize,
    /// The windows not collected yet: a key and where each starts, and its activation id.
    open: Vec<(u64, u64, String)>,
    /// Runs whose answer is in (each counts when its collection begins).
    answered: u64,
    next_key: u64,
    /// Lines before this belong to collected windows; a window opened while none is open
    /// starts here (what came between two runs, an `/init`'s output, goes to the next).
    claimed_upto: u64,
}

impl Inner {
    fn next_seq(&self) -> u64 {
        self.first + self.lines.len() as u64
    }

    /// Drops what no open window and no future one can need.
    fn trim(&mut self) {
        let keep = self.open.iter().map(|(_, start, _)| *start).min().unwrap_or(u64::MAX).min(self.claimed_upto);
        while self.first < keep {
            let Some(line) = self.lines.pop_front() else { break };
            self.bytes -= line.text.len();
            self.first += 1;
        }
    }

    /// The length of the prefix (activation id and space) that tags `text` as an open
    /// window's, or 0.
    fn tag_of(&self, text: &str) -> usize {
        self.open
            .iter()
            .find(|(_, _, id)| {
                !id.is_empty()
                    && text.len() > id.len()
                    && text.starts_with(id.as_str())
                    && text.as_bytes()[id.len()] == b' '
            })
            .map_or(0, |(_, _, id)| id.len() + 1)
    }

    /// Splits a line that ends with a sentinel after other output (an action that wrote no
    /// final newline): the sentinel ends a line whatever came before it, and a tagged
    /// sentinel keeps its tag.
    fn split(&self, text: String) -> (Option<String>, String) {
        let Some(head) = text.strip_suffix(SENTINEL) else { return (None, text) };
        if head.is_empty() || self.tag_of(&text) == head.len() {
            return (None, text);
        }
        let cut = self
            .open
            .iter()
            .find_map(|(_, _, id)| {
                let rest = head.strip_suffix(' ')?.strip_suffix(id.as_str())?;
                (!id.is_empty()).then_some(rest.len())
            })
            .unwrap_or(head.len());
        if cut == 0 {
            return (None, text);
        }
        let mut text = text;
        let last = text.split_off(cut);
        (Some(text), last)
    }

    /// Adds one line, already split.
    fn add(&mut self, stream: Stream, text: String) {
        let tag = self.tag_of(&text);
        let sentinel = text == SENTINEL || (tag > 0 && &text[tag..] == SENTINEL);
        self.bytes += text.len();
        // A sentinel is never shown: no clock read for it.
        let at = if sentinel { SystemTime::UNIX_EPOCH } else { SystemTime::now() };
        self.lines.push_back(Line { stream, text, at, tag, sentinel });
        while self.bytes > BUFFER_BYTES {
            let Some(old) = self.lines.pop_front() else { break };
            self.bytes -= old.text.len();
            self.first += 1;
            self.dropped_below = self.first;
        }
    }
}

/// Lines kept at most (a runaway action cannot exhaust memory).
const BUFFER_BYTES: usize = 16 * 1024 * 1024;

impl Default for LogBuffer {
    fn default() -> Self {
        LogBuffer { inner: Mutex::new(Inner::default()), arrived: Notify::new(), sources: Mutex::new(Vec::new()) }
    }
}

impl LogBuffer {
    pub fn add_source(&self, source: Arc<dyn LineSource>) {
        self.sources.lock().push(source);
    }

    pub fn remove_source(&self, source: &Arc<dyn LineSource>) {
        self.sources.lock().retain(|s| !Arc::ptr_eq(s, source));
    }

    /// Reads what the container's pipes hold now: every line it wrote before this call is in
    /// the buffer when it returns. False when the buffer reads no pipes (a factory that gets
    /// its containers' output from elsewhere, Docker's log stream), which `drain` cannot hurry.
    pub fn drain(&self) -> bool {
        let sources = self.sources.lock().clone();
        for source in &sources {
            source.read_now(self);
        }
        !sources.is_empty()
    }

    pub fn push(&self, stream: Stream, line: String) {
        let mut inner = self.inner.lock();
        let (before, last) = inner.split(line);
        if let Some(before) = before {
            inner.add(stream, before);
        }
        inner.add(stream, last);
        drop(inner);
        self.arrived.notify_waiters();
    }

    /// A line of one stream that merges stdout and stderr (a Kubernetes pod's log): its lines
    /// count as stdout, and its sentinels as stdout's and stderr's in turn, since a runtime
    /// writes one on each after every activation.
    pub fn push_merged(&self, line: String) {
        let mut inner = self.inner.lock();
        let (before, last) = inner.split(line);
        if let Some(before) = before {
            inner.add(Stream::Stdout, before);
        }
        let stream = if last.ends_with(SENTINEL) {
            inner.merged_sentinels += 1;
            if inner.merged_sentinels % 2 == 1 {
                Stream::Stdout
            } else {
                Stream::Stderr
            }
        } else {
            Stream::Stdout
        };
        inner.add(stream, last);
        drop(inner);
        self.arrived.notify_waiters();
    }

    /// The last line on stderr so far (why a runtime exited before it was ready).
    pub fn last_stderr(&self) -> Option<String> {
        let inner = self.inner.lock();
        inner.lines.iter().rev().find(|l| l.stream == Stream::Stderr).map(|l| l.text.clone())
    }

    /// The streams ended (the container is gone): collectors stop waiting.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.arrived.notify_waiters();
    }

    /// Opens the window of one run as it is handed to the runtime; `id` is the activation id
    /// its lines may be tagged with, or empty where they are not.
    pub fn open(self: &Arc<Self>, id: &str) -> LogWindow {
        let mut inner = self.inner.lock();
        let start = if inner.open.is_empty() { inner.claimed_upto } else { inner.next_seq() };
        let key = inner.next_key;
        inner.next_key += 1;
        inner.open.push((key, start, id.to_string()));
        LogWindow { buffer: self.clone(), key, start, answered_before: inner.answered, collected: false }
    }

    /// Where `window`'s lines end, once they are in: after its own tagged sentinels, or after
    /// the untagged pairs of the `answered` runs whose answers came since it opened (itself
    /// included), taking every complete pair already there.
    fn window_end(inner: &Inner, window: &LogWindow, answered: u64) -> Option<u64> {
        let id = inner.open.iter().find(|(key, _, _)| *key == window.key).map_or("", |(_, _, id)| id.as_str());
        let from = window.start.max(inner.first);
        // Inline for the usual few sentinels: no allocation on the warm path.
        let mut untagged: [SmallVec<[u64; 4]>; 2] = Default::default();
        let mut tagged: [Option<u64>; 2] = [None, None];
        for (offset, line) in inner.lines.iter().enumerate().skip((from - inner.first) as usize) {
            if !line.sentinel {
                continue;
            }
            let at = inner.first + offset as u64;
            if line.tag == 0 {
                untagged[line.stream as usize].push(at);
            } else if line.tagged_by(id) && tagged[line.stream as usize].is_none() {
                tagged[line.stream as usize] = Some(at);
                if let [Some(a), Some(b)] = tagged {
                    return Some(a.max(b) + 1);
                }
            }
        }
        let pairs = untagged[0].len().min(untagged[1].len());
        (pairs as u64 >= answered.max(1)).then(|| untagged[0][pairs - 1].max(untagged[1][pairs - 1]) + 1)
    }

    /// See [`LogWindow::collect`]; with `quiet`, the wait also ends once no line came for that
    /// long.
    async fn collect(
        &self,
        mut window: LogWindow,
        wait: Duration,
        quiet: Option<Duration>,
        limit_bytes: usize,
    ) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + wait;
        let answered = {
            let mut inner = self.inner.lock();
            inner.answered += 1;
            inner.answered - window.answered_before
        };
        let end = loop {
            let notified = self.arrived.notified();
            let (end, closed) = {
                let inner = self.inner.lock();
                (Self::window_end(&inner, &window, answered), inner.closed)
            };
            let until = quiet.map_or(deadline, |q| deadline.min(tokio::time::Instant::now() + q));
            // No wait at all when none is allowed: a timer even at its deadline would take
            // the timer wheel's next tick (a millisecond) to fire.
            if end.is_some() || closed || wait.is_zero() || tokio::time::timeout_at(until, notified).await.is_err() {
                break end;
            }
        };
        window.collected = true;
        let mut inner = self.inner.lock();
        let place = inner.open.iter().position(|(key, _, _)| *key == window.key);
        let id = place.map(|at| inner.open.swap_remove(at).2).unwrap_or_default();
        let end = end.unwrap_or_else(|| inner.next_seq());
        let mut out = Vec::new();
        if window.start < inner.dropped_below {
            out.push(format!("{} stderr: [log lines dropped for room]", timestamp_of(SystemTime::now())));
        }
        let (mut size, mut truncated) = (0, false);
        let from = window.start.max(inner.first);
        for line in inner.lines.iter().skip((from - inner.first) as usize).take(end.saturating_sub(from) as usize) {
            let text = if line.tagged_by(&id) {
                &line.text[line.tag..]
            } else if line.tag > 0 {
                // Another run's, tagged while that run's window was open.
                continue;
            } else {
                &line.text
            };
            if line.sentinel {
                continue;
            }
            if size + text.len() > limit_bytes {
                truncated = true;
                continue;
            }
            size += text.len();
            out.push(format!("{} {}: {}", timestamp_of(line.at), line.stream.name(), text));
        }
        if truncated {
            out.push(format!(
                "Logs were truncated because the total bytes size exceeds the limit of {limit_bytes} bytes."
            ));
        }
        inner.claimed_upto = inner.claimed_upto.max(end);
        inner.trim();
        out
    }
}

/// How long a factory's log stream must stay quiet after an answer before a run without end
/// marks is taken to have all its lines, and the most it waits. A line reaches such a stream
/// through the engine (Docker's daemon, a kubelet's log), not straight from the function: with
/// 5 ms, a node function's line on Docker came after its run's window had closed on a loaded
/// CI machine, and was lost. A silent call pays this once.
const LOG_QUIET: Duration = Duration::from_millis(20);
const LOG_QUIET_MAX: Duration = Duration::from_millis(200);

/// One run's share of a container's logs, from when it was handed to the runtime; collected
/// once with [`LogWindow::collect`]. One dropped uncollected (a run that never ran) gives up
/// its place.
#[derive(Debug)]
pub struct LogWindow {
    buffer: Arc<LogBuffer>,
    key: u64,
    start: u64,
    /// Runs whose answer was in when this window opened.
    answered_before: u64,
    collected: bool,
}

impl LogWindow {
    /// Collects the lines of its run: those of its window up to its sentinels, waiting at most
    /// `wait` for them, keeping at most `limit_bytes` (OpenWhisk's log limit) and noting the cut.
    pub async fn collect(self, wait: Duration, limit_bytes: usize) -> Vec<String> {
        let buffer = self.buffer.clone();
        buffer.collect(self, wait, None, limit_bytes).await
    }

    /// For a runtime that marks no ends (one run at a time, everything it writes meanwhile is
    /// the run's): what its pipes hold when its answer came, read at once, and nothing after.
    /// Where the lines come through a stream of the factory's instead, those until the stream
    /// was quiet for `LOG_QUIET` (at most `LOG_QUIET_MAX`).
    pub async fn collect_now(self, limit_bytes: usize) -> Vec<String> {
        let buffer = self.buffer.clone();
        if buffer.drain() {
            buffer.collect(self, Duration::ZERO, None, limit_bytes).await
        } else {
            buffer.collect(self, LOG_QUIET_MAX, Some(LOG_QUIET), limit_bytes).await
        }
    }
}

impl Drop for LogWindow {
    fn drop(&mut self) {
        if !self.collected {
            let mut inner = self.buffer.inner.lock();
            inner.open.retain(|(key, _, _)| *key != self.key);
            inner.trim();
        }
    }
}

/// RFC 3339 UTC with milliseconds, as OpenWhisk stamps log lines.
pub fn timestamp() -> String {
    timestamp_of(SystemTime::now())
}

fn timestamp_of(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn collects_up_to_both_sentinels_within_the_limit() {
        let buf = Arc::new(LogBuffer::default());
        let window = buf.open("a");
        buf.push(Stream::Stdout, "hello".into());
        buf.push(Stream::Stderr, "oops".into());
        buf.push(Stream::Stdout, SENTINEL.into());
        buf.push(Stream::Stderr, SENTINEL.into());
        buf.push(Stream::Stdout, "next activation".into());
        let lines = buf.collect(window, WAIT, None, 1000).await;
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with("stdout: hello") && lines[1].ends_with("stderr: oops"), "{lines:?}");
        let window = buf.open("b");
        buf.push(Stream::Stdout, SENTINEL.into());
        buf.push(Stream::Stderr, SENTINEL.into());
        let lines = buf.collect(window, WAIT, None, 5).await;
        assert!(lines[0].ends_with("next activation") || lines.last().unwrap().contains("truncated"), "{lines:?}");
    }

    #[tokio::test]
    async fn a_merged_stream_ends_an_activation_at_its_second_sentinel() {
        let buf = Arc::new(LogBuffer::default());
        for line in ["one", SENTINEL, "two", SENTINEL, "late"] {
            buf.push_merged(line.into());
        }
        let lines = buf.collect(buf.open("a"), WAIT, None, 1000).await;
        assert!(lines.len() == 2 && lines[1].ends_with("stdout: two"), "{lines:?}");
        let window = buf.open("b");
        for line in ["next", SENTINEL, SENTINEL] {
            buf.push_merged(line.into());
        }
        let lines = window.collect(WAIT, 1000).await;
        assert!(
            lines.len() == 2 && lines[0].ends_with("stdout: late") && lines[1].ends_with("stdout: next"),
            "{lines:?}"
        );
    }

    /// `sys.stdout.write("x")` with no newline: the runtime's sentinel lands on the same line.
    /// The sentinel still ends the activation at once, and the line holds only the output.
    #[tokio::test(start_paused = true)]
    async fn a_sentinel_after_output_without_a_newline_ends_the_activation() {
        let buf = Arc::new(LogBuffer::default());
        let window = buf.open("a");
        buf.push(Stream::Stdout, format!("x{SENTINEL}"));
        buf.push(Stream::Stderr, SENTINEL.into());
        let began = tokio::time::Instant::now();
        let lines = buf.collect(window, Duration::from_secs(2), None, 1000).await;
        assert_eq!(began.elapsed(), Duration::ZERO, "no wait for a sentinel that came");
        assert!(lines.len() == 1 && lines[0].ends_with("stdout: x"), "{lines:?}");
        // A tagged sentinel after untagged output keeps its tag.
        let id = "0123456789abcdef0123456789abcdef";
        let window = buf.open(id);
        buf.push(Stream::Stdout, format!("{id} y{id} {SENTINEL}"));
        buf.push(Stream::Stderr, format!("{id} {SENTINEL}"));
        let lines = buf.collect(window, Duration::from_secs(2), None, 1000).await;
        assert_eq!(began.elapsed(), Duration::ZERO);
        assert!(lines.len() == 1 && lines[0].ends_with("stdout: y"), "{lines:?}");
    }

    /// Four overlapping runs whose sentinels come in another order than their answers: none
    /// waits, and tagged lines go to their own run only.
    #[tokio::test(start_paused = true)]
    async fn overlapping_runs_take_their_own_tagged_lines_and_wait_for_no_other_sentinel() {
        let buf = Arc::new(LogBuffer::default());
        let ids: Vec<String> = (0..4).map(|i| format!("{i:032x}")).collect();
        let windows: Vec<LogWindow> = ids.iter().map(|id| buf.open(id)).collect();
        for id in ids.iter().rev() {
            buf.push(Stream::Stdout, format!("{id} line of {id}"));
            buf.push(Stream::Stderr, format!("{id} err of {id}"));
        }
        for id in &ids {
            buf.push(Stream::Stdout, format!("{id} {SENTINEL}"));
            buf.push(Stream::Stderr, format!("{id} {SENTINEL}"));
        }
        let began = tokio::time::Instant::now();
        for (window, id) in windows.into_iter().zip(&ids).rev() {
            let lines = buf.collect(window, Duration::from_secs(2), None, 1000).await;
            assert_eq!(lines.len(), 2, "{lines:?}");
            assert!(lines[0].ends_with(&format!("stdout: line of {id}")), "{lines:?}");
            assert!(lines[1].ends_with(&format!("stderr: err of {id}")), "{lines:?}");
        }
        assert_eq!(began.elapsed(), Duration::ZERO, "no run waited");
        assert!(buf.inner.lock().lines.is_empty(), "nothing is kept once collected");
    }

    /// A runtime that tags nothing: every run in a window shows the window's lines up to as
    /// many sentinel pairs as runs answered since it opened, and every pair already in.
    #[tokio::test(start_paused = true)]
    async fn untagged_overlapping_runs_share_their_window_up_to_the_pairs_of_the_runs_answered() {
        let buf = Arc::new(LogBuffer::default());
        let a = buf.open("a");
        buf.push(Stream::Stdout, "early".into());
        let b = buf.open("b");
        buf.push(Stream::Stdout, "both".into());
        for _ in 0..2 {
            buf.push(Stream::Stdout, SENTINEL.into());
            buf.push(Stream::Stderr, SENTINEL.into());
        }
        let began = tokio::time::Instant::now();
        let lines_b = buf.collect(b, Duration::from_secs(2), None, 1000).await;
        let lines_a = buf.collect(a, Duration::from_secs(2), None, 1000).await;
        assert_eq!(began.elapsed(), Duration::ZERO);
        assert!(lines_b.len() == 1 && lines_b[0].ends_with("both"), "{lines_b:?}");
        assert!(lines_a.len() == 2 && lines_a[0].ends_with("early"), "{lines_a:?}");
        // A run whose sentinel never comes waits its bound, and no longer.
        let c = buf.open("c");
        buf.push(Stream::Stdout, "alone".into());
        let lines = buf.collect(c, Duration::from_secs(2), None, 1000).await;
        assert_eq!(began.elapsed(), Duration::from_secs(2));
        assert!(lines.len() == 1 && lines[0].ends_with("alone"), "{lines:?}");
    }

    /// Four untagged runs answered in the reverse of the order they wrote in (as tasks on
    /// other connections may be): the first collected, whose pair is the last, still holds its
    /// own lines, and none waits.
    #[tokio::test(start_paused = true)]
    async fn an_untagged_run_answered_first_still_holds_its_own_lines() {
        let buf = Arc::new(LogBuffer::default());
        let windows: Vec<LogWindow> = (0..4).map(|i| buf.open(&i.to_string())).collect();
        for i in 0..4 {
            buf.push(Stream::Stdout, format!("start {i}"));
        }
        for i in 0..4 {
            buf.push(Stream::Stderr, format!("end {i}"));
            buf.push(Stream::Stdout, SENTINEL.into());
            buf.push(Stream::Stderr, SENTINEL.into());
        }
        let began = tokio::time::Instant::now();
        for (i, window) in windows.into_iter().enumerate().rev() {
            let lines = window.collect(Duration::from_secs(2), 1000).await;
            for own in [format!("stdout: start {i}"), format!("stderr: end {i}")] {
                assert!(lines.iter().any(|l| l.ends_with(&own)), "{i}: {lines:?}");
            }
        }
        assert_eq!(began.elapsed(), Duration::ZERO, "no run waited");
    }

    #[test]
    fn timestamps_are_iso_8601() {
        let t = timestamp();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'));
    }
}
