//! The embedded database under the journal: actions, records, pending entries and settings in
//! one redb file, with the indexes the API lists by (namespace, then newest first).

use super::contract::{next_version, Accepted, DocKind, QueuedCall, Recovered, Store, StoreError};
use super::large_records::{LargeRecords, OUT_OF_LINE};
use invoker_wire::json_parts::JsonParts;
use invoker_wire::model::{Action, ActivationMeta, ActivationRecord, EncodedRecord, RecordHead};
use parking_lot::RwLock;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const SCHEMA_VERSION: u64 = 1;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The last revision any action got, in `META`.
const LAST_REVISION: &str = "last_action_revision";
/// `namespace \0 name` → action JSON.
const ACTIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("actions");
/// activation id → record JSON, or [`OUT_OF_LINE`] for a record in its own file
/// (`large_records.rs`).
const ACTIVATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("activations");
/// activation id → accepted-activation JSON, until its record is written.
const PENDING: TableDefinition<&str, &[u8]> = TableDefinition::new("pending");
/// activation id → [`QueuedCall`] JSON: an asynchronous call accepted and not started (its
/// pending entry is in `PENDING` too).
const QUEUED: TableDefinition<&str, &[u8]> = TableDefinition::new("queued");
/// activation id → when it started (epoch ms): a queued call handed to a container, kept in
/// `QUEUED` until its record is written, so that a restart can retry it by its policy.
const STARTED: TableDefinition<&str, u64> = TableDefinition::new("queued_started");
/// `namespace \0 start(20 digits) \0 id` → action name: listing newest first, and retention
/// (namespace by namespace, oldest first).
const BY_NAMESPACE: TableDefinition<&str, &str> = TableDefinition::new("activations_by_namespace");
/// An index by end time that earlier versions kept for retention; dropped at open.
const BY_END: TableDefinition<&str, &str> = TableDefinition::new("activations_by_end");
/// Records removed per retention transaction at most.
const EXPIRE_BATCH: usize = 10_000;
/// Small values kept across restarts (a Mesos framework id).
const SETTINGS: TableDefinition<&str, &str> = TableDefinition::new("settings");
/// `namespace \0 kind \0 id` → JSON: Fn's apps, functions and triggers (`DocKind`).
const DOCS: TableDefinition<&str, &str> = TableDefinition::new("documents");

pub struct RedbStore {
    path: PathBuf,
    /// Records whose result is large, each in its own file beside the database.
    large: LargeRecords,
    /// `None` only while a reopen has failed (`broken` stays set).
    db: RwLock<Option<Database>>,
    /// Set by an I/O error: redb answers every later call with `PreviousIo` until the file is
    /// closed and opened again, which the next call does.
    broken: AtomicBool,
    /// Moves on after each document write: see [`Store::docs_generation`].
    docs_generation: std::sync::atomic::AtomicU64,
}

/// The page cache: actions (read through the journaled store's own cache) and recent records.
const CACHE_BYTES: usize = 32 * 1024 * 1024;

fn db_err(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Db(e.into().into())
}

fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt { key: key.to_string(), reason: e.to_string() })
}

/// A record from its value in the records table: its JSON, or read from its own file.
fn record_of(large: &LargeRecords, id: &str, value: &[u8]) -> Result<ActivationRecord, StoreError> {
    if value != OUT_OF_LINE {
        return decode(id, value);
    }
    let json = large.read(id).map_err(|source| match source.kind() {
        // One record's file gone (removed by hand): that record is damaged, the store is not.
        std::io::ErrorKind::NotFound => {
            StoreError::Corrupt { key: id.to_string(), reason: "its file is missing".into() }
        }
        _ => StoreError::Io { what: format!("record {id}"), source },
    })?;
    decode(id, &json)
}

fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("model types always serialize")
}

/// A pending entry as `accept` reports it: with its namespace, which the caller checks.
fn pending(id: &str, entry: &[u8]) -> Result<Accepted, StoreError> {
    let meta: ActivationMeta = decode(id, entry)?;
    Ok(Accepted::Pending { namespace: meta.namespace })
}

fn action_key(namespace: &str, name: &str) -> String {
    format!("{namespace}\0{name}")
}

