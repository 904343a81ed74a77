//! Actions and activation records, in the JSON shapes OpenWhisk clients read and write.

use crate::json_parts::JsonParts;
use crate::params::Params;
use crate::result_json::ResultJson;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

/// `{"key": ..., "value": ...}`: OpenWhisk's parameter and annotation entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyValue {
    pub key: String,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Exec {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main: Option<String>,
    #[serde(default)]
    pub binary: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// An action's limits. On the wire: `timeout` in ms, `memory`, `logs` and `disk` in MB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub timeout: u64,
    pub memory: u32,
    pub logs: u32,
    pub concurrency: u32,
    /// What a container of the action may write (its code, working directory, `/tmp`,
    /// `/dev/shm`). OpenWhisk has no such limit; an action stored before it existed has the
    /// built-in default.
    #[serde(default = "Limits::default_disk")]
    pub disk: u32,
}

impl Limits {
    /// `limits.disk_default_mb`'s own default, and the disk of actions stored without one.
    pub const DEFAULT_DISK_MB: u32 = invoker_ids::DEFAULT_DISK_MB;

    fn default_disk() -> u32 {
        Self::DEFAULT_DISK_MB
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Action {
    pub namespace: String,
    pub name: String,
    pub version: String,
    pub exec: Exec,
    pub limits: Limits,
    #[serde(default)]
    pub parameters: Vec<KeyValue>,
    #[serde(default)]
    pub annotations: Vec<KeyValue>,
    #[serde(default)]
    pub publish: bool,
    /// Epoch ms of the last change.
    pub updated: u64,
    /// Bumped on every update, so that containers of an older revision are never reused.
    #[serde(default)]
    pub revision: u64,
}

/// An Fn function's ids and configuration (its environment), kept in its action's `fn`
/// annotation.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct FnFunction {
    #[serde(default)]
    pub fn_id: String,
    #[serde(default)]
    pub app_id: String,
    #[serde(default)]
    pub config: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub app_config: std::collections::BTreeMap<String, String>,
    /// Fn's `idle_timeout`: its idle containers go after this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u32>,
}

impl Action {
    /// A `python:3` action of the `guest` namespace with `code`, for the unit tests.
    /// For tests: a minimal one.
    #[cfg(any(test, feature = "test-util"))]
    pub fn for_test(name: &str, code: &str) -> Action {
        Action {
            namespace: "guest".into(),
            name: name.into(),
            version: "0.0.1".into(),
            exec: Exec { kind: "python:3".into(), code: Some(code.into()), main: None, binary: false, image: None },
            limits: Limits { timeout: 1000, memory: 256, logs: 10, concurrency: 1, disk: 256 },
            parameters: vec![],
            annotations: vec![],
            publish: false,
            updated: 0,
            revision: 1,
        }
    }

    /// The action's own bound on the retries of an asynchronous call that failed
    /// ([`MAX_RETRY_ATTEMPTS`]), if it sets one.
    pub fn max_retry_attempts(&self) -> Option<u32> {
        self.annotations
            .iter()
            .find(|a| a.key == MAX_RETRY_ATTEMPTS)?
            .value
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
    }

    /// The action its asynchronous calls' outcome goes to (`key`: [`ON_SUCCESS`] or
    /// [`ON_FAILURE`]), if it names one.
    pub fn destination(&self, key: &str) -> Option<String> {
        self.annotations.iter().find(|a| a.key == key)?.value.as_str().map(str::to_string)
    }

    /// The most activations of the action that may run at once, if it sets a cap: its
    /// [`MAX_CONCURRENCY`], or its [`RESERVED_CONCURRENCY`] (which caps too), the smaller.
    pub fn max_concurrency(&self) -> Option<u32> {
        let cap = self.positive_annotation(MAX_CONCURRENCY);
        let reserved = self.reserved_concurrency();
        cap.into_iter().chain(reserved).min()
    }

    /// The part of its namespace's limit the action keeps for itself ([`RESERVED_CONCURRENCY`]).
    pub fn reserved_concurrency(&self) -> Option<u32> {
        self.positive_annotation(RESERVED_CONCURRENCY)
    }

    /// The containers of the action kept created and initialised at all times
    /// ([`PROVISIONED_CONCURRENCY`]).
    pub fn provisioned_concurrency(&self) -> Option<u32> {
        self.positive_annotation(PROVISIONED_CONCURRENCY)
    }

