//! ContainerProxy: one actor per container. It creates the container through the factory,
//! initialises it once, runs the activations the pool dispatches to it, builds their records,
//! and removes the container when told. It tells the pool what happened and decides nothing.
//!
//! Network I/O never runs inside `ctx.wait`: every call is spawned with `ctx.spawn`, and its
//! result comes back to the actor, so a long `/run` never blocks `Remove` or other runs.

pub mod client;
pub mod outcome;

use crate::activation::job::RunJob;
use crate::config::ProxyConfig;
use crate::factory::{ContainerFactory, ContainerHandle, ContainerSpec, Factory};
use crate::model::{epoch_ms, ActivationRecord, ActivationResponse, KeyValue, Outcome, StartKind};
use crate::pool::core::{ContainerId, JobId, NodeId};
use actix::prelude::*;
use client::{RuntimeClient, RuntimeError, RuntimeResponse};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a proxy reports to the pool.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub enum ProxyReport {
    Started { container: ContainerId, ok: bool, at: crate::pool::core::Time },
    Finished { container: ContainerId, job: JobId, reusable: bool },
    Removed { container: ContainerId },
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Run {
    pub job: JobId,
    pub run: RunJob,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Remove;

/// The factory saw the container end on its own. An idle proxy removes it at once; a busy one
/// lets its runs fail (each gets its record and retires the container).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Gone;

/// The OpenWhisk ContainerProxy states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyState {
    Uninitialized,
    Starting,
    Started,
    Running,
    Ready,
    Pausing,
    Paused,
    Removing,
}

/// Settings every proxy shares.
#[derive(Clone)]
pub struct ProxyContext {
    pub factory: Factory,
    pub config: ProxyConfig,
    pub pool: Recipient<ProxyReport>,
    pub api_host: String,
    pub max_result_bytes: usize,
}

enum Init {
    NotYet,
    InProgress,
    Done,
}

pub struct ContainerProxy {
    spec: ContainerSpec,
    node: NodeId,
    ctx: ProxyContext,
    state: ProxyState,
    handle: Option<ContainerHandle>,
    client: Option<Arc<RuntimeClient>>,
    init: Init,
    /// Runs that arrived while `/init` was under way.
    queued: Vec<(JobId, RunJob, Instant)>,
    running: usize,
    create_ms: u64,
    init_ms: Option<u64>,
    /// Whether the next run is the first on this container (a cold start).
    cold: bool,
    /// Started as a prewarm (stem) container: its first run is a prewarm start, whose path
    /// held no container creation.
    prewarmed: bool,
    /// When the container pauses if it stays idle; cleared by every run.
    pause_at: Option<Instant>,
    /// Whether the one pause timer is pending. One timer per proxy, re-armed for the rest of
    /// the grace when it fires early: actix polls every pending timer of an actor whenever the
    /// actor wakes, so a timer per run would cost a busy container O(runs in the grace) per run.
    pause_timer: bool,
    /// Runs that arrived while the container was pausing or paused; they go once it resumes.
    parked: Vec<(JobId, RunJob, Instant)>,
}

impl ContainerProxy {
    pub fn new(spec: ContainerSpec, node: NodeId, ctx: ProxyContext, prewarmed: bool) -> Self {
        ContainerProxy {
            spec,
            node,
            ctx,
            state: ProxyState::Uninitialized,
            handle: None,
            client: None,
            init: Init::NotYet,
            queued: Vec::new(),
            running: 0,
            create_ms: 0,
            init_ms: None,
            cold: true,
            prewarmed,
            pause_at: None,
            pause_timer: false,
            parked: Vec::new(),
        }
    }

    pub fn state(&self) -> ProxyState {
        self.state
    }

    fn report(&self, report: ProxyReport) {
        self.ctx.pool.do_send(report);
    }

    fn start_init(&mut self, first: &RunJob, ctx: &mut Context<Self>) {
        self.init = Init::InProgress;
        let action = &first.action;
        let body = json!({ "value": {
            "name": action.name,
            "main": action.exec.main.clone().unwrap_or_else(|| "main".into()),
            "code": action.exec.code.clone().unwrap_or_default(),
            "binary": action.exec.binary,
            "env": {
                "__OW_NAMESPACE": action.namespace,
                "__OW_ACTION_NAME": format!("/{}/{}", action.namespace, action.name),
                "__OW_ACTION_VERSION": action.version,
                "__OW_API_HOST": self.ctx.api_host,
            },
        }});
        let client = self.client.clone().expect("started before init");
        let timeout = self.ctx.config.init_timeout;
        let began = Instant::now();
        let fut = async move { client.init(&body, timeout).await };
        ctx.spawn(fut.into_actor(self).map(move |answer, act, ctx| {
            act.init_ms = Some(began.elapsed().as_millis() as u64);
            match answer {
                Ok(RuntimeResponse { status: 200, .. }) => {
                    act.init = Init::Done;
                    for (job, run, began) in std::mem::take(&mut act.queued) {
                        act.start_run(job, run, began, ctx);
                    }
                }
                failed => act.fail_init(failed, ctx),
            }
        }));
    }

    /// A failed `/init` fails every run waiting for it, as developer errors; the container
    /// is not reused.
    fn fail_init(&mut self, answer: Result<RuntimeResponse, RuntimeError>, ctx: &mut Context<Self>) {
        let timeout_ms = self.ctx.config.init_timeout.as_millis() as u64;
        let oom = self.handle.as_ref().is_some_and(|h| self.ctx.factory.was_oom_killed(h));
        let mut interpreted = outcome::interpret(answer, timeout_ms, oom, self.ctx.max_result_bytes);
        if interpreted.outcome != Outcome::DeveloperError {
            interpreted = outcome::Interpreted {
                outcome: Outcome::DeveloperError,
                reusable: false,
                timed_out: false,
                result: json!({ "error": "The action failed to initialise." }),
            };
        }
        let logs_wait = self.ctx.config.log_sentinel_wait;
        for (job, run, began) in std::mem::take(&mut self.queued) {
            let logs = self.handle.clone();
            let result = interpreted.result.clone();
            let record_fields = self.record_fields(&run, began);
            let container = self.spec.id;
            let fut = async move {
                let limit = run.meta.limits.logs as usize * 1024 * 1024;
                let lines = match logs {
                    Some(h) => h.logs.collect(logs_wait.min(Duration::from_millis(200)), limit).await,
                    None => Vec::new(),
                };
                (run, lines)
            };
            ctx.spawn(fut.into_actor(self).map(move |(run, lines), act, _| {
                act.running -= 1;
                let record = build_record(&run, record_fields, Outcome::DeveloperError, result, lines, false);
                run.completion.finish(record);
                act.report(ProxyReport::Finished { container, job, reusable: false });
            }));
        }
        self.init = Init::NotYet;
    }

    fn record_fields(&self, run: &RunJob, began: Instant) -> RecordFields {
        RecordFields {
            container: self.spec.id,
            start_kind: match (self.cold, self.prewarmed) {
                (false, _) => StartKind::Warm,
                (true, false) => StartKind::Cold,
                (true, true) => StartKind::Prewarm,
            },
            create_ms: (self.cold && !self.prewarmed).then_some(self.create_ms),
            init_ms: if self.cold { self.init_ms } else { None },
            wait_ms: began.duration_since(run.accepted).as_millis() as u64,
            start: epoch_ms() - began.elapsed().as_millis() as u64,
        }
    }

    fn start_run(&mut self, job: JobId, run: RunJob, began: Instant, ctx: &mut Context<Self>) {
        let fields = self.record_fields(&run, began);
        self.cold = false;
        let timeout_ms = run.meta.limits.timeout;
        let body = RunBody {
            value: &run.params,
            namespace: &run.meta.namespace,
            action_name: format!("/{}/{}", run.meta.namespace, run.meta.name),
            action_version: &run.meta.version,
            activation_id: &run.meta.activation_id,
            transaction_id: &run.transaction_id,
            deadline: (epoch_ms() + timeout_ms).to_string(),
            api_key: run.api_key.as_deref(),
        };
        let body = bytes::Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let client = self.client.clone().expect("started before run");
        let handle = self.handle.clone().expect("started before run");
        let factory = self.ctx.factory.clone();
        let (log_wait, max_result) = (self.ctx.config.log_sentinel_wait, self.ctx.max_result_bytes);
        let container = self.spec.id;
        let fut = async move {
            let answer = client.run(body, Duration::from_millis(timeout_ms)).await;
            let failed = !matches!(answer, Ok(RuntimeResponse { status: 200, .. }));
            let oom = failed && factory.was_oom_killed(&handle);
            let interpreted = outcome::interpret(answer, timeout_ms, oom, max_result);
            // A failed container may never write its sentinels: do not wait long for them.
            let wait = if interpreted.reusable { log_wait } else { log_wait.min(Duration::from_millis(200)) };
            let lines = handle.logs.collect(wait, run.meta.limits.logs as usize * 1024 * 1024).await;
            (run, interpreted, lines)
        };
        ctx.spawn(fut.into_actor(self).map(move |(run, interpreted, lines), act, ctx| {
            act.running -= 1;
            let reusable = interpreted.reusable;
            if act.running == 0 && act.state == ProxyState::Running {
                act.state = ProxyState::Ready;
                if reusable {
                    act.schedule_pause(ctx);
                }
            }
            let record =
                build_record(&run, fields, interpreted.outcome, interpreted.result, lines, interpreted.timed_out);
            run.completion.finish(record);
            act.report(ProxyReport::Finished { container, job, reusable });
        }));
    }
}

/// The `/run` body of OpenWhisk's runtime protocol, written straight from the job (no copy of
/// the parameters, no JSON tree in between).
#[derive(serde::Serialize)]
struct RunBody<'a> {
    value: &'a serde_json::Map<String, Value>,
    namespace: &'a str,
    action_name: String,
    action_version: &'a str,
    activation_id: &'a str,
    transaction_id: &'a str,
    /// Milliseconds since the epoch, as a string.
    deadline: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key: Option<&'a str>,
}