impl RedbStore {
    /// Opens (or creates) the store file and checks its schema version.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Self::open_db(path)?;
        let large =
            LargeRecords::open(path).map_err(|source| StoreError::Io { what: path.display().to_string(), source })?;
        Ok(RedbStore {
            path: path.to_path_buf(),
            large,
            db: RwLock::new(Some(db)),
            broken: AtomicBool::new(false),
            docs_generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn record(&self, id: &str, value: &[u8]) -> Result<ActivationRecord, StoreError> {
        record_of(&self.large, id, value)
    }

    /// Runs `f` on the database, opened again first if an I/O error broke it; an I/O error
    /// `f` meets breaks it (a full disk: the next call, once there is room, finds it working).
    fn run<T>(&self, f: impl FnOnce(&Database) -> Result<T, StoreError>) -> Result<T, StoreError> {
        if self.broken.load(Ordering::Acquire) {
            self.reopen()?;
        }
        let db = self.db.read();
        let result = match db.as_ref() {
            Some(db) => f(db),
            None => Err(db_err(redb::Error::DatabaseClosed)),
        };
        if result.as_ref().is_err_and(StoreError::is_storage) {
            self.broken.store(true, Ordering::Release);
        }
        result
    }

    /// Closes the database (releasing its file lock) and opens it again; redb repairs a file
    /// whose last commit failed. On failure it stays closed, for the next call to try again.
    fn reopen(&self) -> Result<(), StoreError> {
        let mut db = self.db.write();
        if !self.broken.load(Ordering::Acquire) {
            return Ok(()); // another call did it
        }
        drop(db.take());
        *db = Some(Self::open_db(&self.path)?);
        self.broken.store(false, Ordering::Release);
        tracing::info!(path = %self.path.display(), "the store's database was opened again after an I/O error");
        Ok(())
    }

    fn open_db(path: &Path) -> Result<Database, StoreError> {
        // redb caches up to 1 GiB by default; records are written once and read rarely.
        let db = redb::Builder::new().set_cache_size(CACHE_BYTES).create(path).map_err(db_err)?;
        // Actions' parameters and every record: the invoker's alone, whatever the umask.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|source| StoreError::Io { what: path.display().to_string(), source })?;
        let txn = db.begin_write().map_err(db_err)?;
        {
            let mut meta = txn.open_table(META).map_err(db_err)?;
            let found = meta.get("schema_version").map_err(db_err)?.map(|v| v.value());
            match found {
                None => {
                    meta.insert("schema_version", SCHEMA_VERSION).map_err(db_err)?;
                }
                Some(v) if v == SCHEMA_VERSION => {}
                Some(found) => {
                    let path = path.display().to_string();
                    return Err(StoreError::Schema { path, found, expected: SCHEMA_VERSION });
                }
            }
            txn.open_table(ACTIONS).map_err(db_err)?;
            txn.open_table(ACTIVATIONS).map_err(db_err)?;
            txn.open_table(PENDING).map_err(db_err)?;
            txn.open_table(QUEUED).map_err(db_err)?;
            txn.open_table(STARTED).map_err(db_err)?;
            txn.open_table(BY_NAMESPACE).map_err(db_err)?;
            txn.delete_table(BY_END).map_err(db_err)?;
            txn.open_table(SETTINGS).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        Ok(db)
    }

    /// The activations accepted and not finished, as the pending table holds them (a read).
    pub fn pending(&self) -> Result<Vec<ActivationMeta>, StoreError> {
        self.run(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let table = txn.open_table(PENDING).map_err(db_err)?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(db_err)? {
                let (k, v) = entry.map_err(db_err)?;
                out.push(decode(k.value(), v.value())?);
            }
            Ok(out)
        })
    }

    /// The queued calls not finished, as the queued table holds them, each with whether it
    /// started (a read).
    pub fn queued(&self) -> Result<Vec<(QueuedCall, bool)>, StoreError> {
        self.run(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let table = txn.open_table(QUEUED).map_err(db_err)?;
            let started = txn.open_table(STARTED).map_err(db_err)?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(db_err)? {
                let (k, v) = entry.map_err(db_err)?;
                let was_started = started.get(k.value()).map_err(db_err)?.is_some();
                out.push((decode(k.value(), v.value())?, was_started));
            }
            Ok(out)
        })
    }

    /// Whether an activation id was seen before (finished or pending), without writing.
    pub fn seen(&self, id: &str) -> Result<Accepted, StoreError> {
        self.run(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            if let Some(v) = txn.open_table(ACTIVATIONS).map_err(db_err)?.get(id).map_err(db_err)? {
                return Ok(Accepted::Finished(Box::new(self.record(id, v.value())?)));
            }
            if let Some(v) = txn.open_table(PENDING).map_err(db_err)?.get(id).map_err(db_err)? {
                return pending(id, v.value());
            }
            Ok(Accepted::New)
        })
    }

    /// Writes a batch in one durable transaction: pending entries, queued calls (each also
    /// pending), the queued calls that started since, then records (which clear their pending
    /// entries). Applying a batch twice changes nothing.
    /// Each finished record comes with its JSON, as the journal already encoded it.
    pub fn apply(&self, batch: &Batch<'_>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.run(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            {
                let mut tables = RecordTables::open(&txn, &self.large)?;
                for meta in batch.accepted {
                    let id = meta.activation_id.as_str();
                    if tables.records.get(id).map_err(db_err)?.is_none() {
                        tables.pending.insert(id, encode(meta).as_slice()).map_err(db_err)?;
                    }
                }
                if !batch.queued.is_empty() || !batch.started.is_empty() || !batch.unqueued.is_empty() {
                    let mut queued = txn.open_table(QUEUED).map_err(db_err)?;
                    let mut started = txn.open_table(STARTED).map_err(db_err)?;
                    for &(id, call) in batch.queued {
                        if tables.records.get(id).map_err(db_err)?.is_none() {
                            queued.insert(id, call).map_err(db_err)?;
                        }
                    }
                    for &(id, at) in batch.started {
                        if queued.get(id).map_err(db_err)?.is_some() {
                            started.insert(id, at).map_err(db_err)?;
                        }
                    }
                    for id in batch.unqueued {
                        queued.remove(id.as_str()).map_err(db_err)?;
                        started.remove(id.as_str()).map_err(db_err)?;
                    }
                }
                for &(record, pending_in_db) in batch.finished {
                    tables.write_encoded(record.head(), &record.json, pending_in_db)?;
                }
            }
            txn.commit().map_err(db_err)?;
            Ok(())
        })
    }
}

