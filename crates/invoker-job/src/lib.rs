//! An accepted activation on its way through the pool, and the one place it ends, with what it
//! holds while it runs (its namespace's slot, its place in the durable queue's counts). A leaf:
//! it depends on the model, the store and the metrics only, so the pool, the proxies and the
//! scheduler that carry a job import nothing of the intake (`activation`).

#![forbid(unsafe_code)]

pub mod queue;
pub mod runner;
pub mod slot;
pub mod stream;

use invoker_metrics::Metrics;
use invoker_store::{DeadLetter, DocKind, QueuedCall, Store};
use invoker_telemetry::ActivationTrace;
use invoker_wire::model::{Action, ActivationMeta, ActivationRecord, EncodedRecord, KeyValue, Rejection};
use queue::QueueTicket;
use serde_json::Value;
use slot::NamespaceSlot;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// A call's own HTTP request, for a runtime that takes one as it came (Fn's functions): its
/// headers and body.
#[derive(Debug, Default)]
pub struct CallRequest {
    pub headers: Vec<(String, String)>,
    pub body: bytes::Bytes,
}

impl CallRequest {
    /// As the durable queue keeps it: its body in base64 (it may not be text).
    pub fn to_queued(&self) -> invoker_store::QueuedRequest {
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.encode(&self.body);
        invoker_store::QueuedRequest { headers: self.headers.clone(), body }
    }

    /// As the durable queue kept it (a body that does not decode is empty).
    pub fn from_queued(queued: &invoker_store::QueuedRequest) -> Self {
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.decode(&queued.body).unwrap_or_default();
        CallRequest { headers: queued.headers.clone(), body: body.into() }
    }
}

/// What a proxy needs to run one activation.
pub struct RunJob {
    /// Shared with the job's completion, which needs it only if the job is dropped unfinished.
    pub meta: Arc<ActivationMeta>,
    pub action: Arc<Action>,
    pub params: invoker_wire::params::Params,
    /// The caller's request as it came, where the route keeps it (Fn's); `None`: the runtime
    /// gets `params`.
    pub request: Option<Arc<CallRequest>>,
    pub api_key: Option<String>,
    pub transaction_id: String,
    /// When the invoker accepted it (for `waitTime`).
    pub accepted: Instant,
    pub completion: Completion,
    /// An asynchronous call from the durable queue, until it is handed to a container.
    pub queued: Option<Queued>,
    /// A caller that must hear of the run's start before `/run` goes out: a scheduler keeping
    /// a queued call until an invoker starts it.
    pub start_notice: Option<StartNotice>,
    /// A caller that takes the answer as a stream, should the action stream one.
    pub stream: Option<stream::StreamRequest>,
}

/// How a caller hears that its call is being handed to a container: it is sent an
/// acknowledgement, which it fires once it has passed the word on (the shim: once the started
/// line is on its way to the scheduler); only then does the run begin. A caller gone before
/// (the notice or the acknowledgement dropped) means the run never begins.
pub type StartNotice = oneshot::Sender<oneshot::Sender<()>>;

/// What an asynchronous call's completion needs to try it again: the call as queued (its
/// parameters and request, encoded), the policy's backoff, and where a retry goes to wait for
/// it. Every attempt ends here with its record; a failed one that its policy retries is
/// journaled as a new queued call first, under an id of its own, linked both ways.
pub struct Retry {
    pub call: bytes::Bytes,
    /// A retry's first attempt and its number: what its record is annotated with.
    pub link: Option<(String, u32)>,
    /// Whether a success goes to a destination: only then, or on a failure, is `call` read.
    pub on_success: bool,
    /// Before the first retry; doubled for each later one.
    pub backoff: std::time::Duration,
    /// The intake's loop. Unbounded, since each message is a call the queue's bounds already
    /// admitted (and at most one is sent per attempt).
    pub retries: tokio::sync::mpsc::UnboundedSender<QueueWork>,
}

/// What the intake's loop is handed by the end of an attempt.
pub enum QueueWork {
    /// A next attempt, journaled already, to run once its backoff passed.
    Retry(Box<QueuedCall>),
    /// A call's outcome for a destination action of its namespace (`on-success`, `on-failure`).
    Destination { namespace: String, subject: String, action: String, params: serde_json::Map<String, Value> },
}

