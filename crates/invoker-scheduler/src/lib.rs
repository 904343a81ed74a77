//! The scheduler (`invoker scheduler`): the front door of many invokers. Its API is the
//! invoker's REST subset over its own store; what differs is where an accepted activation runs.
//! [`Dispatcher`] places each one with the pure [`invoker_core::placement`] rules on the cluster as
//! [`view`] last read it from etcd, hands it to the chosen invoker's shim ([`send`]), tries
//! another when that one refused before running anything, and ends it with the record the
//! invoker returns (annotated with the invoker's id) or with a whisk-error record when the
//! invoker was lost: every activation the scheduler accepts ends with a record it serves.
//!
//! Its own crate, below the invoker's API and assembly: it takes its settings
//! ([`DispatcherSettings`]) rather than the invoker's config, and the jobs it runs are
//! `invoker_job`'s, as the pool's are.

#![forbid(unsafe_code)]

pub mod backlog;
pub mod caps;
pub mod demand;
pub mod guesses;
pub mod metrics;
pub mod presence;
pub mod provisioned;
mod publish;
mod relay;
pub mod send;
pub mod sends;
pub mod stalls;
pub mod view;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use invoker_core::placement::{place, ActionNeeds, NoPlacement, PlacementConfig};
use invoker_etcd::client::Etcd;
use invoker_etcd::kv::ClusterKv;
use invoker_etcd::mirror::Snapshot;
use invoker_job::runner::{KeepQueued, Kept, Refused, Runner};
use invoker_job::stream::StreamFormat;
use invoker_job::RunJob;
use invoker_telemetry::TraceParent;
use invoker_wire::cluster::{
    cluster_revision, controller_wait, drain_key, DrainMark, InvokerRecord, STREAM_AS_WRITTEN,
};
use invoker_wire::model::{
    epoch_ms, Action, ActivationMessage, ActivationRecord, ControllerIndex, KeyValue, MessageAction, MessageKey,
    MessageNamespace, MessageRequest, MessageUser, Rejection, RejectionKind,
};
use metrics::SchedulerMetrics;
use parking_lot::Mutex;
use send::{InvokerClient, Sent};
use sends::{RoomCorrection, SendKey, Sends};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::field::Empty;
use view::{ClusterView, Directory, RecordCache, RevisionKey};

/// A quiet prefix is still read into the directory this often (the grace of a registration
/// that went ends with time).
const QUIET_READING: Duration = Duration::from_secs(1);
/// How long a drain this scheduler wrote may take to come back through its watch before it
/// reads the prefix itself.
const OWN_WRITE_SEEN: Duration = Duration::from_secs(2);
/// A queued call every invoker refused in one round waits this long before the next.
const QUEUED_ROUND_PAUSE: Duration = Duration::from_secs(1);

/// The scheduler is at its `max_in_flight`: the activation was answered with a record.
#[derive(Debug)]
pub struct SchedulerBusy;

/// What a dispatcher is told: `[scheduler]`, and the few settings of the cluster, the pool and
/// the proxies its waits follow (the invoker's config checks them all).
#[derive(Clone, Debug)]
pub struct DispatcherSettings {
    /// Unique among the schedulers of one etcd.
    pub id: String,
    /// The cluster's etcd prefix.
    pub prefix: String,
    pub max_reschedules: u32,
    pub max_in_flight: u32,
    pub refresh_interval: Duration,
    pub placement: PlacementConfig,
    /// The pool's `wait_deadline`: with the action's timeout, how long an invoker's answer is
    /// awaited.
    pub wait_deadline: Duration,
    /// The proxies' `init_timeout`.
    pub init_timeout: Duration,
    pub handover_timeout: Duration,
    pub wait_for_room: Duration,
    /// How long an invoker last read healthy is still placed on after its registration went.
    pub registration_grace: Duration,
}

/// An invoker as `GET /v1/invokers` shows it.
#[derive(serde::Serialize)]
pub struct InvokerStatus {
    #[serde(flatten)]
    pub record: InvokerRecord,
    pub drained: bool,
    pub containers: u32,
    /// What this scheduler sent there that has not ended.
    pub in_flight: u32,
    /// It took no hand-over in time and has not answered a ping since: nothing new goes there.
    pub stalled: bool,
}

