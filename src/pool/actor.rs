//! The ContainerPool actor: a thin shell that feeds events to the pure core and carries out
//! the effects it returns: starting proxies, handing them jobs, answering rejected jobs.

use super::hand_off::{HandOff, JobShape};
use super::live;
use super::status::{
    CappedAction, ContainerSummary, ControlledAction, PoolSnapshot, PoolStatus, ProvisionedAction, WarmContainers,
};
use crate::config::{PoolConfig, ProxyConfig};
use crate::factory::Factory;
use crate::proxy::{ContainerProxy, DiscardLog, Gone, Pause, ProxyContext, ProxyReport, Remove, Resume, Run};
use actix::prelude::*;
use futures_util::future::BoxFuture;
use invoker_core::pool::{
    ContainerState, ContainerView, CoreConfig, Effect, Event, KeyId, Owner, PoolCore, PoolCounts, Provision,
    RejectReason, StemId, TenantId,
};
use invoker_factory::contract::ContainerFactory;
use invoker_factory::contract::ContainerSpec;
use invoker_factory::contract::Epoch;
use invoker_factory::kinds::RuntimeProtocol;
use invoker_ids::{ContainerId, CreateFailure, JobId, NodeId, NodeStatsUpdate, Time};
use invoker_job::runner::{Refused, Runner};
use invoker_job::RunJob;
use invoker_metrics::Metrics;
use invoker_telemetry::TARGET;
use invoker_wire::model::{Action, Rejection};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::oneshot;
use tracing::Span;

/// Hand a job to the pool, with `try_send`: a full mailbox answers the job at once (503).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submit(pub RunJob);

#[derive(Message)]
#[rtype(result = "()")]
struct StatsChanged(Vec<NodeStatsUpdate>);

/// How long a queued call whose container could not be created waits before it is offered to
/// the pool again (it is not failed: nothing ran, and it is durable).
const QUEUED_AFTER_CREATE_FAILED: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the factory is asked to observe the cluster while jobs wait for room.
const OBSERVE_WHILE_WAITING: std::time::Duration = std::time::Duration::from_secs(1);

/// The factory saw a container end on its own (its cluster node was lost, its task failed).
#[derive(Message)]
#[rtype(result = "()")]
struct ContainerGone(ContainerId);

/// An action was deleted (`keep: None`) or replaced by revision `keep`: the containers of its
/// other revisions are never used again, and their idle ones go now.
#[derive(Message)]
#[rtype(result = "()")]
struct RetireAction {
    namespace: String,
    name: String,
    keep: Option<u64>,
}

/// Keep `count` containers of `action` (this revision) created and initialised at all times;
/// zero keeps none.
#[derive(Message)]
#[rtype(result = "()")]
struct ProvisionAction {
    action: Arc<Action>,
    count: u32,
}

/// Stop taking work; answers when every container is gone.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain(pub oneshot::Sender<()>);

/// The idle containers go now ([`Event::ShedIdle`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShedIdle;

/// The live view's snapshot, framed: every container's row, the nodes and the queue.
#[derive(Message)]
#[rtype(result = "bytes::Bytes")]
pub struct LiveSnapshot;

/// Every container: the admin's pool view (O(containers), read on demand).
#[derive(Message)]
#[rtype(result = "PoolSnapshot")]
pub struct Snapshot;

/// The counts and the nodes: what health, `/health` and the registry read every few hundred
/// ms, from what the core keeps (O(nodes), never a view of every container).
#[derive(Message)]
#[rtype(result = "PoolStatus")]
pub struct Status;

/// The containers that run an action, if that set changed since generation `since`.
#[derive(Message)]
#[rtype(result = "Option<WarmContainers>")]
pub struct WarmSince(pub Option<u64>);

/// Sets the container gauges from the core's counts: what a `/metrics` scrape needs, without
/// a view of every container.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RefreshGauges;

/// What the pool keeps of an action key: its action (one allocation of it), its spec (its
/// entry in `keys`), the concurrency it runs with, and its own idle bound.
struct KeyEntry {
    action: Arc<Action>,
    spec: String,
    concurrency: u32,
    idle: Option<std::time::Duration>,
    tenant: TenantId,
}