struct RecordFields {
    container: ContainerId,
    start_kind: StartKind,
    create_ms: Option<u64>,
    init_ms: Option<u64>,
    wait_ms: u64,
    start: u64,
}

fn build_record(
    run: &RunJob,
    f: RecordFields,
    outcome: Outcome,
    result: Value,
    logs: Vec<String>,
    timed_out: bool,
) -> ActivationRecord {
    let end = epoch_ms();
    let mut annotations = run.meta.base_annotations();
    annotations.push(KeyValue { key: "timeout".into(), value: json!(timed_out) });
    annotations.push(KeyValue { key: "waitTime".into(), value: json!(f.wait_ms) });
    if let Some(init) = f.init_ms {
        annotations.push(KeyValue { key: "initTime".into(), value: json!(init) });
    }
    annotations.push(KeyValue { key: "containerId".into(), value: json!(f.container.0) });
    annotations.push(KeyValue { key: "startKind".into(), value: json!(f.start_kind) });
    if let Some(create) = f.create_ms {
        annotations.push(KeyValue { key: "createTime".into(), value: json!(create) });
    }
    ActivationRecord {
        namespace: run.meta.namespace.clone(),
        name: run.meta.name.clone(),
        version: run.meta.version.clone(),
        subject: run.meta.subject.clone(),
        activation_id: run.meta.activation_id.clone(),
        start: f.start,
        end,
        duration: end.saturating_sub(f.start),
        status_code: outcome.status_code(),
        response: ActivationResponse::new(outcome, result),
        logs,
        annotations,
        publish: false,
        rejection: None,
    }
}

