//! What every store promises (the trait, its errors and its entries), apart from the stores
//! that keep it, so that each store imports the promise and not its siblings.

use invoker_wire::model::{Action, ActivationMeta, ActivationRecord, EncodedRecord};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Db(DbError),
    /// A file of the store could not be read or written (the journal, the database file).
    #[error("store: {what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// An entry that does not decode: written by another version, or damaged.
    #[error("store: corrupt entry {key}: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("store: schema version {found} in {path}, this invoker reads version {expected}")]
    Schema { path: String, found: u64, expected: u64 },
    #[error("action {0} exists")]
    ActionExists(String),
    /// The store cannot write now (its disk is full or failing) and takes no new work until it
    /// can; the reason names the disk.
    #[error("{0}")]
    Unavailable(String),
}

impl StoreError {
    /// Whether the store's files could not be written or read (a full or failing disk), rather
    /// than an entry being bad or taken: the same call may succeed once the disk works again.
    pub fn is_storage(&self) -> bool {
        match self {
            StoreError::Io { .. } | StoreError::Unavailable(_) => true,
            StoreError::Db(DbError(e)) => {
                matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo | redb::Error::DatabaseClosed)
            }
            _ => false,
        }
    }

    /// Whether the disk is full (or the user's quota spent).
    pub fn is_disk_full(&self) -> bool {
        let io = match self {
            StoreError::Io { source, .. } => Some(source),
            StoreError::Db(DbError(redb::Error::Io(e))) => Some(e),
            _ => None,
        };
        io.and_then(std::io::Error::raw_os_error).is_some_and(|code| code == libc::ENOSPC || code == libc::EDQUOT)
    }
}

/// The embedded database's own error, behind a type of the store's: callers do not depend on
/// which database the store is built on.
#[derive(Debug)]
pub struct DbError(redb::Error);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DbError {}

impl<E: Into<redb::Error>> From<E> for DbError {
    fn from(e: E) -> Self {
        DbError(e.into())
    }
}

/// The line a record answered before its logs came ends with, when the process stopped before
/// they did.
pub const STOPPED_BEFORE_LOGS: &str =
    "[the invoker stopped after this activation was answered, before its logs were collected]";

/// The message of the guess recorded for an activation a restart found unfinished.
pub const STOPPED_UNFINISHED: &str =
    "the process that accepted this activation stopped before it finished; it may have started";

/// What `accept` found: a new activation, or one seen before (Kafka delivers at least once).
#[derive(Debug, PartialEq)]
pub enum Accepted {
    New,
    /// Accepted earlier, for `namespace`, and not finished yet.
    Pending {
        namespace: String,
    },
    Finished(Box<ActivationRecord>),
}

/// An asynchronous call as the durable queue keeps it until it starts: all a restart needs to
/// run it (the action is read again then, as it is when the call runs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueuedCall {
    pub meta: ActivationMeta,
    /// The caller's parameters (the action's own are merged in when it runs).
    #[serde(default)]
    pub params: invoker_wire::params::Params,
    /// The caller's HTTP request as it came, for a function that takes it so (Fn's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<QueuedRequest>,
    /// The caller's key, kept only for an action that asks for it (`provide-api-key`) and
    /// only until the call starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    pub transaction_id: String,
    /// Epoch ms past which it is not run (its maximum event age, from the first attempt).
    pub expires_at: u64,
    /// Which attempt this is, from 1; a retry is an activation of its own.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The attempts it may have in all: 1 and its retries (the policy when it was accepted).
    #[serde(default = "first_attempt")]
    pub max_attempts: u32,
    /// The first attempt's activation id, for a retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<String>,
    /// Epoch ms before which it does not start (a retry's backoff).
    #[serde(default)]
    pub not_before: u64,
    /// Actions of its namespace called (asynchronously, with its record) when it succeeds, and
    /// when it is given up: its action's `on-success` and `on-failure` when it was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_success: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<String>,
}

