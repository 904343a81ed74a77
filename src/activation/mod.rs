//! The intake shared by both front doors (REST invoke and the `ActivationMessage` shim):
//! namespace limits, acceptance in the store before anything is acknowledged, hand-over to
//! the pool, and the blocking wait. [`job`] is the record's path from there on: the one owner
//! of how an accepted activation ends.

pub mod keep_queued;
mod provisioning;
pub mod reservations;

use invoker_job::queue::{QueueCounts, QueueFull, QueueSettings};
use invoker_job::runner::Runner;
use invoker_job::slot::{NamespaceSlot, NamespaceSlots};
use invoker_job::stream::{StreamFormat, StreamRequest, StreamStart};
use invoker_job::{Completion, Reply, RunJob};
use invoker_metrics::Metrics;
use invoker_store::{Accepted, QueuedCall, Store, StoreError};
use invoker_telemetry::{ActivationTrace, TraceParent};
use invoker_wire::cluster::Health;
use invoker_wire::model::{epoch_ms, Action, ActivationMeta, EncodedRecord};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("namespace {namespace} has {limit} activations in flight, its limit{}", reserved_part(*.reserved))]
    NamespaceLimit { namespace: String, limit: u32, reserved: u32 },
    #[error("the invoker is shutting down")]
    Draining,
    /// A caller's activation id that an activation of another namespace already has: it is
    /// neither run nor answered from the other's record.
    #[error("activationId: {0} is already taken by another activation")]
    IdTaken(String),
    /// What a dead letter would run again is gone (its action was deleted).
    #[error("{0}")]
    Gone(String),
    /// The durable queue of asynchronous calls is at one of its bounds.
    #[error(transparent)]
    QueueFull(#[from] QueueFull),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn reserved_part(reserved: u32) -> String {
    match reserved {
        0 => String::new(),
        r => format!(" less the {r} its actions reserve for themselves (reserved-concurrency)"),
    }
}

/// How an invoke ended, from the caller's side.
#[derive(Debug)]
pub enum Invoked {
    /// Finished within the blocking wait.
    Done(EncodedRecord),
    /// Accepted; the record will be there later (non-blocking, or the blocking wait passed).
    Accepted(String),
    /// The action streams its answer: its values as the caller reads them, as they come (the
    /// record is stored once the stream ends).
    Streaming { activation_id: String, format: StreamFormat, start: StreamStart },
}

pub struct InvokeRequest {
    pub action: Arc<Action>,
    pub params: invoker_wire::params::Params,
    /// The caller's request as it came (Fn's routes); `None`: the runtime gets `params`.
    pub request: Option<Arc<invoker_job::CallRequest>>,
    pub subject: String,
    pub api_key: Option<String>,
    /// Given by the caller (the shim: checked for an earlier delivery), or `None` for a new one.
    pub activation_id: Option<String>,
    pub transaction_id: String,
    /// `None`: answer as soon as it is accepted.
    pub wait: Option<Duration>,
    /// The caller's W3C `traceparent` (a scheduler's, through the shim), if a valid one came.
    pub traceparent: Option<TraceParent>,
    /// A caller that takes an answer before the record is whole, and the whole record after
    /// (a scheduler, through the shim): where the whole record goes. Dropped unused when the
    /// answer was the whole record.
    pub whole: Option<oneshot::Sender<EncodedRecord>>,
    /// A caller that keeps the call until it starts (a scheduler's queued call, through the
    /// shim): told before `/run` goes out; gone, and nothing starts.
    pub start_notice: Option<invoker_job::StartNotice>,
    /// A blocking caller that takes the answer as a stream in this format (its `Accept`),
    /// should the action stream one.
    pub stream: Option<StreamFormat>,
}