impl Actor for ContainerProxy {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.state = ProxyState::Starting;
        let factory = self.ctx.factory.clone();
        let (spec, node) = (self.spec.clone(), self.node.clone());
        let began = Instant::now();
        let fut = async move { factory.create(&spec, &node).await };
        ctx.spawn(fut.into_actor(self).map(move |created, act, ctx| {
            act.create_ms = began.elapsed().as_millis() as u64;
            let client = created.as_ref().map_err(|e| e.to_string()).and_then(|h| RuntimeClient::new(&h.transport));
            match (created, client) {
                (Ok(handle), Ok(client)) => {
                    let at = handle.ready_at;
                    act.handle = Some(handle);
                    act.client = Some(Arc::new(client));
                    act.state = ProxyState::Started;
                    act.report(ProxyReport::Started { container: act.spec.id, ok: true, at });
                }
                (created, client) => {
                    let reason = created.as_ref().err().map(|e| e.to_string()).or(client.err()).unwrap_or_default();
                    tracing::warn!(container = act.spec.id.0, action = %act.spec.action_path, "create failed: {reason}");
                    if let Ok(handle) = created {
                        let factory = act.ctx.factory.clone();
                        actix::spawn(async move {
                            let _ = factory.destroy(&handle).await;
                        });
                    }
                    act.report(ProxyReport::Started { container: act.spec.id, ok: false, at: Default::default() });
                    ctx.stop();
                }
            }
        }));
    }
}

impl Handler<Run> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, msg: Run, ctx: &mut Context<Self>) {
        let began = Instant::now();
        self.running += 1;
        self.pause_at = None;
        match self.state {
            ProxyState::Pausing => self.parked.push((msg.job, msg.run, began)),
            ProxyState::Paused => {
                self.parked.push((msg.job, msg.run, began));
                self.resume(ctx);
            }
            _ => {
                self.state = ProxyState::Running;
                self.dispatch(msg.job, msg.run, began, ctx);
            }
        }
    }
}