fn first_attempt() -> u32 {
    1
}

/// An asynchronous call that exhausted its attempts or its age, kept in its namespace's
/// dead-letter list (a document of [`DocKind::DeadLetter`]) until it is driven again or
/// deleted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The last attempt's activation id: the letter's id, and the record that says how it ended.
    pub activation_id: String,
    /// The first attempt's activation id (the same for a call tried once).
    pub first_activation_id: String,
    pub action: String,
    pub attempts: u32,
    /// Why the last attempt ended as it did (its record's error).
    pub reason: String,
    /// When it was given up (epoch ms).
    pub at: u64,
    /// The call as queued (without the caller's key), to drive it again.
    pub call: QueuedCall,
}

/// A caller's request kept in the queue: its headers, and its body in base64 (it may not be
/// text).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueuedRequest {
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// What a start found an earlier run left unfinished.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Accepted, maybe started, not finished: each got a whisk-error record written as a
    /// guess ([`ActivationRecord::guess`]), or the record its caller was answered with.
    pub guessed: Vec<ActivationMeta>,
    /// Asynchronous calls that never started: still queued, to be run.
    pub queued: Vec<QueuedCall>,
    /// Asynchronous calls that started and did not end: left pending, without a record, for
    /// whoever can retry them by their policy to end (`ActivationService::interrupted`).
    pub interrupted: Vec<QueuedCall>,
}

/// Activation calls (`accept`, `finish`, `get_activation`) are made on async threads: an
/// implementation must answer them quickly (the journaled store appends one line).
pub trait Store: Send + Sync + 'static {
    /// Creates or (with `overwrite`) replaces an action, bumping its version and revision.
    fn put_action(&self, action: Action, overwrite: bool) -> Result<Action, StoreError>;
    fn get_action(&self, namespace: &str, name: &str) -> Result<Option<Arc<Action>>, StoreError>;
    fn list_actions(&self, namespace: &str, skip: usize, limit: usize) -> Result<Vec<Action>, StoreError>;
    /// Every action of every namespace that `keep` keeps: read once, at a start (the actions
    /// that keep provisioned containers).
    fn find_actions(&self, keep: &dyn Fn(&Action) -> bool) -> Result<Vec<Action>, StoreError>;
    fn delete_action(&self, namespace: &str, name: &str) -> Result<Option<Action>, StoreError>;

    /// Records an activation as accepted, unless its id was seen before (in any namespace:
    /// the caller checks whose it was before answering from it).
    fn accept(&self, meta: &ActivationMeta) -> Result<Accepted, StoreError>;
    /// Records an activation whose id the invoker just made (no earlier delivery can exist).
    fn accept_new(&self, meta: &ActivationMeta) -> Result<(), StoreError> {
        self.accept(meta).map(|_| ())
    }
    /// Records an asynchronous call as accepted and queued, with what it takes to run it after
    /// a restart (`json`: the call encoded, once, by the caller), unless (`given`: the caller
    /// chose its id) its id was seen before.
    fn enqueue(&self, call: &QueuedCall, json: &[u8], given: bool) -> Result<Accepted, StoreError>;
    /// Notes that a queued call was handed to a container: a restart no longer runs it again
    /// as if it never started (it is interrupted, and retried by its policy). Written before
    /// the hand-over. The call stays kept until its record is written.
    fn started(&self, id: &str) -> Result<(), StoreError>;
    /// Stores the final record (its JSON as encoded once) and clears the pending entry.
    fn finish(&self, record: &EncodedRecord) -> Result<(), StoreError>;
    /// Notes the record its caller was answered with before it was whole (its logs still
    /// coming), so that a restart before `finish` ends the activation with it rather than a
    /// guess. Not shown by `get_activation`.
    fn answered(&self, _record: &EncodedRecord) -> Result<(), StoreError> {
        Ok(())
    }
    fn get_activation(&self, id: &str) -> Result<Option<ActivationRecord>, StoreError>;
    /// Newest first.
    fn list_activations(
        &self,
        namespace: &str,
        name: Option<&str>,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<ActivationRecord>, StoreError>;
    /// Gives every activation an earlier run left unfinished a whisk-error record written as a
    /// guess ([`ActivationRecord::guess`]), except the queued calls: those that never started
    /// stay queued, those that started stay pending for their retry policy; returns all three.
    fn recover_unfinished(&self, now_ms: u64) -> Result<Recovered, StoreError>;
    /// At the end of a run: writes what is held in memory alone (a disk that was full), for at
    /// most `within`; returns the ids of the records that could not be written anywhere.
    fn write_out(&self, _within: std::time::Duration) -> Vec<String> {
        Vec::new()
    }
    /// Deletes records that ended before `before_ms`.
    fn expire(&self, before_ms: u64) -> Result<usize, StoreError>;

    /// Why the store takes no new work now (its disk is full or failing), while it does not:
    /// the invoker then refuses new activations with 503 and calls itself unhealthy.
    fn trouble(&self) -> Option<String> {
        None
    }

    /// A small value the invoker keeps across restarts (a Mesos framework id), durably.
    fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError>;
    fn put_setting(&self, key: &str, value: &str) -> Result<(), StoreError>;

    /// A namespace's document of `kind` (Fn's apps, functions and triggers) by id, as JSON.
    fn get_doc(&self, namespace: &str, kind: DocKind, id: &str) -> Result<Option<String>, StoreError>;
    /// Every document of `kind` in `namespace`, by id.
    fn list_docs(&self, namespace: &str, kind: DocKind) -> Result<Vec<String>, StoreError>;
    /// A number that moves on whenever a document is written: what a cache read of the
    /// documents holds while it stands.
    fn docs_generation(&self) -> u64;
    /// Writes `value` at `id`, or (`None`) deletes it; answers the document it replaced.
    fn put_doc(
        &self,
        namespace: &str,
        kind: DocKind,
        id: &str,
        value: Option<&str>,
    ) -> Result<Option<String>, StoreError>;
}

