//! The activation hot path without an fsync: `accept` and `finish` append one line each to a
//! journal file (a copy into a shared mapping of it, `segment.rs`: in the page cache, so it
//! survives a SIGKILL of the invoker, without a syscall) and
//! keep the entry in memory; a background thread moves what the journal holds into redb in one
//! transaction every `FLUSH_EVERY` (group commit), then deletes the journal segment it covered.
//! At open, segments an earlier run left are replayed into redb first. Reads see the memory
//! first, then redb, so a record is visible the moment it is finished.
//!
//! Power loss may lose the last `FLUSH_EVERY` of journal lines (they are not fsynced); a
//! SIGKILL loses nothing.
//!
//! A full disk: a write that fails (a journal line, a flush, an action) puts the store in
//! trouble, which refuses new activations (`StoreError::Unavailable`, a 503 naming the disk)
//! and makes the invoker unhealthy. What was accepted before still ends with its record: one
//! whose line cannot be written is kept in memory (bounded by what was accepted, since nothing
//! new is) and reaches redb with the next flush that succeeds. Every `FLUSH_EVERY` the store
//! tries a write of each kind (a scratch file beside the journal, a redb transaction, which
//! opens the database again if the error broke it); once both succeed it takes work again.
//!
//! So that a full disk never turns a finished result into a failure, the journal keeps a
//! reserve: a file of `end_reserve` bytes allocated beside the segments while the disk has room.
//! When a record's line finds the disk full, the reserve gives back what the line needs and the
//! line is written after all; only endings may use it (an acceptance finds the disk full and is
//! refused). The reserve is allocated whole again before the store takes work again. A start
//! on a full disk does not fail: what the journal holds that redb cannot take is kept in memory
//! (and in its segments) until a flush succeeds, and the store starts in trouble.

use super::action_cache::ActionCache;
use super::contract::{Accepted, DocKind, QueuedCall, Recovered, Store, StoreError};
use super::redb_store::{Batch, RedbStore};
use super::segment::Segment;
use invoker_wire::model::{Action, ActivationMeta, ActivationRecord, EncodedRecord};
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// The action cache's budget unless configured (`[store] action_cache_mb`).
pub const DEFAULT_ACTION_CACHE_BYTES: usize = 256 * 1024 * 1024;

/// The journal's reserve for endings unless configured (`[store] end_reserve_mb`).
pub const DEFAULT_END_RESERVE_BYTES: u64 = 32 * 1024 * 1024;

/// The reserve's file in the journal directory.
const RESERVE: &str = "reserve";

/// What the reserve gives back at least when a line needs room: a few lines' worth.
const RESERVE_STEP: u64 = 1024 * 1024;

/// How a journaled store is set up besides its paths.
#[derive(Clone, Copy, Debug)]
pub struct JournalOptions {
    pub action_cache_bytes: usize,
    pub end_reserve_bytes: u64,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions { action_cache_bytes: DEFAULT_ACTION_CACHE_BYTES, end_reserve_bytes: DEFAULT_END_RESERVE_BYTES }
    }
}

/// Disk kept for the lines of records, given back a step at a time when the disk is full.
struct Reserve {
    file: File,
    /// What is allocated now, and what it should be.
    size: u64,
    target: u64,
}

impl Reserve {
    fn open(dir: &Path, target: u64) -> Result<Self, StoreError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(dir.join(RESERVE))
            .map_err(|e| io_err("journal reserve", e))?;
        let size = file.metadata().map_err(|e| io_err("journal reserve", e))?.len();
        Ok(Reserve { file, size, target })
    }

    /// Allocates the reserve whole (real blocks, not a sparse file); `Err` when the disk has
    /// not the room.
    fn fill(&mut self) -> Result<(), StoreError> {
        if self.size >= self.target {
            return Ok(());
        }
        let len = i64::try_from(self.target).unwrap_or(i64::MAX);
        nix::fcntl::posix_fallocate(&self.file, 0, len).map_err(|e| io_err("journal reserve", e.into()))?;
        self.size = self.target;
        Ok(())
    }

    /// Gives back at least `need` bytes (a step at least) to the disk; false once it is empty.
    fn release(&mut self, need: u64) -> bool {
        if self.size == 0 {
            return false;
        }
        let size = self.size.saturating_sub(need.max(RESERVE_STEP));
        if self.file.set_len(size).is_err() {
            return false;
        }
        self.size = size;
        true
    }
}

pub struct JournaledStore {
    inner: Arc<Inner>,
}

struct Inner {
    db: RedbStore,
    /// Actions read on every invoke, kept whole in memory within a byte budget; a write
    /// replaces or drops the entry.
    actions: Mutex<ActionCache>,
    dir: PathBuf,
    state: Mutex<State>,
    /// Serialises flushes (the thread's and an explicit one).
    flushing: Mutex<()>,
    /// The segment the next flush moves the journal to (its number), made with room for a
    /// flush's lines by the flush before, off the activations' path.
    prepared: Mutex<Option<(u64, Segment)>>,
    /// Why writes fail now; `None` while they succeed.
    trouble: Mutex<Option<String>>,
    reserve: Mutex<Reserve>,
}

struct State {
    file: Segment,
    segment: u64,
    /// Accepted and not finished; `true` once redb's pending table has it.
    pending: FxHashMap<String, (ActivationMeta, bool)>,
    /// Finished, not yet in redb.
    finished: FxHashMap<String, Finished>,
    /// Being written to redb by a flush right now (still visible to reads).
    in_flight: Arc<FxHashMap<String, Finished>>,
    /// Answered and not finished (their logs still coming): the record as answered, and its
    /// JSON. Journaled again in each new segment until finished, so that a restart finishes
    /// such an activation with what its caller was told, not with a guess.
    answered: FxHashMap<String, (Arc<ActivationRecord>, bytes::Bytes)>,
    /// Asynchronous calls accepted and not finished (each pending too).
    queued: FxHashMap<String, QueueEntry>,
    /// Queued calls that ended while redb held them: out of its queued table with the next
    /// flush.
    unqueue: Vec<String>,
}

/// A queued call in memory: its JSON until redb has it, and whether it started.
#[derive(Default)]
struct QueueEntry {
    json: Option<bytes::Bytes>,
    /// In redb's queued table, or on its way there with a flush under way.
    saved: bool,
    /// When it was handed to a container (epoch ms), if it was.
    started: Option<u64>,
    /// That it started is in redb, or on its way there.
    started_saved: bool,
}

/// A finished record with its JSON as the journal wrote it (the store reuses the bytes).
#[derive(Clone)]
struct Finished {
    record: Arc<ActivationRecord>,
    json: bytes::Bytes,
    /// In the journal (or in a segment an earlier run left): a restart finds it. False only
    /// for a record the disk had no room for at all, held in memory alone.
    journaled: bool,
    /// Its activation may be pending in redb (its acceptance was flushed before it finished,
    /// or this run cannot tell): the flush removes that entry. Most activations finish before
    /// a flush saw them accepted, and their record is then one write and its index entry.
    pending_in_db: bool,
}

fn io_err(what: &str, source: std::io::Error) -> StoreError {
    StoreError::Io { what: what.to_string(), source }
}

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("journal.{n:020}"))
}

/// A segment's number, from its file name (`journal.<n>`).
fn segment_number(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_prefix("journal.")?.parse().ok()
}

/// The segments in `dir`, oldest first: the regular files named as segments, nothing else.
fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_err("journal directory", e))? {
        let entry = entry.map_err(|e| io_err("journal directory", e))?;
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let path = entry.path();
        if let (Some(n), true) = (segment_number(&path), is_file) {
            found.push((n, path));
        }
    }
    found.sort();
    Ok(found)
}