/// What one flush (or one segment replayed at open) writes into redb.
#[derive(Default)]
pub struct Batch<'a> {
    /// Accepted: pending entries (a queued call's meta is among them).
    pub accepted: &'a [ActivationMeta],
    /// Queued calls not yet in redb: id and [`QueuedCall`] JSON.
    pub queued: &'a [(&'a str, &'a [u8])],
    /// Queued calls that started: marked so (they stay kept until they end).
    pub started: &'a [(&'a str, u64)],
    /// Queued calls that ended (a record): out of the queued table.
    pub unqueued: &'a [String],
    /// Records, each with its JSON and whether its pending entry may be in redb.
    pub finished: &'a [(&'a EncodedRecord, bool)],
}

impl Batch<'_> {
    fn is_empty(&self) -> bool {
        self.accepted.is_empty()
            && self.queued.is_empty()
            && self.started.is_empty()
            && self.unqueued.is_empty()
            && self.finished.is_empty()
    }
}

/// The tables a record touches, opened once for a whole batch.
struct RecordTables<'txn> {
    large: &'txn LargeRecords,
    records: redb::Table<'txn, &'static str, &'static [u8]>,
    pending: redb::Table<'txn, &'static str, &'static [u8]>,
    by_namespace: redb::Table<'txn, &'static str, &'static str>,
}

impl<'txn> RecordTables<'txn> {
    fn open(txn: &'txn redb::WriteTransaction, large: &'txn LargeRecords) -> Result<Self, StoreError> {
        Ok(RecordTables {
            large,
            records: txn.open_table(ACTIVATIONS).map_err(db_err)?,
            pending: txn.open_table(PENDING).map_err(db_err)?,
            by_namespace: txn.open_table(BY_NAMESPACE).map_err(db_err)?,
        })
    }

    fn write(&mut self, record: &ActivationRecord) -> Result<(), StoreError> {
        self.write_encoded(&RecordHead::of(record), &JsonParts::whole(encode(record).into()), true)
    }

    /// The record, its index entry, and no pending entry any more (`pending_in_db`: there may
    /// be one to remove). A record that replaces one (a guess replaced by what ran) takes the
    /// old one's index entry with it.
    fn write_encoded(&mut self, record: &RecordHead, json: &JsonParts, pending_in_db: bool) -> Result<(), StoreError> {
        let id = record.activation_id.as_str();
        let ns_key = format!("{}\0{:020}\0{id}", record.namespace, record.start);
        let large = self.large;
        let replaced = if LargeRecords::takes(id, json) {
            // Read before its file is written over.
            let old = self.records.get(id).map_err(db_err)?.map(|old| record_of(large, id, old.value()));
            large.write(id, json).map_err(|source| StoreError::Io { what: format!("record {id}"), source })?;
            self.records.insert(id, OUT_OF_LINE).map_err(db_err)?;
            old
        } else {
            // One part as it is; a record in parts whose id is no file name is joined (rare).
            let bytes = json.to_bytes();
            let old = self.records.insert(id, &bytes[..]).map_err(db_err)?;
            old.map(|old| {
                let was = record_of(large, id, old.value());
                if old.value() == OUT_OF_LINE {
                    large.remove(id);
                }
                was
            })
        };
        if let Some(Ok(old)) = replaced {
            let old_key = format!("{}\0{:020}\0{id}", old.namespace, old.start);
            if old_key != ns_key {
                self.by_namespace.remove(old_key.as_str()).map_err(db_err)?;
            }
        }
        if pending_in_db {
            self.pending.remove(id).map_err(db_err)?;
        }
        self.by_namespace.insert(ns_key.as_str(), record.name.as_str()).map_err(db_err)?;
        Ok(())
    }
}

/// The highest revision of the actions stored: where the store-wide counter starts in a store
/// written before it had one (deleted actions' revisions are gone with them, so a store made
/// before the counter may still repeat one of those, once).
fn highest_revision(table: &redb::Table<&str, &[u8]>) -> Result<u64, StoreError> {
    let mut highest = 0;
    for entry in table.iter().map_err(db_err)? {
        let (k, v) = entry.map_err(db_err)?;
        highest = highest.max(decode::<Action>(k.value(), v.value())?.revision);
    }
    Ok(highest)
}