pub struct ContainerPool {
    core: PoolCore,
    epoch: Epoch,
    factory: Factory,
    config: PoolConfig,
    proxy_config: ProxyConfig,
    api_host: String,
    max_result_bytes: usize,
    metrics: Arc<Metrics>,
    proxies: HashMap<ContainerId, Addr<ContainerProxy>>,
    /// When the core asked each container being removed to go: its removal's time is
    /// measured to its proxy's report (`invoker_container_remove_seconds`; the simulator's
    /// `remove_latency`).
    removing: HashMap<ContainerId, std::time::Instant>,
    create_failures_in_a_row: u32,
    create_refusals_in_a_row: u32,
    jobs: HashMap<JobId, RunJob>,
    keys: HashMap<String, KeyId>,
    /// The same keys by the action's allocation and the concurrency: a warm activation's key
    /// found without building its spec. Sound because the key keeps its action (`key_actions`)
    /// alive, so no other action can be at that address while the entry stands.
    keys_by_action: rustc_hash::FxHashMap<(usize, u32), KeyId>,
    /// Each key's action, its entry in `keys`, and its own idle bound.
    key_actions: HashMap<KeyId, KeyEntry>,
    /// Never reused: a key the core forgot may be interned again, as a new id.
    next_key: u32,
    /// Each namespace the pool has run, as the core's tenant (as many as the namespaces).
    tenants: HashMap<String, TenantId>,
    /// The offers a caller hands a job to without a message here, and the jobs it took.
    hand_off: Arc<HandOff>,
    drained: Vec<oneshot::Sender<()>>,
    /// Each kind's runtime protocol, for the proxies.
    protocols: Arc<HashMap<String, RuntimeProtocol>>,
    /// Each kind's `max_concurrency`, applied at every run; a kind not listed has none.
    kind_concurrency: rustc_hash::FxHashMap<String, u32>,
    discards: Arc<DiscardLog>,
    /// When the factory was last asked to observe because jobs waited for room.
    observed_for_waiting: std::time::Instant,
    /// The capacity of every node the factory reports, summed: kept where callers read it
    /// without a message to the pool (the shim's completion message says it per activation).
    user_memory_mb: Arc<AtomicU64>,
}