/// The suffix of a segment that could not be read whole, kept aside for inspection.
const DAMAGED: &str = "damaged";

/// Looks over the journal directory once at open: says what lies there that is not a segment
/// (a directory named as one, a stray file: skipped, never a reason not to start), and returns
/// the number of the next segment, past every name taken.
fn survey(dir: &Path) -> Result<u64, StoreError> {
    let mut next = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| io_err("journal directory", e))?.flatten() {
        let path = entry.path();
        let number = segment_number(&path);
        next = next.max(number.map_or(0, |n| n + 1));
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let kept_aside = path.extension().is_some_and(|e| e == DAMAGED);
        let reserve = path.file_name().is_some_and(|n| n == RESERVE);
        if !(kept_aside || reserve || is_file && number.is_some()) {
            tracing::warn!(path = %path.display(), "skipped an entry of the journal directory that is not a segment");
        }
    }
    Ok(next)
}

fn open_segment(dir: &Path, n: u64) -> Result<Segment, StoreError> {
    Segment::create(&segment_path(dir, n)).map_err(|e| io_err("journal segment", e))
}

#[derive(serde::Deserialize)]
enum Line {
    A(ActivationMeta),
    F(Box<ActivationRecord>),
    /// Answered before its record was whole (its logs still coming): the record as answered.
    R(Box<ActivationRecord>),
    /// An asynchronous call accepted into the queue, with what it takes to run it.
    Q(Box<QueuedCall>),
    /// A queued call handed to a container, and when (epoch ms).
    S(String, u64),
}

/// A journal line as a restart reads it, written again as the journal writes it: `None` when
/// it does not parse (what the fuzz targets feed with arbitrary bytes).
#[cfg(any(test, feature = "test-util"))]
pub fn reread_line(bytes: &[u8]) -> Option<Vec<u8>> {
    match serde_json::from_slice::<Line>(bytes).ok()? {
        Line::A(meta) => {
            let mut line = accepted_line(&meta);
            line.pop();
            Some(line)
        }
        Line::F(record) => {
            let mut line = finished_line(&EncodedRecord::new(*record).json);
            line.pop();
            Some(line)
        }
        Line::R(record) => {
            let mut line = answered_line(&EncodedRecord::new(*record).json);
            line.pop();
            Some(line)
        }
        Line::Q(call) => {
            let mut line = queued_line(&serde_json::to_vec(&call).ok()?);
            line.pop();
            Some(line)
        }
        Line::S(id, at) => serde_json::to_vec(&LineRef::S(&id, at)).ok(),
    }
}

/// What `Line` reads of a start, written without a copy (an acceptance's line is
/// [`accepted_line`], a finished record's [`finished_line`]).
#[derive(serde::Serialize)]
enum LineRef<'a> {
    S(&'a str, u64),
}

/// An acceptance's line, newline included: `{"A":<meta>}`, as `Line::A` reads it.
fn accepted_line(meta: &ActivationMeta) -> Vec<u8> {
    let mut line = Vec::with_capacity(256);
    line.extend_from_slice(b"{\"A\":");
    meta.write_json(&mut line);
    line.extend_from_slice(b"}\n");
    line
}

/// A queued call's line, newline included: `{"Q":<call>}` around its JSON, encoded once for
/// the journal and redb.
fn queued_line(json: &[u8]) -> Vec<u8> {
    wrapped_line(b"{\"Q\":", json)
}

fn wrapped_line(head: &[u8], json: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(json.len() + 7);
    line.extend_from_slice(head);
    line.extend_from_slice(json);
    line.extend_from_slice(b"}\n");
    line
}

/// An answered record's line, newline included: `{"R":<record>}`.
fn answered_line(json: &[u8]) -> Vec<u8> {
    wrapped_line(b"{\"R\":", json)
}

/// A finished record's line, newline included: `{"F":<record>}` around the record's JSON as it
/// was encoded, once.
fn finished_line(json: &[u8]) -> Vec<u8> {
    wrapped_line(b"{\"F\":", json)
}

impl JournaledStore {
    /// Opens redb at `db_path`, replays the journal segments in `dir` into it, and starts the
    /// flusher thread, with the default [`JournalOptions`].
    pub fn open(db_path: &Path, dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(db_path, dir, JournalOptions::default())
    }