#[derive(Clone)]
pub struct ActivationService {
    store: Arc<dyn Store>,
    /// Where accepted activations run: this invoker's pool, or (a scheduler) its invokers.
    runner: Arc<dyn Runner>,
    metrics: Arc<Metrics>,
    in_flight: NamespaceSlots,
    namespace_limit: u32,
    /// What each namespace's actions keep of its limit for themselves.
    reservations: reservations::Reservations,
    /// Provisioned containers each namespace's actions may keep in all.
    namespace_provisioned: u32,
    draining: Arc<std::sync::atomic::AtomicBool>,
    /// Who runs the activations here, on their spans (the invoker's or the scheduler's id).
    process: Arc<str>,
    /// Where asynchronous calls wait until they start (an invoker's; a scheduler hands them on).
    queue: Option<AsyncQueue>,
}

/// What is kept of an activation of `action` accepted now.
fn accepted_now(action: &Action, activation_id: String, subject: String) -> ActivationMeta {
    ActivationMeta {
        activation_id,
        namespace: action.namespace.clone(),
        name: action.name.clone(),
        version: action.version.clone(),
        subject,
        kind: action.exec.kind.clone(),
        limits: action.limits,
        accepted_at: epoch_ms(),
    }
}

/// Who made an asynchronous call: a caller, or a destination of another call's outcome.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    Caller,
    Destination,
}

/// The durable queue as the intake sees it: its counts, its default policy, and its retries
/// waiting out their backoff.
#[derive(Clone)]
struct AsyncQueue {
    counts: QueueCounts,
    settings: QueueSettings,
    retries: tokio::sync::mpsc::UnboundedSender<invoker_job::QueueWork>,
    /// Taken by [`ActivationService::run_retries`].
    waiting_retries: Arc<parking_lot::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<invoker_job::QueueWork>>>>,
}

impl ActivationService {
    /// The intake of activations that `runner` runs (an invoker's pool, a scheduler's
    /// dispatcher: `app.rs` chooses).
    pub fn new(store: Arc<dyn Store>, runner: Arc<dyn Runner>, metrics: Arc<Metrics>, namespace_limit: u32) -> Self {
        ActivationService {
            store,
            runner,
            metrics,
            in_flight: NamespaceSlots::default(),
            namespace_limit,
            reservations: reservations::Reservations::default(),
            namespace_provisioned: 0,
            draining: Arc::default(),
            process: Arc::from(""),
            queue: None,
        }
    }

    /// Asynchronous calls (no wait) go through a durable queue with these bounds, rather than
    /// straight to the runner: this invoker's pool, or (a scheduler) the cluster's invokers,
    /// which report when they start one.
    pub fn with_queue(mut self, settings: QueueSettings) -> Self {
        let (retries, waiting) = tokio::sync::mpsc::unbounded_channel();
        self.queue = Some(AsyncQueue {
            counts: QueueCounts::new(settings.bounds),
            settings,
            retries,
            waiting_retries: Arc::new(parking_lot::Mutex::new(Some(waiting))),
        });
        self
    }

    /// Runs the retries (and the calls a restart found with a backoff still to wait) once their
    /// backoff passed, for as long as the service lives.
    pub fn run_retries(&self) {
        let Some(mut waiting) = self.queue.as_ref().and_then(|q| q.waiting_retries.lock().take()) else { return };
        let service = self.clone();
        actix_rt::spawn(async move {
            while let Some(work) = waiting.recv().await {
                let service = service.clone();
                actix_rt::spawn(async move {
                    match work {
                        invoker_job::QueueWork::Retry(call) => {
                            let wait = call.not_before.saturating_sub(epoch_ms());
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                            service.requeue(*call).await;
                        }
                        invoker_job::QueueWork::Destination { namespace, subject, action, params } => {
                            service.call_destination(&namespace, subject, &action, &params).await;
                        }
                    }
                });
            }
        });
    }

    /// Where a runner keeps a blocking call that found no room within its wait: this intake's
    /// durable queue; `None` without one.
    pub fn queue_keeper(&self) -> Option<keep_queued::QueueKeeper> {
        let queue = self.queue.as_ref()?;
        Some(keep_queued::QueueKeeper {
            store: self.store.clone(),
            counts: queue.counts.clone(),
            max_event_age: queue.settings.max_event_age,
        })
    }

