//! The Mesos factory: action containers as tasks of a Mesos framework, through the v1
//! scheduler HTTP API. Resource offers are the node stats: per agent, what is offered now.
//!
//! [`scheduler::Scheduler`] makes every decision; this module carries them out. One task holds
//! the subscription (and subscribes again, with backoff, when the stream ends or heartbeats
//! stop), one sends calls in order, one ticks; the first two live as long as the process. The
//! framework id is kept in the invoker's store ([`KeptSettings`]), so a restarted invoker
//! subscribes as the same framework, and its reconciliation finds the tasks the earlier run
//! left, which it kills.

#![forbid(unsafe_code)]

/// The protocol's message codec, for what the invoker's own tests (the fake master) say.
pub use prost;

pub mod client;
pub mod offers;
pub mod proto;
pub mod recordio;
pub mod scheduler;

use client::{MasterClient, MesosError};
use futures_util::StreamExt;
use invoker_factory::contract::{ContainerFactory, ContainerHandle, ContainerSpec, Epoch, StatsReceiver, Transport};
use invoker_factory::error::{Cause, CreateError, FactoryError, SetupError};
use invoker_factory::logs::LogBuffer;
use invoker_factory::settings::MesosFactoryConfig;
use invoker_ids::{ContainerId, NodeId, NodeStatsUpdate};
use offers::Need;
use parking_lot::Mutex;
use proto::v1::scheduler::{call, event, Call, Event};
use proto::v1::{FrameworkId, FrameworkInfo};
use scheduler::{LaunchRequest, Outcome, Scheduler, SchedulerConfig, Step, TaskTemplate};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Calls queued for the master at most; beyond, a call is dropped (each one is either
/// repeated by the master, like an unacknowledged update, or bounded by a timeout here).
const OUTBOX: usize = 4096;
const TICK: Duration = Duration::from_millis(250);
/// Heartbeat interval assumed until the master says (upstream sends one every 15 s).
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(15);
const MAX_BACKOFF: Duration = Duration::from_secs(15);
/// The store key of the framework id.
const FRAMEWORK_ID: &str = "mesos.framework_id";

/// What the factory keeps across the invoker's restarts (its framework id), in the invoker's
/// store: a setting by key.
pub trait KeptSettings: Send + Sync + 'static {
    fn get(&self, key: &str) -> Result<Option<String>, Box<dyn std::error::Error + Send + Sync>>;
    fn put(&self, key: &str, value: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

#[derive(Clone)]
pub struct MesosFactory {
    inner: Arc<Inner>,
}

struct Inner {
    config: MesosFactoryConfig,
    invoker_id: String,
    epoch: Epoch,
    client: MasterClient,
    state: Mutex<Driver>,
    outbox: mpsc::Sender<Call>,
    stats: watch::Sender<Vec<NodeStatsUpdate>>,
    /// Kind → the task template (the `[kinds]` command, with the agents' binary and address).
    templates: BTreeMap<String, TaskTemplate>,
    kept: Arc<dyn KeptSettings>,
    ready_timeout: Duration,
    /// Containers whose task ended on its own, for the pool; the receiver is taken once.
    gone: mpsc::Sender<ContainerId>,
    gone_rx: Mutex<Option<mpsc::Receiver<ContainerId>>>,
}

/// Where a launched task's runtime listens (agent host and port), or why it did not start.
type Launched = Result<(String, u16), String>;

struct Driver {
    scheduler: Scheduler,
    stream_id: Option<String>,
    launches: HashMap<ContainerId, oneshot::Sender<Launched>>,
    kills: HashMap<ContainerId, oneshot::Sender<()>>,
    /// Containers launched and not yet gone.
    live: HashMap<ContainerId, Arc<LogBuffer>>,
}

impl MesosFactory {
    /// `commands`: each kind's runtime command on the agents (`{port}` the port the offer
    /// gives); `ready_timeout`: how long a launched task's runtime has to answer.
    pub async fn new(
        m: &MesosFactoryConfig,
        invoker_id: &str,
        commands: BTreeMap<String, Vec<String>>,
        ready_timeout: Duration,
        epoch: Epoch,
        kept: Arc<dyn KeptSettings>,
    ) -> Result<Self, FactoryError> {
        let m = m.clone();
        let setup =
            |what, source: Cause| FactoryError::Setup { factory: "mesos", source: SetupError::Failed { what, source } };
        let client = MasterClient::new(&m.master, m.call_timeout).map_err(|source| {
            setup("the master's client", MesosError::Http { master: m.master.clone(), source }.into())
        })?;
        let templates = commands
            .into_iter()
            .map(|(kind, command)| {
                let image = m.images.get(&kind).cloned();
                (kind, TaskTemplate { command, image })
            })
            .collect();
        let scheduler_config = SchedulerConfig {
            refuse_seconds: m.refuse.as_secs_f64(),
            offer_hold: m.offer_hold,
            suppress_after: m.suppress_after,
            launch_timeout: m.launch_timeout,
            kill_timeout: m.kill_timeout,
            agent_capacity_mb: m.agent_capacity_mb.map(|mb| mb as f64),
        };
        // Task ids of this run: the invoker id and the run's start time, unique over restarts.
        let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
        let prefix = format!("{invoker_id}.{run}");
        let (outbox, calls) = mpsc::channel(OUTBOX);
        let (gone, gone_rx) = mpsc::channel(OUTBOX);
        let factory = MesosFactory {
            inner: Arc::new(Inner {
                config: m,
                invoker_id: invoker_id.to_string(),
                epoch,
                client,
                state: Mutex::new(Driver {
                    scheduler: Scheduler::new(scheduler_config, prefix),
                    stream_id: None,
                    launches: HashMap::new(),
                    kills: HashMap::new(),
                    live: HashMap::new(),
                }),
                outbox,
                stats: watch::channel(Vec::new()).0,
                templates,
                kept,
                ready_timeout,
                gone,
                gone_rx: Mutex::new(Some(gone_rx)),
            }),
        };
        tokio::spawn(subscription(factory.inner.clone()));
        tokio::spawn(sender(factory.inner.clone(), calls));
        tokio::spawn(ticker(Arc::downgrade(&factory.inner)));
        Ok(factory)
    }
}

/// Mesos has no pause: an idle task keeps running (as in OpenWhisk's Mesos factory), so pause
/// and resume are the trait's defaults.
impl ContainerFactory for MesosFactory {
    fn describe(&self) -> String {
        let c = &self.inner.config;
        format!(
            "mesos factory: framework '{}' of invoker {} on master {} (offers are the node stats; tasks run as '{}')",
            c.framework_name,
            self.inner.invoker_id,
            self.inner.client.leader(),
            c.user
        )
    }

    fn take_gone(&self) -> Option<mpsc::Receiver<ContainerId>> {
        self.inner.gone_rx.lock().take()
    }

    fn stats(&self) -> StatsReceiver {
        self.inner.stats.subscribe()
    }

    fn observe(&self) {
        self.inner.publish_stats(&self.inner.state.lock());
    }

    /// Jobs wait for room: a suppressed framework asks for offers again.
    fn demand(&self, waiting: bool) {
        self.inner.apply(|s, now, step| s.demand(waiting, now, step));
    }

    async fn create(&self, spec: &ContainerSpec, node: &NodeId) -> Result<ContainerHandle, FactoryError> {
        let inner = &self.inner;
        if spec.function.is_some() {
            return Err(CreateError::NoFunctions("mesos").into());
        }
        let template = inner.templates.get(&spec.kind).ok_or_else(|| FactoryError::UnknownKind(spec.kind.clone()))?;
        let request = LaunchRequest {
            container: spec.id,
            agent: node.0.to_string(),
            need: Need {
                cpus: (f64::from(spec.memory_mb) / 1024.0 * inner.config.cpus_per_gb).max(0.01),
                mem_mb: f64::from(spec.memory_mb),
            },
            name: format!("{}:{}", inner.invoker_id, spec.action_path),
            template: template.clone(),
        };
        let (tx, rx) = oneshot::channel();
        inner.state.lock().launches.insert(spec.id, tx);
        inner.apply(|s, now, step| s.launch(request, now, step));
        let bound = inner.config.launch_timeout + Duration::from_secs(5);
        let started = tokio::time::timeout(bound, rx).await;
        let (host, port) = match started {
            Ok(Ok(Ok(address))) => address,
            Ok(Ok(Err(reason))) => return Err(CreateError::Failed(reason).into()),
            Ok(Err(_)) | Err(_) => {
                inner.state.lock().launches.remove(&spec.id);
                self.kill(spec.id).await;
                return Err(FactoryError::NotReady(bound));
            }
        };
        let ready = async {
            let addr = tokio::net::lookup_host((host.as_str(), port))
                .await
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| CreateError::Unresolved(host.clone()))?;
            let transport = Transport::Tcp(addr);
            if !transport.until_accepts(tokio::time::Instant::now() + inner.ready_timeout).await {
                return Err(FactoryError::NotReady(inner.ready_timeout));
            }
            Ok(transport)
        };
        match ready.await {
            Ok(transport) => {
                // Logs stay in the task's sandbox on its agent; none reach the invoker.
                let logs = Arc::new(LogBuffer::default());
                logs.close();
                inner.state.lock().live.insert(spec.id, logs.clone());
                let peer = Arc::default();
                Ok(ContainerHandle {
                    id: spec.id,
                    node: node.clone(),
                    transport,
                    peer,
                    logs,
                    ready_at: inner.epoch.now(),
                })
            }
            Err(e) => {
                self.kill(spec.id).await;
                Err(e)
            }
        }
    }

    async fn destroy(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.kill(c.id).await;
        Ok(())
    }

    async fn destroy_all(&self) {
        let ids: Vec<ContainerId> = self.inner.state.lock().live.keys().copied().collect();
        futures_util::future::join_all(ids.into_iter().map(|id| self.kill(id))).await;
    }
}

impl MesosFactory {
    /// KILLs the task and waits for the master to confirm (the scheduler bounds the wait).
    async fn kill(&self, id: ContainerId) {
        let inner = &self.inner;
        let (tx, rx) = oneshot::channel();
        inner.state.lock().kills.insert(id, tx);
        inner.apply(|s, now, step| s.kill(id, now, step));
        let _ = tokio::time::timeout(inner.config.kill_timeout + Duration::from_secs(5), rx).await;
        if let Some(logs) = inner.state.lock().live.remove(&id) {
            logs.close();
        }
    }
}

impl Inner {
    /// Runs one scheduler decision and carries out what it asks.
    fn apply(&self, decide: impl FnOnce(&mut Scheduler, invoker_ids::Time, &mut Step)) {
        let mut state = self.state.lock();
        let mut step = Step::default();
        decide(&mut state.scheduler, self.epoch.now(), &mut step);
        self.carry_out(&mut state, step);
    }

    fn carry_out(&self, state: &mut Driver, mut step: Step) {
        let mut unsent = Step::default();
        for call in std::mem::take(&mut step.calls) {
            if let Err(e) = self.outbox.try_send(call) {
                let call = match e {
                    mpsc::error::TrySendError::Full(call) | mpsc::error::TrySendError::Closed(call) => call,
                };
                tracing::warn!(call = call.r#type, "mesos: the queue of calls to the master is full");
                state.scheduler.unsent(call, &mut unsent);
            }
        }
        step.outcomes.append(&mut unsent.outcomes);
        for outcome in step.outcomes {
            match outcome {
                Outcome::Started { container, host, port } => {
                    if let Some(tx) = state.launches.remove(&container) {
                        let _ = tx.send(Ok((host, port)));
                    }
                }
                Outcome::LaunchFailed { container, reason } => {
                    if let Some(tx) = state.launches.remove(&container) {
                        let _ = tx.send(Err(reason));
                    }
                }
                Outcome::Gone { container, reason } => {
                    tracing::warn!(container = container.0, %reason, "mesos: a task ended on its own");
                    if let Some(logs) = state.live.remove(&container) {
                        logs.close();
                    }
                    if self.gone.try_send(container).is_err() {
                        tracing::warn!(container = container.0, "mesos: the pool was not told of a gone container");
                    }
                }
                Outcome::Killed { container } => {
                    if let Some(tx) = state.kills.remove(&container) {
                        let _ = tx.send(());
                    }
                }
            }
        }
        self.publish_stats(state);
    }

    fn publish_stats(&self, state: &Driver) {
        self.stats.send_replace(state.scheduler.stats(self.epoch.now()));
    }

    fn subscribe_call(&self) -> Call {
        let id = match self.kept.get(FRAMEWORK_ID) {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!("mesos: the framework id could not be read ({e}); subscribing as a new framework");
                None
            }
        };
        let c = &self.config;
        Call {
            framework_id: id.clone().filter(|s| !s.is_empty()).map(|value| FrameworkId { value }),
            r#type: call::Type::Subscribe as i32,
            subscribe: Some(call::Subscribe {
                framework_info: FrameworkInfo {
                    user: c.user.clone(),
                    name: c.framework_name.clone(),
                    id: id.filter(|s| !s.is_empty()).map(|value| FrameworkId { value }),
                    failover_timeout: Some(c.failover_timeout.as_secs_f64()),
                    checkpoint: Some(true),
                    hostname: None,
                    principal: None,
                },
                suppressed_roles: vec![],
            }),
            ..Default::default()
        }
    }

    /// Handles one event; returns the heartbeat interval when the master announces it.
    fn on_event(&self, event: Event) -> Option<Duration> {
        let now = self.epoch.now();
        let mut heartbeat = None;
        let mut state = self.state.lock();
        let mut step = Step::default();
        let s = &mut state.scheduler;
        match event.r#type.and_then(|t| event::Type::try_from(t).ok()) {
            Some(event::Type::Subscribed) => {
                if let Some(sub) = event.subscribed {
                    let id = sub.framework_id.value;
                    if let Err(e) = self.kept.put(FRAMEWORK_ID, &id) {
                        tracing::warn!("mesos: the framework id could not be kept: {e}");
                    }
                    tracing::info!(framework_id = %id, master = %self.client.leader(), "mesos: subscribed");
                    heartbeat = sub.heartbeat_interval_seconds.filter(|s| *s > 0.0).map(Duration::from_secs_f64);
                    s.subscribed(id, now, &mut step);
                }
            }
            Some(event::Type::Offers) => s.offers(&event.offers.unwrap_or_default().offers, now, &mut step),
            Some(event::Type::Rescind) => {
                if let Some(r) = event.rescind {
                    s.rescind(&r.offer_id.value);
                }
            }
            Some(event::Type::Update) => {
                if let Some(u) = event.update {
                    s.update(&u.status, now, &mut step);
                }
            }
            Some(event::Type::Failure) => {
                // Without an executor, a failure is the loss of an agent.
                if let Some(f) = event.failure.filter(|f| f.executor_id.is_none()) {
                    if let Some(agent) = f.agent_id {
                        tracing::warn!(agent = %agent.value, "mesos: agent lost");
                        s.agent_lost(&agent.value, &mut step);
                    }
                }
            }
            Some(event::Type::Error) => {
                let message = event.error.map(|e| e.message).unwrap_or_default();
                tracing::error!(%message, "mesos: the master reported an error");
            }
            _ => {}
        }
        self.carry_out(&mut state, step);
        heartbeat
    }
}