    /// As [`open`](Self::open), with `options`.
    pub fn open_with(db_path: &Path, dir: &Path, options: JournalOptions) -> Result<Self, StoreError> {
        let db = RedbStore::open(db_path)?;
        std::fs::create_dir_all(dir).map_err(|e| io_err("journal directory", e))?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io_err("journal directory", e))?;
        let segment = survey(dir)?;
        let found = segments(dir)?;
        let read = found.iter().map(|(_, path)| read_segment(path)).collect::<Result<Vec<_>, _>>()?;
        // Every segment applied before any is removed: a failure leaves them all for the next
        // start. A full disk leaves them too, and what they hold waits in memory.
        let applied = read.iter().try_for_each(|segment| segment.apply_to(&db));
        let mut state = State {
            file: open_segment(dir, segment)?,
            segment,
            pending: FxHashMap::default(),
            finished: FxHashMap::default(),
            in_flight: Arc::default(),
            answered: FxHashMap::default(),
            queued: FxHashMap::default(),
            unqueue: Vec::new(),
        };
        // The activations answered and not finished, oldest segment first; journaled again in
        // the new segment before the old ones go.
        for segment in &read {
            for (record, json) in &segment.answered {
                let entry = (Arc::new(record.clone()), bytes::Bytes::from(json.clone()));
                state.answered.insert(record.activation_id.clone(), entry);
            }
            for (record, _) in &segment.finished {
                state.answered.remove(&record.activation_id);
            }
        }
        Inner::journal_answered(&mut state)?;
        let mut trouble = None;
        match applied {
            Ok(()) => {}
            Err(e) if e.is_storage() => {
                let reason = format!(
                    "the store cannot write what the journal holds into {} ({e}); it is kept in memory and new work \
                     is refused until the disk takes it",
                    db_path.display()
                );
                tracing::error!("{reason}");
                trouble = Some(reason);
                for segment in &read {
                    segment.load_into(&mut state);
                }
            }
            Err(e) => return Err(e),
        }
        for ((_, path), segment) in found.iter().zip(&read) {
            if segment.unread == 0 {
                if trouble.is_none() {
                    let _ = std::fs::remove_file(path);
                }
                continue;
            }
            let unread = segment.unread;
            // Kept aside, not deleted: what could not be read may still be read by hand.
            let mut aside = path.as_os_str().to_owned();
            aside.push(format!(".{DAMAGED}"));
            let aside = PathBuf::from(aside);
            let kept = std::fs::rename(path, &aside);
            tracing::warn!(
                segment = %path.display(),
                unread_lines = unread,
                kept_as = %aside.display(),
                renamed = kept.is_ok(),
                "a journal segment could not be read whole: replayed what was sound"
            );
        }
        let mut reserve = Reserve::open(dir, options.end_reserve_bytes)?;
        if let Err(e) = reserve.fill() {
            let reason = format!(
                "the journal's reserve for endings ({} MB) cannot be allocated in {} ({e}); new work is refused \
                 until it can",
                options.end_reserve_bytes >> 20,
                dir.display()
            );
            tracing::error!("{reason}");
            trouble.get_or_insert(reason);
        }
        let inner = Arc::new(Inner {
            db,
            actions: Mutex::new(ActionCache::new(options.action_cache_bytes)),
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
            flushing: Mutex::new(()),
            prepared: Mutex::new(None),
            trouble: Mutex::new(trouble),
            reserve: Mutex::new(reserve),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("store-flush".into())
            .spawn(move || flush_loop(weak))
            .map_err(|e| io_err("flusher thread", e))?;
        Ok(JournaledStore { inner })
    }

    /// Moves everything journaled so far into redb (also done every `FLUSH_EVERY`).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
}

/// What can be read of one segment: every line that parses, up to where the file can be read
/// at all, and how many lines could not be read (a torn last line where the invoker died
/// mid-write, a corrupt one, the rest of a file that fails to read).
struct SegmentRead {
    accepted: Vec<ActivationMeta>,
    /// Queued calls (also in `accepted`): id and JSON.
    queued: Vec<(String, Vec<u8>)>,
    /// Queued calls that started, and when.
    started: Vec<(String, u64)>,
    /// Ended (a record): out of the queue.
    unqueued: Vec<String>,
    finished: Vec<(ActivationRecord, Vec<u8>)>,
    answered: Vec<(ActivationRecord, Vec<u8>)>,
    unread: usize,
}

fn read_segment(path: &Path) -> Result<SegmentRead, StoreError> {
    let file = File::open(path).map_err(|e| io_err("journal segment", e))?;
    let mut read = SegmentRead {
        accepted: Vec::new(),
        queued: Vec::new(),
        started: Vec::new(),
        unqueued: Vec::new(),
        finished: Vec::new(),
        answered: Vec::new(),
        unread: 0,
    };
    for line in BufReader::new(file).split(b'\n') {
        let Ok(line) = line else {
            read.unread += 1;
            break;
        };
        // The segment's room not yet written (`segment.rs`): the end of its lines. (An empty
        // line is no such room: it is unreadable, as any line that does not parse.)
        if !line.is_empty() && line.iter().all(|&b| b == 0) {
            break;
        }
        match serde_json::from_slice::<Line>(&line) {
            Ok(Line::A(meta)) => read.accepted.push(meta),
            Ok(Line::F(record)) => {
                // A record is strings, numbers and JSON values: encoding it cannot fail.
                let json = serde_json::to_vec(&record).expect("a record serialises");
                read.unqueued.push(record.activation_id.clone());
                read.finished.push((*record, json));
            }
            Ok(Line::Q(call)) => {
                let json = serde_json::to_vec(&call).expect("a queued call serialises");
                read.queued.push((call.meta.activation_id.clone(), json));
                read.accepted.push(call.meta);
            }
            Ok(Line::S(id, at)) => read.started.push((id, at)),
            Ok(Line::R(record)) => {
                let json = serde_json::to_vec(&record).expect("a record serialises");
                read.answered.push((*record, json));
            }
            Err(_) => read.unread += 1,
        }
    }
    Ok(read)
}

impl SegmentRead {
    fn apply_to(&self, db: &RedbStore) -> Result<(), StoreError> {
        let finished: Vec<(&ActivationRecord, &[u8], bool)> =
            self.finished.iter().map(|(r, j)| (r, j.as_slice(), true)).collect();
        let queued: Vec<(&str, &[u8])> = self.queued.iter().map(|(id, j)| (id.as_str(), j.as_slice())).collect();
        let started: Vec<(&str, u64)> = self.started.iter().map(|(id, at)| (id.as_str(), *at)).collect();
        let unqueued = &self.unqueued;
        db.apply(&Batch { accepted: &self.accepted, queued: &queued, started: &started, unqueued, finished: &finished })
    }

    /// Into memory, as if this run had journaled it (segments are read oldest first).
    fn load_into(&self, state: &mut State) {
        for meta in &self.accepted {
            state.pending.insert(meta.activation_id.clone(), (meta.clone(), false));
        }
        for (id, json) in &self.queued {
            state.queued.insert(id.clone(), QueueEntry { json: Some(json.clone().into()), ..QueueEntry::default() });
        }
        for (id, at) in &self.started {
            if let Some(q) = state.queued.get_mut(id) {
                q.started = Some(*at);
            }
        }
        for id in &self.unqueued {
            state.queued.remove(id);
        }
        for (record, json) in &self.finished {
            state.pending.remove(&record.activation_id);
            let finished = Finished {
                record: Arc::new(record.clone()),
                json: json.clone().into(),
                journaled: true,
                pending_in_db: true,
            };
            state.finished.insert(record.activation_id.clone(), finished);
        }
    }
}

/// The records of a flush as redb takes them best: in id order. Ids are time-ordered
/// (`new_activation_id`), so a batch in their order lands at the end of the records table and
/// of its index, leaf after leaf; in the order of a hash map it lands on the last few leaves
/// at random, splitting each again and again (a fifth more of the flush's work a record, and a
/// larger file, measured).
fn in_id_order(finished: &FxHashMap<String, Finished>) -> Vec<(&ActivationRecord, &[u8], bool)> {
    let mut records: Vec<(&ActivationRecord, &[u8], bool)> =
        finished.values().map(|f| (&*f.record, &*f.json, f.pending_in_db)).collect();
    records.sort_unstable_by(|a, b| a.0.activation_id.cmp(&b.0.activation_id));
    records
}

fn flush_loop(inner: Weak<Inner>) {
    loop {
        std::thread::sleep(FLUSH_EVERY);
        let Some(inner) = inner.upgrade() else { return };
        let troubled = inner.trouble.lock().is_some();
        match inner.flush() {
            Ok(()) if troubled => inner.try_recover(),
            Ok(()) => {}
            // Said once, when the trouble begins (`troubled`).
            Err(_) => {}
        }
    }
}

/// What a scratch write beside the journal must fit for the store to take work again: a
/// journal line of a large record.
const PROBE_BYTES: usize = 256 * 1024;

impl Inner {
    /// An earlier delivery of `id` (pending or finished, in memory or in redb), if there was one.
    fn seen(&self, state: &State, id: &str) -> Result<Option<Accepted>, StoreError> {
        if let Some((earlier, _)) = state.pending.get(id) {
            return Ok(Some(Accepted::Pending { namespace: earlier.namespace.clone() }));
        }
        if let Some(f) = state.finished.get(id).or_else(|| state.in_flight.get(id)) {
            return Ok(Some(Accepted::Finished(Box::new((*f.record).clone()))));
        }
        match self.db.seen(id).map_err(|e| self.troubled(e))? {
            Accepted::New => Ok(None),
            seen => Ok(Some(seen)),
        }
    }

    /// Takes a call out of the queue (it ended); out of redb's queue too with the next flush
    /// if it may be there.
    fn unqueue(state: &mut State, id: &str) {
        if let Some(QueueEntry { saved: true, .. }) = state.queued.remove(id) {
            state.unqueue.push(id.to_string());
        }
    }

    /// Journals again, in the current segment, every activation answered and not finished.
    fn journal_answered(state: &mut State) -> Result<(), StoreError> {
        let lines: Vec<Vec<u8>> = state.answered.values().map(|(_, json)| answered_line(json)).collect();
        lines.iter().try_for_each(|line| Self::append_line(state, line))
    }

    /// Writes one line, its newline included, whole or not at all.
    fn append_line(state: &mut State, bytes: &[u8]) -> Result<(), StoreError> {
        state.file.append(bytes).map_err(|e| io_err("journal append", e))
    }

