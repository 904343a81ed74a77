//! A container's log lines as they arrive, bounded, and how they are attributed to the runs
//! that wrote them.
//!
//! Each run opens a [`LogWindow`] when it is handed to the runtime, closes it
//! ([`LogWindow::close_at_answer`]) when its answer is in, and takes its lines then if they are
//! all in ([`LogWindow::is_complete`]), or later with [`LogWindow::collect`]. Nothing on the answer's
//! path waits for lines: the caller is answered, and the container takes its next run, while a
//! run's last lines are still on their way (through Docker's daemon, a kubelet's log).
//!
//! A container runs one activation at a time (`limits.concurrency` 1), or several at once.
//!
//! **One at a time** ([`LogBuffer::open_sequential`]), two ways to tell whose a line is:
//! - [`Ends::Sentinels`] (OpenWhisk's runtimes write a sentinel on stdout and one on stderr
//!   after every activation): the n-th run's lines on a stream are those after that stream's
//!   (n-1)-th sentinel and before its n-th. Each stream is counted on its own, so the next
//!   run's first stdout line never lands in this run's record while this run's stderr
//!   sentinel is still on its way; what a run writes after its sentinels (a thread left
//!   behind) is the next run's, as what `/init` writes is the first's.
//! - [`Ends::Time`] (Fn's functions write no sentinel). Where the FDK writes log frames
//!   (`FN_LOGFRAME_NAME=<call id>` on both streams at the start of each call, which the
//!   invoker asks for on Docker and Kubernetes), the n-th run's lines on a stream are those
//!   after its frame and before the next run's, however late the engine passes them on; a
//!   run's lines are in once the next run's frame came on both streams (the last run's, once
//!   its own frame came and nothing more for `LOG_QUIET`; in a pod's merged log, a line after
//!   either of a call's two frames is that call's). Without frames, by when
//!   each line was read first (by Docker's daemon, a kubelet, or this process for a pipe it
//!   reads), as Fn's agent swaps its log writer per call: a run's window ends where the next
//!   run begins (or, with none, when its lines are taken); a line the engine reads only after
//!   the next run began is that run's. A pipe of this process is read to its end when the
//!   answer comes, so its lines are in at once; an engine's stream is in once a line past the
//!   window's end came, or nothing came for `LOG_QUIET` (at most `LOG_QUIET_MAX`).
//!
//! **Overlapping** ([`LogBuffer::open`]):
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

use invoker_wire::runtime::FN_LOGFRAME_NAME;
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

/// How the lines of a run that has its container to itself are told from the next run's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ends {
    /// The runtime writes a sentinel on each stream after every activation.
    Sentinels,
    /// It writes none: by when each line was written.
    Time,
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
    /// When it was written, as its first reader stamped it.
    at: SystemTime,
    /// The length of the activation-id prefix (id and space) when the line has one.
    tag: usize,
    sentinel: bool,
    /// The untagged sentinels on its stream before it: the one-at-a-time run it belongs to.
    ordinal: u64,
    /// Fn's log frames on its stream before it: the call it belongs to, where frames are written.
    frame: u64,
    /// Never shown: a frame, or the empty line an FDK writes around one.
    hidden: bool,
    /// In a window already taken.
    taken: bool,
}

impl Line {
    fn tagged_by(&self, id: &str) -> bool {
        self.tag > 0 && self.text.as_bytes()[..self.tag - 1] == *id.as_bytes()
    }
}