pub struct Dispatcher {
    id: String,
    kv: Etcd,
    prefix: String,
    max_reschedules: u32,
    max_in_flight: u32,
    refresh_interval: Duration,
    placement: PlacementConfig,
    /// The bounds an invoker's answer is awaited within, with the action's timeout
    /// ([`invoker_wire::cluster::controller_wait`], and 10 s more for the way back).
    wait_deadline: Duration,
    init_timeout: Duration,
    /// How long an invoker has to ask for a message ([`send`]).
    handover_timeout: Duration,
    /// How long an activation waits for an invoker with room.
    wait_for_room: Duration,
    /// What this scheduler needs of the fleet, for the capacity manager.
    pub demand: Arc<demand::DemandLedger>,
    directory: Directory,
    /// The prefix as this scheduler's watch keeps it, once `refresh` runs.
    snapshots: Mutex<Option<tokio::sync::watch::Receiver<Snapshot>>>,
    /// The `seq` of the snapshot last taken into the directory (an older one is not taken),
    /// and the registrations as then decoded.
    taken: Mutex<(u64, RecordCache)>,
    stalls: stalls::Stalls,
    client: Arc<InvokerClient>,
    in_flight: Mutex<InFlight>,
    /// A send ended: the room it held may be free ([`sends`]), and the calls waiting for room
    /// look again at once rather than at their next refresh.
    ended: tokio::sync::Notify,
    /// Activations between `submit` and their end.
    active: AtomicU32,
    /// The state of the random draws of placement (xorshift).
    draws: AtomicU64,
    /// Records written as guesses, waiting for the invoker's record to replace them.
    guesses: Arc<guesses::Guesses>,
    /// Queued calls waiting for an invoker with room, in lines by action.
    backlog: backlog::Backlog,
    /// What each capped action has running through this scheduler.
    caps: caps::Caps,
    /// The actions of its store that keep provisioned containers on the invokers.
    pub provisioned: provisioned::Provisioned,
    pub metrics: SchedulerMetrics,
    /// Where a blocking call that found no room within `wait_for_room` is kept (the intake's
    /// durable queue), rather than refused; set once, when the intake is made.
    keeper: std::sync::OnceLock<Arc<dyn KeepQueued>>,
}

/// What this scheduler has sent and not seen end, per invoker and per action revision there.
#[derive(Default)]
struct InFlight {
    per_revision: HashMap<RevisionKey, BTreeMap<String, u32>>,
    /// Per invoker, each hand-over out and those ended lately: placement corrects the room
    /// the invoker's record shows by them, and `GET /v1/invokers` counts those out.
    sends: HashMap<String, Sends>,
    sent: u64,
}

impl Dispatcher {
    /// `controller_key` is what the invokers' shims take from their schedulers.
    pub fn new(settings: DispatcherSettings, kv: Etcd, controller_key: &str) -> Self {
        let s = settings;
        Dispatcher {
            id: s.id,
            kv,
            prefix: s.prefix,
            max_reschedules: s.max_reschedules,
            max_in_flight: s.max_in_flight,
            refresh_interval: s.refresh_interval,
            placement: s.placement,
            wait_deadline: s.wait_deadline,
            init_timeout: s.init_timeout,
            handover_timeout: s.handover_timeout,
            wait_for_room: s.wait_for_room,
            demand: Arc::default(),
            directory: Directory::new(s.registration_grace),
            snapshots: Mutex::default(),
            taken: Mutex::default(),
            stalls: stalls::Stalls::default(),
            client: Arc::new(InvokerClient::new(controller_key)),
            in_flight: Mutex::default(),
            ended: tokio::sync::Notify::new(),
            active: AtomicU32::new(0),
            draws: AtomicU64::new(u64::from(std::process::id()) << 32 | u64::from(epoch_ms() as u32) | 1),
            guesses: Arc::default(),
            backlog: backlog::Backlog::default(),
            caps: caps::Caps::default(),
            provisioned: provisioned::Provisioned::default(),
            metrics: SchedulerMetrics::default(),
            keeper: std::sync::OnceLock::new(),
        }
    }

    /// Keeps the blocking calls no invoker had room for within `wait_for_room` in `keeper`
    /// (the intake's durable queue): each is answered 202 and runs when there is room, rather
    /// than being refused with a 503. Without one they are refused.
    pub fn keep_queued_in(&self, keeper: Arc<dyn KeepQueued>) {
        let _ = self.keeper.set(keeper);
    }