    /// Notes a failed write: the store takes no new work until `try_recover` finds both the
    /// journal's disk and redb writable. Returns the error to answer with (a storage error
    /// becomes `Unavailable`, naming the disk). While the trouble lasts, its first reason
    /// stands: what fails after it (redb's `Previous I/O error`) is its consequence.
    fn troubled(&self, e: StoreError) -> StoreError {
        if !e.is_storage() {
            return e;
        }
        if let Some(reason) = &*self.trouble.lock() {
            return StoreError::Unavailable(reason.clone());
        }
        let reason = match &e {
            StoreError::Unavailable(reason) => reason.clone(),
            e if e.is_disk_full() => format!(
                "the disk holding the store ({}) is full ({e}); new work is refused until space is freed",
                self.dir.parent().unwrap_or(&self.dir).display()
            ),
            e => format!(
                "the store cannot write to {} ({e}); new work is refused until it can",
                self.dir.parent().unwrap_or(&self.dir).display()
            ),
        };
        tracing::error!("{reason}");
        *self.trouble.lock() = Some(reason.clone());
        StoreError::Unavailable(reason)
    }

    /// `Err(Unavailable)` while the store is in trouble.
    fn check_trouble(&self) -> Result<(), StoreError> {
        match &*self.trouble.lock() {
            Some(reason) => Err(StoreError::Unavailable(reason.clone())),
            None => Ok(()),
        }
    }

    /// Tries a write of each kind the store makes, and allocates the reserve whole again; when
    /// all succeed, the trouble is over.
    fn try_recover(&self) {
        let scratch = self.dir.join("probe.tmp");
        let journal = std::fs::write(&scratch, vec![0u8; PROBE_BYTES]);
        let _ = std::fs::remove_file(&scratch);
        let probed = match journal {
            Ok(()) => self.db.put_setting("store.probe", &invoker_wire::model::epoch_ms().to_string()),
            Err(e) => Err(io_err("journal directory", e)),
        };
        let probed = probed.and_then(|()| self.reserve.lock().fill());
        match probed {
            Ok(()) => {
                if let Some(reason) = self.trouble.lock().take() {
                    tracing::info!(was = %reason, "the store writes again; new work is taken");
                }
            }
            Err(e) => {
                self.troubled(e);
            }
        }
    }

    /// A record's line, written with room from the reserve when the disk has none left.
    fn append_ending(&self, state: &mut State, json: &[u8]) -> Result<(), StoreError> {
        let line = finished_line(json);
        loop {
            match Inner::append_line(state, &line) {
                Err(e) if e.is_disk_full() => {
                    // The store refuses new work from the first line that found the disk full.
                    self.troubled(io_err("journal append", std::io::Error::from_raw_os_error(libc::ENOSPC)));
                    let need = json.len() as u64 + 16;
                    if !self.reserve.lock().release(need) {
                        return Err(e);
                    }
                }
                done => return done,
            }
        }
    }

    /// Makes segment `n` with room for about `expected` bytes (what the last flush's segment
    /// held, and a quarter more), so that the lines it takes need no allocation or page fault.
    /// A full disk leaves it without room: its first line then finds the disk full.
    fn prepare(&self, n: u64, expected: usize) {
        let Ok(mut segment) = open_segment(&self.dir, n) else { return };
        if expected > 0 {
            let _ = segment.make_room(expected + expected / 4);
        }
        *self.prepared.lock() = Some((n, segment));
    }

    /// Journals the records held in memory alone (the reserve may have room again), then
    /// flushes; the ids of those still in memory alone.
    fn write_out_once(&self) -> Vec<String> {
        {
            let mut state = self.state.lock();
            let alone: Vec<(String, bytes::Bytes)> = state
                .finished
                .iter()
                .filter(|(_, f)| !f.journaled)
                .map(|(id, f)| (id.clone(), f.json.clone()))
                .collect();
            for (id, json) in alone {
                if self.append_ending(&mut state, &json).is_ok() {
                    if let Some(f) = state.finished.get_mut(&id) {
                        f.journaled = true;
                    }
                }
            }
        }
        if self.flush().is_ok() {
            return Vec::new();
        }
        let state = self.state.lock();
        state.finished.values().filter(|f| !f.journaled).map(|f| f.record.activation_id.clone()).collect()
    }

    fn flush(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.flushing.lock();
        let (old_segment, old_len, accepted, queued, started, unqueued, finished) = {
            let mut state = self.state.lock();
            let mut unsaved: Vec<ActivationMeta> = state
                .pending
                .values_mut()
                .filter(|(_, saved)| !*saved)
                .map(|(meta, saved)| {
                    *saved = true;
                    meta.clone()
                })
                .collect();
            // In id order, as `in_id_order` says why.
            unsaved.sort_unstable_by(|a, b| a.activation_id.cmp(&b.activation_id));
            // Marked saved before redb has them: a call that starts meanwhile is then taken out
            // of redb's queue by the next flush, after this one put it there.
            let queued: Vec<(String, bytes::Bytes)> = state
                .queued
                .iter_mut()
                .filter(|(_, q)| !q.saved)
                .filter_map(|(id, q)| {
                    q.saved = true;
                    Some((id.clone(), q.json.clone()?))
                })
                .collect();
            let started: Vec<(String, u64)> = state
                .queued
                .iter_mut()
                .filter(|(_, q)| !q.started_saved)
                .filter_map(|(id, q)| {
                    let at = q.started?;
                    q.started_saved = true;
                    Some((id.clone(), at))
                })
                .collect();
            let unqueued = std::mem::take(&mut state.unqueue);
            let nothing_queued = queued.is_empty() && started.is_empty() && unqueued.is_empty();
            if unsaved.is_empty() && nothing_queued && state.finished.is_empty() {
                return Ok(());
            }
            let old = state.segment;
            let next = match self.prepared.lock().take() {
                Some((n, prepared)) if n == old + 1 => prepared,
                _ => open_segment(&self.dir, old + 1).map_err(|e| self.troubled(e))?,
            };
            let old_len = std::mem::replace(&mut state.file, next).written();
            state.segment = old + 1;
            // The old segments go once this flush is in redb: the answered lines move on.
            Inner::journal_answered(&mut state).map_err(|e| self.troubled(e))?;
            state.in_flight = Arc::new(std::mem::take(&mut state.finished));
            (old, old_len, unsaved, queued, started, unqueued, state.in_flight.clone())
        };
        let records = in_id_order(&finished);
        let calls: Vec<(&str, &[u8])> = queued.iter().map(|(id, json)| (id.as_str(), &**json)).collect();
        let starts: Vec<(&str, u64)> = started.iter().map(|(id, at)| (id.as_str(), *at)).collect();
        let batch =
            Batch { accepted: &accepted, queued: &calls, started: &starts, unqueued: &unqueued, finished: &records };
        let applied = self.db.apply(&batch);
        let mut state = self.state.lock();
        match applied {
            Ok(()) => {
                state.in_flight = Arc::default();
                // redb holds them now: memory keeps only that they are queued.
                for (id, _) in &queued {
                    if let Some(q) = state.queued.get_mut(id) {
                        q.json = None;
                    }
                }
                drop(state);
                for (n, path) in segments(&self.dir)? {
                    if n <= old_segment {
                        let _ = std::fs::remove_file(path);
                    }
                }
                self.prepare(old_segment + 2, old_len);
                Ok(())
            }
            Err(e) => {
                // Keep everything for the next attempt; the segments stay on disk too.
                let in_flight = std::mem::take(&mut state.in_flight);
                state.finished.extend(in_flight.iter().map(|(id, f)| (id.clone(), f.clone())));
                for meta in &accepted {
                    if let Some(entry) = state.pending.get_mut(&meta.activation_id) {
                        entry.1 = false;
                    }
                }
                for (id, _) in &queued {
                    // One that ended meanwhile is taken out of redb's queue, which never had it.
                    if let Some(q) = state.queued.get_mut(id) {
                        q.saved = false;
                    }
                }
                for (id, _) in &started {
                    if let Some(q) = state.queued.get_mut(id) {
                        q.started_saved = false;
                    }
                }
                state.unqueue.extend(unqueued);
                drop(state);
                Err(self.troubled(e))
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::error!("the last journal flush failed; the journal is replayed at the next start: {e}");
        }
    }
}

impl Store for JournaledStore {
    fn put_action(&self, action: Action, overwrite: bool) -> Result<Action, StoreError> {
        let inner = &self.inner;
        let saved = inner.db.put_action(action, overwrite).map_err(|e| inner.troubled(e))?;
        inner.actions.lock().insert(Arc::new(saved.clone()));
        Ok(saved)
    }