impl Store for RedbStore {
    fn put_action(&self, mut action: Action, overwrite: bool) -> Result<Action, StoreError> {
        self.run(|db| {
            let key = action_key(&action.namespace, &action.name);
            let txn = db.begin_write().map_err(db_err)?;
            {
                let mut table = txn.open_table(ACTIONS).map_err(db_err)?;
                let old: Option<Action> = match table.get(key.as_str()).map_err(db_err)? {
                    Some(v) => Some(decode(&key, v.value())?),
                    None => None,
                };
                action.version = match &old {
                    Some(_) if !overwrite => return Err(StoreError::ActionExists(action.path())),
                    Some(old) => next_version(&old.version),
                    None => "0.0.1".into(),
                };
                // One counter for the whole store: a name deleted and created again gets a
                // revision no container was ever started for (the pool's key never repeats).
                let mut meta = txn.open_table(META).map_err(db_err)?;
                let last = match meta.get(LAST_REVISION).map_err(db_err)?.map(|v| v.value()) {
                    Some(last) => last,
                    None => highest_revision(&table)?,
                };
                action.revision = last.max(old.map_or(0, |o| o.revision)) + 1;
                meta.insert(LAST_REVISION, action.revision).map_err(db_err)?;
                table.insert(key.as_str(), encode(&action).as_slice()).map_err(db_err)?;
            }
            txn.commit().map_err(db_err)?;
            Ok(action)
        })
    }

    fn get_action(&self, namespace: &str, name: &str) -> Result<Option<Arc<Action>>, StoreError> {
        self.run(|db| {
            let key = action_key(namespace, name);
            let txn = db.begin_read().map_err(db_err)?;
            let table = txn.open_table(ACTIONS).map_err(db_err)?;
            let value = table.get(key.as_str()).map_err(db_err)?;
            value.map(|v| decode(&key, v.value()).map(Arc::new)).transpose()
        })
    }

    fn list_actions(&self, namespace: &str, skip: usize, limit: usize) -> Result<Vec<Action>, StoreError> {
        self.run(|db| {
            let (from, to) = (format!("{namespace}\0"), format!("{namespace}\u{1}"));
            let txn = db.begin_read().map_err(db_err)?;
            let table = txn.open_table(ACTIONS).map_err(db_err)?;
            let mut actions = Vec::new();
            for entry in table.range(from.as_str()..to.as_str()).map_err(db_err)?.skip(skip).take(limit) {
                let (k, v) = entry.map_err(db_err)?;
                actions.push(decode(k.value(), v.value())?);
            }
            Ok(actions)
        })
    }