impl ContainerPool {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        factory: Factory,
        epoch: Epoch,
        config: PoolConfig,
        proxy_config: ProxyConfig,
        api_host: String,
        max_result_bytes: usize,
        metrics: Arc<Metrics>,
    ) -> Self {
        // The proxies' setting, the core's decision: it pauses idle containers and resumes them.
        let core = PoolCore::new(CoreConfig { pause_grace: proxy_config.pause_grace, ..config.clone() });
        ContainerPool {
            core,
            epoch,
            factory,
            config,
            proxy_config,
            api_host,
            max_result_bytes,
            metrics,
            proxies: HashMap::new(),
            removing: HashMap::new(),
            create_failures_in_a_row: 0,
            create_refusals_in_a_row: 0,
            jobs: HashMap::new(),
            keys: HashMap::new(),
            keys_by_action: rustc_hash::FxHashMap::default(),
            tenants: HashMap::new(),
            key_actions: HashMap::new(),
            next_key: 0,
            hand_off: Arc::new(HandOff::new(epoch)),
            drained: Vec::new(),
            user_memory_mb: Arc::default(),
            protocols: Arc::default(),
            kind_concurrency: Default::default(),
            discards: Arc::default(),
            observed_for_waiting: std::time::Instant::now(),
        }
    }

    /// The runtime protocol of each kind that does not speak OpenWhisk's (the default).
    pub fn with_protocols(mut self, protocols: HashMap<String, RuntimeProtocol>) -> Self {
        self.protocols = Arc::new(protocols);
        self
    }

    /// The most runs one container of each kind takes at once, as the config says now (an
    /// action stored when its kind allowed more gets no more than this).
    pub fn with_kind_concurrency(mut self, max: HashMap<String, u32>) -> Self {
        self.kind_concurrency = max.into_iter().collect();
        self
    }

    /// The runs at once one container of `action` takes: its limit, within its kind's.
    fn runs_at_once(&self, action: &Action) -> u32 {
        let kind_max = self.kind_concurrency.get(&action.exec.kind).copied().unwrap_or(u32::MAX);
        action.limits.concurrency.min(kind_max).max(1)
    }

    /// Containers of one key are interchangeable: same action revision, kind, memory, disk,
    /// concurrency.
    /// The action revision's key, and its own idle bound (an Fn function's `idle_timeout`,
    /// read from its annotation once per key).
    fn intern(&mut self, action: &Arc<Action>, concurrency: u32) -> (KeyId, Option<std::time::Duration>, TenantId) {
        let by_action = (Arc::as_ptr(action) as usize, concurrency);
        if let Some(&id) = self.keys_by_action.get(&by_action) {
            let entry = &self.key_actions[&id];
            return (id, entry.idle, entry.tenant);
        }
        let tenants = self.tenants.len() as u32;
        let tenant = *self.tenants.entry(action.namespace.clone()).or_insert(TenantId(tenants));
        let (l, exec) = (&action.limits, &action.exec);
        // The revision never repeats in a store; `updated` keeps it so across a store restored
        // from an older copy (or another scheduler's).
        let spec = format!(
            "{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}",
            action.namespace, action.name, action.revision, action.updated, exec.kind, l.memory, l.disk, concurrency
        );
        let next = KeyId(self.next_key);
        let id = *self.keys.entry(spec.clone()).or_insert(next);
        if id == next {
            self.next_key = self.next_key.wrapping_add(1);
        }
        let entry = self.key_actions.entry(id).or_insert_with(|| {
            let idle = action.fn_function().idle_timeout_s.map(|s| std::time::Duration::from_secs(u64::from(s)));
            KeyEntry { action: action.clone(), spec, concurrency, idle, tenant }
        });
        // Only the allocation the key keeps is known by its address (another copy of the same
        // revision is found by its spec, and is not kept).
        if Arc::ptr_eq(&entry.action, action) {
            self.keys_by_action.insert(by_action, id);
        }
        (id, entry.idle, tenant)
    }

    /// Forgets what it keeps of the keys the core no longer holds (no container, no waiting
    /// job): without this an invoker that sees many actions and revisions would keep every
    /// one, with its code.
    fn forget_keys(&mut self, keys: impl IntoIterator<Item = KeyId>) {
        for key in keys {
            if let Some(entry) = self.key_actions.remove(&key) {
                self.keys.remove(&entry.spec);
                self.keys_by_action.remove(&(Arc::as_ptr(&entry.action) as usize, entry.concurrency));
            }
        }
    }

    /// Applies the jobs taken from the offers since the last event, then `event`, then
    /// publishes the offers it changed.
    fn apply(&mut self, event: Event, ctx: &mut Context<Self>) {
        for taken in self.hand_off.taken() {
            self.apply_one(taken, ctx);
        }
        self.apply_one(event, ctx);
        self.publish_offers();
    }

    /// The offers the core changed, as the hand-off keeps them.
    fn publish_offers(&mut self) {
        for (key, offer) in self.core.take_offer_changes() {
            let (Some(container), Some(entry)) = (offer, self.key_actions.get(&key)) else {
                self.hand_off.withdraw(key);
                continue;
            };
            let Some(proxy) = self.proxies.get(&container) else {
                self.hand_off.withdraw(key);
                continue;
            };
            let interned = (entry.concurrency, entry.tenant, entry.idle);
            let shape = JobShape::of(key, &entry.action, interned, &self.config);
            self.hand_off.offer(entry.action.clone(), container, proxy.clone(), shape);
        }
    }

    fn apply_one(&mut self, event: Event, ctx: &mut Context<Self>) {
        // A container created on a job's arrival is created for it: its span is that job's.
        let arrived = match &event {
            Event::Arrived(job) => Some((job.id, job.key)),
            _ => None,
        };
        let watched = self.metrics.live.watched();
        let mut touched: smallvec::SmallVec<[ContainerId; 4]> = smallvec::SmallVec::new();
        if watched {
            touched.extend(live::touched(&event));
        }
        let effects = self.core.handle(event, self.epoch.now());
        if watched {
            touched.extend(effects.iter().filter_map(live::touched_by));
        }
        for effect in effects {
            match effect {
                Effect::Create { container, owner, memory_mb, node, prewarm, provisioned } => {
                    let (kind, disk_mb, action_path, function) = match owner {
                        Owner::Key(key) => {
                            let action = &self.key_actions[&key].action;
                            let protocol = self.protocols.get(&action.exec.kind).copied().unwrap_or_default();
                            let function = crate::proxy::protocol::function_start(protocol, action, memory_mb);
                            (action.exec.kind.clone(), action.limits.disk, action.path(), function.map(Arc::new))
                        }
                        Owner::Stem(stem) => {
                            let class = &self.config.prewarm[stem.0 as usize];
                            (class.kind.clone(), class.disk_mb, self.stem_label(stem), None)
                        }
                    };
                    let spec = ContainerSpec { id: container, kind, memory_mb, disk_mb, action_path, function };
                    let proxy_ctx = ProxyContext {
                        factory: self.factory.clone(),
                        config: self.proxy_config.clone(),
                        pool: ctx.address().recipient(),
                        api_host: self.api_host.clone(),
                        max_result_bytes: self.max_result_bytes,
                        protocols: self.protocols.clone(),
                        discards: self.discards.clone(),
                    };
                    // A stem, or a container the keep-alive policy started ahead of a call: its
                    // first run waited for no create.
                    let prewarmed = matches!(owner, Owner::Stem(_)) || prewarm;
                    let for_job = match (owner, arrived) {
                        (Owner::Key(key), Some((job, arrived_key))) if key == arrived_key && !prewarm => {
                            self.jobs.get(&job)
                        }
                        _ => None,
                    };
                    let creating = create_span(for_job, &spec, &node, self.factory.name(), prewarmed || provisioned);
                    let mut proxy = ContainerProxy::new(spec, node, proxy_ctx, prewarmed, creating);
                    if let (true, Owner::Key(key)) = (provisioned, owner) {
                        proxy = proxy.initialised_ahead(self.key_actions[&key].action.clone());
                    }
                    let proxy = proxy.start();
                    self.proxies.insert(container, proxy);
                }
                // Messages to a proxy are bounded by the core, not by the proxy's mailbox: a
                // container holds at most its concurrency in runs (up to `concurrency_max`, more
                // than a mailbox's default 16), with one pause or resume between them; so they
                // are sent without a capacity check, and none is ever refused.
                Effect::Dispatch { job, container } => {
                    if let (Some(mut run), Some(proxy)) = (self.jobs.remove(&job), self.proxies.get(&container)) {
                        run.completion.trace_mut().set_queued(Span::none());
                        if run.queued.take().is_some() {
                            run.completion.started();
                        }
                        proxy.do_send(Run { job, run });
                    }
                }
                Effect::Remove { container } => {
                    if let Some(proxy) = self.proxies.get(&container) {
                        self.removing.insert(container, std::time::Instant::now());
                        proxy.do_send(Remove);
                    }
                }
                Effect::Pause { container } => {
                    if let Some(proxy) = self.proxies.get(&container) {
                        proxy.do_send(Pause);
                    }
                }
                Effect::Resume { container } => {
                    if let Some(proxy) = self.proxies.get(&container) {
                        proxy.do_send(Resume);
                    }
                }
                Effect::Reject { job, reason: RejectReason::CreateFailed(why) } if self.is_queued(job) => {
                    // Nothing ran: the call stays queued, and is offered again a little later.
                    let Some(run) = self.jobs.remove(&job) else { continue };
                    tracing::debug!(activation = %run.meta.activation_id, "a queued call waits on: {why:?}");
                    ctx.run_later(QUEUED_AFTER_CREATE_FAILED, move |pool, ctx| {
                        <Self as Handler<Submit>>::handle(pool, Submit(run), ctx);
                    });
                }
                Effect::Reject { job, reason } => {
                    if let Some(run) = self.jobs.remove(&job) {
                        reject(run, reason);
                    }
                }
            }
        }
        if watched {
            self.publish_touched(&touched);
        }
        let forgotten = self.core.take_forgotten_keys();
        self.forget_keys(forgotten);
        if self.core.is_draining() && self.proxies.is_empty() {
            for waiter in self.drained.drain(..) {
                let _ = waiter.send(());
            }
        }
    }

    fn is_queued(&self, job: JobId) -> bool {
        self.jobs.get(&job).is_some_and(|run| run.queued.is_some())
    }

    fn node_stats(&mut self, snapshot: Vec<NodeStatsUpdate>, ctx: &mut Context<Self>) {
        self.user_memory_mb.store(snapshot.iter().map(|n| n.capacity_mb).sum(), Ordering::Relaxed);
        for update in snapshot {
            self.apply(Event::NodeStats(update), ctx);
        }
    }

    /// What a prewarm container is called until an action adopts it (labels, the pool view).
    fn stem_label(&self, stem: StemId) -> String {
        format!("prewarm/{}", self.config.prewarm[stem.0 as usize].kind)
    }

    fn status(&self) -> PoolStatus {
        let PoolCounts { starting, idle, busy, removing, waiting, prewarm, prewarm_mb, blocked_keys } =
            self.core.counts();
        PoolStatus {
            draining: self.core.is_draining(),
            starting,
            idle,
            prewarm,
            prewarm_mb,
            busy,
            removing,
            waiting,
            blocked: blocked_keys,
            nodes: self.core.nodes(self.epoch.now()),
            create_failures_in_a_row: self.create_failures_in_a_row,
            create_refusals_in_a_row: self.create_refusals_in_a_row,
            action_keys: self.key_actions.len(),
        }
    }

    /// The actions with a cap or provisioned containers, as the core holds them now.
    fn controlled_actions(&self) -> Vec<ControlledAction> {
        let mut actions: Vec<ControlledAction> = self
            .core
            .controlled_keys()
            .filter_map(|k| {
                let entry = self.key_actions.get(&k.key)?;
                Some(ControlledAction {
                    action: entry.action.path(),
                    revision: entry.action.revision,
                    cap: k.cap,
                    running: k.running,
                    waiting: k.waiting,
                    provisioned: k.provisioned,
                    provisioned_up: k.provisioned_up,
                })
            })
            .collect();
        actions.sort_by(|a, b| (&a.action, a.revision).cmp(&(&b.action, b.revision)));
        actions
    }

    fn summaries(&self, keep: impl Fn(ContainerState) -> bool) -> Vec<ContainerSummary> {
        let views = self.core.containers().into_iter().filter(|c| keep(c.state));
        views
            .map(|c| ContainerSummary {
                id: c.id.0,
                action: match c.owner {
                    Owner::Key(key) => self.key_actions.get(&key).map(|k| k.action.path()).unwrap_or_default(),
                    Owner::Stem(stem) => self.stem_label(stem),
                },
                revision: match c.owner {
                    Owner::Key(key) => self.key_actions.get(&key).map_or(0, |k| k.action.revision),
                    Owner::Stem(_) => 0,
                },
                node: c.node.to_string(),
                memory_mb: c.memory_mb,
                state: c.state,
                running: c.running,
                provisioned: c.provisioned,
            })
            .collect()
    }
}

