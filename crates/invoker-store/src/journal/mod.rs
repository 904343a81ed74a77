//! The activation hot path without an fsync: `accept` and `finish` append one line each to a
//! journal file (a copy into a shared mapping of it, `segment.rs`: in the page cache, so it
//! survives a SIGKILL of the invoker, without a syscall) and
//! keep the entry in memory. A background thread makes the journal durable every `FLUSH_EVERY`
//! (an `msync` of its segment's lines), and moves what it holds into redb in one transaction
//! (group commit) every `INDEX_EVERY`, or sooner once `INDEX_AT` records wait, then deletes
//! the journal segment it covered. A redb transaction costs the same whether it holds ten
//! records or a thousand (its commit walks the freed pages and the tables' roots: ~200,000
//! instructions, more than ten records' inserts), so at a light load it is made a tenth as
//! often as the journal is synced; under load `INDEX_AT` makes it as often as before.
//! At open, segments an earlier run left are replayed into redb first. Reads see the memory
//! first, then redb, so a record is visible the moment it is finished.
//!
//! Power loss may lose the last `FLUSH_EVERY` of journal lines (synced then, in the journal or
//! in redb); a SIGKILL loses nothing.
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

mod files;
pub mod lines;
mod store;
#[cfg(test)]
mod tests;

use super::action_cache::ActionCache;
use super::contract::{Accepted, Store, StoreError};
use super::redb_store::{Batch, RedbStore};
use super::segment::Segment;
use files::{io_err, open_segment, segments, survey, Reserve, DAMAGED};
use invoker_wire::json_parts::JsonParts;
use invoker_wire::model::{ActivationMeta, EncodedRecord};
use lines::{record_line, Line, ANSWERED, FINISHED};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// How long records may wait in the journal and in memory before redb indexes them, at most.
const INDEX_EVERY: Duration = Duration::from_secs(2);

/// Records held in memory (finished, not in redb) past which they go into redb at the next
/// `FLUSH_EVERY`: what a read scans and the memory the store holds stay bounded under load.
const INDEX_AT: usize = 2048;

/// The most room a segment is made with ahead of its lines (its pages made writable, so
/// resident): a flush's worth of warm calls' lines. One large record (a 64 MiB result) made the
/// next segment's room its size, 80 MiB of zeros held in memory and on disk for lines that
/// never came; a large line goes past the mapping anyway (`segment.rs`).
const PREPARED_MAX: usize = 8 * 1024 * 1024;

/// The action cache's budget unless configured (`[store] action_cache_mb`).
pub const DEFAULT_ACTION_CACHE_BYTES: usize = 256 * 1024 * 1024;

/// The journal's reserve for endings unless configured (`[store] end_reserve_mb`).
pub const DEFAULT_END_RESERVE_BYTES: u64 = 32 * 1024 * 1024;

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
    /// Serialises flushes (the thread's and an explicit one); `true` once no flush may run
    /// again (a test's kill, [`JournaledStore::killed`]).
    flushing: Mutex<bool>,
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
    answered: FxHashMap<String, EncodedRecord>,
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
    record: EncodedRecord,
    /// In the journal (or in a segment an earlier run left): a restart finds it. False only
    /// for a record the disk had no room for at all, held in memory alone.
    journaled: bool,
    /// Its activation may be pending in redb (its acceptance was flushed before it finished,
    /// or this run cannot tell): the flush removes that entry. Most activations finish before
    /// a flush saw them accepted, and their record is then one write and its index entry.
    pending_in_db: bool,
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
            for record in &segment.answered {
                state.answered.insert(record.head().activation_id.clone(), record.clone());
            }
            for record in &segment.finished {
                state.answered.remove(&record.head().activation_id);
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
            flushing: Mutex::new(false),
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

    /// Moves everything journaled so far into redb (also done every `INDEX_EVERY`, or sooner
    /// under load).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    /// As a SIGKILL leaves the store: no flush runs after this (its thread's included, which a
    /// store merely leaked goes on running) and nothing is dropped; its journal and redb stay as
    /// they are, for a test of what the next start reads.
    #[cfg(any(test, feature = "test-util"))]
    pub fn killed(self) {
        *self.inner.flushing.lock() = true;
        std::mem::forget(self);
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
    finished: Vec<EncodedRecord>,
    answered: Vec<EncodedRecord>,
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
                read.unqueued.push(record.activation_id.clone());
                read.finished.push(EncodedRecord::new(*record));
            }
            Ok(Line::Q(call)) => {
                let json = serde_json::to_vec(&call).expect("a queued call serialises");
                read.queued.push((call.meta.activation_id.clone(), json));
                read.accepted.push(call.meta);
            }
            Ok(Line::S(id, at)) => read.started.push((id, at)),
            Ok(Line::R(record)) => read.answered.push(EncodedRecord::new(*record)),
            Err(_) => read.unread += 1,
        }
    }
    Ok(read)
}

impl SegmentRead {
    fn apply_to(&self, db: &RedbStore) -> Result<(), StoreError> {
        let finished: Vec<(&EncodedRecord, bool)> = self.finished.iter().map(|r| (r, true)).collect();
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
        for record in &self.finished {
            let id = &record.head().activation_id;
            state.pending.remove(id);
            let finished = Finished { record: record.clone(), journaled: true, pending_in_db: true };
            state.finished.insert(id.clone(), finished);
        }
    }
}