    fn get_action(&self, namespace: &str, name: &str) -> Result<Option<Arc<Action>>, StoreError> {
        let inner = &self.inner;
        if let Some(action) = inner.actions.lock().get(namespace, name) {
            return Ok(Some(action));
        }
        let found = inner.db.get_action(namespace, name).map_err(|e| inner.troubled(e))?;
        if let Some(action) = &found {
            inner.actions.lock().insert(action.clone());
        }
        Ok(found)
    }

    fn list_actions(&self, namespace: &str, skip: usize, limit: usize) -> Result<Vec<Action>, StoreError> {
        self.inner.db.list_actions(namespace, skip, limit).map_err(|e| self.inner.troubled(e))
    }

    fn find_actions(&self, keep: &dyn Fn(&Action) -> bool) -> Result<Vec<Action>, StoreError> {
        self.inner.db.find_actions(keep).map_err(|e| self.inner.troubled(e))
    }

    fn delete_action(&self, namespace: &str, name: &str) -> Result<Option<Action>, StoreError> {
        let inner = &self.inner;
        let deleted = inner.db.delete_action(namespace, name).map_err(|e| inner.troubled(e))?;
        inner.actions.lock().remove(namespace, name);
        Ok(deleted)
    }

    fn accept(&self, meta: &ActivationMeta) -> Result<Accepted, StoreError> {
        let inner = &self.inner;
        inner.check_trouble()?;
        let id = meta.activation_id.as_str();
        let mut state = inner.state.lock();
        // Under the lock, so that two deliveries of one id cannot both be new.
        if let Some(seen) = inner.seen(&state, id)? {
            return Ok(seen);
        }
        Inner::append_line(&mut state, &accepted_line(meta)).map_err(|e| inner.troubled(e))?;
        state.pending.insert(id.to_string(), (meta.clone(), false));
        Ok(Accepted::New)
    }

    fn accept_new(&self, meta: &ActivationMeta) -> Result<(), StoreError> {
        let inner = &self.inner;
        inner.check_trouble()?;
        let mut state = inner.state.lock();
        Inner::append_line(&mut state, &accepted_line(meta)).map_err(|e| inner.troubled(e))?;
        state.pending.insert(meta.activation_id.clone(), (meta.clone(), false));
        Ok(())
    }

    fn enqueue(&self, call: &QueuedCall, json: &[u8], given: bool) -> Result<Accepted, StoreError> {
        let inner = &self.inner;
        inner.check_trouble()?;
        let meta = &call.meta;
        let id = meta.activation_id.as_str();
        // Outside the lock: the parameters may be large.
        let line = queued_line(json);
        let json = bytes::Bytes::copy_from_slice(json);
        let mut state = inner.state.lock();
        if given {
            if let Some(seen) = inner.seen(&state, id)? {
                return Ok(seen);
            }
        }
        Inner::append_line(&mut state, &line).map_err(|e| inner.troubled(e))?;
        state.pending.insert(id.to_string(), (meta.clone(), false));
        state.queued.insert(id.to_string(), QueueEntry { json: Some(json), ..QueueEntry::default() });
        Ok(Accepted::New)
    }

    fn started(&self, id: &str) -> Result<(), StoreError> {
        let inner = &self.inner;
        let mut state = inner.state.lock();
        let at = invoker_wire::model::epoch_ms();
        let line = serde_json::to_vec(&LineRef::S(id, at)).map(|mut l| {
            l.push(b'\n');
            l
        });
        Inner::append_line(&mut state, &line.expect("an id serialises")).map_err(|e| inner.troubled(e))?;
        if let Some(q) = state.queued.get_mut(id) {
            q.started = Some(at);
        }
        Ok(())
    }

    /// Never loses an accepted activation's record: a line the disk has no room for takes it
    /// from the journal's reserve; one that finds the reserve spent too is kept in memory until
    /// a flush moves it into redb (and `write_out` says so if none does before the end).
    fn finish(&self, encoded: &EncodedRecord) -> Result<(), StoreError> {
        let inner = &self.inner;
        let record = &encoded.record;
        let mut state = inner.state.lock();
        let journaled = match inner.append_ending(&mut state, &encoded.json) {
            Ok(()) => true,
            Err(e) => {
                drop(state);
                let e = inner.troubled(e);
                tracing::warn!(activation = %record.activation_id, "record kept in memory until the store writes: {e}");
                state = inner.state.lock();
                false
            }
        };
        let pending_in_db = state.pending.remove(&record.activation_id).is_none_or(|(_, saved)| saved);
        state.answered.remove(&record.activation_id);
        Inner::unqueue(&mut state, &record.activation_id);
        let finished = Finished { record: Arc::clone(record), json: encoded.json.clone(), journaled, pending_in_db };
        state.finished.insert(record.activation_id.clone(), finished);
        Ok(())
    }

    /// One journal line; not shown by reads. A line the disk has no room for is not written:
    /// the activation then ends as a guess if the process stops before its record is whole.
    fn answered(&self, encoded: &EncodedRecord) -> Result<(), StoreError> {
        let mut state = self.inner.state.lock();
        Inner::append_line(&mut state, &answered_line(&encoded.json))?;
        let entry = (Arc::clone(&encoded.record), encoded.json.clone());
        state.answered.insert(encoded.record.activation_id.clone(), entry);
        Ok(())
    }

    fn get_activation(&self, id: &str) -> Result<Option<ActivationRecord>, StoreError> {
        {
            let state = self.inner.state.lock();
            if let Some(f) = state.finished.get(id).or_else(|| state.in_flight.get(id)) {
                return Ok(Some((*f.record).clone()));
            }
        }
        self.inner.db.get_activation(id).map_err(|e| self.inner.troubled(e))
    }