/// The core's reason, as the record carries it.
/// The span of a container's creation: under the activation it was created for, else (ahead
/// of calls: a prewarm, a stem, room freed for waiting jobs) a trace of its own.
fn create_span(for_job: Option<&RunJob>, spec: &ContainerSpec, node: &NodeId, factory: &str, prewarm: bool) -> Span {
    let parent = match for_job.map(|run| run.completion.trace().span()) {
        Some(span) if span.is_disabled() => return Span::none(),
        Some(span) => span.id(),
        None => None,
    };
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "container.create",
        container = spec.id.0,
        action = %spec.action_path,
        kind = %spec.kind,
        memory_mb = spec.memory_mb,
        node = %node.0,
        factory,
        ahead = prewarm,
        "otel.status_code" = tracing::field::Empty,
        "otel.status_description" = tracing::field::Empty,
    )
}

/// Ends a job the core gave up on, with its record; a queued call the invoker stops with is
/// left in the queue (dropped unfinished, it stays journaled for the next start).
fn reject(run: RunJob, reason: RejectReason) {
    let why = match (&run.queued, reason) {
        (Some(_), RejectReason::Draining) => return drop(run),
        (Some(queued), RejectReason::DeadlineExceeded | RejectReason::Capped { .. }) => {
            let age = std::time::Duration::from_millis(queued.expires_at.saturating_sub(run.meta.accepted_at));
            format!("the call was not started within its maximum event age ({})", humantime::format_duration(age))
        }
        _ => rejection(reason).message(),
    };
    invoker_telemetry::failed(run.completion.trace().queued(), &why);
    run.reject_because(rejection(reason), &why);
}