    fn positive_annotation(&self, key: &str) -> Option<u32> {
        let value = self.annotations.iter().find(|a| a.key == key)?.value.as_u64()?;
        u32::try_from(value).ok().filter(|&v| v > 0)
    }

    /// The action's own maximum age of an asynchronous call, in seconds ([`MAX_EVENT_AGE`]).
    pub fn max_event_age_s(&self) -> Option<u64> {
        self.annotations.iter().find(|a| a.key == MAX_EVENT_AGE)?.value.as_u64()
    }

    /// OpenWhisk passes the caller's key to the action only when the `provide-api-key`
    /// annotation is true (new actions default to false).
    pub fn provides_api_key(&self) -> bool {
        self.annotations.iter().any(|a| a.key == "provide-api-key" && a.value == Value::Bool(true))
    }

    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// What Fn says of the action (its `fn` annotation, which Fn's routes set): its ids and the
    /// configuration of its app and its own. An action without one is its own app.
    pub fn fn_function(&self) -> FnFunction {
        let said = self.annotations.iter().find(|a| a.key == "fn");
        let mut function: FnFunction =
            said.and_then(|a| serde_json::from_value(a.value.clone()).ok()).unwrap_or_default();
        if function.fn_id.is_empty() {
            function.fn_id = self.path();
        }
        if function.app_id.is_empty() {
            function.app_id = self.namespace.clone();
        }
        function
    }

    /// The default parameters merged under the invocation's (the invocation wins), spliced
    /// into the caller's bytes ([`Params::merged_under`]).
    pub fn merged_params(&self, params: Params) -> Params {
        params.merged_under(self.parameters.iter().map(|p| (p.key.as_str(), &p.value)))
    }
}

/// OpenWhisk's four activation outcomes and their status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Success,
    ApplicationError,
    DeveloperError,
    WhiskError,
}

impl Outcome {
    pub fn status_code(self) -> u8 {
        self as u8
    }

    pub fn status(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::ApplicationError => "application error",
            Outcome::DeveloperError => "action developer error",
            Outcome::WhiskError => "whisk internal error",
        }
    }

    pub fn from_status_code(code: u64) -> Option<Outcome> {
        [Outcome::Success, Outcome::ApplicationError, Outcome::DeveloperError, Outcome::WhiskError]
            .get(code as usize)
            .copied()
    }
}

/// How the container that ran an activation came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartKind {
    Cold,
    Warm,
    Prewarm,
}

impl StartKind {
    /// As serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            StartKind::Cold => "cold",
            StartKind::Warm => "warm",
            StartKind::Prewarm => "prewarm",
        }
    }

    /// As written in a record's `startKind` annotation.
    pub fn from_code(code: &str) -> Option<Self> {
        [StartKind::Cold, StartKind::Warm, StartKind::Prewarm].into_iter().find(|kind| kind.as_str() == code)
    }
}

/// The activation record. Serialized exactly as OpenWhisk's `WhiskActivation`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivationRecord {
    pub namespace: String,
    pub name: String,
    pub version: String,
    pub subject: String,
    pub activation_id: String,
    pub start: u64,
    pub end: u64,
    pub duration: u64,
    pub status_code: u8,
    pub response: ActivationResponse,
    pub logs: Vec<String>,
    pub annotations: Vec<KeyValue>,
    pub publish: bool,
    /// Why the invoker answered without running the action, for the one place statuses are
    /// chosen (`api::error`). Not part of OpenWhisk's record: the `rejected` annotation tells
    /// its readers, and a record read back from the store has `None` here.
    #[serde(skip)]
    pub rejection: Option<Rejection>,
}

/// Why an accepted activation ended without running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Larger than any node of the cluster: retrying cannot help.
    NeverFits {
        memory_mb: u32,
        largest_node_mb: u64,
    },
    Deadline,
    QueueFull,
    /// Its container could not be had, for this reason (the pure core's own word for it).
    CreateFailed(invoker_ids::CreateFailure),
    Draining,
    ContainerLost,
    /// A scheduler found no invoker that would take it (the record's message says why).
    NoInvoker,
    /// The scheduler that handed over a queued call it keeps was gone before a container took
    /// it: it runs where the scheduler sends it next.
    CallerGone,
    /// It waited its bounded time while its action ran as many activations as its
    /// `max-concurrency` allows.
    Capped {
        cap: u32,
    },
}