#[derive(Debug)]
struct Inner {
    lines: VecDeque<Line>,
    /// The sequence number of `lines[0]`.
    first: u64,
    bytes: usize,
    /// Lines before this were dropped for room (not collected).
    dropped_below: u64,
    closed: bool,
    /// Untagged sentinels seen on each stream.
    sentinels: [u64; 2],
    /// Fn's log frames seen on each stream.
    frames: [u64; 2],
    /// The line just before on each stream (an FDK writes an empty line before its frame), and
    /// whether it was a frame (the python FDK writes one after it too).
    before: [Option<(u64, bool)>; 2],
    /// Windows attributed by time opened: the next one's number.
    timed: u64,
    /// The windows not collected yet: a key and where each starts, and its activation id.
    open: Vec<(u64, u64, String)>,
    /// Overlapping runs whose answer is in.
    answered: u64,
    /// One-at-a-time windows opened: the next one's ordinal.
    sequential: u64,
    /// The latest window attributed by time whose end is not cut yet.
    uncut: Option<u64>,
    /// The ends of the windows attributed by time that are cut but not collected, by key.
    cuts: SmallVec<[(u64, SystemTime); 2]>,
    /// The last cut: where the next window attributed by time begins.
    last_cut: Option<SystemTime>,
    /// The latest stamp of a line that came.
    latest: SystemTime,
    next_key: u64,
    /// Lines before this belong to collected windows; a window opened while none is open
    /// starts here (what came between two runs, an `/init`'s output, goes to the next).
    claimed_upto: u64,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            lines: VecDeque::new(),
            first: 0,
            bytes: 0,
            dropped_below: 0,
            closed: false,
            sentinels: [0, 0],
            frames: [0, 0],
            before: [None, None],
            timed: 0,
            open: Vec::new(),
            answered: 0,
            sequential: 0,
            uncut: None,
            cuts: SmallVec::new(),
            last_cut: None,
            latest: SystemTime::UNIX_EPOCH,
            next_key: 0,
            claimed_upto: 0,
        }
    }
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

    /// Adds one line, already split. `merged`: of a stream that merges stdout and stderr,
    /// whose lines belong to the run of the pairs of sentinels complete before them.
    fn add(&mut self, stream: Stream, text: String, at: Option<SystemTime>, merged: bool) {
        let s = stream as usize;
        let tag = self.tag_of(&text);
        let sentinel = text == SENTINEL || (tag > 0 && &text[tag..] == SENTINEL);
        let ordinal = if merged { self.sentinels[0].min(self.sentinels[1]) } else { self.sentinels[s] };
        if sentinel && tag == 0 {
            self.sentinels[s] += 1;
        }
        self.bytes += text.len();
        // A sentinel is never shown: no clock read for it.
        let at = if sentinel { SystemTime::UNIX_EPOCH } else { at.unwrap_or_else(SystemTime::now) };
        self.latest = self.latest.max(at);
        // A merged log (a pod's) does not say a line's stream: a line after any frame of a call
        // is that call's. The two frames of a call are written together at its start, but the
        // engine copies each pipe on its own, so the call's first output may come between them.
        let frame_count = if merged { self.frames[0].max(self.frames[1]) } else { self.frames[s] };
        let is_frame = tag == 0 && is_frame(&text);
        let mut hidden = is_frame;
        if is_frame {
            // The FDK's newline before its frame belongs to the frame.
            if let Some((seq, false)) = self.before[s] {
                if let Some(line) = seq.checked_sub(self.first).and_then(|i| self.lines.get_mut(i as usize)) {
                    line.hidden |= line.text.is_empty() && !line.taken;
                }
            }
            let stream = if merged && self.frames[0] > self.frames[1] { 1 } else { s };
            self.frames[stream] += 1;
        } else if text.is_empty() && matches!(self.before[s], Some((_, true))) {
            hidden = true;
        }
        self.before[s] = Some((self.next_seq(), is_frame));
        self.lines.push_back(Line {
            stream,
            text,
            at,
            tag,
            sentinel,
            ordinal,
            frame: frame_count,
            hidden,
            taken: false,
        });
        while self.bytes > BUFFER_BYTES {
            let Some(old) = self.lines.pop_front() else { break };
            self.bytes -= old.text.len();
            self.first += 1;
            self.dropped_below = self.first;
        }
    }

    /// Whether the container's FDK writes log frames: then they, not the clock, tell whose a
    /// line is.
    fn framed(&self) -> bool {
        self.frames != [0, 0]
    }

    /// Where window `key`, attributed by time, ends, if that is known yet.
    fn cut_of(&self, key: u64) -> Option<SystemTime> {
        self.cuts.iter().find(|(k, _)| *k == key).map(|(_, at)| *at)
    }

    /// Where window `key`, attributed by time and being collected, ends: where the next one
    /// began, or now if none has (and then the next begins there).
    fn cut(&mut self, key: u64) -> SystemTime {
        match self.cuts.iter().position(|(k, _)| *k == key) {
            Some(at) => self.cuts.swap_remove(at).1,
            None => {
                if self.uncut == Some(key) {
                    self.uncut = None;
                }
                let now = SystemTime::now();
                self.last_cut = Some(now);
                now
            }
        }
    }

    /// Where the lines of runs up to ordinal `through` end: past the first line of a later one
    /// on each stream (each stream's ordinals only grow), or at the last line. A window reads
    /// its own lines and the next run's first, not the whole buffer.
    fn ordinal_end(&self, from: u64, through: u64) -> u64 {
        let skip = from.saturating_sub(self.first) as usize;
        let mut past = [false, false];
        for (i, line) in self.lines.iter().enumerate().skip(skip) {
            past[line.stream as usize] |= line.ordinal > through;
            if past == [true, true] {
                return self.first + i as u64;
            }
        }
        self.next_seq()
    }

    /// The sequence number of the first line from `from` on that `later` says is past a
    /// collected window, or the next one: where what is still needed begins.
    fn first_past(&self, from: u64, later: impl Fn(&Line) -> bool) -> u64 {
        let skip = from.saturating_sub(self.first) as usize;
        self.lines.iter().skip(skip).position(later).map_or(self.next_seq(), |i| from.max(self.first) + i as u64)
    }
}