    fn find_actions(&self, keep: &dyn Fn(&Action) -> bool) -> Result<Vec<Action>, StoreError> {
        self.run(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let table = txn.open_table(ACTIONS).map_err(db_err)?;
            let mut actions = Vec::new();
            for entry in table.iter().map_err(db_err)? {
                let (k, v) = entry.map_err(db_err)?;
                let action = decode(k.value(), v.value())?;
                if keep(&action) {
                    actions.push(action);
                }
            }
            Ok(actions)
        })
    }

    fn delete_action(&self, namespace: &str, name: &str) -> Result<Option<Action>, StoreError> {
        self.run(|db| {
            let key = action_key(namespace, name);
            let txn = db.begin_write().map_err(db_err)?;
            let old = {
                let mut table = txn.open_table(ACTIONS).map_err(db_err)?;
                let removed = table.remove(key.as_str()).map_err(db_err)?;
                removed.map(|v| decode(&key, v.value())).transpose()?
            };
            txn.commit().map_err(db_err)?;
            Ok(old)
        })
    }

    fn accept(&self, meta: &ActivationMeta) -> Result<Accepted, StoreError> {
        self.run(|db| {
            let id = meta.activation_id.as_str();
            let txn = db.begin_write().map_err(db_err)?;
            let seen = {
                if let Some(v) = txn.open_table(ACTIVATIONS).map_err(db_err)?.get(id).map_err(db_err)? {
                    Some(Accepted::Finished(Box::new(self.record(id, v.value())?)))
                } else if let Some(v) = txn.open_table(PENDING).map_err(db_err)?.get(id).map_err(db_err)? {
                    Some(pending(id, v.value())?)
                } else {
                    None
                }
            };
            if let Some(seen) = seen {
                txn.abort().map_err(db_err)?;
                return Ok(seen);
            }
            txn.open_table(PENDING).map_err(db_err)?.insert(id, encode(meta).as_slice()).map_err(db_err)?;
            txn.commit().map_err(db_err)?;
            Ok(Accepted::New)
        })
    }

    fn enqueue(&self, call: &QueuedCall, json: &[u8], given: bool) -> Result<Accepted, StoreError> {
        if given {
            if let seen @ (Accepted::Pending { .. } | Accepted::Finished(_)) = self.seen(&call.meta.activation_id)? {
                return Ok(seen);
            }
        }
        let id = call.meta.activation_id.as_str();
        self.apply(&Batch { accepted: std::slice::from_ref(&call.meta), queued: &[(id, json)], ..Batch::default() })?;
        Ok(Accepted::New)
    }

    fn started(&self, id: &str) -> Result<(), StoreError> {
        self.apply(&Batch { started: &[(id, invoker_wire::model::epoch_ms())], ..Batch::default() })
    }

    fn finish(&self, record: &EncodedRecord) -> Result<(), StoreError> {
        self.run(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            RecordTables::open(&txn, &self.large)?.write_encoded(record.head(), &record.json, true)?;
            let id = record.head().activation_id.as_str();
            txn.open_table(QUEUED).map_err(db_err)?.remove(id).map_err(db_err)?;
            txn.open_table(STARTED).map_err(db_err)?.remove(id).map_err(db_err)?;
            txn.commit().map_err(db_err)?;
            Ok(())
        })
    }

    fn get_activation(&self, id: &str) -> Result<Option<ActivationRecord>, StoreError> {
        self.run(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let table = txn.open_table(ACTIVATIONS).map_err(db_err)?;
            let value = table.get(id).map_err(db_err)?;
            value.map(|v| self.record(id, v.value())).transpose()
        })
    }

    fn list_activations(
        &self,
        namespace: &str,
        name: Option<&str>,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<ActivationRecord>, StoreError> {
        self.run(|db| {
            let (from, to) = (format!("{namespace}\0"), format!("{namespace}\u{1}"));
            let txn = db.begin_read().map_err(db_err)?;
            let index = txn.open_table(BY_NAMESPACE).map_err(db_err)?;
            let records = txn.open_table(ACTIVATIONS).map_err(db_err)?;
            let mut out = Vec::new();
            let mut skipped = 0;
            for entry in index.range(from.as_str()..to.as_str()).map_err(db_err)?.rev() {
                let (k, v) = entry.map_err(db_err)?;
                if name.is_some_and(|n| n != v.value()) {
                    continue;
                }
                if skipped < skip {
                    skipped += 1;
                    continue;
                }
                let id = k.value().rsplit('\0').next().unwrap_or_default().to_string();
                if let Some(r) = records.get(id.as_str()).map_err(db_err)? {
                    out.push(self.record(&id, r.value())?);
                }
                if out.len() >= limit {
                    break;
                }
            }
            Ok(out)
        })
    }

    fn recover_unfinished(&self, now_ms: u64) -> Result<Recovered, StoreError> {
        let mut pending = self.pending()?;
        let unfinished: std::collections::HashSet<&str> = pending.iter().map(|m| m.activation_id.as_str()).collect();
        // A queued entry whose activation ended (expired unrun) is no longer queued.
        let (mut queued, mut interrupted) = (Vec::new(), Vec::new());
        for (call, started) in self.queued()? {
            if unfinished.contains(call.meta.activation_id.as_str()) {
                if started {
                    interrupted.push(call)
                } else {
                    queued.push(call)
                }
            }
        }
        let kept: std::collections::HashSet<String> =
            queued.iter().chain(&interrupted).map(|c| c.meta.activation_id.clone()).collect();
        pending.retain(|m| !kept.contains(&m.activation_id));
        if !pending.is_empty() {
            self.run(|db| {
                let txn = db.begin_write().map_err(db_err)?;
                {
                    let mut tables = RecordTables::open(&txn, &self.large)?;
                    for meta in &pending {
                        tables.write(&ActivationRecord::guess(meta, super::contract::STOPPED_UNFINISHED, now_ms))?;
                    }
                }
                txn.commit().map_err(db_err)
            })?;
        }
        Ok(Recovered { guessed: pending, queued, interrupted })
    }

    fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.run(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let table = txn.open_table(SETTINGS).map_err(db_err)?;
            Ok(table.get(key).map_err(db_err)?.map(|v| v.value().to_string()))
        })
    }

    fn put_setting(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.run(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            txn.open_table(SETTINGS).map_err(db_err)?.insert(key, value).map_err(db_err)?;
            txn.commit().map_err(db_err)
        })
    }

    fn expire(&self, before_ms: u64) -> Result<usize, StoreError> {
        self.expire_in_batches(before_ms, EXPIRE_BATCH)
    }

    fn get_doc(&self, namespace: &str, kind: DocKind, id: &str) -> Result<Option<String>, StoreError> {
        self.run(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let table = match txn.open_table(DOCS) {
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                opened => opened.map_err(db_err)?,
            };
            Ok(table.get(kind.key(namespace, id).as_str()).map_err(db_err)?.map(|v| v.value().to_string()))
        })
    }

    fn list_docs(&self, namespace: &str, kind: DocKind) -> Result<Vec<String>, StoreError> {
        self.run(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let table = match txn.open_table(DOCS) {
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                opened => opened.map_err(db_err)?,
            };
            let prefix = kind.prefix(namespace);
            let mut docs = Vec::new();
            for entry in table.range(prefix.as_str()..).map_err(db_err)? {
                let (key, value) = entry.map_err(db_err)?;
                if !key.value().starts_with(&prefix) {
                    break;
                }
                docs.push(value.value().to_string());
            }
            Ok(docs)
        })
    }

    fn put_doc(
        &self,
        namespace: &str,
        kind: DocKind,
        id: &str,
        value: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.run(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            let before = {
                let mut table = txn.open_table(DOCS).map_err(db_err)?;
                let key = kind.key(namespace, id);
                let before = match value {
                    Some(value) => table.insert(key.as_str(), value).map_err(db_err)?,
                    None => table.remove(key.as_str()).map_err(db_err)?,
                };
                before.map(|v| v.value().to_string())
            };
            txn.commit().map_err(db_err)?;
            // After the commit: whoever reads the new generation reads the new document.
            self.docs_generation.fetch_add(1, Ordering::Release);
            Ok(before)
        })
    }

    fn docs_generation(&self) -> u64 {
        self.docs_generation.load(Ordering::Acquire)
    }
}