/// Holds the subscription: subscribes, reads events until the stream ends or heartbeats stop,
/// and subscribes again with exponential backoff.
async fn subscription(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match inner.client.subscribe(&inner.subscribe_call()).await {
            Ok(mut sub) => {
                backoff = Duration::from_millis(100);
                inner.state.lock().stream_id = Some(sub.stream_id.clone());
                let mut heartbeat = DEFAULT_HEARTBEAT;
                loop {
                    let silence = heartbeat * inner.config.heartbeat_misses;
                    match tokio::time::timeout(silence, sub.events.next()).await {
                        Ok(Some(Ok(event))) => {
                            if let Some(h) = inner.on_event(event) {
                                heartbeat = h;
                            }
                        }
                        Ok(Some(Err(e))) => {
                            tracing::warn!("mesos: {e}");
                            break;
                        }
                        Ok(None) => {
                            tracing::warn!("mesos: the master closed the event stream");
                            break;
                        }
                        Err(_) => {
                            tracing::warn!("mesos: no event for {silence:?}; subscribing again");
                            break;
                        }
                    }
                }
                inner.state.lock().stream_id = None;
            }
            Err(e) => {
                tracing::warn!("mesos: subscribe failed: {e}; again in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Sends calls in the order they were decided, on the current subscription.
async fn sender(inner: Arc<Inner>, mut calls: mpsc::Receiver<Call>) {
    while let Some(call) = calls.recv().await {
        let stream_id = inner.state.lock().stream_id.clone();
        let Some(stream_id) = stream_id else {
            tracing::debug!(call = call.r#type, "mesos: not subscribed; a call was dropped");
            continue;
        };
        if let Err(e) = inner.client.call(&stream_id, &call).await {
            tracing::warn!(call = call.r#type, "mesos: {e}");
            if matches!(e, MesosError::Status { status: 403, .. }) {
                inner.state.lock().stream_id = None;
            }
        }
    }
}

async fn ticker(inner: std::sync::Weak<Inner>) {
    let mut interval = tokio::time::interval(TICK);
    loop {
        interval.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        inner.apply(|s, now, step| s.tick(now, step));
    }
}