    /// Activations accepted and not yet ended.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Acquire)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Takes `run` on its way to an invoker; at `max_in_flight`, ends it with a record.
    pub fn submit(self: &Arc<Self>, run: RunJob) -> Result<(), SchedulerBusy> {
        if self.active.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.active.fetch_sub(1, Ordering::AcqRel);
            let message =
                format!("the scheduler has {} activations in flight, its limit; nothing ran", self.max_in_flight);
            run.reject_because(Rejection::QueueFull, &message);
            return Err(SchedulerBusy);
        }
        let dispatcher = self.clone();
        // Boxed: the dispatch's state is kilobytes, which the task would otherwise copy as it
        // is spawned and polled.
        tokio::spawn(Box::pin(async move {
            dispatcher.dispatch(run).await;
            dispatcher.active.fetch_sub(1, Ordering::AcqRel);
        }));
        Ok(())
    }

    /// Takes a queued (asynchronous) call, journaled already: it waits in its action's line for
    /// an invoker with room for as long as its age allows, never refused for being busy, and
    /// stays this scheduler's until an invoker says a container took it.
    pub fn submit_queued(self: &Arc<Self>, run: RunJob) {
        let dispatcher = self.clone();
        tokio::spawn(Box::pin(async move { dispatcher.dispatch(run).await }));
    }

    async fn dispatch(self: &Arc<Self>, mut run: RunJob) {
        let action = &run.action;
        let revision = cluster_revision(&self.id, action.revision, action.updated);
        let key: RevisionKey = (action.namespace.clone(), action.name.clone(), revision);
        let needs = needs_of(action);
        let invoker_wait = Duration::from_millis(action.limits.timeout);
        let timeout = controller_wait(invoker_wait, self.wait_deadline, self.init_timeout) + Duration::from_secs(10);
        let mut tried = BTreeSet::new();
        let mut refusals = Vec::new();
        let mut tags = needs.tags.clone();
        tags.sort_unstable();
        // A queued call: in its action's line until it is handed over, tried until its age
        // passes, and kept here until an invoker says it started.
        let expires_at = run.queued.as_ref().map(|q| q.expires_at);
        let mut line = None;
        let mut permit = None;
        let mut placed_before = false;
        let mut attempt = 0;
        loop {
            if attempt > self.max_reschedules {
                if expires_at.is_none() {
                    break;
                }
                // Every invoker refused it this round: a pause, and another round.
                attempt = 0;
                tried.clear();
                refusals.clear();
                tokio::time::sleep(QUEUED_ROUND_PAUSE).await;
            }
            let until = match expires_at {
                Some(expires_at) => Instant::now() + Duration::from_millis(expires_at.saturating_sub(epoch_ms())),
                None => Instant::now() + self.wait_for_room,
            };
            if expires_at.is_some() {
                // In line (one handed over that came back unstarted goes first of it), and
                // never past its age.
                let in_line = line.insert(self.backlog.join(&key, placed_before, &self.demand, &tags, needs.memory_mb));
                if tokio::time::timeout_at(until.into(), in_line.first()).await.is_err() {
                    let message = self.expired(&run, "it waited in its action's line");
                    return run.reject_because(Rejection::Deadline, &with_refusals(message, &refusals));
                }
            }
            // Within this scheduler's share of the action's cap, held until it ends: a blocking
            // call waits its bounded time, a queued one (first of its line) its age.
            if let (Some(cap), None) = (run.action.max_concurrency(), &permit) {
                let share = || caps::share(cap, self.directory.current().schedulers.len());
                let bound = match expires_at {
                    Some(_) => until,
                    None => Instant::now() + self.wait_deadline,
                };
                if self.caps.running(&key.0, &key.1) >= share() {
                    self.metrics.capped_waits.inc();
                    run.completion.trace().span().record("capped", cap);
                }
                match self.caps.pass(&key.0, &key.1, share, bound).await {
                    Ok(passed) => permit = Some(passed),
                    Err(caps::AtCap) if expires_at.is_some() => {
                        let message = self.expired(&run, "its action ran its max-concurrency meanwhile");
                        return run.reject_because(Rejection::Deadline, &message);
                    }
                    Err(caps::AtCap) => {
                        let rejection = Rejection::Capped { cap };
                        return run.reject_because(rejection, &rejection.message());
                    }
                }
            }
            attempt += 1;
            let placing = invoker_telemetry::stage_span!(
                run.completion.trace(),
                "placement",
                attempt = attempt - 1,
                invoker = Empty,
                rule = Empty,
                "otel.status_code" = Empty,
                "otel.status_description" = Empty
            );
            let placed = self.place_or_wait(&key, &needs, &tags, &tried, until, expires_at.is_none()).await;
            let (view, chosen) = match placed {
                Ok(placed) => placed,
                Err(why) if expires_at.is_some() => {
                    let message = self.expired(&run, &why.to_string());
                    invoker_telemetry::failed(&placing, &message);
                    return run.reject_because(Rejection::Deadline, &with_refusals(message, &refusals));
                }
                Err(why) => {
                    // Past its wait on a fleet that may have room later: kept in the queue,
                    // its caller answered 202.
                    let (run, not_kept) = match self.keeper_for(&why, &needs) {
                        Ok(keeper) => match keeper.keep(run) {
                            Kept::Queued(queued) => {
                                self.metrics.kept_queued.inc();
                                drop(placing);
                                return self.submit_queued(queued);
                            }
                            Kept::NotTaken(run, because) => (run, Some(format!("not kept in the queue: {because}"))),
                        },
                        Err(never) => (run, never),
                    };
                    invoker_telemetry::failed(&placing, &why.to_string());
                    self.metrics.unavailable(Some(&why));
                    self.demand.refused(&tags, needs.memory_mb);
                    let mut message = with_refusals(why.to_string(), &refusals);
                    if let Some(because) = not_kept {
                        message = format!("{message}; {because}");
                    }
                    return run.reject_because(Rejection::NoInvoker, &message);
                }
            };
            // Placed: the next of its line may go.
            line = None;
            placed_before = true;
            if attempt > 1 {
                self.metrics.reschedules.inc();
            }
            self.metrics.placed(chosen.rule);
            let invoker = chosen.invoker;
            placing.record("invoker", invoker.as_str());
            placing.record("rule", tracing::field::debug(chosen.rule));
            drop(placing);
            let Some(authority) = view.invokers.get(&invoker).and_then(|r| invoker_wire::cluster::authority(&r.api))
            else {
                refusals.push(format!("{invoker}: its address is not http://host:port"));
                tried.insert(invoker);
                continue;
            };
            // Gone between the placement and now: nothing was sent.
            let Some(departure) = self.directory.departure(&invoker) else {
                refusals.push(format!("{invoker}: it left the cluster"));
                tried.insert(invoker);
                continue;
            };
            let handing = invoker_telemetry::stage_span!(
                run.completion.trace(),
                "handover",
                "otel.kind" = "client",
                invoker = invoker.as_str(),
                "otel.status_code" = Empty,
                "otel.status_description" = Empty
            );
            let message = self.message(&run, revision, run.completion.trace().pass_on(&handing));
            let send = self.enter(&invoker, &key, needs.memory_mb);
            self.demand.add(&tags, demand::Stage::InFlight, needs.memory_mb);
            let mut started = false;
            let mut on_started = || {
                // Journaled before anything else: a restart of this scheduler never hands it
                // over again as if it had not started.
                started = true;
                run.queued.take();
                run.completion.started();
            };
            let on_started = expires_at.is_some().then_some(&mut on_started as &mut (dyn FnMut() + Send));
            // A blocking call whose caller takes a stream (of values, or of a function's bytes as
            // it writes them) asks the invoker for one.
            let stream_to = run.stream.as_ref().filter(|_| expires_at.is_none()).map(|s| match s.format {
                StreamFormat::AsWritten => STREAM_AS_WRITTEN,
                format => format.content_type(),
            });
            let handing_over =
                self.client.send(authority, message, self.handover_timeout, timeout, on_started, stream_to);
            let sent = tokio::select! {
                sent = handing_over => sent,
                _ = departure.cancelled() => Sent::Lost("it left the cluster (its lease expired)".into()),
            };
            if let Some(reason) = sent.failure() {
                invoker_telemetry::failed(&handing, reason);
            }
            drop(handing);
            self.leave(&invoker, &key, send);
            self.demand.remove(&tags, demand::Stage::InFlight, needs.memory_mb);
            match sent {
                // A queued call an invoker held back for the action's cap ran nothing: it
                // stays queued, first of its line.
                Sent::Finished(finished)
                    if expires_at.is_some() && finished.head().rejection_kind == Some(RejectionKind::Capped) =>
                {
                    refusals.push(format!("{invoker}: the action was at its max-concurrency there"));
                    tried.insert(invoker);
                }
                Sent::Finished(finished) => return run.completion.finish_encoded(finished.ran_on(&invoker)),
                // The result before the logs: the caller is answered now, the record stored
                // whole when the invoker sends it (as it answered, if it never does).
                Sent::Answered { answer, whole } => {
                    let ran_on = KeyValue { key: "invoker".into(), value: json!(invoker) };
                    let mut answer = *answer;
                    answer.annotations.push(ran_on.clone());
                    run.completion.answer(&mut answer);
                    // Off the dispatch: the activation no longer counts as in flight here.
                    tokio::spawn(async move {
                        let mut record = whole.await.ok().flatten().unwrap_or(answer);
                        record.annotations.retain(|a| a.key != "invoker");
                        record.annotations.push(ran_on);
                        run.completion.finish(record);
                    });
                    return;
                }
                // The values as they come, through a task of its own; the record after them.
                Sent::Streaming { headers, body } => {
                    let Some(stream) = run.stream.take() else {
                        let message = format!("invoker {invoker} streamed an answer nobody asked for");
                        let record = ActivationRecord::guess(&run.meta, &message, epoch_ms());
                        return run.completion.finish(record);
                    };
                    let ends = relay::Ends { client: self.client.clone(), guesses: self.guesses.clone() };
                    let authority = authority.to_string();
                    let answer = relay::Answer { headers, body };
                    tokio::spawn(relay::relay(ends, run, stream, answer, invoker.to_string(), authority, timeout));
                    return;
                }
                Sent::Refused(reason) => {
                    refusals.push(format!("{invoker}: {reason}"));
                    tried.insert(invoker);
                }
                Sent::Unheard(reason) => {
                    self.metrics.unheard.inc();
                    if self.stalls.mark(&invoker) {
                        tracing::warn!(%invoker, "an invoker took no hand-over in {:?}; nothing new goes there until it answers", self.handover_timeout);
                        self.probe(&invoker, authority);
                    }
                    refusals.push(format!("{invoker}: {reason}"));
                    tried.insert(invoker);
                }
                // A queued call that did not start there: the invoker starts nothing whose caller
                // is gone, so it goes elsewhere, first of its line.
                Sent::Lost(reason) if expires_at.is_some() && !started => {
                    refusals.push(format!("{invoker}: lost before it started the call ({reason})"));
                    tried.insert(invoker);
                }
                Sent::Lost(reason) => {
                    self.metrics.lost.inc();
                    let message = match expires_at {
                        Some(_) => format!(
                            "invoker {invoker} was lost while it ran the call ({reason}); it may have run, so \
                             its retry policy decides whether it runs again"
                        ),
                        None => format!(
                            "invoker {invoker} was lost while it held the activation ({reason}); it may have \
                             started, so it is not run again"
                        ),
                    };
                    let mut record = ActivationRecord::guess(&run.meta, &message, epoch_ms());
                    record.annotations.push(KeyValue { key: "invoker".into(), value: json!(invoker) });
                    self.guesses.add(&run.meta.activation_id, Some(&invoker), Instant::now());
                    return run.completion.finish(record);
                }
            }
        }
        self.metrics.unavailable(None);
        let message = with_refusals(format!("no invoker took the activation in {} tries", tried.len()), &refusals);
        run.reject_because(Rejection::NoInvoker, &message);
    }

    /// Where a blocking call that found no room within its wait goes instead of a refusal:
    /// the intake's queue, unless this scheduler waits for no room at all (`wait_for_room` 0,
    /// a cluster that does not grow) or the call can never fit: invokers are registered and
    /// none has a node of its memory. Whether more invokers may come is the capacity
    /// manager's to know, not this scheduler's: one at its group's `max` leaves the call to
    /// wait for room that calls ending free, within its maximum event age.
    /// `Err` says why it is refused instead, where there is more to say than `why`.
    fn keeper_for(&self, why: &NoPlacement, needs: &ActionNeeds) -> Result<&Arc<dyn KeepQueued>, Option<String>> {
        if self.wait_for_room.is_zero() {
            return Err(None);
        }
        if matches!(why, NoPlacement::NoneFits(_)) {
            let view = self.directory.current();
            let largest = view.invokers.values().flat_map(|r| r.nodes.iter().map(|n| n.capacity_mb)).max();
            if let Some(largest) = largest.filter(|&mb| mb < needs.memory_mb) {
                return Err(Some(format!(
                    "no invoker of the cluster has a node of {} MB (the largest holds {largest} MB): it can never \
                     run here",
                    needs.memory_mb
                )));
            }
        }
        self.keeper.get().ok_or(None)
    }

    /// Why a queued call ends unstarted: its age passed (`while`: what it was waiting for).
    fn expired(&self, run: &RunJob, while_: &str) -> String {
        let expires_at = run.queued.as_ref().map_or(0, |q| q.expires_at);
        let age = Duration::from_millis(expires_at.saturating_sub(run.meta.accepted_at));
        format!("the call was not started within its maximum event age ({}): {while_}", humantime::format_duration(age))
    }

    /// Asks the invokers for the records of the activations this scheduler wrote guesses for
    /// (`recovered`: those a restart found unfinished, held by an invoker not known), and
    /// replaces each guess with the record found, until `stop` ([`guesses`]).
    pub async fn confirm_guesses(
        self: Arc<Self>,
        store: Arc<dyn invoker_store::Store>,
        recovered: Vec<invoker_wire::model::ActivationMeta>,
        stop: CancellationToken,
    ) {
        let started = Instant::now();
        for meta in &recovered {
            self.guesses.add(&meta.activation_id, None, started);
        }
        let mut pause = guesses::FIRST_ROUND;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            let round = self.guesses.round(Instant::now());
            if round.is_empty() {
                pause = guesses::FIRST_ROUND;
                continue;
            }
            let found = self.ask_for_records(&round).await;
            let mut replaced = 0;
            for (invoker, record) in found {
                replaced += u32::from(self.replace_guess(&store, &invoker, record).await);
            }
            pause = if replaced > 0 { guesses::FIRST_ROUND } else { (pause * 2).min(guesses::LAST_ROUND) };
        }
    }

    /// The records the invokers in the view hold of the round's activations, by invoker.
    async fn ask_for_records(&self, round: &guesses::Round) -> Vec<(String, ActivationRecord)> {
        let view = self.directory.current();
        let mut found = Vec::new();
        for (invoker, registration) in &view.invokers {
            let Some(authority) = invoker_wire::cluster::authority(&registration.api) else { continue };
            let mut ids = round.of_all.clone();
            ids.extend(round.of.get(invoker).into_iter().flatten().cloned());
            for chunk in ids.chunks(invoker_wire::cluster::MAX_RECORDS_ASKED) {
                if let Some(records) = self.client.records(authority, chunk, Duration::from_secs(2)).await {
                    found.extend(records.into_iter().map(|r| (invoker.clone(), r)));
                }
            }
        }
        found
    }

    /// Puts `record` (from `invoker`) in the place of this scheduler's guess of the same
    /// activation, if the guess is still there and of the same action; whether it did.
    async fn replace_guess(
        &self,
        store: &Arc<dyn invoker_store::Store>,
        invoker: &str,
        mut record: ActivationRecord,
    ) -> bool {
        let id = record.activation_id.clone();
        let (reading, wanted) = (store.clone(), id.clone());
        let mine = tokio::task::spawn_blocking(move || reading.get_activation(&wanted)).await;
        let Ok(Ok(Some(mine))) = mine else { return false };
        let same = mine.namespace == record.namespace && mine.name == record.name;
        if !mine.is_guess() || !same || record.is_guess() {
            if !same {
                tracing::warn!(activation = %id, %invoker, "an invoker's record of another action under this id: the guess stands");
            }
            self.guesses.settle(&id);
            return false;
        }
        if !self.guesses.settle(&id) {
            return false;
        }
        record.annotations.retain(|a| a.key != "invoker");
        record.annotations.push(KeyValue { key: "invoker".into(), value: json!(invoker) });
        let writing = store.clone();
        match tokio::task::spawn_blocking(move || writing.finish(&record.into())).await {
            Ok(Ok(())) => {
                self.metrics.guesses_replaced.inc();
                tracing::info!(activation = %id, %invoker, "a guessed record replaced by the invoker's record of what ran");
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(activation = %id, "replacing a guess with the invoker's record: {e}");
                false
            }
            Err(_) => false,
        }
    }

    /// An invoker for the activation, on the cluster as last read; when none has room (or none
    /// has the tags, or none is healthy), the placement is tried again at each new reading
    /// until `until`, the activation counted as waiting meanwhile if `count_waiting` (a queued
    /// call counts from its line).
    async fn place_or_wait(
        &self,
        key: &RevisionKey,
        needs: &ActionNeeds,
        tags: &[String],
        tried: &BTreeSet<String>,
        until: Instant,
        count_waiting: bool,
    ) -> Result<(Arc<ClusterView>, invoker_core::placement::Placement), NoPlacement> {
        let mut waiting_since: Option<Instant> = None;
        let mut readings = self.directory.readings();
        let placed = loop {
            // Taken before the look, so that an end between the look and the wait wakes it.
            let ended = self.ended.notified();
            let view = self.directory.current();
            let (in_flight, corrections) = {
                let mut in_flight = self.in_flight.lock();
                let corrections = self.room_corrections(&mut in_flight, &view);
                (in_flight.per_revision.get(key).cloned().unwrap_or_default(), corrections)
            };
            let views = view.views(key, &in_flight, &corrections, &self.stalls.ids());
            match place(&views, needs, &self.placement, tried, &mut |n| self.draw(n)) {
                Ok(chosen) => break Ok((view, chosen)),
                Err(why) if Instant::now() >= until => break Err(why),
                Err(why) => {
                    waiting_since.get_or_insert_with(|| {
                        if count_waiting {
                            self.demand.add(tags, demand::Stage::Waiting, needs.memory_mb);
                        }
                        Instant::now()
                    });
                    if Instant::now() >= until {
                        break Err(why);
                    }
                    // A new reading (an invoker with room, one more invoker), or one of this
                    // scheduler's own sends ended; at the latest after a refresh interval.
                    let wait = self.refresh_interval.min(until - Instant::now());
                    let _ = tokio::time::timeout(wait, async {
                        tokio::select! {
                            _ = readings.changed() => {}
                            () = ended => {}
                        }
                    })
                    .await;
                }
            }
        };
        if let Some(since) = waiting_since {
            if count_waiting {
                self.demand.remove(tags, demand::Stage::Waiting, needs.memory_mb);
            }
            self.metrics.room_wait_seconds.observe(since.elapsed().as_secs_f64());
        }
        placed
    }

    /// OpenWhisk's `ActivationMessage`, naming this scheduler and the action's cluster revision
    /// (an invoker fetches the action by them). Serialised from borrowed fields: the
    /// parameters are not copied into a JSON tree first.
    fn message(&self, run: &RunJob, revision: u64, traceparent: Option<TraceParent>) -> Bytes {
        let meta = &run.meta;
        let message = ActivationMessage {
            transid: serde_json::json!([run.transaction_id, meta.accepted_at]),
            action: MessageAction {
                path: Cow::Borrowed(&meta.namespace),
                name: Cow::Borrowed(&meta.name),
                version: Some(Cow::Borrowed(&meta.version)),
            },
            revision: Some(Cow::Owned(revision.to_string())),
            user: MessageUser {
                subject: Cow::Borrowed(&meta.subject),
                namespace: MessageNamespace { name: Cow::Borrowed(&meta.namespace) },
                authkey: run.api_key.as_deref().map(|api_key| MessageKey { api_key: Cow::Borrowed(api_key) }),
            },
            activation_id: Cow::Borrowed(&meta.activation_id),
            root_controller_index: Some(ControllerIndex {
                as_string: Cow::Borrowed(&self.id),
                instance_type: Some(Cow::Borrowed("controller")),
            }),
            blocking: true,
            content: Some(Cow::Borrowed(&run.params)),
            request: run.request.as_deref().map(|r| MessageRequest {
                headers: r
                    .headers
                    .iter()
                    .map(|(n, v)| (Cow::Borrowed(n.as_str()), Cow::Borrowed(v.as_str())))
                    .collect(),
                body: Cow::Owned(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &r.body)),
            }),
            trace_context: traceparent.map(|t| {
                BTreeMap::from([(Cow::Borrowed(invoker_telemetry::HEADER), Cow::Owned(t.as_str().to_string()))])
            }),
        };
        Bytes::from(serde_json::to_vec(&message).expect("a message serialises"))
    }

    /// Each invoker's room as its record shows it, corrected by this scheduler's sends there
    /// ([`sends`]): a record is read at most a refresh after it was published. The ends kept
    /// for an invoker no longer in the view go.
    fn room_corrections(&self, in_flight: &mut InFlight, view: &ClusterView) -> BTreeMap<String, RoomCorrection> {
        let mut corrections = BTreeMap::new();
        in_flight.sends.retain(|invoker, sends| {
            match view.changed.get(invoker) {
                Some(read_at) => {
                    let correction = sends.correction(*read_at, self.refresh_interval);
                    if correction != RoomCorrection::default() {
                        corrections.insert(invoker.clone(), correction);
                    }
                }
                None => sends.forget_ended(),
            }
            !sends.is_empty()
        });
        corrections
    }

    fn enter(&self, invoker: &str, key: &RevisionKey, memory_mb: u64) -> SendKey {
        let mut in_flight = self.in_flight.lock();
        in_flight.sent += 1;
        let send = (Instant::now(), in_flight.sent);
        in_flight.sends.entry(invoker.to_string()).or_default().send(send, memory_mb);
        *in_flight.per_revision.entry(key.clone()).or_default().entry(invoker.to_string()).or_insert(0) += 1;
        self.metrics.in_flight.get_or_create(&metrics::InvokerLabel { invoker: invoker.to_string() }).inc();
        send
    }

    fn leave(&self, invoker: &str, key: &RevisionKey, send: SendKey) {
        let shown_before = self
            .directory
            .current()
            .changed
            .get(invoker)
            .map(|read_at| sends::shown_before(*read_at, self.refresh_interval));
        let mut in_flight = self.in_flight.lock();
        if let Some(sends) = in_flight.sends.get_mut(invoker) {
            sends.end(send, Instant::now(), shown_before);
        }
        self.ended.notify_waiters();
        if let Some(per) = in_flight.per_revision.get_mut(key) {
            if let Some(n) = per.get_mut(invoker) {
                *n -= 1;
                if *n == 0 {
                    per.remove(invoker);
                }
            }
            if per.is_empty() {
                in_flight.per_revision.remove(key);
            }
        }
        self.metrics.in_flight.get_or_create(&metrics::InvokerLabel { invoker: invoker.to_string() }).dec();
    }

    /// Pings a stalled invoker until it answers (it is placed on again) or leaves the cluster.
    fn probe(self: &Arc<Self>, invoker: &str, authority: &str) {
        let (dispatcher, invoker, authority) = (self.clone(), invoker.to_string(), authority.to_string());
        tokio::spawn(async move {
            loop {
                if !dispatcher.knows(&invoker) {
                    dispatcher.stalls.clear(&invoker);
                    return;
                }
                if dispatcher.client.ping(&authority, stalls::PING_TIMEOUT).await {
                    if let Some(stalled) = dispatcher.stalls.clear(&invoker) {
                        tracing::info!(%invoker, "a stalled invoker answers again after {stalled:?}");
                    }
                    return;
                }
                tokio::time::sleep(stalls::PING_INTERVAL).await;
            }
        });
    }

    /// A random index below `n` (xorshift64*: placement needs spread, not secrecy).
    fn draw(&self, n: usize) -> usize {
        let mut x = self.draws.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.draws.store(x, Ordering::Relaxed);
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }

    /// The registered invokers, as last read, with what this scheduler has in flight there.
    pub fn invokers(&self) -> Vec<InvokerStatus> {
        let view = self.directory.current();
        let in_flight: HashMap<String, u32> =
            self.in_flight.lock().sends.iter().map(|(id, sends)| (id.clone(), sends.out() as u32)).collect();
        view.invokers
            .values()
            .map(|r| InvokerStatus {
                record: r.clone(),
                drained: view.drained.contains(&r.id),
                containers: view.containers.get(&r.id).copied().unwrap_or(0),
                in_flight: in_flight.get(&r.id).copied().unwrap_or(0),
                stalled: self.stalls.contains(&r.id),
            })
            .collect()
    }

    /// Tells every registered invoker that `ns/name` was deleted (`kept: None`) or saved as
    /// `kept`, so that its idle containers of other revisions go now. Best effort and bounded:
    /// an invoker that misses it never reuses them anyway (a revision never repeats), it only
    /// keeps them until its keep-alive ends.
    pub async fn retire_action(&self, ns: &str, name: &str, kept: Option<&invoker_wire::model::Action>) {
        let view = self.directory.current();
        let keep = kept.map(|a| cluster_revision(&self.id, a.revision, a.updated));
        let mut path = format!(
            "/v1/internal/actions/{}/{}",
            percent_encoding::utf8_percent_encode(ns, percent_encoding::NON_ALPHANUMERIC),
            percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC)
        );
        if let Some(keep) = keep {
            path.push_str(&format!("?keep={keep}"));
        }
        let told = view.invokers.values().filter_map(|r| invoker_wire::cluster::authority(&r.api)).map(|authority| {
            let path = path.as_str();
            async move {
                if !self.client.retire(authority, path, Duration::from_secs(2)).await {
                    tracing::info!(invoker = authority, "an invoker was not told of a deleted or updated action");
                }
            }
        });
        futures_util::future::join_all(told).await;
    }

    /// Whether `id` is registered, as last read.
    pub fn knows(&self, id: &str) -> bool {
        self.directory.current().invokers.contains_key(id)
    }

    /// Whether any invoker would take work now.
    pub fn any_healthy(&self) -> bool {
        let view = self.directory.current();
        view.invokers.values().any(|r| {
            r.health == invoker_wire::cluster::Health::Healthy
                && !view.drained.contains(&r.id)
                && !self.stalls.contains(&r.id)
        })
    }

    /// Marks `invoker` drained (`drain`) or takes it back, for every scheduler (the key lives in
    /// etcd, and the invoker keeps the operator's word should etcd lose it); this scheduler's
    /// view follows at once.
    pub async fn set_drained(&self, invoker: &str, drain: bool) -> Result<(), invoker_etcd::client::EtcdError> {
        let key = drain_key(&self.prefix, invoker);
        self.kv.put(&key, &DrainMark::operator(drain, epoch_ms()).to_value(), None).await?;
        let seen = |s: &Snapshot| s.current && s.entries.get(&key).is_some_and(|v| DrainMark::read(v).drained == drain);
        let snapshots = self.snapshots.lock().clone();
        if let Some(mut snapshots) = snapshots {
            if let Ok(Ok(snapshot)) = tokio::time::timeout(OWN_WRITE_SEEN, snapshots.wait_for(seen)).await {
                let snapshot = snapshot.clone();
                self.take(&snapshot);
                return Ok(());
            }
        }
        // No watch yet, or it lags: read the prefix once.
        let view = ClusterView::read(&self.kv, &self.prefix).await?;
        self.take_view(view);
        Ok(())
    }

    /// Takes a snapshot of the watch into the directory, unless a later one was taken.
    fn take(&self, snapshot: &Snapshot) {
        let mut taken = self.taken.lock();
        let (seq, cache) = &mut *taken;
        if snapshot.seq < *seq {
            return;
        }
        *seq = snapshot.seq;
        let entries = snapshot.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        self.take_view(ClusterView::from_entries(&self.prefix, entries, cache));
    }

    fn take_view(&self, view: ClusterView) {
        let before = self.directory.current();
        for (id, record) in &before.invokers {
            if view.invokers.get(id).is_none_or(|r| r.api != record.api) {
                if let Some(authority) = invoker_wire::cluster::authority(&record.api) {
                    self.client.forget(authority);
                }
            }
        }
        self.metrics.schedulers.set(view.schedulers.len() as i64);
        self.directory.update(view);
    }

    /// Watches the cluster's prefix until `stop`, and takes each change into the directory: at
    /// once after a quiet spell, then at most once per `refresh_interval` (a busy cluster's
    /// changes cost a bounded CPU), and at least every `QUIET_READING` (a registration's grace
    /// ends with time, not with a change). While etcd cannot be read the picture stays as
    /// last seen (activations go on to the invokers already known).
    pub async fn refresh(self: Arc<Self>, stop: CancellationToken) {
        let mut snapshots = self.kv.mirror(&format!("{}/", self.prefix), stop.clone());
        *self.snapshots.lock() = Some(snapshots.clone());
        let mut counted_ranges = 0;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = tokio::time::timeout(QUIET_READING, snapshots.changed()) => {
                    if let Ok(Err(_)) = changed {
                        return;
                    }
                }
            }
            let snapshot = snapshots.borrow_and_update().clone();
            if snapshot.current {
                self.take(&snapshot);
            }
            self.metrics.etcd_ranges.inc_by(snapshot.ranges - counted_ranges);
            counted_ranges = snapshot.ranges;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.refresh_interval) => {}
            }
        }
    }
}