/// Pausing an idle container (OpenWhisk's Ready → Pausing → Paused) and resuming it on the
/// next run. A paused container uses no CPU; resuming costs one factory call.
impl ContainerProxy {
    fn dispatch(&mut self, job: JobId, run: RunJob, began: Instant, ctx: &mut Context<Self>) {
        match self.init {
            Init::Done => self.start_run(job, run, began, ctx),
            Init::InProgress => self.queued.push((job, run, began)),
            Init::NotYet => {
                self.start_init(&run, ctx);
                self.queued.push((job, run, began));
            }
        }
    }

    fn schedule_pause(&mut self, ctx: &mut Context<Self>) {
        let grace = self.ctx.config.pause_grace;
        if grace.is_zero() {
            return;
        }
        self.pause_at = Some(Instant::now() + grace);
        if !self.pause_timer {
            self.arm_pause(grace, ctx);
        }
    }

    fn arm_pause(&mut self, after: Duration, ctx: &mut Context<Self>) {
        self.pause_timer = true;
        ctx.run_later(after, |act, ctx| {
            act.pause_timer = false;
            let Some(at) = act.pause_at else { return };
            let now = Instant::now();
            if at > now {
                act.arm_pause(at - now, ctx);
            } else if act.state == ProxyState::Ready && act.running == 0 {
                act.pause_at = None;
                act.pause(ctx);
            }
        });
    }

    fn pause(&mut self, ctx: &mut Context<Self>) {
        let Some(handle) = self.handle.clone() else { return };
        self.state = ProxyState::Pausing;
        let factory = self.ctx.factory.clone();
        let fut = async move { factory.pause(&handle).await };
        ctx.spawn(fut.into_actor(self).map(|paused, act, ctx| {
            if act.state != ProxyState::Pausing {
                return;
            }
            match paused {
                Ok(()) => {
                    act.state = ProxyState::Paused;
                    if !act.parked.is_empty() {
                        act.resume(ctx);
                    }
                }
                Err(e) => {
                    tracing::warn!(container = act.spec.id.0, "pause failed, the container stays unpaused: {e}");
                    act.release_parked(ctx);
                }
            }
        }));
    }

    fn resume(&mut self, ctx: &mut Context<Self>) {
        let Some(handle) = self.handle.clone() else { return };
        self.state = ProxyState::Running;
        let factory = self.ctx.factory.clone();
        let fut = async move { factory.resume(&handle).await };
        ctx.spawn(fut.into_actor(self).map(|resumed, act, ctx| match resumed {
            Ok(()) => act.release_parked(ctx),
            Err(e) => act.fail_parked(&e.to_string()),
        }));
    }

    fn release_parked(&mut self, ctx: &mut Context<Self>) {
        self.state = if self.running > 0 { ProxyState::Running } else { ProxyState::Ready };
        for (job, run, began) in std::mem::take(&mut self.parked) {
            self.dispatch(job, run, began, ctx);
        }
    }

    /// A container that cannot be resumed ran nothing: its parked runs get whisk-error
    /// records (safe to retry) and the container is given up.
    fn fail_parked(&mut self, reason: &str) {
        tracing::warn!(container = self.spec.id.0, "resume failed: {reason}");
        let container = self.spec.id;
        for (job, run, began) in std::mem::take(&mut self.parked) {
            self.running -= 1;
            let fields = self.record_fields(&run, began);
            let result = json!({ "error": format!("the container could not be resumed: {reason}") });
            let record = build_record(&run, fields, Outcome::WhiskError, result, Vec::new(), false);
            run.completion.finish(record);
            self.report(ProxyReport::Finished { container, job, reusable: false });
        }
    }
}

impl Handler<Gone> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, _: Gone, ctx: &mut Context<Self>) {
        if self.running == 0 && self.queued.is_empty() {
            ctx.notify(Remove);
        }
    }
}

impl Handler<Remove> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, _: Remove, ctx: &mut Context<Self>) {
        if self.state == ProxyState::Removing {
            return;
        }
        self.state = ProxyState::Removing;
        let factory = self.ctx.factory.clone();
        let handle = self.handle.take();
        let fut = async move {
            if let Some(handle) = handle {
                if let Err(e) = factory.destroy(&handle).await {
                    tracing::warn!(container = handle.id.0, "destroy failed: {e}");
                }
            }
        };
        ctx.spawn(fut.into_actor(self).map(|(), act, ctx| {
            act.report(ProxyReport::Removed { container: act.spec.id });
            ctx.stop();
        }));
    }
}