    fn list_activations(
        &self,
        namespace: &str,
        name: Option<&str>,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<ActivationRecord>, StoreError> {
        let mut records: Vec<ActivationRecord> = {
            let state = self.inner.state.lock();
            state
                .finished
                .values()
                .chain(state.in_flight.values())
                .map(|f| &*f.record)
                .filter(|r| r.namespace == namespace && name.is_none_or(|n| n == r.name))
                .cloned()
                .collect()
        };
        let stored = self.inner.db.list_activations(namespace, name, 0, skip.saturating_add(limit));
        // A record in memory is the newer (a guess replaced by what ran may start elsewhere).
        let held: FxHashSet<String> = records.iter().map(|r| r.activation_id.clone()).collect();
        let stored = stored.map_err(|e| self.inner.troubled(e))?;
        records.extend(stored.into_iter().filter(|r| !held.contains(&r.activation_id)));
        records.sort_by(|a, b| (b.start, &b.activation_id).cmp(&(a.start, &a.activation_id)));
        Ok(records.into_iter().skip(skip).take(limit).collect())
    }

    /// The earlier run's unfinished activations (in redb's pending table, and in memory when
    /// the journal could not be applied at open) get whisk-error records at once, in memory
    /// first: on a full disk they reach redb with the first flush that succeeds.
    fn recover_unfinished(&self, now_ms: u64) -> Result<Recovered, StoreError> {
        let inner = &self.inner;
        let mut left: FxHashMap<String, ActivationMeta> =
            inner.db.pending()?.into_iter().map(|m| (m.activation_id.clone(), m)).collect();
        let in_db_queue = inner.db.queued()?;
        let mut state = inner.state.lock();
        left.extend(state.pending.iter().map(|(id, (meta, _))| (id.clone(), meta.clone())));
        // Finished already, on its way to redb: not unfinished.
        left.retain(|id, _| !state.finished.contains_key(id) && !state.in_flight.contains_key(id));
        // Queued and never started: it stays queued (and pending), to be run. Started: it stays
        // pending, for its retry policy.
        let (mut queued, mut interrupted) = (Vec::new(), Vec::new());
        let mut seen = FxHashSet::default();
        let taken_out: FxHashSet<&String> = state.unqueue.iter().collect();
        // One answered before its logs came ended as far as its caller knows: it ends with
        // what was answered, below, and is not tried again.
        let kept = |id: &String| left.contains_key(id) && !state.answered.contains_key(id);
        for (call, started_in_db) in in_db_queue {
            let id = call.meta.activation_id.clone();
            if kept(&id) && !taken_out.contains(&id) && seen.insert(id.clone()) {
                let started = started_in_db || state.queued.get(&id).is_some_and(|q| q.started.is_some());
                if started {
                    interrupted.push(call)
                } else {
                    queued.push(call)
                }
            }
        }
        for (id, q) in &state.queued {
            let Some(json) = &q.json else { continue };
            if kept(id) && seen.insert(id.clone()) {
                if let Ok(call) = serde_json::from_slice::<QueuedCall>(json) {
                    if q.started.is_some() {
                        interrupted.push(call)
                    } else {
                        queued.push(call)
                    }
                }
            }
        }
        left.retain(|id, _| !seen.contains(id));
        for id in left.keys() {
            state.pending.remove(id);
        }
        for (id, meta) in &left {
            // Its caller was answered: the record says what it was told, and that its logs
            // were not collected. Otherwise a guess.
            let record = match state.answered.remove(id) {
                Some((answered, _)) => {
                    let mut record = (*answered).clone();
                    record.logs.push(format!(
                        "{} stderr: {}",
                        humantime::format_rfc3339_millis(std::time::SystemTime::now()),
                        super::contract::STOPPED_BEFORE_LOGS
                    ));
                    record
                }
                None => ActivationRecord::guess(meta, super::contract::STOPPED_UNFINISHED, now_ms),
            };
            let EncodedRecord { record, json, .. } = EncodedRecord::new(record);
            state.finished.insert(id.clone(), Finished { record, json, journaled: false, pending_in_db: true });
        }
        drop(state);
        if let Err(e) = inner.flush() {
            tracing::warn!("the records of unfinished activations are kept in memory until the store writes: {e}");
        }
        queued.sort_by_key(|c| c.meta.accepted_at);
        Ok(Recovered { guessed: left.into_values().collect(), queued, interrupted })
    }

    fn write_out(&self, within: Duration) -> Vec<String> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let alone = self.inner.write_out_once();
            if alone.is_empty() || std::time::Instant::now() >= deadline {
                return alone;
            }
            std::thread::sleep(FLUSH_EVERY);
        }
    }

    fn expire(&self, before_ms: u64) -> Result<usize, StoreError> {
        self.inner.db.expire(before_ms).map_err(|e| self.inner.troubled(e))
    }

    fn trouble(&self) -> Option<String> {
        self.inner.trouble.lock().clone()
    }

    fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.inner.db.get_setting(key).map_err(|e| self.inner.troubled(e))
    }

    fn put_setting(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.inner.db.put_setting(key, value).map_err(|e| self.inner.troubled(e))
    }

    fn get_doc(&self, namespace: &str, kind: DocKind, id: &str) -> Result<Option<String>, StoreError> {
        self.inner.db.get_doc(namespace, kind, id).map_err(|e| self.inner.troubled(e))
    }

    fn list_docs(&self, namespace: &str, kind: DocKind) -> Result<Vec<String>, StoreError> {
        self.inner.db.list_docs(namespace, kind).map_err(|e| self.inner.troubled(e))
    }

    fn docs_generation(&self) -> u64 {
        self.inner.db.docs_generation()
    }

    fn put_doc(
        &self,
        namespace: &str,
        kind: DocKind,
        id: &str,
        value: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.inner.db.put_doc(namespace, kind, id, value).map_err(|e| self.inner.troubled(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use invoker_wire::model::Outcome;
    use std::io::Write;

    fn meta(id: &str) -> ActivationMeta {
        ActivationMeta::for_test(id)
    }

    fn open(dir: &Path) -> JournaledStore {
        JournaledStore::open(&dir.join("s.redb"), &dir.join("journal")).unwrap()
    }

    fn record(id: &str) -> ActivationRecord {
        let mut r = ActivationRecord::whisk_error(&meta(id), "x", 5);
        r.response = invoker_wire::model::ActivationResponse::new(Outcome::Success, serde_json::json!({"ok": true}));
        r.status_code = 0;
        r
    }

    /// The store's files at `from` (journal segments and redb), copied to `to` as a killed
    /// process leaves them.
    fn copy_store(from: &Path, to: &Path) {
        std::fs::create_dir_all(to.join("journal")).unwrap();
        for (_, path) in segments(&from.join("journal")).unwrap() {
            std::fs::copy(&path, to.join("journal").join(path.file_name().unwrap())).unwrap();
        }
        std::fs::copy(from.join("s.redb"), to.join("s.redb")).unwrap();
    }

    #[test]
    fn records_are_visible_at_once_and_survive_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        assert_eq!(store.accept(&meta("a1")).unwrap(), Accepted::New);
        assert_eq!(store.accept(&meta("a1")).unwrap(), Accepted::Pending { namespace: "guest".into() });
        store.finish(&record("a1").into()).unwrap();
        assert_eq!(store.get_activation("a1").unwrap().unwrap().activation_id, "a1");
        store.flush().unwrap();
        assert_eq!(store.get_activation("a1").unwrap().unwrap(), record("a1"), "the journal's bytes, stored whole");
        assert!(matches!(store.accept(&meta("a1")).unwrap(), Accepted::Finished(_)));
        assert_eq!(store.list_activations("guest", None, 0, 10).unwrap().len(), 1);
    }

    /// An activation finished before any flush saw it accepted never reaches redb's pending
    /// table (its record is one write and its index entry); one whose acceptance was flushed
    /// first has that entry removed when its record is. Neither is unfinished after a restart.
    #[test]
    fn a_pending_entry_is_removed_from_redb_only_where_a_flush_wrote_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        store.accept(&meta("quick")).unwrap();
        store.finish(&record("quick").into()).unwrap();
        store.accept(&meta("slow")).unwrap();
        store.flush().unwrap();
        let pending = |store: &JournaledStore| -> Vec<String> {
            store.inner.db.pending().unwrap().into_iter().map(|m| m.activation_id).collect()
        };
        assert_eq!(pending(&store), ["slow"], "only what was still running when it flushed");
        store.finish(&record("slow").into()).unwrap();
        store.flush().unwrap();
        assert!(pending(&store).is_empty());
        drop(store);
        let store = open(dir.path());
        assert!(store.recover_unfinished(9).unwrap().guessed.is_empty());
        assert_eq!(store.list_activations("guest", None, 0, 10).unwrap().len(), 2);
    }

    #[test]
    fn the_action_cache_follows_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let action = |code: &str| Action { version: String::new(), revision: 0, ..Action::for_test("a", code) };
        store.put_action(action("one"), false).unwrap();
        assert_eq!(store.get_action("guest", "a").unwrap().unwrap().exec.code.as_deref(), Some("one"));
        store.put_action(action("two"), true).unwrap();
        let cached = store.get_action("guest", "a").unwrap().unwrap();
        assert_eq!((cached.exec.code.as_deref(), cached.version.as_str()), (Some("two"), "0.0.2"));
        store.delete_action("guest", "a").unwrap();
        assert!(store.get_action("guest", "a").unwrap().is_none());
    }