/// The records of a flush as redb takes them best: in id order. Ids are time-ordered
/// (`new_activation_id`), so a batch in their order lands at the end of the records table and
/// of its index, leaf after leaf; in the order of a hash map it lands on the last few leaves
/// at random, splitting each again and again (a fifth more of the flush's work a record, and a
/// larger file, measured).
fn in_id_order(finished: &FxHashMap<String, Finished>) -> Vec<(&EncodedRecord, bool)> {
    let mut records: Vec<(&EncodedRecord, bool)> = finished.values().map(|f| (&f.record, f.pending_in_db)).collect();
    records.sort_unstable_by(|a, b| a.0.head().activation_id.cmp(&b.0.head().activation_id));
    records
}

/// The journal's segment being synced: its number, its file, and how many of its bytes were
/// synced.
struct Syncing {
    segment: u64,
    file: File,
    synced: usize,
}

fn flush_loop(inner: Weak<Inner>) {
    let mut indexed = std::time::Instant::now();
    // The segment being synced, as a handle of its own (no lock is held while the disk writes).
    let mut syncing: Option<Syncing> = None;
    loop {
        std::thread::sleep(FLUSH_EVERY);
        let Some(inner) = inner.upgrade() else { return };
        let troubled = inner.trouble.lock().is_some();
        let waiting = inner.state.lock().finished.len();
        // In trouble, every tick tries redb again (and, once it takes the batch, the disk).
        if troubled || waiting >= INDEX_AT || indexed.elapsed() >= INDEX_EVERY {
            indexed = std::time::Instant::now();
            // The segment it held goes with this flush: its handle would keep the file's blocks.
            syncing = None;
            match inner.flush() {
                Ok(()) if troubled => inner.try_recover(),
                Ok(()) => {}
                // Said once, when the trouble begins (`troubled`).
                Err(_) => {}
            }
        } else if let Err(e) = inner.sync_journal(&mut syncing) {
            inner.troubled(e);
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
            return Ok(Some(Accepted::Finished(Box::new(f.record.record().clone()))));
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

    /// Makes the journal's lines so far durable: the current segment's lines synced to the disk
    /// (lines before it are in redb, but while the store is in trouble). `syncing` keeps the
    /// segment's number, a handle of its file and how much of it was synced, between calls.
    ///
    /// Only the lines are synced (`msync(2)` of a mapping of them), not the whole file as
    /// `fdatasync` would: the segment's room past its lines is made writable ahead, dirty zeros
    /// that it would write out at every sync (a megabyte a segment at the least, one segment
    /// every `INDEX_EVERY` at a light load).
    fn sync_journal(&self, syncing: &mut Option<Syncing>) -> Result<(), StoreError> {
        let err = |e| io_err("journal sync", e);
        let (new, written) = {
            let state = self.state.lock();
            let new = match syncing {
                Some(s) if s.segment == state.segment => None,
                _ => Some(Syncing { segment: state.segment, file: state.file.handle().map_err(err)?, synced: 0 }),
            };
            (new, state.file.written())
        };
        if let Some(new) = new {
            // A new segment's name is in the directory for good once the directory is synced.
            File::open(&self.dir).and_then(|dir| dir.sync_all()).map_err(err)?;
            *syncing = Some(new);
        }
        let Some(s) = syncing.as_mut().filter(|s| written > s.synced) else { return Ok(()) };
        let lines = memmap2::MmapOptions::new().len(written).map_raw_read_only(&s.file).map_err(err)?;
        lines.flush().map_err(err)?;
        s.synced = written;
        Ok(())
    }

    /// Journals again, in the current segment, every activation answered and not finished.
    fn journal_answered(state: &mut State) -> Result<(), StoreError> {
        let State { file, answered, .. } = state;
        answered
            .values()
            .try_for_each(|record| file.append_parts(&record_line(ANSWERED, &record.json)))
            .map_err(|e| io_err("journal append", e))
    }

    /// Writes one line, its newline included, whole or not at all.
    fn append_line(state: &mut State, bytes: &[u8]) -> Result<(), StoreError> {
        state.file.append(bytes).map_err(|e| io_err("journal append", e))
    }

    /// Writes a record's line (`key`: [`FINISHED`] or [`ANSWERED`]) as its parts, whole or not
    /// at all.
    fn append_record(state: &mut State, key: &'static [u8], json: &JsonParts) -> Result<(), StoreError> {
        state.file.append_parts(&record_line(key, json)).map_err(|e| io_err("journal append", e))
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
    fn append_ending(&self, state: &mut State, json: &JsonParts) -> Result<(), StoreError> {
        loop {
            match Inner::append_record(state, FINISHED, json) {
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
    /// held, and a quarter more, within [`PREPARED_MAX`]), so that the lines it takes need no
    /// allocation or page fault. A full disk leaves it without room: its first line then finds
    /// the disk full.
    fn prepare(&self, n: u64, expected: usize) {
        let Ok(mut segment) = open_segment(&self.dir, n) else { return };
        if expected > 0 {
            let _ = segment.make_room((expected + expected / 4).min(PREPARED_MAX));
        }
        *self.prepared.lock() = Some((n, segment));
    }

    /// Journals the records held in memory alone (the reserve may have room again), then
    /// flushes; the ids of those still in memory alone.
    fn write_out_once(&self) -> Vec<String> {
        {
            let mut state = self.state.lock();
            let alone: Vec<(String, JsonParts)> = state
                .finished
                .iter()
                .filter(|(_, f)| !f.journaled)
                .map(|(id, f)| (id.clone(), f.record.json.clone()))
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
        state.finished.values().filter(|f| !f.journaled).map(|f| f.record.head().activation_id.clone()).collect()
    }

    fn flush(&self) -> Result<(), StoreError> {
        let one_at_a_time = self.flushing.lock();
        if *one_at_a_time {
            return Ok(());
        }
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