fn with_refusals(why: String, refusals: &[String]) -> String {
    if refusals.is_empty() {
        why
    } else {
        format!("{why}; refused by {}", refusals.join("; "))
    }
}

/// Where a scheduler's intake hands its activations: its dispatcher, which runs them on its
/// invokers (a handle of its own, as the dispatcher's methods take the `Arc` they spawn with).
pub struct SchedulerRunner(pub Arc<Dispatcher>);

impl Runner for SchedulerRunner {
    fn submit(&self, run: RunJob) -> Result<(), Refused> {
        self.0.submit(run).map_err(|_| Refused::SchedulerFull)
    }

    fn submit_queued(&self, run: RunJob) -> BoxFuture<'_, ()> {
        self.0.submit_queued(run);
        Box::pin(std::future::ready(()))
    }

    fn retire_action<'a>(&'a self, namespace: &'a str, name: &'a str, kept: Option<&'a Action>) -> BoxFuture<'a, ()> {
        if kept.is_none() {
            self.0.provisioned.forget(namespace, name);
        }
        Box::pin(self.0.retire_action(namespace, name, kept))
    }

    fn provision(&self, action: Arc<Action>, count: u32) -> BoxFuture<'_, ()> {
        self.0.provisioned.set(action, count);
        Box::pin(std::future::ready(()))
    }

    fn records_elsewhere(&self) -> bool {
        true
    }
}

/// What an action asks of an invoker: its memory, and its `invoker-resources` tags (strict
/// unless `invoker-resources-strict-policy` is false), and whether it is a blackbox (image) one.
fn needs_of(action: &invoker_wire::model::Action) -> ActionNeeds {
    let annotation = |key: &str| action.annotations.iter().find(|a| a.key == key).map(|a| &a.value);
    let tags = match annotation("invoker-resources") {
        Some(Value::Array(tags)) => tags.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        Some(Value::String(tag)) => vec![tag.clone()],
        _ => Vec::new(),
    };
    let strict = !matches!(annotation("invoker-resources-strict-policy"), Some(Value::Bool(false)))
        && !matches!(annotation("invoker-resources-strict-policy"), Some(Value::String(s)) if s == "false");
    ActionNeeds {
        memory_mb: u64::from(action.limits.memory),
        tags,
        strict,
        blackbox: action.exec.kind == "blackbox" || action.exec.image.is_some(),
    }
}