impl Retry {
    /// Links `record` to its attempts, and queues the next attempt if it failed and its policy
    /// and age allow one.
    fn decide(mut self, record: &mut ActivationRecord, store: &Arc<dyn Store>, metrics: &Metrics) {
        if let Some((first, attempt)) = self.link.take() {
            record.annotations.push(KeyValue { key: invoker_wire::model::RETRY_OF.into(), value: first.into() });
            record.annotations.push(KeyValue { key: invoker_wire::model::ATTEMPT.into(), value: attempt.into() });
        }
        let succeeded = record.response.status_code == 0;
        if succeeded && !self.on_success {
            return; // the common end: nothing of the call is read again
        }
        let Ok(mut call) = serde_json::from_slice::<QueuedCall>(&self.call) else { return };
        if succeeded {
            return self.destination(&call, call.on_success.as_deref(), "on-success", record);
        }
        let now = invoker_wire::model::epoch_ms();
        let backoff = self.backoff.saturating_mul(1 << (call.attempt - 1).min(16));
        let not_before = now.saturating_add(backoff.as_millis() as u64);
        // Out of attempts, or past its age before another could start: given up.
        if call.attempt >= call.max_attempts || not_before >= call.expires_at {
            metrics.dead_letters.inc();
            self.destination(&call, call.on_failure.as_deref(), "on-failure", record);
            return dead_letter(call, record, store);
        }
        let first = call.retry_of.take().unwrap_or_else(|| call.meta.activation_id.clone());
        call.meta.activation_id = invoker_wire::model::new_activation_id();
        call.meta.accepted_at = now;
        call.attempt += 1;
        call.retry_of = Some(first);
        call.not_before = not_before;
        // Strings, numbers and JSON values: encoding cannot fail.
        let json = serde_json::to_vec(&call).expect("a queued call serialises");
        if let Err(e) = store.enqueue(&call, &json, false) {
            tracing::warn!(activation = %record.activation_id, "its retry could not be queued: {e}");
            return;
        }
        let next = call.meta.activation_id.clone();
        record.annotations.push(KeyValue { key: invoker_wire::model::RETRIED_AS.into(), value: next.into() });
        metrics.retries.inc();
        let _ = self.retries.send(QueueWork::Retry(Box::new(call)));
    }

    /// Hands `record` to the call's destination `to`, if it names one.
    fn destination(&self, call: &QueuedCall, to: Option<&str>, why: &str, record: &ActivationRecord) {
        let Some(action) = to else { return };
        let mut params = serde_json::Map::new();
        params.insert("destination".into(), why.into());
        params.insert("activation".into(), serde_json::to_value(record).unwrap_or_default());
        let (namespace, subject) = (call.meta.namespace.clone(), call.meta.subject.clone());
        let _ = self.retries.send(QueueWork::Destination { namespace, subject, action: action.to_string(), params });
    }
}

/// Keeps a call given up in its namespace's dead-letter list, off the thread that ends it (a
/// document write is a durable commit).
fn dead_letter(mut call: QueuedCall, record: &ActivationRecord, store: &Arc<dyn Store>) {
    let store = store.clone();
    call.api_key = None;
    let first = call.retry_of.clone().unwrap_or_else(|| call.meta.activation_id.clone());
    let result = &record.response.result;
    let reason = result.error().unwrap_or_else(|| result.get().to_string());
    let letter = DeadLetter {
        activation_id: record.activation_id.clone(),
        first_activation_id: first,
        action: format!("{}/{}", call.meta.namespace, call.meta.name),
        attempts: call.attempt,
        reason,
        at: invoker_wire::model::epoch_ms(),
        call,
    };
    let json = serde_json::to_string(&letter).expect("a dead letter serialises");
    let keep = move || {
        let ns = &letter.call.meta.namespace;
        if let Err(e) = store.put_doc(ns, DocKind::DeadLetter, &letter.activation_id, Some(&json)) {
            tracing::error!(activation = %letter.activation_id, "its dead letter was not kept: {e}");
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(keep)),
        Err(_) => keep(),
    }
}

/// What the caller waiting on an activation hears first.
#[derive(Debug)]
pub enum Reply {
    /// Its record (or, when it was answered before its logs came, the record as answered).
    Record(EncodedRecord),
    /// No invoker had room for it within its wait: it was kept in the durable queue, to run
    /// when one has (the caller reads its record later, as after a 202).
    Queued,
}