    /// What waits in the durable queue; `None` without one.
    pub fn queue_counts(&self) -> Option<&QueueCounts> {
        self.queue.as_ref().map(|q| &q.counts)
    }

    /// Names who runs the activations accepted here, on their spans.
    pub fn named(mut self, process: &str) -> Self {
        self.process = Arc::from(process);
        self
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The action `namespace/name` was deleted (`kept: None`) or saved as `kept`: no container
    /// of another revision runs anything again, and the idle ones are removed now, here or (a
    /// scheduler) on every invoker.
    pub async fn retire_action(&self, namespace: &str, name: &str, kept: Option<&invoker_wire::model::Action>) {
        self.reservations.set(namespace, name, kept.map(reservations::Kept::of));
        self.runner.retire_action(namespace, name, kept).await;
        if let Some(action) = kept {
            self.provision_saved(action).await;
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn set_draining(&self) {
        self.draining.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The invoker's health as `/health` and its cluster registration say it: the pool's (as
    /// its status says it, with this intake's draining), unless the store cannot write, when new work would be refused whatever the pool could
    /// run (draining is said as it is).
    pub fn health(&self, of_the_pool: Health) -> Health {
        match of_the_pool {
            Health::Draining => Health::Draining,
            _ if self.store.trouble().is_some() => Health::Unhealthy,
            health => health,
        }
    }

    /// A slot of the namespace's shared part: its limit less what its actions reserve.
    async fn take_slot(&self, namespace: &str) -> Result<NamespaceSlot, IntakeError> {
        let reserved = self.reserved_in(namespace).await?;
        let limit = self.namespace_limit.saturating_sub(reserved);
        let full = || IntakeError::NamespaceLimit { namespace: namespace.into(), limit, reserved };
        self.in_flight.take(namespace, limit).ok_or_else(full)
    }

    /// What the actions of `namespace` reserve in all (read from the store the first time).
    async fn reserved_in(&self, namespace: &str) -> Result<u32, IntakeError> {
        if let Some(total) = self.reservations.total(namespace) {
            return Ok(total.reserved);
        }
        self.read_reservations(namespace).await?;
        Ok(self.reservations.total(namespace).unwrap_or_default().reserved)
    }

    /// What the actions of `namespace` other than `name` keep: what `name` may reserve at most
    /// is the namespace's limit less what they reserve, and what it may provision
    /// `limits.namespace_provisioned` less what they provision.
    pub async fn kept_by_others(&self, namespace: &str, name: &str) -> Result<reservations::Kept, IntakeError> {
        if self.reservations.total(namespace).is_none() {
            self.read_reservations(namespace).await?;
        }
        Ok(self.reservations.others(namespace, name).unwrap_or_default())
    }

    /// The namespace's limit on its blocking calls in flight (`limits.namespace_concurrent`).
    pub fn namespace_limit(&self) -> u32 {
        self.namespace_limit
    }

    async fn read_reservations(&self, namespace: &str) -> Result<(), IntakeError> {
        let (store, ns) = (self.store.clone(), namespace.to_string());
        let actions =
            tokio::task::spawn_blocking(move || store.list_actions(&ns, 0, usize::MAX)).await.map_err(|e| {
                StoreError::Io { what: format!("reading {namespace}'s actions"), source: std::io::Error::other(e) }
            })??;
        let kept = actions.into_iter().map(|a| (a.name.clone(), reservations::Kept::of(&a))).collect::<Vec<_>>();
        self.reservations.read(namespace, kept);
        Ok(())
    }

    /// Accepts, hands over and (for a blocking call) waits. A repeated activation id is
    /// answered from the first, never run again.
    pub async fn invoke(&self, req: InvokeRequest) -> Result<Invoked, IntakeError> {
        if self.is_draining() {
            return Err(IntakeError::Draining);
        }
        if let (None, Some(queue)) = (req.wait, &self.queue) {
            return self.enqueue(req, queue, Origin::Caller).await;
        }
        let accepted = Instant::now();
        let action = req.action;
        let given = req.activation_id.is_some();
        let activation_id = req.activation_id.unwrap_or_else(invoker_wire::model::new_activation_id);
        let meta = accepted_now(&action, activation_id.clone(), req.subject);
        // An action with a reservation runs on it alone (capped by it in the pool), not on the
        // namespace's shared part.
        let slot = match action.reserved_concurrency() {
            Some(_) => None,
            None => Some(self.take_slot(&action.namespace).await?),
        };
        // A journal append (and, for a caller's id, an index lookup for an earlier delivery):
        // quick enough to call inline.
        if given {
            match self.store.accept(&meta)? {
                Accepted::New => {}
                // A scheduler's queued call that an earlier delivery here ended unrun (no room
                // in time, a container that could not be created): it keeps the call until one
                // starts it, so this delivery runs it (nothing ran twice), and its record
                // replaces the refusal.
                Accepted::Finished(record)
                    if req.start_notice.is_some() && record.namespace == meta.namespace && record.ran_nothing() =>
                {
                    self.store.accept_new(&meta)?
                }
                Accepted::Finished(record) if record.namespace == meta.namespace => {
                    return Ok(Invoked::Done(EncodedRecord::new(*record)))
                }
                Accepted::Pending { namespace } if namespace == meta.namespace => {
                    return Ok(self.await_existing(activation_id, &meta.namespace, req.wait).await)
                }
                Accepted::Finished(_) | Accepted::Pending { .. } => return Err(IntakeError::IdTaken(activation_id)),
            }
        } else {
            self.store.accept_new(&meta)?;
        }
        let (tx, rx) = oneshot::channel();
        let meta = Arc::new(meta);
        let trace = ActivationTrace::begin(req.traceparent, &meta, &self.process);
        let mut completion =
            Completion::new(self.store.clone(), self.metrics.clone(), meta.clone(), Some(tx), slot, trace);
        if let Some(whole) = req.whole {
            completion = completion.with_whole(whole);
        }
        let params = action.merged_params(req.params);
        let (stream, mut streamed) = match req.stream.filter(|_| req.wait.is_some()) {
            Some(format) => {
                let (started, streamed) = oneshot::channel();
                (Some(StreamRequest { format, started }), Some((format, streamed)))
            }
            None => (None, None),
        };
        let run = RunJob {
            meta: meta.clone(),
            action,
            params,
            request: req.request,
            api_key: req.api_key,
            transaction_id: req.transaction_id,
            accepted,
            completion,
            queued: None,
            start_notice: req.start_notice,
            stream,
        };
        let replied = |reply: Reply| match reply {
            Reply::Record(record) => Invoked::Done(record),
            Reply::Queued => Invoked::Accepted(activation_id.clone()),
        };
        if self.runner.submit(run).is_err() {
            // Answered at once, blocking or not: the record is written already.
            return Ok(match rx.await {
                Ok(reply) => replied(reply),
                Err(_) => Invoked::Accepted(activation_id),
            });
        }
        let Some(wait) = req.wait else { return Ok(Invoked::Accepted(activation_id)) };
        let answered = async {
            // A stream that starts answers the caller; a run that ends without one drops its
            // sender, and the record is the answer.
            let Some((format, started)) = streamed.take() else { return rx.await.map(replied) };
            tokio::select! {
                biased;
                reply = rx => reply.map(replied),
                Ok(start) = started => Ok(Invoked::Streaming { activation_id: activation_id.clone(), format, start }),
            }
        };
        match tokio::time::timeout(wait, answered).await {
            Ok(Ok(invoked)) => Ok(invoked),
            Ok(Err(_)) => Ok(self.await_existing(activation_id, &meta.namespace, Some(Duration::from_secs(1))).await),
            Err(_) => Ok(Invoked::Accepted(activation_id)),
        }
    }

    /// An asynchronous call: counted against the queue's bounds, journaled with what it takes
    /// to run it, handed to the pool as a patient job; answered once it is durable. It holds no
    /// namespace slot while it waits (it runs when the pool has room; the queue's per-namespace
    /// bound is what keeps one tenant from filling it).
    async fn enqueue(&self, req: InvokeRequest, queue: &AsyncQueue, origin: Origin) -> Result<Invoked, IntakeError> {
        let accepted = Instant::now();
        let action = req.action;
        let given = req.activation_id.is_some();
        let activation_id = req.activation_id.unwrap_or_else(invoker_wire::model::new_activation_id);
        let meta = accepted_now(&action, activation_id.clone(), req.subject);
        let settings = &queue.settings;
        let expires_at = invoker_job::queue::expires_at(&action, settings.max_event_age, meta.accepted_at);
        let retries = action.max_retry_attempts().unwrap_or(settings.max_retry_attempts);
        let request = req.request.as_deref().map(invoker_job::CallRequest::to_queued);
        let call = QueuedCall {
            meta,
            params: req.params,
            request,
            api_key: req.api_key,
            transaction_id: req.transaction_id,
            expires_at,
            attempt: 1,
            max_attempts: 1 + retries,
            retry_of: None,
            not_before: 0,
            // A destination's own call has none: an outcome never calls back in a loop.
            on_success: action.destination(invoker_wire::model::ON_SUCCESS).filter(|_| origin == Origin::Caller),
            on_failure: action.destination(invoker_wire::model::ON_FAILURE).filter(|_| origin == Origin::Caller),
        };
        // Strings, numbers and JSON values: encoding cannot fail.
        let json = serde_json::to_vec(&call).expect("a queued call serialises");
        let ticket = queue.counts.admit(&call.meta.namespace, json.len() as u64, call.meta.accepted_at, false)?;
        match self.store.enqueue(&call, &json, given)? {
            Accepted::New => {}
            Accepted::Finished(record) if record.namespace == call.meta.namespace => {
                return Ok(Invoked::Done(EncodedRecord::new(*record)))
            }
            Accepted::Pending { namespace } if namespace == call.meta.namespace => {
                return Ok(Invoked::Accepted(activation_id))
            }
            Accepted::Finished(_) | Accepted::Pending { .. } => return Err(IntakeError::IdTaken(activation_id)),
        }
        let queued = invoker_job::Queued { ticket, expires_at };
        let run = self.queued_run(call, json.into(), action, req.request, queued, accepted, req.traceparent, queue);
        self.hand_over_queued(run).await;
        Ok(Invoked::Accepted(activation_id))
    }

    /// Runs a queued call again: one an earlier run of this invoker accepted and never started,
    /// or a retry whose backoff passed (one still to wait goes to the retry loop). The action
    /// is read as it is now; one deleted since ends the call with a record saying so.
    pub async fn requeue(&self, call: QueuedCall) {
        let Some(queue) = &self.queue else { return };
        if call.not_before > epoch_ms() {
            let _ = queue.retries.send(invoker_job::QueueWork::Retry(Box::new(call)));
            return;
        }
        let action = match self.action_of(&call.meta.namespace, &call.meta.name).await {
            Ok(action) => action,
            Err(why) => return self.end_unrun(&call, &why),
        };
        // Strings, numbers and JSON values: encoding cannot fail.
        let json = serde_json::to_vec(&call).expect("a queued call serialises");
        // A retry waits from when its backoff ended, a call a restart found from its acceptance.
        let since = call.retry_of.as_ref().map_or(call.meta.accepted_at, |_| call.not_before);
        let Ok(ticket) = queue.counts.admit(&call.meta.namespace, json.len() as u64, since, true) else { return };
        let request = call.request.as_ref().map(|r| Arc::new(invoker_job::CallRequest::from_queued(r)));
        let expires_at = call.expires_at;
        let queued = invoker_job::Queued { ticket, expires_at };
        let run = self.queued_run(call, json.into(), action, request, queued, Instant::now(), None, queue);
        self.hand_over_queued(run).await;
    }

    /// Drives a dead letter again: a new call (a new activation id, its first attempt, its
    /// age from now) of the action as stored now, with the letter's parameters and request,
    /// by the queue's path. `api_key`: the caller's, for an action that asks for it.
    pub async fn redrive(
        &self,
        letter: &invoker_store::DeadLetter,
        api_key: Option<String>,
    ) -> Result<String, IntakeError> {
        if self.queue.is_none() {
            return Err(IntakeError::Draining);
        }
        let action =
            self.action_of(&letter.call.meta.namespace, &letter.call.meta.name).await.map_err(IntakeError::Gone)?;
        let request = letter.call.request.as_ref().map(|r| Arc::new(invoker_job::CallRequest::from_queued(r)));
        let req = InvokeRequest {
            api_key: api_key.filter(|_| action.provides_api_key()),
            action,
            params: letter.call.params.clone(),
            request,
            subject: letter.call.meta.subject.clone(),
            activation_id: None,
            transaction_id: invoker_wire::model::new_activation_id(),
            wait: None,
            traceparent: None,
            whole: None,
            start_notice: None,
            stream: None,
        };
        match self.invoke(req).await? {
            Invoked::Accepted(id) | Invoked::Streaming { activation_id: id, .. } => Ok(id),
            Invoked::Done(record) => Ok(record.head().activation_id.clone()),
        }
    }

    /// Calls `action` of `namespace` (a destination) asynchronously with `params` (the outcome
    /// of another call). One that cannot be called (deleted, the queue full) is said in the log.
    async fn call_destination(&self, namespace: &str, subject: String, action: &str, params: &Map<String, Value>) {
        let Some(queue) = &self.queue else { return };
        let target = match self.action_of(namespace, action).await {
            Ok(target) => target,
            Err(why) => return tracing::warn!(namespace, destination = action, "a destination was not called: {why}"),
        };
        let req = InvokeRequest {
            action: target,
            params: invoker_wire::params::Params::from_map(params),
            request: None,
            subject,
            api_key: None,
            activation_id: None,
            transaction_id: invoker_wire::model::new_activation_id(),
            wait: None,
            traceparent: None,
            whole: None,
            start_notice: None,
            stream: None,
        };
        if let Err(e) = self.enqueue(req, queue, Origin::Destination).await {
            tracing::warn!(namespace, destination = action, "a destination was not called: {e}");
        }
    }

    /// Ends a call that started in an earlier run and did not end: a whisk-error record written
    /// as a guess, and its next attempt queued if its policy allows. In a scheduler the call
    /// started on an invoker, which has its record: the guess waits to be replaced by it
    /// (returned, for the scheduler's round of guesses), and nothing is retried.
    pub fn interrupted(&self, call: QueuedCall) -> Option<invoker_wire::model::ActivationMeta> {
        if self.runner.records_elsewhere() {
            let meta = Arc::new(call.meta);
            let why = "the scheduler stopped while an invoker ran this call; its record is asked of the invokers";
            self.end_with(meta.clone(), invoker_wire::model::ActivationRecord::guess(&meta, why, epoch_ms()));
            return Some(Arc::unwrap_or_clone(meta));
        }
        let queue = self.queue.as_ref()?;
        let json = serde_json::to_vec(&call).expect("a queued call serialises");
        let retry = self.retry_of(&call, json.into(), queue);
        let meta = Arc::new(call.meta);
        let record = invoker_wire::model::ActivationRecord::guess(&meta, invoker_store::STOPPED_UNFINISHED, epoch_ms());
        let trace = ActivationTrace::begin(None, &meta, &self.process);
        let completion = Completion::new(self.store.clone(), self.metrics.clone(), meta, None, None, trace);
        completion.interrupted(retry).finish(record);
        None
    }

    /// The action a queued call runs, as stored now, or why there is none.
    async fn action_of(&self, namespace: &str, name: &str) -> Result<Arc<Action>, String> {
        let store = self.store.clone();
        let (ns, name) = (namespace.to_string(), name.to_string());
        match tokio::task::spawn_blocking(move || store.get_action(&ns, &name)).await {
            Ok(Ok(Some(action))) => Ok(action),
            Ok(Ok(None)) => Err("the action was deleted before this queued call could run".into()),
            Ok(Err(e)) => Err(format!("the action could not be read to run this queued call: {e}")),
            Err(e) => Err(format!("the action could not be read to run this queued call: {e}")),
        }
    }

    /// Ends a queued call that cannot run, with a record saying why.
    fn end_unrun(&self, call: &QueuedCall, why: &str) {
        let meta = Arc::new(call.meta.clone());
        self.end_with(meta.clone(), invoker_wire::model::ActivationRecord::whisk_error(&meta, why, epoch_ms()));
    }

    /// Ends an activation nobody waits on with `record`.
    fn end_with(&self, meta: Arc<ActivationMeta>, record: invoker_wire::model::ActivationRecord) {
        let trace = ActivationTrace::begin(None, &meta, &self.process);
        Completion::new(self.store.clone(), self.metrics.clone(), meta, None, None, trace).finish(record);
    }

    fn retry_of(&self, call: &QueuedCall, json: bytes::Bytes, queue: &AsyncQueue) -> invoker_job::Retry {
        invoker_job::Retry {
            call: json,
            link: call.retry_of.clone().map(|first| (first, call.attempt)),
            on_success: call.on_success.is_some(),
            backoff: queue.settings.retry_backoff,
            retries: queue.retries.clone(),
        }
    }

    /// The job of a queued call, its completion marked as in the queue, with its retry policy.
    #[allow(clippy::too_many_arguments)]
    fn queued_run(
        &self,
        call: QueuedCall,
        json: bytes::Bytes,
        action: Arc<Action>,
        request: Option<Arc<invoker_job::CallRequest>>,
        queued: invoker_job::Queued,
        accepted: Instant,
        traceparent: Option<TraceParent>,
        queue: &AsyncQueue,
    ) -> RunJob {
        let retry = self.retry_of(&call, json, queue);
        let QueuedCall { meta, params, api_key, transaction_id, retry_of, attempt, .. } = call;
        let meta = Arc::new(meta);
        let trace = ActivationTrace::begin(traceparent, &meta, &self.process);
        // A retry's span names the attempt it follows up: each attempt is a trace of its own.
        if let Some(first) = retry_of {
            trace.span().record("retry_of", first.as_str());
            trace.span().record("attempt", attempt);
        }
        let completion = Completion::new(self.store.clone(), self.metrics.clone(), meta.clone(), None, None, trace);
        RunJob {
            meta,
            params: action.merged_params(params),
            action,
            request,
            api_key,
            transaction_id,
            accepted,
            completion: completion.in_queue(retry),
            queued: Some(queued),
            start_notice: None,
            stream: None,
        }
    }

    /// Into the pool, waiting for room in its mailbox rather than refused: the call is durable
    /// already. A pool gone (the invoker stopping) leaves it queued for the next start. In a
    /// scheduler, into its action's line for an invoker.
    async fn hand_over_queued(&self, run: RunJob) {
        self.runner.submit_queued(run).await;
    }

    /// For a duplicate still running: polls the store for its record within the wait. Only a
    /// record of `namespace` is an answer.
    async fn await_existing(&self, id: String, namespace: &str, wait: Option<Duration>) -> Invoked {
        let deadline = Instant::now() + wait.unwrap_or_default();
        loop {
            let store = self.store.clone();
            let lookup = id.clone();
            if let Ok(Ok(Some(record))) = tokio::task::spawn_blocking(move || store.get_activation(&lookup)).await {
                if record.namespace == namespace {
                    return Invoked::Done(EncodedRecord::new(record));
                }
                return Invoked::Accepted(id);
            }
            if Instant::now() >= deadline {
                return Invoked::Accepted(id);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