/// Whether `text` is a log frame an Fn FDK writes at the start of each call (`FN_LOGFRAME_NAME`
/// `=` the call's id, the `FN_LOGFRAME_HDR` header the invoker sends).
fn is_frame(text: &str) -> bool {
    text.strip_prefix(FN_LOGFRAME_NAME)
        .and_then(|rest| rest.strip_prefix('='))
        .is_some_and(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
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

    #[cfg(test)]
    pub(crate) fn source_count(&self) -> usize {
        self.sources.lock().len()
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

    /// A line read now.
    pub fn push(&self, stream: Stream, line: String) {
        self.push_stamped(stream, line, None);
    }

    /// A line its first reader stamped `at` (Docker's daemon, a kubelet), or now.
    pub fn push_stamped(&self, stream: Stream, line: String, at: Option<SystemTime>) {
        let mut inner = self.inner.lock();
        let (before, last) = inner.split(line);
        if let Some(before) = before {
            inner.add(stream, before, at, false);
        }
        inner.add(stream, last, at, false);
        drop(inner);
        self.arrived.notify_waiters();
    }

    /// A line of one stream that merges stdout and stderr (a Kubernetes pod's log), stamped
    /// `at` by its reader or now: its lines count as stdout, and its sentinels as stdout's and
    /// stderr's in turn, since a runtime writes one on each after every activation.
    pub fn push_merged(&self, line: String, at: Option<SystemTime>) {
        let mut inner = self.inner.lock();
        let (before, last) = inner.split(line);
        if let Some(before) = before {
            inner.add(Stream::Stdout, before, at, true);
        }
        let stream = if last.ends_with(SENTINEL) && inner.tag_of(&last) == 0 {
            if inner.sentinels[0] > inner.sentinels[1] {
                Stream::Stderr
            } else {
                Stream::Stdout
            }
        } else {
            Stream::Stdout
        };
        inner.add(stream, last, at, true);
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

    /// Opens the window of one of runs that may overlap, as it is handed to the runtime; `id`
    /// is the activation id its lines may be tagged with, or empty where they are not.
    pub fn open(self: &Arc<Self>, id: &str) -> LogWindow {
        let mut inner = self.inner.lock();
        let start = if inner.open.is_empty() { inner.claimed_upto } else { inner.next_seq() };
        let mode = Mode::Overlapping { answered_before: inner.answered, answered: None };
        self.window(&mut inner, start, id, mode)
    }

    /// Opens the window of a run that has the container to itself, as it is handed to the
    /// runtime (the last one's may still be collecting: its answer is in).
    pub fn open_sequential(self: &Arc<Self>, ends: Ends) -> LogWindow {
        let mut inner = self.inner.lock();
        let mode = match ends {
            Ends::Sentinels => {
                inner.sequential += 1;
                let n = inner.sequential - 1;
                Mode::Ordinal { n, through: n, resynced: false }
            }
            Ends::Time => {
                // The run before ends where this one begins: what it wrote is stamped before.
                let now = SystemTime::now();
                if let Some(before) = inner.uncut.take() {
                    inner.cuts.push((before, now));
                    inner.last_cut = Some(now);
                }
                inner.uncut = Some(inner.next_key);
                inner.timed += 1;
                Mode::Timed { n: inner.timed - 1, after: inner.last_cut, drained: false }
            }
        };
        let start = inner.claimed_upto;
        self.window(&mut inner, start, "", mode)
    }

    fn window(self: &Arc<Self>, inner: &mut Inner, start: u64, id: &str, mode: Mode) -> LogWindow {
        let key = inner.next_key;
        inner.next_key += 1;
        inner.open.push((key, start, id.to_string()));
        LogWindow { buffer: self.clone(), key, start, mode, collected: false }
    }

    /// Where an overlapping `window`'s lines end, once they are in: after its own tagged
    /// sentinels, or after the untagged pairs of the `answered` runs whose answers came since
    /// it opened (itself included), taking every complete pair already there.
    fn overlapping_end(inner: &Inner, window: &LogWindow, answered: u64) -> Option<u64> {
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
}

/// How long an engine's log stream must stay quiet after a run's answer, when no line stamped
/// later has come, before the run is taken to have all its lines; and the most it waits. A
/// line reaches such a stream through the engine (Docker's daemon, a kubelet's log), not
/// straight from the function. Neither delays an answer or the container's next run: only
/// when the record is whole.
const LOG_QUIET: Duration = Duration::from_millis(50);

/// Whether a timed run's container writes Fn's log frames, and whether the run's own came.
enum Framing {
    None,
    AwaitsOwnFrame,
    Framed,
}
const LOG_QUIET_MAX: Duration = Duration::from_secs(2);

/// How a window tells its lines (see the module's page).
#[derive(Debug)]
enum Mode {
    Overlapping {
        /// Runs whose answer was in when this window opened.
        answered_before: u64,
        /// Runs answered since it opened, itself included; set by its answer.
        answered: Option<u64>,
    },
    /// The n-th run on a container that writes sentinels: its lines are those after the
    /// (n-1)-th pair, through pair `through` (n, unless pairs no run of ours wrote came before
    /// its answer: a caller of the runtime other than the invoker, an action that prints the
    /// sentinel itself; then every pair up to its own, the last at its answer).
    Ordinal {
        n: u64,
        through: u64,
        /// Its answer came and `through` was settled.
        resynced: bool,
    },
    Timed {
        /// The n-th such run on the container: where its FDK writes frames, its lines are
        /// those after the n-th frame on each stream (and the first's, those before any).
        n: u64,
        /// Where the run before ended (when this one began, or when the one before was
        /// collected with none after it): its lines are stamped after this. Its own end is cut
        /// the same way, in the buffer.
        after: Option<SystemTime>,
        /// Its pipes were read to their end at the answer: every line is in.
        drained: bool,
    },
}

/// One run's share of a container's logs, from when it was handed to the runtime; collected
/// once. One dropped uncollected (a run that never ran) gives up its place.
#[derive(Debug)]
pub struct LogWindow {
    buffer: Arc<LogBuffer>,
    key: u64,
    start: u64,
    mode: Mode,
    collected: bool,
}

impl LogWindow {
    /// The run's answer is in: the window ends here (on the clock, or in the count of answers),
    /// and the container's pipes are read, so that what it wrote before it answered is in.
    /// Only the first call ends the window; [`Self::collect`] and [`Self::take`] make it.
    pub fn close_at_answer(&mut self) {
        match &mut self.mode {
            Mode::Overlapping { answered: Some(_), .. } => {}
            Mode::Overlapping { answered_before, answered } => {
                self.buffer.drain();
                let mut inner = self.buffer.inner.lock();
                inner.answered += 1;
                *answered = Some(inner.answered - *answered_before);
            }
            Mode::Ordinal { n, through, resynced } => Self::resync(&self.buffer, *n, through, resynced),
            Mode::Timed { drained, .. } => {
                *drained = self.buffer.drain();
            }
        }
    }

    /// A run counted by sentinels, answered: its sentinels are in, or its pipes are read so that
    /// they are. Its own pair is then the last one in the pipes: pairs beyond its ordinal came
    /// from no run of ours, and it takes them and the lines between them, so that the next
    /// run's ordinal is the next pair again (otherwise every later run would take an earlier
    /// pair's lines, and the lines past them would pile up unclaimed). Without pipes to read
    /// (an engine's stream) the count is not known at the answer, and it stays as it is.
    fn resync(buffer: &LogBuffer, n: u64, through: &mut u64, resynced: &mut bool) {
        if std::mem::replace(resynced, true) {
            return;
        }
        let pairs = |inner: &Inner| inner.sentinels[0].min(inner.sentinels[1]);
        {
            // The usual case: its sentinels, and no others, were read before the answer.
            let inner = buffer.inner.lock();
            if pairs(&inner) == n + 1 {
                return;
            }
        }
        if !buffer.drain() {
            return;
        }
        let mut inner = buffer.inner.lock();
        let last = pairs(&inner);
        if last > n + 1 {
            *through = last - 1;
            inner.sequential = inner.sequential.max(last);
        }
    }

    /// Whether every line of the answered run is in, so that taking them waits for nothing.
    pub fn is_complete(&self) -> bool {
        let inner = self.buffer.inner.lock();
        self.complete_in(&inner)
    }

    fn complete_in(&self, inner: &Inner) -> bool {
        if inner.closed {
            return true;
        }
        match &self.mode {
            Mode::Overlapping { answered, .. } => {
                LogBuffer::overlapping_end(inner, self, answered.unwrap_or(1)).is_some()
            }
            Mode::Ordinal { through, .. } => inner.sentinels[0] > *through && inner.sentinels[1] > *through,
            // The next call's frame on both streams: every line before it is in.
            Mode::Timed { drained: true, .. } => true,
            Mode::Timed { n, .. } if inner.framed() => inner.frames[0] > n + 1 && inner.frames[1] > n + 1,
            Mode::Timed { .. } => inner.cut_of(self.key).is_some_and(|end| inner.latest > end),
        }
    }

    /// Whether the run's container writes frames, and whether its own came on both streams.
    fn framing(&self) -> Framing {
        let Mode::Timed { n, .. } = self.mode else { return Framing::None };
        let inner = self.buffer.inner.lock();
        match (inner.framed(), inner.frames[0] > n && inner.frames[1] > n) {
            (false, _) => Framing::None,
            (true, false) => Framing::AwaitsOwnFrame,
            (true, true) => Framing::Framed,
        }
    }

    /// Collects the lines of its run once they are in, waiting at most `wait` for sentinels
    /// (at most `LOG_QUIET_MAX` for an engine's stream without them), keeping at most
    /// `limit_bytes` (OpenWhisk's log limit) and noting the cut.
    pub async fn collect(mut self, wait: Duration, limit_bytes: usize) -> Vec<String> {
        self.close_at_answer();
        let (wait, quiet) = match self.mode {
            Mode::Timed { .. } => (wait.min(LOG_QUIET_MAX), Some(LOG_QUIET)),
            _ => (wait, None),
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.buffer.arrived.notified();
            if self.is_complete() || wait.is_zero() {
                break;
            }
            // Each line that comes starts the quiet time again; a framed run's quiet time
            // starts once its own frame came (an engine may pass its lines on late, and a
            // frame is sure to come).
            let quiet = match self.framing() {
                Framing::AwaitsOwnFrame => None,
                Framing::Framed | Framing::None => quiet,
            };
            let until = quiet.map_or(deadline, |q| deadline.min(tokio::time::Instant::now() + q));
            if tokio::time::timeout_at(until, notified).await.is_err() {
                break;
            }
        }
        self.take(limit_bytes)
    }

    /// The lines of its run that are in now (see [`Self::is_complete`]).
    pub fn take(mut self, limit_bytes: usize) -> Vec<String> {
        self.close_at_answer();
        self.collected = true;
        let buffer = self.buffer.clone();
        let mut inner = buffer.inner.lock();
        let place = inner.open.iter().position(|(key, _, _)| *key == self.key);
        let id = place.map(|at| inner.open.swap_remove(at).2).unwrap_or_default();
        let from = self.start.max(inner.first);
        let skip = (from - inner.first) as usize;
        // Whose a line is, and where the lines still needed begin once this window is taken.
        let (end, claimed, cut): (u64, u64, Option<SystemTime>) = match &self.mode {
            Mode::Overlapping { answered, .. } => {
                let end = LogBuffer::overlapping_end(&inner, &self, answered.unwrap_or(1))
                    .unwrap_or_else(|| inner.next_seq());
                (end, end, None)
            }
            Mode::Ordinal { through, .. } => {
                (inner.ordinal_end(from, *through), inner.first_past(from, |l| l.ordinal > *through), None)
            }
            Mode::Timed { n, .. } if inner.framed() => {
                inner.cut(self.key);
                (inner.next_seq(), inner.first_past(from, |l| l.frame > n + 1), None)
            }
            Mode::Timed { .. } => {
                let cut = inner.cut(self.key);
                (inner.next_seq(), inner.first_past(from, |l| !l.sentinel && l.at > cut), Some(cut))
            }
        };
        let framed = inner.framed();
        let mine = |line: &Line| match &self.mode {
            Mode::Overlapping { .. } => true,
            Mode::Ordinal { n, through, .. } => (*n..=*through).contains(&line.ordinal),
            // Its own, and any earlier one no window took (written after the last one's lines
            // were taken, before this one's frame).
            Mode::Timed { n, .. } if framed => !line.taken && line.frame <= n + 1,
            Mode::Timed { after, .. } => {
                !line.taken && after.is_none_or(|after| line.at > after) && cut.is_none_or(|cut| line.at <= cut)
            }
        };
        let mut out = Vec::new();
        if self.start < inner.dropped_below {
            out.push(format!("{} stderr: [log lines dropped for room]", timestamp_of(SystemTime::now())));
        }
        let (mut size, mut truncated) = (0, false);
        for line in inner.lines.iter_mut().skip(skip).take(end.saturating_sub(from) as usize) {
            if !mine(line) {
                continue;
            }
            line.taken = true;
            if line.sentinel || line.hidden {
                continue;
            }
            let text = if line.tagged_by(&id) {
                &line.text[line.tag..]
            } else if line.tag > 0 {
                // Another run's, tagged while that run's window was open.
                continue;
            } else {
                &line.text
            };
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
        inner.claimed_upto = inner.claimed_upto.max(claimed);
        inner.trim();
        out
    }
}

impl Drop for LogWindow {
    fn drop(&mut self) {
        if !self.collected {
            let mut inner = self.buffer.inner.lock();
            inner.open.retain(|(key, _, _)| *key != self.key);
            // The last run that never ran wrote no sentinels: the next takes its place (and,
            // by time, its window: the last cut stays where it was).
            match self.mode {
                Mode::Ordinal { n, .. } if inner.sequential == n + 1 => inner.sequential = n,
                Mode::Timed { n, .. } => {
                    if inner.timed == n + 1 {
                        inner.timed = n;
                    }
                    inner.cuts.retain(|(key, _)| *key != self.key);
                    if inner.uncut == Some(self.key) {
                        inner.uncut = None;
                    }
                }
                _ => {}
            }
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

    fn texts(lines: &[String]) -> Vec<&str> {
        lines.iter().map(|l| l.split_once(": ").map_or(l.as_str(), |(_, t)| t)).collect()
    }

    fn pair(buf: &LogBuffer) {
        buf.push(Stream::Stdout, SENTINEL.into());
        buf.push(Stream::Stderr, SENTINEL.into());
    }

    #[tokio::test]
    async fn collects_up_to_both_sentinels_within_the_limit() {
        let buf = Arc::new(LogBuffer::default());
        let window = buf.open_sequential(Ends::Sentinels);
        buf.push(Stream::Stdout, "hello".into());
        buf.push(Stream::Stderr, "oops".into());
        pair(&buf);
        buf.push(Stream::Stdout, "next activation".into());
        let lines = window.collect(WAIT, 1000).await;
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with("stdout: hello") && lines[1].ends_with("stderr: oops"), "{lines:?}");
        let window = buf.open_sequential(Ends::Sentinels);
        pair(&buf);
        let lines = window.collect(WAIT, 5).await;
        assert!(lines[0].ends_with("next activation") || lines.last().unwrap().contains("truncated"), "{lines:?}");
    }

    #[tokio::test]
    async fn a_merged_stream_ends_an_activation_at_its_second_sentinel() {
        let buf = Arc::new(LogBuffer::default());
        let first = buf.open_sequential(Ends::Sentinels);
        for line in ["one", SENTINEL, "two", SENTINEL, "late"] {
            buf.push_merged(line.into(), None);
        }
        let lines = first.collect(WAIT, 1000).await;
        assert_eq!(texts(&lines), ["one", "two"], "a line between the pair's two sentinels is still the run's");
        let window = buf.open_sequential(Ends::Sentinels);
        for line in ["next", SENTINEL, SENTINEL] {
            buf.push_merged(line.into(), None);
        }
        let lines = window.collect(WAIT, 1000).await;
        assert_eq!(texts(&lines), ["late", "next"]);
    }

    /// `sys.stdout.write("x")` with no newline: the runtime's sentinel lands on the same line.
    /// The sentinel still ends the activation at once, and the line holds only the output.
    #[tokio::test(start_paused = true)]
    async fn a_sentinel_after_output_without_a_newline_ends_the_activation() {
        let buf = Arc::new(LogBuffer::default());
        let window = buf.open_sequential(Ends::Sentinels);
        buf.push(Stream::Stdout, format!("x{SENTINEL}"));
        buf.push(Stream::Stderr, SENTINEL.into());
        let began = tokio::time::Instant::now();
        let lines = window.collect(Duration::from_secs(2), 1000).await;
        assert_eq!(began.elapsed(), Duration::ZERO, "no wait for a sentinel that came");
        assert!(lines.len() == 1 && lines[0].ends_with("stdout: x"), "{lines:?}");
        // A tagged sentinel after untagged output keeps its tag.
        let id = "0123456789abcdef0123456789abcdef";
        let window = buf.open(id);
        buf.push(Stream::Stdout, format!("{id} y{id} {SENTINEL}"));
        buf.push(Stream::Stderr, format!("{id} {SENTINEL}"));
        let lines = window.collect(Duration::from_secs(2), 1000).await;
        assert_eq!(began.elapsed(), Duration::ZERO);
        assert!(lines.len() == 1 && lines[0].ends_with("stdout: y"), "{lines:?}");
    }

    /// A source whose lines are all pushed already: the buffer reads pipes, and `drain` is done.
    struct ReadAlready;

    impl LineSource for ReadAlready {
        fn read_now(&self, _: &LogBuffer) {}
    }

    /// Pairs of sentinels that no run of the invoker's wrote (the runtime called by another,
    /// an action that prints the sentinel itself) come between runs on a container whose pipes
    /// the invoker reads: the run answered next takes them with what it wrote, and every later
    /// run has exactly its own lines again, nothing piling up. Before, every later run took an
    /// earlier pair's lines, and the lines past them stayed in the buffer.
    #[tokio::test]
    async fn pairs_no_run_wrote_go_to_the_next_run_and_later_runs_keep_their_own_lines() {
        let buf = Arc::new(LogBuffer::default());
        buf.add_source(Arc::new(ReadAlready));
        let window = buf.open_sequential(Ends::Sentinels);
        buf.push(Stream::Stdout, "first".into());
        pair(&buf);
        assert_eq!(texts(&window.take(1000)), ["first"]);
        for i in 0..100 {
            buf.push(Stream::Stdout, format!("stray {i}"));
            pair(&buf);
        }
        let window = buf.open_sequential(Ends::Sentinels);
        buf.push(Stream::Stdout, "second".into());
        pair(&buf);
        let second = window.take(100_000);
        assert_eq!(second.len(), 101, "the strays and its own: {second:?}");
        assert_eq!(texts(&second)[100], "second");
        for run in ["third", "fourth"] {
            let window = buf.open_sequential(Ends::Sentinels);
            buf.push(Stream::Stderr, run.into());
            pair(&buf);
            let mut window = window;
            window.close_at_answer();
            assert!(window.is_complete());
            assert_eq!(texts(&window.take(1000)), [run]);
        }
        assert!(buf.inner.lock().lines.len() <= 2, "what runs took is not kept");
    }

    /// The answer comes before the run's sentinels, and the container takes the next run at
    /// once: the next run's first lines come while this one's stderr sentinel is still on its
    /// way. Each stream counted on its own, each run has exactly its own lines.
    #[tokio::test(start_paused = true)]
    async fn a_run_answered_before_its_sentinels_keeps_its_lines_while_the_next_one_writes() {
        let buf = Arc::new(LogBuffer::default());
        let mut first = buf.open_sequential(Ends::Sentinels);
        buf.push(Stream::Stdout, "one out".into());
        buf.push(Stream::Stdout, SENTINEL.into());
        first.close_at_answer();
        assert!(!first.is_complete(), "its stderr sentinel is not in");
        let mut second = buf.open_sequential(Ends::Sentinels);
        buf.push(Stream::Stdout, "two out".into());
        buf.push(Stream::Stderr, "one err".into());
        buf.push(Stream::Stderr, SENTINEL.into());
        assert!(first.is_complete());
        buf.push(Stream::Stderr, "two err".into());
        second.close_at_answer();
        assert!(!second.is_complete());
        let collecting = tokio::spawn(second.collect(Duration::from_secs(2), 1000));
        tokio::task::yield_now().await;
        pair(&buf);
        let began = tokio::time::Instant::now();
        let second = collecting.await.unwrap();
        assert_eq!(began.elapsed(), Duration::ZERO, "collected as its sentinels came");
        assert_eq!(texts(&first.take(1000)), ["one out", "one err"]);
        assert_eq!(texts(&second), ["two out", "two err"]);
        assert!(buf.inner.lock().lines.is_empty(), "nothing is kept once collected");
    }

    /// A run that never ran gives its place back: the next run's lines are its own.
    #[tokio::test(start_paused = true)]
    async fn a_window_dropped_unrun_gives_its_place_to_the_next() {
        let buf = Arc::new(LogBuffer::default());
        drop(buf.open_sequential(Ends::Sentinels));
        let window = buf.open_sequential(Ends::Sentinels);
        buf.push(Stream::Stdout, "mine".into());
        pair(&buf);
        assert!(window.is_complete());
        assert_eq!(texts(&window.take(1000)), ["mine"]);
    }

    /// 10,000 lines a run, two runs, the first answered before its lines are all in: each
    /// holds exactly its own.
    #[tokio::test(start_paused = true)]
    async fn a_chatty_run_holds_every_line_it_wrote_and_no_other() {
        let buf = Arc::new(LogBuffer::default());
        let mut first = buf.open_sequential(Ends::Sentinels);
        first.close_at_answer();
        let second = buf.open_sequential(Ends::Sentinels);
        for run in 0..2 {
            for i in 0..10_000 {
                buf.push(if i % 2 == 0 { Stream::Stdout } else { Stream::Stderr }, format!("{run}:{i}"));
            }
            pair(&buf);
        }
        let first = first.collect(WAIT, 1 << 30).await;
        let second = second.collect(WAIT, 1 << 30).await;
        for (run, lines) in [first, second].iter().enumerate() {
            assert_eq!(lines.len(), 10_000);
            assert!(texts(lines).iter().all(|t| t.starts_with(&format!("{run}:"))), "run {run}");
        }
    }

    /// A runtime without sentinels, on an engine's stream (no pipe to read): lines attributed
    /// by their stamps against each run's answer, a late one to the run whose window it falls
    /// in; a silent run waits only for the quiet time, off the answer's path.
    #[tokio::test(start_paused = true)]
    async fn without_sentinels_lines_go_by_their_stamps_and_a_late_one_to_its_own_run() {
        let buf = Arc::new(LogBuffer::default());
        let mut first = buf.open_sequential(Ends::Time);
        let written = SystemTime::now() - Duration::from_millis(1);
        buf.push_stamped(Stream::Stdout, "early".into(), Some(written));
        first.close_at_answer();
        assert!(!first.is_complete(), "a stream's line may still come");
        let mut second = buf.open_sequential(Ends::Time);
        // Written by the first run before its answer, read after the second began.
        buf.push_stamped(Stream::Stderr, "late".into(), Some(written));
        let after = SystemTime::now() + Duration::from_millis(5);
        buf.push_stamped(Stream::Stdout, "second".into(), Some(after));
        assert!(first.is_complete(), "a line stamped after its answer came");
        assert_eq!(texts(&first.take(1000)), ["early", "late"]);
        std::thread::sleep(Duration::from_millis(10));
        second.close_at_answer();
        let began = tokio::time::Instant::now();
        let lines = second.collect(WAIT, 1000).await;
        assert_eq!(texts(&lines), ["second"]);
        assert_eq!(began.elapsed(), LOG_QUIET, "nothing more came: the quiet time, no more");
        let silent = buf.open_sequential(Ends::Time);
        let began = tokio::time::Instant::now();
        assert!(silent.collect(WAIT, 1000).await.is_empty());
        assert_eq!(began.elapsed(), LOG_QUIET);
    }

    /// Fn's FDKs frame each call's lines (`FN_LOGFRAME_NAME`, the python FDK with an empty line
    /// before and after, node's with one before): whose a line is does not depend on when the
    /// engine passes it on, even after the next call began.
    #[tokio::test(start_paused = true)]
    async fn fn_log_frames_tell_whose_a_line_is_however_late_it_comes() {
        let buf = Arc::new(LogBuffer::default());
        let frame = |i: u32, python: bool| {
            for stream in [Stream::Stderr, Stream::Stdout] {
                buf.push(stream, String::new());
                buf.push(stream, format!("{FN_LOGFRAME_NAME}={i:032x}"));
                if python {
                    buf.push(stream, String::new());
                }
            }
        };
        buf.push(Stream::Stdout, "starting".into());
        let mut first = buf.open_sequential(Ends::Time);
        frame(0, true);
        buf.push(Stream::Stdout, "one".into());
        first.close_at_answer();
        assert!(!first.is_complete(), "its last lines may still come");
        let mut second = buf.open_sequential(Ends::Time);
        // Written before the first's answer, passed on after the second began.
        buf.push(Stream::Stderr, "one late".into());
        frame(1, false);
        assert!(first.is_complete(), "the next call's frame came on both streams");
        buf.push(Stream::Stdout, "two".into());
        buf.push(Stream::Stdout, String::new());
        assert_eq!(texts(&first.take(1000)), ["starting", "one", "one late"]);
        second.close_at_answer();
        let began = tokio::time::Instant::now();
        let lines = second.collect(WAIT, 1000).await;
        assert_eq!(texts(&lines), ["two", ""], "its own empty line is kept, the frame's are not");
        assert_eq!(began.elapsed(), LOG_QUIET, "the last call: until the stream is quiet");
        // A line of the second that comes after it was taken goes to the third.
        let third = buf.open_sequential(Ends::Time);
        buf.push(Stream::Stdout, "two, later still".into());
        frame(2, true);
        buf.push(Stream::Stdout, "three".into());
        assert_eq!(texts(&third.collect(WAIT, 1000).await), ["two, later still", "three"]);
    }

    /// Where the FDK writes frames, the last call's lines are waited for until its own frame
    /// came, however late the engine passes them on (under load, later than the quiet time).
    #[tokio::test(start_paused = true)]
    async fn a_framed_calls_lines_passed_on_late_are_waited_for() {
        let buf = Arc::new(LogBuffer::default());
        let frame = |i: u32| {
            for stream in [Stream::Stderr, Stream::Stdout] {
                buf.push(stream, format!("{FN_LOGFRAME_NAME}={i:032x}"));
            }
        };
        let first = buf.open_sequential(Ends::Time);
        frame(0);
        buf.push(Stream::Stdout, "one".into());
        let second = buf.open_sequential(Ends::Time);
        frame(1);
        assert_eq!(texts(&first.take(1000)), ["one"]);
        let third = buf.open_sequential(Ends::Time);
        let late = {
            let buf = buf.clone();
            tokio::spawn(async move {
                tokio::time::sleep(LOG_QUIET * 4).await;
                for stream in [Stream::Stderr, Stream::Stdout] {
                    buf.push(stream, format!("{FN_LOGFRAME_NAME}={:032x}", 2));
                }
                buf.push(Stream::Stdout, "three".into());
            })
        };
        drop(second);
        let began = tokio::time::Instant::now();
        let lines = third.collect(WAIT, 1000).await;
        late.await.unwrap();
        assert_eq!(texts(&lines), ["three"]);
        assert_eq!(began.elapsed(), LOG_QUIET * 5, "its frame came late, then the quiet time");
    }

    /// A pod's merged log: a call's first output may come between its two frames (the engine
    /// copies each pipe on its own); it is that call's, not the one before's.
    #[tokio::test(start_paused = true)]
    async fn in_a_merged_log_a_line_between_a_calls_two_frames_is_that_calls() {
        let buf = Arc::new(LogBuffer::default());
        let frame = |i: u32| format!("{FN_LOGFRAME_NAME}={i:032x}");
        let mut first = buf.open_sequential(Ends::Time);
        buf.push_merged(frame(0), None);
        buf.push_merged(frame(0), None);
        buf.push_merged("one".into(), None);
        first.close_at_answer();
        let second = buf.open_sequential(Ends::Time);
        buf.push_merged(frame(1), None);
        buf.push_merged("two".into(), None);
        buf.push_merged(frame(1), None);
        assert!(first.is_complete());
        assert_eq!(texts(&first.take(1000)), ["one"]);
        assert_eq!(texts(&second.collect(WAIT, 1000).await), ["two"]);
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
            let lines = window.collect(Duration::from_secs(2), 1000).await;
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
            pair(&buf);
        }
        let began = tokio::time::Instant::now();
        let lines_b = b.collect(Duration::from_secs(2), 1000).await;
        let lines_a = a.collect(Duration::from_secs(2), 1000).await;
        assert_eq!(began.elapsed(), Duration::ZERO);
        assert!(lines_b.len() == 1 && lines_b[0].ends_with("both"), "{lines_b:?}");
        assert!(lines_a.len() == 2 && lines_a[0].ends_with("early"), "{lines_a:?}");
        // A run whose sentinel never comes waits its bound, and no longer.
        let c = buf.open("c");
        buf.push(Stream::Stdout, "alone".into());
        let lines = c.collect(Duration::from_secs(2), 1000).await;
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
            pair(&buf);
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