fn rejection(reason: RejectReason) -> Rejection {
    match reason {
        RejectReason::NeverFits { memory_mb, largest_node_mb } => Rejection::NeverFits { memory_mb, largest_node_mb },
        RejectReason::DeadlineExceeded => Rejection::Deadline,
        RejectReason::QueueFull => Rejection::QueueFull,
        RejectReason::CreateFailed(why) => Rejection::CreateFailed(why),
        RejectReason::Draining => Rejection::Draining,
        RejectReason::ContainerLost => Rejection::ContainerLost,
        RejectReason::Capped { cap } => Rejection::Capped { cap },
    }
}

impl Actor for ContainerPool {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let mut stats = self.factory.stats();
        // The first snapshot is applied before any message, so the pool never answers as if
        // it had no nodes.
        let first = stats.borrow_and_update().clone();
        self.node_stats(first, ctx);
        ctx.run_interval(live::POOL_EVERY, |pool, _| pool.publish_pool());
        let me = ctx.address();
        ctx.spawn(
            async move {
                while stats.changed().await.is_ok() {
                    let snapshot = stats.borrow_and_update().clone();
                    if me.send(StatsChanged(snapshot)).await.is_err() {
                        break;
                    }
                }
            }
            .into_actor(self),
        );
        if let Some(mut gone) = self.factory.take_gone() {
            let me = ctx.address();
            ctx.spawn(
                async move {
                    while let Some(container) = gone.recv().await {
                        if me.send(ContainerGone(container)).await.is_err() {
                            break;
                        }
                    }
                }
                .into_actor(self),
            );
        }
        ctx.run_interval(self.config.tick, |act, ctx| {
            act.apply(Event::Tick, ctx);
            let waiting = act.core.waiting_for_room();
            act.factory.demand(waiting);
            // Jobs waiting for room may wait on stats alone: the reservations of containers
            // that started since the last ones, or memory a removal may already have freed,
            // count only once newer stats come. Not a quarter of `stats_ttl` (15 s) for them.
            if waiting && act.observed_for_waiting.elapsed() >= OBSERVE_WHILE_WAITING {
                act.observed_for_waiting = std::time::Instant::now();
                act.factory.observe();
            }
        });
        let factory = self.factory.clone();
        ctx.run_interval(self.config.stats_ttl / 4, move |_, _| factory.observe());
    }
}

impl Handler<Submit> for ContainerPool {
    type Result = ();

    fn handle(&mut self, Submit(run): Submit, ctx: &mut Context<Self>) {
        let concurrency = self.runs_at_once(&run.action);
        let (key, idle_timeout, tenant) = self.intern(&run.action, concurrency);
        let id = self.hand_off.next_job();
        // A queued call waits until its maximum age, a blocking one its bounded wait.
        let wait = match &run.queued {
            Some(queued) => {
                std::time::Duration::from_millis(queued.expires_at.saturating_sub(invoker_wire::model::epoch_ms()))
            }
            None => self.config.wait_deadline,
        };
        let shape = JobShape::of(key, &run.action, (concurrency, tenant, idle_timeout), &self.config);
        let job = shape.job(id, self.epoch.now() + wait, run.queued.is_some());
        let mut run = run;
        let queued = invoker_telemetry::stage_span!(run.completion.trace(), "queue");
        run.completion.trace_mut().set_queued(queued);
        self.jobs.insert(id, run);
        self.apply(Event::Arrived(job), ctx);
        if !self.core.has_key(key) {
            self.forget_keys([key]); // answered at once, nothing of it kept
        } else if let Some(run) = self.jobs.get(&id) {
            // Still waiting (a dispatched job has left `jobs`): if for its action's cap, its
            // span says so (the `queue` stage's length is the wait).
            if let Some(cap) = self.core.waits_for_cap(key) {
                run.completion.trace().span().record("capped", cap);
            }
        }
        self.metrics.waiting.set(self.jobs.len() as i64);
    }
}