    #[test]
    fn a_flush_hands_its_records_to_redb_in_id_order() {
        let finished: FxHashMap<String, Finished> = (0..64)
            .map(|n| invoker_wire::model::new_activation_id() + &format!("{n}"))
            .map(|id| {
                let record = Arc::new(record(&id));
                (id, Finished { record, json: bytes::Bytes::new(), journaled: true, pending_in_db: false })
            })
            .collect();
        let ids: Vec<&str> = in_id_order(&finished).iter().map(|r| r.0.activation_id.as_str()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    }

    /// A run that finished "done" and left "open" running, killed: a copy of its journal as
    /// the kill left it (no flush, no drop: only the segments on disk remain).
    fn killed_run(dir: &Path) -> tempfile::TempDir {
        let store = open(dir);
        store.accept(&meta("done")).unwrap();
        store.finish(&record("done").into()).unwrap();
        store.accept(&meta("open")).unwrap();
        std::mem::forget(store);
        let copy = tempfile::tempdir().unwrap();
        for (_, path) in segments(&dir.join("journal")).unwrap() {
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
        copy
    }

    #[test]
    fn a_killed_run_is_replayed_from_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let copy = killed_run(dir.path());
        let mut torn = File::options().append(true).open(segments(copy.path()).unwrap()[0].1.clone()).unwrap();
        torn.write_all(b"{\"A\":{\"activation_id\":").unwrap();
        let store = JournaledStore::open(&dir.path().join("s2.redb"), copy.path()).unwrap();
        assert_eq!(store.get_activation("done").unwrap().unwrap().response.status_code, 0);
        assert_eq!(store.recover_unfinished(9).unwrap().guessed.len(), 1, "the open one gets its whisk-error record");
        assert_eq!(store.get_activation("open").unwrap().unwrap().response.status_code, 3);
    }

    /// A segment's room not yet written (zeros, `segment.rs`) is its end, not damage: a kill
    /// leaves it, and the restart replays the lines before it and sets nothing aside.
    #[test]
    fn the_unwritten_room_of_a_killed_runs_segment_is_no_damage() {
        let dir = tempfile::tempdir().unwrap();
        let copy = killed_run(dir.path());
        let found = segments(copy.path()).unwrap();
        let room = std::fs::metadata(&found.last().unwrap().1).unwrap().len();
        assert_eq!(room, crate::segment::ROOM_STEP, "the lines' segment has its room, zeros after them");
        let store = JournaledStore::open(&dir.path().join("s2.redb"), copy.path()).unwrap();
        assert_eq!(store.get_activation("done").unwrap().unwrap().response.status_code, 0);
        assert_eq!(store.recover_unfinished(9).unwrap().guessed.len(), 1);
        let aside: Vec<_> = std::fs::read_dir(copy.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.ends_with(DAMAGED))
            .collect();
        assert!(aside.is_empty(), "set aside as damaged: {aside:?}");
    }

    fn queued(id: &str) -> (QueuedCall, Vec<u8>) {
        let call = QueuedCall {
            meta: meta(id),
            params: serde_json::json!({ "n": id }).as_object().cloned().unwrap_or_default(),
            request: None,
            api_key: None,
            transaction_id: "t".into(),
            expires_at: 99,
            attempt: 1,
            max_attempts: 3,
            retry_of: None,
            not_before: 0,
            on_success: None,
            on_failure: None,
        };
        let json = serde_json::to_vec(&call).unwrap();
        (call, json)
    }

    /// Asynchronous calls across SIGKILLs, whether a flush came between their steps or not:
    /// those never started stay queued (run by the next start, with their parameters), those
    /// that started are interrupted (kept, with their parameters, for their retry policy), one
    /// that ended is neither; and a start that recovered them and was killed again before
    /// running them leaves them as they were.
    #[test]
    fn queued_calls_never_started_survive_kills_with_their_parameters() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let enqueue = |id: &str| {
            let (call, json) = queued(id);
            assert_eq!(store.enqueue(&call, &json, false).unwrap(), Accepted::New);
        };
        enqueue("flushed");
        enqueue("started-after-flush");
        enqueue("ended");
        store.flush().unwrap();
        store.started("started-after-flush").unwrap();
        enqueue("started-before-flush");
        store.started("started-before-flush").unwrap();
        store.finish(&record("ended").into()).unwrap();
        store.flush().unwrap();
        enqueue("only-journaled");
        std::mem::forget(store);
        let copy = tempfile::tempdir().unwrap();
        copy_store(dir.path(), copy.path());
        let store = open(copy.path());
        let recovered = store.recover_unfinished(9).unwrap();
        let ids = |calls: &[QueuedCall]| calls.iter().map(|c| c.meta.activation_id.clone()).collect::<Vec<_>>();
        let mut queued_ids = ids(&recovered.queued);
        queued_ids.sort();
        assert_eq!(queued_ids, ["flushed", "only-journaled"]);
        assert!(recovered.queued.iter().all(|c| c.params["n"] == c.meta.activation_id.as_str()), "with its parameters");
        let mut interrupted = ids(&recovered.interrupted);
        interrupted.sort();
        assert_eq!(interrupted, ["started-after-flush", "started-before-flush"]);
        assert!(recovered.interrupted.iter().all(|c| c.params["n"] == c.meta.activation_id.as_str()));
        assert!(recovered.guessed.is_empty());
        assert!(store.get_activation("flushed").unwrap().is_none(), "no record while it waits");
        std::mem::forget(store);
        let again = tempfile::tempdir().unwrap();
        copy_store(copy.path(), again.path());
        let store = open(again.path());
        let recovered = store.recover_unfinished(10).unwrap();
        let mut queued_ids = ids(&recovered.queued);
        queued_ids.sort();
        assert_eq!(queued_ids, ["flushed", "only-journaled"], "still queued until they start");
        assert_eq!(recovered.interrupted.len(), 2, "still pending until their policy ends them");
        assert!(recovered.guessed.is_empty());
        assert_eq!(store.get_activation("ended").unwrap().unwrap().response.status_code, 0);
    }