/// A rejection's kind, as the record's `rejected` annotation names it (`create_failed`): what
/// a record read back, or sent by another invoker, still says of why nothing ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectionKind {
    NeverFits,
    Deadline,
    QueueFull,
    CreateFailed,
    Draining,
    ContainerLost,
    NoInvoker,
    CallerGone,
    Capped,
}

impl RejectionKind {
    const ALL: [RejectionKind; 9] = [
        RejectionKind::NeverFits,
        RejectionKind::Deadline,
        RejectionKind::QueueFull,
        RejectionKind::CreateFailed,
        RejectionKind::Draining,
        RejectionKind::ContainerLost,
        RejectionKind::NoInvoker,
        RejectionKind::CallerGone,
        RejectionKind::Capped,
    ];

    /// The value of the record's `rejected` annotation.
    pub fn code(self) -> &'static str {
        match self {
            RejectionKind::NeverFits => "never_fits",
            RejectionKind::Deadline => "deadline",
            RejectionKind::QueueFull => "queue_full",
            RejectionKind::CreateFailed => "create_failed",
            RejectionKind::Draining => "draining",
            RejectionKind::ContainerLost => "container_lost",
            RejectionKind::NoInvoker => "no_invoker",
            RejectionKind::CallerGone => "caller_gone",
            RejectionKind::Capped => "capped",
        }
    }

    pub fn from_code(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.code() == code)
    }

    /// Whether a rejection of this kind ran nothing: another invoker may take the activation.
    /// `container_lost` did not: its run may have started.
    pub fn ran_nothing(self) -> bool {
        self != RejectionKind::ContainerLost
    }
}

impl Rejection {
    pub fn kind(&self) -> RejectionKind {
        match self {
            Rejection::NeverFits { .. } => RejectionKind::NeverFits,
            Rejection::Deadline => RejectionKind::Deadline,
            Rejection::QueueFull => RejectionKind::QueueFull,
            Rejection::CreateFailed(_) => RejectionKind::CreateFailed,
            Rejection::Draining => RejectionKind::Draining,
            Rejection::ContainerLost => RejectionKind::ContainerLost,
            Rejection::NoInvoker => RejectionKind::NoInvoker,
            Rejection::CallerGone => RejectionKind::CallerGone,
            Rejection::Capped { .. } => RejectionKind::Capped,
        }
    }