/// A call waiting in the durable queue: its place in the queue's counts, and its age limit.
pub struct Queued {
    pub ticket: QueueTicket,
    /// Epoch ms past which it is not run.
    pub expires_at: u64,
}

/// The end of an activation: the record is stored, then whoever waits is answered. Every
/// accepted activation passes here exactly once, whatever failed on the way (`finish` takes
/// `self`); dropping one unfinished writes a whisk-error record rather than losing it.
///
/// When the result is known before the record is whole (its logs still on their way through
/// an engine), [`Completion::answer`] answers the caller first, as OpenWhisk's
/// `ContainerProxy` sends its result message before it collects the logs; the record is
/// stored, and `GET` shows it, once `finish` has it whole.
pub struct Completion {
    inner: Option<CompletionInner>,
    /// Closed once the record is stored: the activation's span ends with its record's write.
    trace: ActivationTrace,
}

struct CompletionInner {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    reply: Option<oneshot::Sender<Reply>>,
    /// For a caller answered early that takes the whole record too (a scheduler, through the
    /// shim): the record once stored.
    whole: Option<oneshot::Sender<EncodedRecord>>,
    meta: Arc<ActivationMeta>,
    /// Released when the activation ends or is answered: the namespace's in-flight count.
    slot: Option<NamespaceSlot>,
    /// In the durable queue and not started: dropped unfinished, it stays there for the next
    /// start to run, rather than ending with an error.
    queued: bool,
    /// An asynchronous call's: what its policy needs to try it again.
    retry: Option<Retry>,
}

impl Completion {
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        meta: Arc<ActivationMeta>,
        reply: Option<oneshot::Sender<Reply>>,
        slot: Option<NamespaceSlot>,
        trace: ActivationTrace,
    ) -> Self {
        let inner = CompletionInner { store, metrics, reply, whole: None, meta, slot, queued: false, retry: None };
        Completion { inner: Some(inner), trace }
    }

    /// Of a call in the durable queue (journaled with what it takes to run it), retried by
    /// `retry` if it fails.
    pub fn in_queue(mut self, retry: Retry) -> Self {
        if let Some(inner) = &mut self.inner {
            inner.queued = true;
            inner.retry = Some(retry);
        }
        self
    }

    /// Of an asynchronous call that started in an earlier run and did not end: it ends here,
    /// retried by `retry` if its policy allows.
    pub fn interrupted(mut self, retry: Retry) -> Self {
        if let Some(inner) = &mut self.inner {
            inner.retry = Some(retry);
        }
        self
    }

    /// A blocking call that found no room within its wait, journaled into the durable queue
    /// by the caller of this: its waiting caller hears so now (and reads the record later), its
    /// namespace's slot is free, and from here it ends as a queued call does (dropped
    /// unstarted, it stays queued for the next start). It is not retried: a caller who asked
    /// for a blocking call asked for one run.
    pub fn keep_queued(mut self) -> Self {
        if let Some(inner) = &mut self.inner {
            inner.queued = true;
            inner.slot = None;
            inner.whole = None;
            if let Some(reply) = inner.reply.take() {
                let _ = reply.send(Reply::Queued);
            }
        }
        self
    }

    /// A queued call is handed to a container: journaled first, so that a restart never runs
    /// it again as if it had not started. A journal that cannot write does not stop the run
    /// (a restart may then run it twice: at least once, never lost).
    pub fn started(&mut self) {
        let Some(inner) = self.inner.as_mut().filter(|i| i.queued) else { return };
        inner.queued = false;
        if let Err(e) = inner.store.started(&inner.meta.activation_id) {
            tracing::warn!(activation = %inner.meta.activation_id, "its start was not journaled: {e}");
        }
    }

    /// Also hands the whole record to `whole` when the caller was answered before it was whole.
    pub fn with_whole(mut self, whole: oneshot::Sender<EncodedRecord>) -> Self {
        if let Some(inner) = &mut self.inner {
            inner.whole = Some(whole);
        }
        self
    }

    /// Answers whoever waits with `record` before it is whole (its result known, its logs still
    /// to come), and journals it as answered. The record is stored, and shown, only by `finish`.
    /// From here `record`'s result is the one the answer's JSON holds: a large result is not
    /// held a third time, as it came, while its logs come.
    pub fn answer(&mut self, record: &mut ActivationRecord) {
        let Some(inner) = self.inner.as_mut() else { return };
        // The activation no longer runs: it no longer counts against its namespace's limit
        // while its logs come.
        inner.slot = None;
        let encoded = EncodedRecord::new(record.clone());
        record.response.result = encoded.record().response.result.clone();
        // A restart before the record is whole ends the activation with what was answered.
        if let Err(e) = inner.store.answered(&encoded) {
            tracing::warn!(activation = %record.activation_id, "the answer was not journaled: {e}");
        }
        if let Some(reply) = inner.reply.take() {
            let _ = reply.send(Reply::Record(encoded));
        }
    }

    pub fn finish(mut self, record: ActivationRecord) {
        if let Some(inner) = self.inner.take() {
            inner.finish(record, &self.trace);
        }
    }

    /// As [`Completion::finish`], with the record already encoded (a scheduler passes on its
    /// invoker's): stored and answered as its bytes came. A call its retry policy decides on
    /// gets the decision in its record, so that one is encoded again.
    pub fn finish_encoded(mut self, record: EncodedRecord) {
        if let Some(inner) = self.inner.take() {
            if inner.retry.is_some() {
                inner.finish(record.into_record(), &self.trace);
            } else {
                inner.end(record, &self.trace);
            }
        }
    }

    /// The activation's trace in this process, which its stages' spans hang from.
    pub fn trace(&self) -> &ActivationTrace {
        &self.trace
    }

    pub fn trace_mut(&mut self) -> &mut ActivationTrace {
        &mut self.trace
    }
}