/// What a stored document is: Fn's entities, which live beside the actions (an Fn function's
/// code and limits are its action's; its document holds what Fn's API says of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocKind {
    FnApp,
    FnFunction,
    FnTrigger,
    /// An HTTP trigger's route (`<app name><source>`) → its trigger's id: `/t/` finds a
    /// trigger without reading them all.
    FnRoute,
    /// A function's invoke key → its namespace and id, kept in no namespace (the empty one,
    /// which no tenant has): a call to the function's invoke URL carries no credential but the
    /// key, and finds its namespace here.
    FnInvokeKey,
    /// A namespace's dead letter ([`DeadLetter`]) by its activation id.
    DeadLetter,
}

impl DocKind {
    fn tag(self) -> &'static str {
        match self {
            DocKind::FnApp => "fn.app",
            DocKind::FnFunction => "fn.fn",
            DocKind::FnTrigger => "fn.trigger",
            DocKind::FnRoute => "fn.route",
            DocKind::FnInvokeKey => "fn.invoke",
            DocKind::DeadLetter => "deadletter",
        }
    }

    /// The key of a document: namespace and kind first, so that a namespace's documents of a
    /// kind are one range.
    pub(crate) fn key(self, namespace: &str, id: &str) -> String {
        format!("{namespace}\0{}\0{id}", self.tag())
    }

    pub(crate) fn prefix(self, namespace: &str) -> String {
        format!("{namespace}\0{}\0", self.tag())
    }
}

/// Bumps the last component of a semantic version, as OpenWhisk does on update.
pub(crate) fn next_version(old: &str) -> String {
    let mut parts: Vec<u64> = old.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    parts.resize(3, 0);
    parts[2] += 1;
    format!("{}.{}.{}", parts[0], parts[1], parts[2])
}