    /// SIGKILL after an activation was answered and before its record was whole (its logs
    /// still coming through an engine): the restart ends it with the record its caller was
    /// told, noting that its logs were not collected, not with a guess; across a flush and a
    /// second restart too. One answered and then finished is not touched.
    #[test]
    fn an_activation_answered_before_its_logs_ends_as_answered_after_a_kill() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for id in ["told", "whole"] {
            store.accept(&meta(id)).unwrap();
            store.answered(&record(id).into()).unwrap();
        }
        assert!(store.get_activation("told").unwrap().is_none(), "not shown before it is whole");
        let mut whole = record("whole");
        whole.logs.push("a line".into());
        store.finish(&whole.into()).unwrap();
        store.flush().unwrap();
        // A SIGKILL: no drop; what the journal and redb hold remains, as copied.
        std::mem::forget(store);
        let copy = tempfile::tempdir().unwrap();
        copy_store(dir.path(), copy.path());
        // Killed again before anything recovered it: the answer is journaled in the new segment.
        std::mem::forget(open(copy.path()));
        let again = tempfile::tempdir().unwrap();
        copy_store(copy.path(), again.path());
        let store = open(again.path());
        let recovered: Vec<String> =
            store.recover_unfinished(9).unwrap().guessed.into_iter().map(|m| m.activation_id).collect();
        assert_eq!(recovered, ["told"]);
        let told = store.get_activation("told").unwrap().unwrap();
        assert_eq!(told.response, record("told").response, "what its caller was told, not a guess");
        assert!(told.logs.last().unwrap().ends_with(super::super::contract::STOPPED_BEFORE_LOGS), "{:?}", told.logs);
        assert_eq!(store.get_activation("whole").unwrap().unwrap().logs, ["a line"]);
    }

    /// A segment cut short and corrupt in the middle, a directory named as a segment and a
    /// stray file: the store opens, replays every sound line, and keeps the damaged segment
    /// aside under another name.
    #[test]
    fn a_damaged_journal_is_read_as_far_as_it_is_sound_and_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journal");
        {
            let store = open(dir.path());
            store.accept(&meta("first")).unwrap();
            store.finish(&record("first").into()).unwrap();
            std::mem::forget(store);
        }
        let (_, segment) = segments(&journal).unwrap().pop().unwrap();
        let sound = std::fs::read(&segment).unwrap();
        let mut damaged = sound.clone();
        damaged.extend_from_slice(b"\x00\xff not json\n");
        let second = String::from_utf8(sound).unwrap().replace("first", "after");
        damaged.extend_from_slice(second.as_bytes());
        damaged.extend_from_slice(b"{\"F\":{\"activationId\":\"cut");
        std::fs::write(&segment, &damaged).unwrap();
        std::fs::create_dir(journal.join("journal.00000000000000000099")).unwrap();
        std::fs::write(journal.join("notes.txt"), b"stray").unwrap();

        let store = JournaledStore::open(&dir.path().join("s2.redb"), &journal).unwrap();
        assert_eq!(store.get_activation("first").unwrap().unwrap().response.status_code, 0);
        assert_eq!(store.get_activation("after").unwrap().unwrap().response.status_code, 0, "read past the bad line");
        assert!(!segment.exists(), "the damaged segment is not replayed again");
        let aside: Vec<_> = std::fs::read_dir(&journal)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".damaged"))
            .collect();
        assert_eq!(aside.len(), 1, "kept aside: {aside:?}");
        assert_eq!(std::fs::read(journal.join(&aside[0])).unwrap(), damaged, "as it was");
        assert!(journal.join("journal.00000000000000000099").is_dir() && journal.join("notes.txt").exists());
    }

    /// Found by the fuzz targets: a number past u64 in a result came back from the journal
    /// (and redb) as another number, a little different each time it was read and written.
    #[test]
    fn a_large_number_in_a_result_reads_back_as_written() {
        let line = br#"{"F":{"namespace":"guest","name":"echo","version":"0.0.1","subject":"guest","activationId":"0123456789abcdef0123456789abcdef","start":1,"end":2,"duration":1,"statusCode":0,"response":{"status":"success","statusCode":0,"success":true,"result":{"x":[118446744073709551616]}},"logs":[],"annotations":[],"publish":false}}"#;
        let once = reread_line(line).expect("a journal line");
        assert_eq!(reread_line(&once).as_deref(), Some(once.as_slice()));
    }

    /// A store on a small filesystem that fills up: new work is refused with the disk named,
    /// what was accepted keeps its record (in memory while nothing can be written), and once
    /// space is freed the store writes again by itself, redb opened anew. Needs root (a tmpfs).
    #[test]
    #[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
    fn a_full_disk_refuses_new_work_keeps_every_record_and_recovers_by_itself() {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "this test needs root under CI");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let flags = nix::mount::MsFlags::empty();
        nix::mount::mount(Some("tmpfs"), dir.path(), Some("tmpfs"), flags, Some("size=4m")).unwrap();
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let _unmount = Unmount(dir.path());
        let options = JournalOptions { end_reserve_bytes: 1 << 20, ..JournalOptions::default() };
        let store =
            JournaledStore::open_with(&dir.path().join("s.redb"), &dir.path().join("journal"), options).unwrap();
        let big = |id: &str| {
            let mut r = record(id);
            r.response.result = serde_json::json!({ "data": "x".repeat(64 * 1024) });
            EncodedRecord::from(r)
        };
        for id in ["a1", "a2"] {
            assert_eq!(store.accept(&meta(id)).unwrap(), Accepted::New);
        }
        store.flush().unwrap();
        let ballast = dir.path().join("ballast");
        let mut file = File::create(&ballast).unwrap();
        while file.write_all(&[7u8; 64 * 1024]).is_ok() {}
        drop(file);

        store.finish(&big("a1")).unwrap();
        let trouble = store.trouble().expect("the store knows it cannot write");
        assert!(trouble.contains("is full") && trouble.contains(&dir.path().display().to_string()), "{trouble}");
        match store.accept(&meta("a3")) {
            Err(StoreError::Unavailable(reason)) => assert_eq!(reason, trouble),
            other => panic!("new work is refused: {other:?}"),
        }
        // What the reserve gave back beyond the line, taken too.
        let mut more = File::create(dir.path().join("ballast2")).unwrap();
        while more.write_all(&[7u8; 4096]).is_ok() {}
        drop(more);
        assert!(store.flush().is_err(), "nothing can be written");
        let put = store.put_action(Action { version: String::new(), ..Action::for_test("b", "x") }, false);
        assert!(put.as_ref().is_err_and(StoreError::is_storage), "{put:?}");
        assert_eq!(store.get_activation("a1").unwrap().unwrap().activation_id, "a1", "kept in memory");
        // And journaled, with room from the reserve: a stop now would not lose it.
        let journaled = segments(&dir.path().join("journal")).unwrap().iter().any(|(_, path)| {
            std::fs::read_to_string(path).unwrap().lines().any(|l| l.starts_with("{\"F\"") && l.contains("\"a1\""))
        });
        assert!(journaled, "a1's line is in the journal");

        std::fs::remove_file(&ballast).unwrap();
        std::fs::remove_file(dir.path().join("ballast2")).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while store.trouble().is_some() {
            assert!(std::time::Instant::now() < deadline, "the store never recovered: {:?}", store.trouble());
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(store.accept(&meta("a3")).unwrap(), Accepted::New);
        store.put_action(Action { version: String::new(), ..Action::for_test("b", "x") }, false).unwrap();
        store.finish(&big("a2")).unwrap();
        store.flush().unwrap();
        for id in ["a1", "a2"] {
            let stored = store.inner.db.get_activation(id).unwrap().expect("in redb");
            assert_eq!(stored, *big(id).record, "{id}");
        }
    }
}