impl Handler<ProxyReport> for ContainerPool {
    type Result = ();

    fn handle(&mut self, report: ProxyReport, ctx: &mut Context<Self>) {
        let event = match report {
            ProxyReport::Started { container, failure, at } => {
                let (failures, refusals) = (self.create_failures_in_a_row, self.create_refusals_in_a_row);
                (self.create_failures_in_a_row, self.create_refusals_in_a_row) = match failure {
                    None => (0, 0),
                    Some(CreateFailure::Refused) => (failures, refusals.saturating_add(1)),
                    // The action's fault (a provisioned container's `/init`), not the invoker's.
                    Some(CreateFailure::InitFailed) => (failures, refusals),
                    Some(_) => (failures.saturating_add(1), refusals),
                };
                Event::Started { container, failure, at }
            }
            ProxyReport::Finished { container, job, reusable } => Event::Finished { container, job, reusable },
            ProxyReport::Removed { container } => {
                self.proxies.remove(&container);
                if let Some(asked) = self.removing.remove(&container) {
                    self.metrics.container_removed(asked.elapsed());
                }
                Event::Removed(container)
            }
        };
        self.apply(event, ctx);
        self.metrics.waiting.set(self.jobs.len() as i64);
    }
}

impl Handler<ContainerGone> for ContainerPool {
    type Result = ();

    /// An idle container's proxy removes it and reports it removed, so no job is sent to it;
    /// a busy one's runs fail on their own, with records, and retire it.
    fn handle(&mut self, ContainerGone(container): ContainerGone, _: &mut Context<Self>) {
        if let Some(proxy) = self.proxies.get(&container) {
            proxy.do_send(Gone);
        }
    }
}

impl Handler<RetireAction> for ContainerPool {
    type Result = ();

    fn handle(&mut self, retired: RetireAction, ctx: &mut Context<Self>) {
        let keys: Vec<KeyId> = self
            .key_actions
            .iter()
            .filter(|(_, k)| {
                let a = &k.action;
                a.namespace == retired.namespace && a.name == retired.name && Some(a.revision) != retired.keep
            })
            .map(|(&key, _)| key)
            .collect();
        if !keys.is_empty() {
            tracing::info!(
                action = %format_args!("{}/{}", retired.namespace, retired.name),
                "the action was deleted or updated: its containers of an older revision are removed"
            );
        }
        for key in keys {
            self.apply(Event::Retire(key), ctx);
        }
    }
}

impl Handler<ProvisionAction> for ContainerPool {
    type Result = ();

    fn handle(&mut self, ProvisionAction { action, count }: ProvisionAction, ctx: &mut Context<Self>) {
        let concurrency = self.runs_at_once(&action);
        let (key, _, tenant) = self.intern(&action, concurrency);
        let memory_mb = action.limits.memory;
        let max_running = action.max_concurrency();
        let provision = Provision { key, count, memory_mb, concurrency, max_running, tenant };
        tracing::info!(action = %action.path(), revision = action.revision, count, "provisioned containers");
        self.apply(Event::Provision(provision), ctx);
        if !self.core.has_key(key) {
            self.forget_keys([key]);
        }
    }
}

impl Handler<StatsChanged> for ContainerPool {
    type Result = ();

    fn handle(&mut self, StatsChanged(snapshot): StatsChanged, ctx: &mut Context<Self>) {
        self.node_stats(snapshot, ctx);
    }
}

impl Handler<ShedIdle> for ContainerPool {
    type Result = ();

    fn handle(&mut self, _: ShedIdle, ctx: &mut Context<Self>) {
        self.apply(Event::ShedIdle, ctx);
    }
}

impl Handler<Drain> for ContainerPool {
    type Result = ();

    fn handle(&mut self, Drain(done): Drain, ctx: &mut Context<Self>) {
        self.drained.push(done);
        self.apply(Event::Drain, ctx);
    }
}

impl ContainerPool {
    /// Core time `t` in milliseconds since the epoch.
    fn wall_ms(&self, t: Time) -> u64 {
        let (now, wall) = (self.epoch.now(), invoker_wire::model::epoch_ms());
        match t.checked_sub(now) {
            Some(ahead) => wall + ahead.as_millis() as u64,
            None => wall.saturating_sub((now - t).as_millis() as u64),
        }
    }