    /// The value of the record's `rejected` annotation.
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    pub fn message(&self) -> String {
        match self {
            Rejection::NeverFits { memory_mb, largest_node_mb } => {
                format!("limits.memory: {memory_mb} MB can never fit: the largest node offers {largest_node_mb} MB")
            }
            Rejection::Deadline => {
                "no container could be had before the activation's wait deadline; nothing ran".into()
            }
            Rejection::QueueFull => "the invoker's waiting buffer is full; nothing ran".into(),
            Rejection::CreateFailed(why) => {
                use invoker_ids::CreateFailure;
                let why = match why {
                    CreateFailure::Refused => "the cluster refused it (no room on the node after all)",
                    CreateFailure::Image => "its image cannot be had",
                    CreateFailure::ImageNotOwned => {
                        "its image was built on the invoker's engine and is not named after the action's \
                         namespace ('<namespace>/...'), so only its namespace may run it"
                    }
                    CreateFailure::NotReady => "its runtime did not become ready in time",
                    CreateFailure::Failed => "it failed to start",
                    CreateFailure::InitFailed => "the action failed to initialise in it",
                };
                format!("the action's container could not be created: {why}; nothing ran")
            }
            Rejection::Draining => "the invoker is shutting down; nothing ran".into(),
            Rejection::ContainerLost => "the container running the activation vanished".into(),
            Rejection::NoInvoker => "no invoker could take the activation; nothing ran".into(),
            Rejection::Capped { cap } => format!(
                "the action ran its most activations at once (annotations.max-concurrency: {cap}) for as long as \
                 this one could wait; nothing ran"
            ),
            Rejection::CallerGone => {
                "the scheduler that handed the call over was gone before it started; nothing ran here".into()
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivationResponse {
    pub status: String,
    pub status_code: u8,
    pub success: bool,
    pub result: ResultJson,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

impl ActivationResponse {
    /// A result the invoker makes itself (an error, a guess), with its size.
    pub fn new(outcome: Outcome, result: Value) -> Self {
        let result = ResultJson::from_value(&result);
        let size = Some(result.as_bytes().len() as u64);
        ActivationResponse { size, ..Self::without_size(outcome, result) }
    }

    /// Without its `size`, for a record that is encoded next ([`EncodedRecord::new`] sets it
    /// from the one encoding of the result).
    pub fn without_size(outcome: Outcome, result: ResultJson) -> Self {
        ActivationResponse {
            status: outcome.status().to_string(),
            status_code: outcome.status_code(),
            success: outcome == Outcome::Success,
            result,
            size: None,
        }
    }

    pub fn outcome(&self) -> Outcome {
        Outcome::from_status_code(u64::from(self.status_code)).unwrap_or(Outcome::WhiskError)
    }
}

/// What the invoker, a scheduler and their stores decide on in a finished record: its keys in
/// the index, its outcome and why nothing ran, what the metrics count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHead {
    pub activation_id: String,
    pub namespace: String,
    pub name: String,
    pub start: u64,
    pub end: u64,
    pub duration: u64,
    pub outcome: Outcome,
    /// This process's own reason for running nothing; `None` for a record read back or sent
    /// by another process (its `rejected` annotation says the kind, [`Self::rejection_kind`]).
    pub rejection: Option<Rejection>,
    pub rejection_kind: Option<RejectionKind>,
    /// The `startKind` annotation.
    pub start_kind: Option<StartKind>,
    /// The `timeout` annotation is `true`: the action's time ran out.
    pub timed_out: bool,
}

impl RecordHead {
    pub fn of(record: &ActivationRecord) -> Self {
        let start_kind = record.annotation("startKind").and_then(|v| v.as_str()).and_then(StartKind::from_code);
        RecordHead {
            activation_id: record.activation_id.clone(),
            namespace: record.namespace.clone(),
            name: record.name.clone(),
            start: record.start,
            end: record.end,
            duration: record.duration,
            outcome: record.outcome(),
            rejection: record.rejection,
            rejection_kind: record.rejection_kind(),
            start_kind,
            timed_out: record.annotation("timeout") == Some(&serde_json::Value::Bool(true)),
        }
    }

    /// As [`ActivationRecord::ran_nothing`].
    pub fn ran_nothing(&self) -> bool {
        self.rejection_kind.is_some_and(RejectionKind::ran_nothing)
    }
}

/// A finished record and its JSON, encoded once: the store's journal line, its database entry
/// and the caller's answer all take these bytes, and `?result=true` answers the slice where the
/// result lies in them. A record another process encoded (a scheduler's from its invoker) is
/// held as its head and its bytes, and decoded only when something reads it whole.
#[derive(Clone, Debug)]
pub struct EncodedRecord {
    held: Arc<Held>,
    /// One buffer; a large result between the parts before and after it, as it came.
    pub json: JsonParts,
    /// The result's JSON: a slice of `json`'s one buffer, or its middle part.
    pub(crate) result: Bytes,
}

#[derive(Debug)]
struct Held {
    head: RecordHead,
    /// Set from the start for a record this process encoded; decoded from the JSON on the
    /// first read otherwise.
    record: OnceLock<ActivationRecord>,
}

/// A result this long or longer is not copied into its record's JSON: the record holds it as
/// the bytes it came as, between the parts before and after it ([`JsonParts`]). Below it one
/// buffer is cheaper to pass around than three, and the copy costs little.
pub const SHARED_RESULT: usize = 64 * 1024;

/// `EncodedRecord::new`, which writes the JSON, is in `record_json.rs`; a record read for its
/// head ([`crate::record_head::ReadRecord`]) is passed on in `record_head.rs`.
impl EncodedRecord {
    /// `record`, and the JSON it was encoded as.
    pub(crate) fn encoded(record: ActivationRecord, json: JsonParts, result: Bytes) -> Self {
        let held = Held { head: RecordHead::of(&record), record: OnceLock::from(record) };
        EncodedRecord { held: Arc::new(held), json, result }
    }

    /// A record known by its head and its JSON (checked to decode as a record).
    pub(crate) fn read(head: RecordHead, json: JsonParts, result: Bytes) -> Self {
        EncodedRecord { held: Arc::new(Held { head, record: OnceLock::new() }), json, result }
    }

    /// What is decided on: the index's keys, the outcome, why nothing ran.
    pub fn head(&self) -> &RecordHead {
        &self.held.head
    }

    /// The whole record. One read for its head alone (a scheduler's from its invoker) is decoded
    /// from its JSON on the first call, and kept.
    pub fn record(&self) -> &ActivationRecord {
        self.held.record.get_or_init(|| self.decode())
    }

    /// The whole record, owned (a retry's decision is written into it).
    pub fn into_record(self) -> ActivationRecord {
        match Arc::try_unwrap(self.held) {
            Ok(held) => match held.record.into_inner() {
                Some(record) => record,
                None => EncodedRecord::read(held.head, self.json, self.result).decode(),
            },
            Err(held) => EncodedRecord { held, ..self }.record().clone(),
        }
    }

    fn decode(&self) -> ActivationRecord {
        let head = self.head();
        match serde_json::from_slice::<ActivationRecord>(&self.json.to_bytes()) {
            Ok(mut record) => {
                // The result where the JSON holds it, shared, not the decoder's copy.
                record.response.result = ResultJson::within_record(self.result.clone());
                record.rejection = head.rejection;
                record
            }
            // Not met: the bytes were read by a mirror of the record's own shape
            // (`record_head.rs`). Were they not to decode, the head and the result are kept.
            Err(_) => {
                let result = ResultJson::within_record(self.result.clone());
                let mut response = ActivationResponse::without_size(head.outcome, result);
                response.size = Some(self.result.len() as u64);
                ActivationRecord {
                    namespace: head.namespace.clone(),
                    name: head.name.clone(),
                    version: String::new(),
                    subject: String::new(),
                    activation_id: head.activation_id.clone(),
                    start: head.start,
                    end: head.end,
                    duration: head.duration,
                    status_code: head.outcome.status_code(),
                    response,
                    logs: Vec::new(),
                    annotations: Vec::new(),
                    publish: false,
                    rejection: head.rejection,
                }
            }
        }
    }

    /// The result's JSON, as the record holds it.
    pub fn result_json(&self) -> Bytes {
        self.result.clone()
    }

    /// The result's `error`, when it is a dictionary with a string there.
    pub fn error(&self) -> Option<String> {
        ResultJson::within_record(self.result.clone()).error()
    }
}

impl From<ActivationRecord> for EncodedRecord {
    fn from(record: ActivationRecord) -> Self {
        EncodedRecord::new(record)
    }
}

/// The annotation of a record written as a guess ([`ActivationRecord::guess`]).
pub const GUESS: &str = "guess";

/// An action's annotation: how many times an asynchronous call of it that failed is tried
/// again (0 to 2), as `wsk action update a -a max-retry-attempts 1` sets it.
pub const MAX_RETRY_ATTEMPTS: &str = "max-retry-attempts";
/// An action's annotation: how long (seconds, 60 to 21600) an asynchronous call of it may wait
/// to start, counted from its first attempt.
pub const MAX_EVENT_AGE: &str = "max-event-age";
/// An action's annotation: the action of its namespace called, asynchronously and with the
/// record, when an asynchronous call of it succeeds (Lambda's on-success destination).
pub const ON_SUCCESS: &str = "on-success";
/// An action's annotation: the action called when an asynchronous call of it is given up.
pub const ON_FAILURE: &str = "on-failure";
/// An action's annotation: the most activations of it that run at once (1 to
/// [`MAX_CONCURRENCY_MAX`]), as `wsk action update a -a max-concurrency 20` sets it.
pub const MAX_CONCURRENCY: &str = "max-concurrency";
/// The largest `max-concurrency` an action may set.
pub const MAX_CONCURRENCY_MAX: u64 = 10_000;
/// An action's annotation: activations of its namespace's limit kept for it alone, which also
/// caps it (Lambda's reserved concurrency), as `wsk action update a -a reserved-concurrency 10`.
pub const RESERVED_CONCURRENCY: &str = "reserved-concurrency";
/// An action's annotation: containers of it kept created and initialised at all times, so that
/// its calls find them warm (Lambda's provisioned concurrency), as
/// `wsk action update a -a provisioned-concurrency 5` sets it; within its namespace's
/// `limits.namespace_provisioned`.
pub const PROVISIONED_CONCURRENCY: &str = "provisioned-concurrency";
/// A retry's record: the activation id of the call's first attempt.
pub const RETRY_OF: &str = "retryOf";
/// A retry's record: which attempt it is (2 or 3).
pub const ATTEMPT: &str = "attempt";
/// A failed attempt's record: the activation id of the attempt that follows it.
pub const RETRIED_AS: &str = "retriedAs";

impl ActivationRecord {
    /// Whether the record says its action provably never started (a rejection of the kinds
    /// that run nothing, from this process or from the `rejected` annotation of a record read
    /// back or sent by an invoker). Any other whisk error may have run.
    pub fn ran_nothing(&self) -> bool {
        self.rejection_kind().is_some_and(RejectionKind::ran_nothing)
    }

    /// Why nothing ran, when the record says: from this process's rejection, or from the
    /// `rejected` annotation of a record read back or sent by an invoker.
    pub fn rejection_kind(&self) -> Option<RejectionKind> {
        match &self.rejection {
            Some(rejection) => Some(rejection.kind()),
            None => self.annotation("rejected").and_then(Value::as_str).and_then(RejectionKind::from_code),
        }
    }

    pub fn outcome(&self) -> Outcome {
        self.response.outcome()
    }

    pub fn annotation(&self, key: &str) -> Option<&Value> {
        self.annotations.iter().find(|a| a.key == key).map(|a| &a.value)
    }

    /// A whisk-error record written for an activation whose end its writer did not see (a
    /// restart, an invoker lost): it says so in its `guess` annotation, and a later record of
    /// what ran (the invoker's own, fetched by the scheduler) replaces it.
    pub fn guess(job: &ActivationMeta, message: &str, now_ms: u64) -> Self {
        let mut record = Self::whisk_error(job, message, now_ms);
        record.annotations.push(KeyValue {
            key: GUESS.into(),
            value: json!(
                "this activation's end was not seen: a record of what ran replaces this one when one is found"
            ),
        });
        record
    }

    /// Whether this record was written as a [`Self::guess`].
    pub fn is_guess(&self) -> bool {
        self.annotation(GUESS).is_some()
    }

    /// A record for an activation that never ran: the caller may retry it safely.
    pub fn whisk_error(job: &ActivationMeta, message: &str, now_ms: u64) -> Self {
        let response = ActivationResponse::new(Outcome::WhiskError, json!({ "error": message }));
        ActivationRecord {
            namespace: job.namespace.clone(),
            name: job.name.clone(),
            version: job.version.clone(),
            subject: job.subject.clone(),
            activation_id: job.activation_id.clone(),
            start: job.accepted_at,
            end: now_ms,
            duration: now_ms.saturating_sub(job.accepted_at),
            status_code: Outcome::WhiskError.status_code(),
            response,
            logs: Vec::new(),
            annotations: job.base_annotations(),
            publish: false,
            rejection: None,
        }
    }

    /// The record of an activation the invoker answered without running it, `wait_ms` after
    /// accepting it.
    pub fn rejected(job: &ActivationMeta, rejection: Rejection, wait_ms: u64, now_ms: u64) -> Self {
        Self::rejected_because(job, rejection, &rejection.message(), wait_ms, now_ms)
    }

    /// As [`Self::rejected`], with a message of its own (which invokers refused, and why).
    pub fn rejected_because(
        job: &ActivationMeta,
        rejection: Rejection,
        message: &str,
        wait_ms: u64,
        now_ms: u64,
    ) -> Self {
        let mut record = Self::whisk_error(job, message, now_ms);
        record.annotations.push(KeyValue { key: "rejected".into(), value: json!(rejection.code()) });
        record.annotations.push(KeyValue { key: "waitTime".into(), value: json!(wait_ms) });
        record.rejection = Some(rejection);
        record
    }
}

/// What identifies an accepted activation before it ran: written to the store at acceptance,
/// so that an activation interrupted by a crash still ends with a record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActivationMeta {
    pub activation_id: String,
    pub namespace: String,
    pub name: String,
    pub version: String,
    pub subject: String,
    pub kind: String,
    pub limits: Limits,
    pub accepted_at: u64,
}

impl ActivationMeta {
    /// An activation of `guest/a` (`python:3`, 256 MB), for the unit tests.
    /// For tests: a minimal one.
    #[cfg(any(test, feature = "test-util"))]
    pub fn for_test(id: &str) -> ActivationMeta {
        ActivationMeta {
            activation_id: id.into(),
            namespace: "guest".into(),
            name: "a".into(),
            version: "0.0.1".into(),
            subject: "guest".into(),
            kind: "python:3".into(),
            limits: Limits { timeout: 1000, memory: 256, logs: 10, concurrency: 1, disk: 256 },
            accepted_at: 1,
        }
    }

    pub fn base_annotations(&self) -> Vec<KeyValue> {
        vec![
            KeyValue { key: "path".into(), value: json!(format!("{}/{}", self.namespace, self.name)) },
            KeyValue { key: "kind".into(), value: json!(self.kind) },
            KeyValue { key: "limits".into(), value: serde_json::to_value(self.limits).unwrap_or(Value::Null) },
        ]
    }
}

/// A fresh activation id: 32 lowercase hex digits, as OpenWhisk's. Time-ordered (UUIDv7, its
/// random bits from a user-space generator): the store's records table is keyed by id, and
/// ordered ids land at its end instead of rewriting a random page of it for each record.
pub fn new_activation_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

pub fn is_activation_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Milliseconds since the Unix epoch, as records and lists show them: the wall clock, except
/// that it never goes back within a run ([`WallClock`]).
pub fn epoch_ms() -> u64 {
    static CLOCK: std::sync::OnceLock<WallClock> = std::sync::OnceLock::new();
    let clock = CLOCK.get_or_init(WallClock::default);
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    clock.at(wall, clock.base.elapsed().as_millis() as u64)
}

/// The wall clock made monotonic: the time is the monotonic clock's, projected from the wall
/// clock's latest reading ahead of it. A wall clock set forward is followed at once; one set
/// back is not (the time goes on from where it was, until the wall clock catches up), so a
/// record never ends before it starts and the newest records stay at the head of a list.
#[derive(Debug)]
pub struct WallClock {
    base: std::time::Instant,
    /// Wall time at `base`, as last projected (only ever raised).
    offset: std::sync::atomic::AtomicU64,
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock { base: std::time::Instant::now(), offset: std::sync::atomic::AtomicU64::new(0) }
    }
}

impl WallClock {
    /// The time when the wall clock reads `wall` and `mono` ms passed since `base`.
    pub fn at(&self, wall: u64, mono: u64) -> u64 {
        use std::sync::atomic::Ordering;
        let offset = wall.saturating_sub(mono);
        let raised = self.offset.fetch_max(offset, Ordering::AcqRel).max(offset);
        raised + mono
    }
}

/// OpenWhisk's entity name rule: word characters, then word characters, `@`, `.`, `-` or
/// spaces, not ending in a space; at most 256 characters.
pub fn validate_entity_name(field: &str, name: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let ok = !name.is_empty()
        && name.len() <= 256
        && name.chars().next().is_some_and(word)
        && name.chars().all(|c| word(c) || matches!(c, '@' | '.' | '-' | ' '))
        && !name.ends_with(' ');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{field}: '{}' is not a valid name (letters, digits, _ first; then also @ . - or space; at most 256)",
            name.chars().take(64).collect::<String>()
        ))
    }
}