impl RedbStore {
    /// Removes the records that started before `before_ms`: namespace by namespace through the
    /// by-namespace index (oldest first within each), at most `batch` per transaction.
    fn expire_in_batches(&self, before_ms: u64, batch: usize) -> Result<usize, StoreError> {
        self.run(|db| {
            let mut removed = 0;
            // Every key at or after this one is still to be looked at.
            let mut cursor = String::new();
            loop {
                let txn = db.begin_write().map_err(db_err)?;
                // Records kept in their own files: removed once the transaction committed.
                let mut files = Vec::new();
                let (removed_now, next) = {
                    let mut by_ns = txn.open_table(BY_NAMESPACE).map_err(db_err)?;
                    let mut records = txn.open_table(ACTIVATIONS).map_err(db_err)?;
                    let first = by_ns.range(cursor.as_str()..).map_err(db_err)?.next().transpose().map_err(db_err)?;
                    let Some(namespace) =
                        first.map(|(k, _)| k.value().split('\0').next().unwrap_or_default().to_string())
                    else {
                        break;
                    };
                    let (from, to) = (format!("{namespace}\0"), format!("{namespace}\0{before_ms:020}"));
                    let old: Vec<String> = by_ns
                        .range(from.as_str()..to.as_str())
                        .map_err(db_err)?
                        .take(batch)
                        .map(|e| e.map(|(k, _)| k.value().to_string()))
                        .collect::<Result<_, _>>()
                        .map_err(db_err)?;
                    for ns_key in &old {
                        let id = ns_key.rsplit('\0').next().unwrap_or_default();
                        if records.remove(id).map_err(db_err)?.is_some_and(|v| v.value() == OUT_OF_LINE) {
                            files.push(id.to_string());
                        }
                        by_ns.remove(ns_key.as_str()).map_err(db_err)?;
                    }
                    // A full batch may leave more of this namespace; otherwise on to the next one.
                    let next = if old.len() == batch { cursor.clone() } else { format!("{namespace}\u{1}") };
                    (old.len(), next)
                };
                if removed_now > 0 {
                    txn.commit().map_err(db_err)?;
                    files.iter().for_each(|id| self.large.remove(id));
                    removed += removed_now;
                } else {
                    txn.abort().map_err(db_err)?;
                }
                cursor = next;
            }
            Ok(removed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use invoker_wire::model::{ActivationMeta, Exec, Limits};

    fn store() -> (tempfile::TempDir, RedbStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("invoker.redb")).unwrap();
        (dir, store)
    }

    #[test]
    fn documents_are_kept_per_namespace_and_kind_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = RedbStore::open(&path).unwrap();
        assert_eq!(store.list_docs("a", DocKind::FnApp).unwrap(), Vec::<String>::new());
        assert_eq!(store.put_doc("a", DocKind::FnApp, "1", Some("{\"n\":1}")).unwrap(), None);
        store.put_doc("a", DocKind::FnApp, "2", Some("{\"n\":2}")).unwrap();
        store.put_doc("a", DocKind::FnFunction, "3", Some("{}")).unwrap();
        store.put_doc("ab", DocKind::FnApp, "4", Some("{}")).unwrap();
        assert_eq!(
            store.list_docs("a", DocKind::FnApp).unwrap(),
            ["{\"n\":1}", "{\"n\":2}"],
            "another kind or namespace is not listed"
        );
        assert_eq!(store.put_doc("a", DocKind::FnApp, "1", None).unwrap().as_deref(), Some("{\"n\":1}"));
        drop(store);
        let again = RedbStore::open(&path).unwrap();
        assert_eq!(again.get_doc("a", DocKind::FnApp, "2").unwrap().as_deref(), Some("{\"n\":2}"));
        assert_eq!(again.get_doc("a", DocKind::FnApp, "1").unwrap(), None);
        assert_eq!(again.get_doc("b", DocKind::FnApp, "2").unwrap(), None);
    }

    #[test]
    fn settings_survive_a_reopen() {
        let (dir, store) = store();
        assert_eq!(store.get_setting("mesos.framework_id").unwrap(), None);
        store.put_setting("mesos.framework_id", "fw-1").unwrap();
        store.put_setting("mesos.framework_id", "fw-2").unwrap();
        drop(store);
        let again = RedbStore::open(&dir.path().join("invoker.redb")).unwrap();
        assert_eq!(again.get_setting("mesos.framework_id").unwrap().as_deref(), Some("fw-2"));
    }

    fn action(name: &str) -> Action {
        Action {
            namespace: "guest".into(),
            name: name.into(),
            version: String::new(),
            exec: Exec { kind: "python:3".into(), code: Some("x".into()), main: None, binary: false, image: None },
            limits: Limits { timeout: 1000, memory: 256, logs: 10, concurrency: 1, disk: 256 },
            parameters: vec![],
            annotations: vec![],
            publish: false,
            updated: 0,
            revision: 0,
        }
    }

    fn meta(id: &str) -> ActivationMeta {
        let a = action("hello");
        ActivationMeta {
            activation_id: id.into(),
            namespace: a.namespace,
            name: a.name,
            version: "0.0.1".into(),
            subject: "guest".into(),
            kind: a.exec.kind,
            limits: a.limits,
            accepted_at: 10,
        }
    }

    #[test]
    fn actions_are_versioned_and_not_overwritten_unless_asked() {
        let (_d, s) = store();
        assert_eq!(s.put_action(action("a"), false).unwrap().version, "0.0.1");
        assert!(matches!(s.put_action(action("a"), false), Err(StoreError::ActionExists(_))));
        let updated = s.put_action(action("a"), true).unwrap();
        assert_eq!((updated.version.as_str(), updated.revision), ("0.0.2", 2));
        s.put_action(action("b"), false).unwrap();
        let names: Vec<_> = s.list_actions("guest", 0, 10).unwrap().into_iter().map(|a| a.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(s.delete_action("guest", "a").unwrap().is_some());
        assert!(s.get_action("guest", "a").unwrap().is_none());
    }

    #[test]
    fn a_name_deleted_and_created_again_never_gets_a_revision_it_had() {
        let (dir, s) = store();
        let first = s.put_action(action("a"), false).unwrap();
        let second = s.put_action(action("a"), true).unwrap();
        s.delete_action("guest", "a").unwrap();
        let again = s.put_action(action("a"), false).unwrap();
        assert_eq!(again.version, "0.0.1", "the version starts again, as OpenWhisk's");
        assert!(again.revision > second.revision && second.revision > first.revision, "{again:?}");
        // And after a restart of the store.
        s.delete_action("guest", "a").unwrap();
        drop(s);
        let s = RedbStore::open(&dir.path().join("invoker.redb")).unwrap();
        let reopened = s.put_action(action("a"), false).unwrap();
        assert!(reopened.revision > again.revision, "{reopened:?}");
    }

    #[test]
    fn an_activation_id_is_accepted_once() {
        let (_d, s) = store();
        assert_eq!(s.accept(&meta("a1")).unwrap(), Accepted::New);
        assert_eq!(s.accept(&meta("a1")).unwrap(), Accepted::Pending { namespace: "guest".into() });
        let record = ActivationRecord::whisk_error(&meta("a1"), "x", 20);
        s.finish(&record.clone().into()).unwrap();
        assert_eq!(s.accept(&meta("a1")).unwrap(), Accepted::Finished(Box::new(record)));
    }

    fn queued(id: &str) -> QueuedCall {
        QueuedCall {
            meta: meta(id),
            params: invoker_wire::params::Params::from_body(bytes::Bytes::from_static(br#"{"x": 1}"#))
                .expect("an object"),
            request: None,
            api_key: None,
            transaction_id: "t".into(),
            expires_at: 1_000,
            attempt: 1,
            max_attempts: 3,
            retry_of: None,
            not_before: 0,
            on_success: None,
            on_failure: None,
        }
    }

    /// A queued call that never started stays queued across a restart (it is run, not
    /// guessed); one that started is interrupted (kept, with its parameters, for its retry
    /// policy); one that ended is neither.
    #[test]
    fn queued_calls_that_never_started_stay_queued_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("invoker.redb");
        {
            let s = RedbStore::open(&path).unwrap();
            for id in ["q1", "q2", "q3"] {
                assert_eq!(s.enqueue(&queued(id), &encode(&queued(id)), true).unwrap(), Accepted::New);
            }
            let again = s.enqueue(&queued("q1"), &encode(&queued("q1")), true).unwrap();
            assert_eq!(again, Accepted::Pending { namespace: "guest".into() });
            s.started("q2").unwrap();
            s.finish(&ActivationRecord::whisk_error(&meta("q3"), "expired", 20).into()).unwrap();
        }
        let s = RedbStore::open(&path).unwrap();
        let recovered = s.recover_unfinished(99).unwrap();
        assert_eq!(recovered.queued, [queued("q1")]);
        assert_eq!(recovered.interrupted, [queued("q2")]);
        assert!(recovered.guessed.is_empty());
        assert!(s.get_activation("q1").unwrap().is_none(), "still to run: no record");
        assert_eq!(s.recover_unfinished(100).unwrap().queued, [queued("q1")], "queued until it starts");
    }

    #[test]
    fn unfinished_activations_get_a_record_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("invoker.redb");
        {
            let s = RedbStore::open(&path).unwrap();
            s.accept(&meta("p1")).unwrap();
        }
        let s = RedbStore::open(&path).unwrap();
        assert_eq!(s.recover_unfinished(99).unwrap().guessed.len(), 1);
        let record = s.get_activation("p1").unwrap().unwrap();
        assert_eq!(record.response.status_code, 3);
        assert_eq!(s.list_activations("guest", Some("hello"), 0, 10).unwrap().len(), 1);
        assert_eq!(s.recover_unfinished(100).unwrap().guessed.len(), 0);
        assert!(record.is_guess(), "written as a guess");

        // The truth found later replaces the guess, in the list too (it started at another time).
        let mut truth = ActivationRecord::whisk_error(&meta("p1"), "x", 130);
        truth.start = 120;
        truth.response.status_code = 0;
        s.finish(&truth.into()).unwrap();
        let listed = s.list_activations("guest", Some("hello"), 0, 10).unwrap();
        assert_eq!(listed.len(), 1, "one record per activation: {listed:?}");
        assert_eq!((listed[0].start, listed[0].response.status_code), (120, 0));
    }

    #[test]
    fn records_list_newest_first_and_expire() {
        let (_d, s) = store();
        for (i, id) in ["r1", "r2", "r3"].iter().enumerate() {
            let mut m = meta(id);
            m.accepted_at = 100 * (i as u64 + 1);
            s.finish(&ActivationRecord::whisk_error(&m, "x", m.accepted_at + 1).into()).unwrap();
        }
        let ids: Vec<_> =
            s.list_activations("guest", None, 0, 10).unwrap().into_iter().map(|r| r.activation_id).collect();
        assert_eq!(ids, ["r3", "r2", "r1"]);
        assert_eq!(s.list_activations("guest", None, 1, 1).unwrap()[0].activation_id, "r2");
        assert_eq!(s.expire(250).unwrap(), 2);
        assert_eq!(s.list_activations("guest", None, 0, 10).unwrap().len(), 1);
    }

    #[test]
    fn retention_goes_namespace_by_namespace_in_bounded_batches() {
        let (_d, s) = store();
        let namespaces = ["a", "guest", "guest2", "zz"];
        for ns in namespaces {
            for i in 0..5u64 {
                let mut m = meta(&format!("{ns}-{i}"));
                m.namespace = ns.into();
                m.accepted_at = 100 * (i + 1);
                s.finish(&ActivationRecord::whisk_error(&m, "x", m.accepted_at + 1).into()).unwrap();
            }
        }
        // 3 of 5 per namespace started before 350; batches of 2 split every namespace.
        assert_eq!(s.expire_in_batches(350, 2).unwrap(), 12);
        for ns in namespaces {
            let ids: Vec<_> =
                s.list_activations(ns, None, 0, 10).unwrap().into_iter().map(|r| r.activation_id).collect();
            assert_eq!(ids, [format!("{ns}-4"), format!("{ns}-3")], "{ns}");
            assert!(s.get_activation(&format!("{ns}-0")).unwrap().is_none(), "the record goes with its index entry");
        }
        assert_eq!(s.expire_in_batches(350, 2).unwrap(), 0);
    }

    /// A record whose result is large is kept in its own file: listed, read, replaced by a
    /// small one (its file gone) and expired (its file gone) as any other.
    #[test]
    fn a_large_record_lives_in_its_own_file_and_goes_with_its_entry() {
        let (d, s) = store();
        let large = |id: &str, at: u64| {
            let mut m = meta(id);
            m.accepted_at = at;
            let mut r = ActivationRecord::whisk_error(&m, "x", at + 1);
            let big = "z".repeat(invoker_wire::model::SHARED_RESULT);
            r.response = invoker_wire::model::ActivationResponse::new(
                invoker_wire::model::Outcome::Success,
                serde_json::json!({ "big": big }),
            );
            r
        };
        let file = |id: &str| d.path().join(format!("invoker.records/{id}.json"));
        for (id, at) in [("big1", 100), ("big2", 200)] {
            s.finish(&EncodedRecord::new(large(id, at))).unwrap();
            assert!(file(id).exists(), "{id} is in a file of its own");
        }
        assert_eq!(s.get_activation("big1").unwrap().unwrap(), large("big1", 100));
        // A file removed by hand damages its record alone: no storage error, which would stop
        // the store taking work.
        let kept = std::fs::read(file("big1")).unwrap();
        std::fs::remove_file(file("big1")).unwrap();
        let missing = s.get_activation("big1").unwrap_err();
        assert!(matches!(missing, StoreError::Corrupt { .. }) && !missing.is_storage(), "{missing}");
        std::fs::write(file("big1"), kept).unwrap();
        assert_eq!(s.list_activations("guest", None, 0, 10).unwrap()[0], large("big2", 200));
        // Replaced by a small record (a guess, say): in redb, its file gone.
        let mut small = meta("big2");
        small.accepted_at = 200;
        s.finish(&ActivationRecord::whisk_error(&small, "x", 201).into()).unwrap();
        assert!(!file("big2").exists());
        assert_eq!(s.get_activation("big2").unwrap().unwrap().response.status_code, 3);
        assert_eq!(s.expire(150).unwrap(), 1);
        assert!(!file("big1").exists(), "expired with its entry");
        assert!(s.get_activation("big1").unwrap().is_none());
    }
}