    fn live_row(&self, view: ContainerView) -> live::ContainerRow {
        let action = match view.owner {
            Owner::Key(key) => self.key_actions.get(&key).map(|k| k.action.path()).unwrap_or_default(),
            Owner::Stem(stem) => self.stem_label(stem),
        };
        live::container_row(view, action, |t| self.wall_ms(t))
    }

    /// Each container in `ids` as it is now (its row, or that it is gone).
    fn publish_touched(&self, ids: &smallvec::SmallVec<[ContainerId; 4]>) {
        let feed = &self.metrics.live;
        for (i, &id) in ids.iter().enumerate() {
            if ids[..i].contains(&id) {
                continue;
            }
            match self.core.container(id) {
                Some(view) => feed.publish("container", &self.live_row(view)),
                None => feed.publish("gone", &serde_json::json!({ "id": id.0 })),
            }
        }
    }

    /// The nodes and the queue, every [`live::POOL_EVERY`] while somebody watches.
    fn publish_pool(&self) {
        if self.metrics.live.watched() {
            let row = live::pool_row(self.status(), self.jobs.values(), self.controlled_actions());
            self.metrics.live.publish("pool", &row);
        }
    }
}

impl Handler<LiveSnapshot> for ContainerPool {
    type Result = MessageResult<LiveSnapshot>;

    fn handle(&mut self, _: LiveSnapshot, _: &mut Context<Self>) -> Self::Result {
        let containers = self.core.containers().into_iter().map(|view| self.live_row(view)).collect();
        let pool = live::pool_row(self.status(), self.jobs.values(), self.controlled_actions());
        MessageResult(live::snapshot(pool, containers))
    }
}

impl Handler<Snapshot> for ContainerPool {
    type Result = MessageResult<Snapshot>;

    fn handle(&mut self, _: Snapshot, _: &mut Context<Self>) -> Self::Result {
        let controlled = self.controlled_actions();
        let capped = controlled
            .iter()
            .filter_map(|c| {
                let (action, revision, running, waiting) = (c.action.clone(), c.revision, c.running, c.waiting);
                Some(CappedAction { action, revision, cap: c.cap?, running, waiting })
            })
            .collect();
        let provisioned = controlled
            .iter()
            .filter(|c| c.provisioned > 0)
            .map(|c| ProvisionedAction {
                action: c.action.clone(),
                revision: c.revision,
                count: c.provisioned,
                up: c.provisioned_up,
                in_use: c.running,
            })
            .collect();
        let containers = self.summaries(|_| true);
        MessageResult(PoolSnapshot { status: self.status(), containers, capped, provisioned })
    }
}

impl Handler<Status> for ContainerPool {
    type Result = MessageResult<Status>;

    fn handle(&mut self, _: Status, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status())
    }
}

impl Handler<WarmSince> for ContainerPool {
    type Result = Option<WarmContainers>;

    fn handle(&mut self, WarmSince(since): WarmSince, _: &mut Context<Self>) -> Self::Result {
        let generation = self.core.warm_generation();
        (since != Some(generation))
            .then(|| WarmContainers { generation, containers: self.summaries(ContainerState::runs_an_action) })
    }
}

impl Handler<RefreshGauges> for ContainerPool {
    type Result = ();

    fn handle(&mut self, _: RefreshGauges, _: &mut Context<Self>) {
        let PoolCounts { starting, idle, busy, removing, prewarm, prewarm_mb, .. } = self.core.counts();
        // `prewarm`: stems not yet taken, ready or starting (a starting one is in `starting` too).
        let states =
            [("starting", starting), ("idle", idle), ("busy", busy), ("removing", removing), ("prewarm", prewarm)];
        for (state, n) in states {
            self.metrics.containers.get_or_create(&invoker_metrics::StateLabel { state: state.into() }).set(n as i64);
        }
        self.metrics.prewarm_memory_mb.set(prewarm_mb as i64);
        let (mut wanted, mut up, mut capped_waiting) = (0u64, 0u64, 0u64);
        for k in self.core.controlled_keys() {
            wanted += u64::from(k.provisioned);
            up += u64::from(k.provisioned_up);
            if k.cap.is_some_and(|cap| k.running >= cap) {
                capped_waiting += k.waiting as u64;
            }
        }
        for (state, n) in [("wanted", wanted), ("up", up)] {
            self.metrics.provisioned.get_or_create(&invoker_metrics::StateLabel { state: state.into() }).set(n as i64);
        }
        self.metrics.capped_waiting.set(capped_waiting as i64);
    }
}

/// An invoker's activations run in its own pool.
impl Runner for PoolHandle {
    fn submit(&self, run: RunJob) -> Result<(), Refused> {
        PoolHandle::submit(self, run).map_err(|PoolBusy| Refused::PoolFull)
    }