impl RunJob {
    /// Ends the job without running it, `waitTime` counted from its acceptance.
    pub fn reject(self, rejection: Rejection) {
        let message = rejection.message();
        self.reject_because(rejection, &message);
    }

    /// As [`Self::reject`], the record's message saying why.
    pub fn reject_because(self, rejection: Rejection, message: &str) {
        let wait_ms = self.accepted.elapsed().as_millis() as u64;
        let now = invoker_wire::model::epoch_ms();
        let record = ActivationRecord::rejected_because(&self.meta, rejection, message, wait_ms, now);
        self.completion.finish(record);
    }
}

impl CompletionInner {
    /// Stores the record first, then answers: whoever is answered can read it back at once.
    /// The store's `finish` is a journal append, quick enough to call on any thread. The
    /// record is encoded here, once: the store and the waiter share it and its bytes.
    fn finish(mut self, mut record: ActivationRecord, trace: &ActivationTrace) {
        if let Some(retry) = self.retry.take() {
            retry.decide(&mut record, &self.store, &self.metrics);
        }
        let _write = invoker_telemetry::stage_span!(trace, "record").entered();
        let record = EncodedRecord::new(record);
        trace.ended(&record);
        self.metrics.activation_finished(&record);
        self.store_and_answer(record);
    }

    /// As `finish`, with a record encoded already, which no retry policy decides on.
    fn end(self, record: EncodedRecord, trace: &ActivationTrace) {
        trace.ended(&record);
        let _write = invoker_telemetry::stage_span!(trace, "record").entered();
        self.metrics.activation_finished(&record);
        self.store_and_answer(record);
    }

    fn store_and_answer(self, record: EncodedRecord) {
        if let Err(e) = self.store.finish(&record) {
            tracing::error!(activation = %record.head().activation_id, "record not stored: {e}");
        }
        match (self.reply, self.whole) {
            // Not answered yet: the whole record is the answer. `whole` is dropped before the
            // answer goes, so whoever holds its receiver sees at once that nothing follows.
            (Some(reply), whole) => {
                drop(whole);
                let _ = reply.send(Reply::Record(record));
            }
            (None, Some(whole)) => {
                let _ = whole.send(record);
            }
            (None, None) => {}
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            if inner.queued {
                // Journaled with its parameters and not started: the next start runs it.
                tracing::info!(activation = %inner.meta.activation_id, "a queued call is left for the next start");
                return;
            }
            let now = invoker_wire::model::epoch_ms();
            let record = ActivationRecord::whisk_error(&inner.meta, "the activation was dropped by the invoker", now);
            tracing::error!(activation = %record.activation_id, "an activation was dropped unfinished");
            inner.finish(record, &self.trace);
        }
    }
}