/// Whether `image` is an image reference as Docker takes one: `name[:tag][@digest]`, the name
/// lowercase (a registry's `host:port/` first, if any), up to 255 characters in all.
pub fn is_image_reference(image: &str) -> bool {
    let (rest, digest) = image.split_once('@').unwrap_or((image, ""));
    let (name, tag) = match rest.rsplit_once(':') {
        Some((_, "")) => return false,
        Some((name, tag)) if !tag.contains('/') => (name, tag),
        _ => (rest, ""),
    };
    // A `:` in the name is only a registry's port, in its first component.
    let (registry, path) = name.split_once('/').unwrap_or(("", name));
    let port_ok = match registry.split_once(':') {
        Some((host, port)) => !host.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()),
        None => true,
    };
    let name_ok = name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:".contains(c))
        && !path.contains(':')
        && port_ok
        && !name.contains("//")
        && !name.ends_with('/');
    let tag_ok = tag.len() <= 128 && tag.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    let digest_ok = digest.chars().all(|c| c.is_ascii_alphanumeric() || c == ':');
    image.len() <= 255 && name_ok && tag_ok && digest_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_as_docker_takes_them() {
        for good in ["hello", "fnproject/hello:0.0.1", "localhost:5000/team/f:V1.2_x", "a/b@sha256:abc123", "f:1"] {
            assert!(is_image_reference(good), "{good}");
        }
        for bad in ["", "Hello", "-x", "a//b", "a/", "a b", "a:", "a:t/ag", "x\0y", &"a".repeat(256)] {
            assert!(!is_image_reference(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_record_encoded_once_is_its_json_and_the_result_its_slice() {
        let meta = ActivationMeta::for_test("0123456789abcdef0123456789abcdef");
        for result in [json!({"a": [1, 2.5, "x\"y"], "result": null}), json!([]), json!({"error": "bad"})] {
            let mut record = ActivationRecord::whisk_error(&meta, "x", 10);
            record.response = ActivationResponse::without_size(Outcome::Success, result.clone().into());
            record.logs = vec!["\"response\":{\"result\":null".into()];
            let encoded = EncodedRecord::new(record.clone());
            record.response.size = Some(result.to_string().len() as u64);
            assert_eq!(
                encoded.json.to_bytes(),
                Bytes::from(serde_json::to_vec(&record).unwrap()),
                "the same bytes as serde's"
            );
            assert_eq!(encoded.result_json(), Bytes::from(result.to_string()));
            assert_eq!(*encoded.record(), record);
        }
    }
    use proptest::prelude::*;

    #[test]
    fn the_clock_follows_a_wall_clock_set_forward_and_not_one_set_back() {
        let clock = WallClock::default();
        let hour = 3_600_000;
        assert_eq!(clock.at(1_000_000, 0), 1_000_000);
        assert_eq!(clock.at(1_002_000, 2_000), 1_002_000);
        assert_eq!(clock.at(1_004_000 + hour, 4_000), 1_004_000 + hour, "set forward: followed at once");
        assert_eq!(clock.at(1_006_000, 6_000), 1_006_000 + hour, "set back: the time goes on");
        assert_eq!(clock.at(1_008_000 + hour + 5, 8_000), 1_008_000 + hour + 5, "caught up");
    }

    proptest! {
        /// Whatever the wall clock does, the time moves at least as far as the monotonic clock
        /// and is never behind the wall clock.
        #[test]
        fn the_clock_never_goes_back(steps in proptest::collection::vec((0u64..10_000, -7_200_000i64..7_200_000), 1..50)) {
            let clock = WallClock::default();
            let (mut mono, mut wall, mut last) = (0u64, 1_800_000_000_000i64, 0u64);
            for (elapsed, jump) in steps {
                mono += elapsed;
                wall += elapsed as i64 + jump;
                let now = clock.at(wall as u64, mono);
                prop_assert!(now >= last + elapsed, "{now} after {last}, {elapsed} ms later");
                prop_assert!(now >= wall as u64, "never behind the wall clock");
                last = now;
            }
        }
    }

    #[test]
    fn entity_names_follow_openwhisk() {
        for good in ["hello", "a", "my_action-1.2", "x@y", "with space"] {
            assert!(validate_entity_name("name", good).is_ok(), "{good}");
        }
        for bad in ["", "-x", "a/b", "trailing ", ".hidden", "é"] {
            assert!(validate_entity_name("name", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn activation_ids_are_32_hex() {
        let id = new_activation_id();
        assert!(is_activation_id(&id));
        assert!(!is_activation_id("xyz"));
    }
}

/// OpenWhisk's `ActivationMessage`, what a controller puts on an invoker's topic: the shim
/// reads it, the cluster's scheduler writes it. Borrowed when written (the parameters are not
/// copied into a JSON tree first), owned when read.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivationMessage<'a> {
    /// `[transaction id, start millis, ...]`.
    pub transid: Value,
    pub action: MessageAction<'a>,
    /// A scheduler's cluster revision of the action (an OpenWhisk controller's document
    /// revision otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<Cow<'a, str>>,
    /// Which controller sent it; a scheduler of the cluster names itself here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_controller_index: Option<ControllerIndex<'a>>,
    pub user: MessageUser<'a>,
    pub activation_id: Cow<'a, str>,
    #[serde(default)]
    pub blocking: bool,
    /// The parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Cow<'a, Params>>,
    /// Ours, not OpenWhisk's: the caller's request as it came, for a runtime that takes one
    /// (an Fn function called through a scheduler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<MessageRequest<'a>>,
    /// OpenWhisk's: the trace the activation belongs to, as propagation headers. A scheduler
    /// puts W3C's `traceparent` in it; an invoker reads that key only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<std::collections::BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
}

/// A call's headers, and its body in base64.
#[derive(Debug, Serialize, Deserialize)]
pub struct MessageRequest<'a> {
    pub headers: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    pub body: Cow<'a, str>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MessageAction<'a> {
    /// The namespace (OpenWhisk's path; packages are not supported).
    pub path: Cow<'a, str>,
    pub name: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<Cow<'a, str>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ControllerIndex<'a> {
    #[serde(rename = "asString")]
    pub as_string: Cow<'a, str>,
    #[serde(rename = "instanceType", default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<Cow<'a, str>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MessageUser<'a> {
    pub subject: Cow<'a, str>,
    pub namespace: MessageNamespace<'a>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authkey: Option<MessageKey<'a>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MessageNamespace<'a> {
    pub name: Cow<'a, str>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MessageKey<'a> {
    pub api_key: Cow<'a, str>,
}