    fn submit_queued(&self, run: RunJob) -> BoxFuture<'_, ()> {
        Box::pin(PoolHandle::submit_queued(self, run))
    }

    fn retire_action<'a>(&'a self, namespace: &'a str, name: &'a str, kept: Option<&'a Action>) -> BoxFuture<'a, ()> {
        Box::pin(PoolHandle::retire_action(self, namespace, name, kept.map(|a| a.revision)))
    }

    /// The intake provisions a revision it has just saved (or read at a start), which keeps
    /// nothing yet (its older revisions' containers are retired with them): zero is nothing to do.
    fn provision(&self, action: Arc<Action>, count: u32) -> BoxFuture<'_, ()> {
        match count {
            0 => Box::pin(std::future::ready(())),
            _ => Box::pin(PoolHandle::provision(self, action, count)),
        }
    }

    fn records_elsewhere(&self) -> bool {
        false
    }
}

/// Jobs that may wait in the pool's mailbox before it takes them; one more is answered 503 at
/// once. The pool takes a job in microseconds, so a full mailbox means the invoker is far
/// behind, not a burst.
const MAILBOX: usize = 1024;

/// The pool did not take the job; its record is written (`queue_full`, or a whisk error when the
/// pool is gone).
#[derive(Debug)]
pub struct PoolBusy;

/// A cloneable handle on the pool actor, so callers do not depend on actix types.
#[derive(Clone)]
pub struct PoolHandle {
    addr: Addr<ContainerPool>,
    user_memory_mb: Arc<AtomicU64>,
    hand_off: Arc<HandOff>,
}

impl PoolHandle {
    pub fn start(pool: ContainerPool) -> Self {
        let user_memory_mb = pool.user_memory_mb.clone();
        let hand_off = pool.hand_off.clone();
        let addr = ContainerPool::create(move |ctx| {
            ctx.set_mailbox_capacity(MAILBOX);
            pool
        });
        PoolHandle { addr, user_memory_mb, hand_off }
    }

    /// The memory of every node of the cluster, as the factory last reported it.
    pub fn user_memory_mb(&self) -> u64 {
        self.user_memory_mb.load(Ordering::Relaxed)
    }

    /// Hands a job over without waiting for the pool to take it (one thread hop, not two).
    /// When the pool's mailbox is full the job is answered at once with a `queue_full` record;
    /// when the pool is gone, its completion is dropped with the message and writes a
    /// whisk-error record. Either way nothing is lost, and `Err` says the record is written.
    /// A queued call: waits for room in the mailbox rather than being refused (it is durable
    /// already). A pool that stopped drops it, which leaves it queued for the next start.
    pub async fn submit_queued(&self, run: RunJob) {
        let _ = self.addr.send(Submit(run)).await;
    }

    /// A job whose action has an offered container goes to it directly (see `hand_off`).
    pub fn submit(&self, run: RunJob) -> Result<(), PoolBusy> {
        let Some(run) = self.hand_off.take(run) else { return Ok(()) };
        match self.addr.try_send(Submit(run)) {
            Ok(()) => Ok(()),
            Err(SendError::Full(Submit(run))) => {
                run.reject(Rejection::QueueFull);
                Err(PoolBusy)
            }
            Err(SendError::Closed(_)) => Err(PoolBusy),
        }
    }

    /// The live view's snapshot, framed as a server-sent event.
    pub async fn live_snapshot(&self) -> Option<bytes::Bytes> {
        self.addr.send(LiveSnapshot).await.ok()
    }

    pub async fn snapshot(&self) -> Option<PoolSnapshot> {
        self.addr.send(Snapshot).await.ok()
    }

    pub async fn status(&self) -> Option<PoolStatus> {
        self.addr.send(Status).await.ok()
    }

    /// `None` when the containers that run an action are still those of generation `since`
    /// (or the pool is gone, which the next status says).
    pub async fn warm_since(&self, since: Option<u64>) -> Option<WarmContainers> {
        self.addr.send(WarmSince(since)).await.ok().flatten()
    }

    /// Brings the container gauges up to date (before a `/metrics` scrape).
    pub async fn refresh_gauges(&self) {
        let _ = self.addr.send(RefreshGauges).await;
    }

    /// The action `namespace/name` was deleted (`keep: None`) or is now at revision `keep`:
    /// its other revisions' containers are not used again and its idle ones are removed now.
    pub async fn retire_action(&self, namespace: &str, name: &str, keep: Option<u64>) {
        let retire = RetireAction { namespace: namespace.to_string(), name: name.to_string(), keep };
        let _ = self.addr.send(retire).await;
    }

    /// Keeps `count` containers of `action` (its revision) created and initialised at all
    /// times, here; zero keeps none. Its older revisions keep nothing once retired.
    pub async fn provision(&self, action: Arc<Action>, count: u32) {
        let _ = self.addr.send(ProvisionAction { action, count }).await;
    }

    /// Removes the idle containers now (an invoker given back, whose pod is to shrink).
    pub async fn shed_idle(&self) {
        let _ = self.addr.send(ShedIdle).await;
    }

    pub async fn drain(&self) {
        let (tx, rx) = oneshot::channel();
        if self.addr.send(Drain(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}
