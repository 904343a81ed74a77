//! ContainerProxy: one actor per container. It creates the container through the factory,
//! initialises it once, runs the activations the pool dispatches to it, builds their records,
//! and removes the container when told. It tells the pool what happened and decides nothing.
//!
//! Network I/O never runs inside `ctx.wait`: every call is spawned with `ctx.spawn`, and its
//! result comes back to the actor, so a long `/run` never blocks `Remove` or other runs.

mod discard;
mod pause;
pub mod protocol;
mod record;

use crate::activation::job::RunJob;
use crate::config::{ProxyConfig, RuntimeProtocol};
use crate::factory::{ContainerFactory, ContainerHandle, ContainerSpec, Factory};
use crate::model::{epoch_ms, Outcome, StartKind};
use crate::pool::core::{ContainerId, JobId, NodeId};
use actix::prelude::*;
pub use discard::DiscardLog;
use protocol::{discard_reason, Answer, Interpreted, Runtime};
use record::{build_record, RecordFields};
use serde_json::json;
use std::collections::HashMap;
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

/// The pool's core decided the idle container pauses.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Pause;

/// The pool's core sends a run to the paused container next: resume it first.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resume;

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
    Resuming,
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
    /// Each kind's runtime protocol; a kind not listed speaks OpenWhisk's.
    pub protocols: Arc<HashMap<String, RuntimeProtocol>>,
    /// Where every proxy says why it gave its container up.
    pub discards: Arc<DiscardLog>,
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
    runtime: Option<Arc<Runtime>>,
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
    /// The pool asked for a resume while the container was still pausing.
    resume_wanted: bool,
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
            runtime: None,
            init: Init::NotYet,
            queued: Vec::new(),
            running: 0,
            create_ms: 0,
            init_ms: None,
            cold: true,
            prewarmed,
            resume_wanted: false,
            parked: Vec::new(),
        }
    }

    pub fn state(&self) -> ProxyState {
        self.state
    }

    /// Reports are never refused: each answers one decision of the core (a start, a run, a
    /// removal), so there are never more than the containers and their runs, and the core must
    /// hear every one of them to keep its ledger true.
    fn report(&self, report: ProxyReport) {
        self.ctx.pool.do_send(report);
    }

    fn start_init(&mut self, first: &RunJob, ctx: &mut Context<Self>) {
        self.init = Init::InProgress;
        let action = first.action.clone();
        let runtime = self.runtime.clone().expect("started before init");
        let (api_host, timeout) = (self.ctx.api_host.clone(), self.ctx.config.init_timeout);
        let began = Instant::now();
        let fut = async move { runtime.init(&action, &api_host, timeout).await };
        ctx.spawn(fut.into_actor(self).map(move |answer, act, ctx| {
            act.init_ms = Some(began.elapsed().as_millis() as u64);
            match answer {
                Ok(()) => {
                    act.init = Init::Done;
                    for (job, run, began) in std::mem::take(&mut act.queued) {
                        act.start_run(job, run, began, ctx);
                    }
                }
                Err(failed) => act.fail_init(failed, ctx),
            }
        }));
    }

    /// A failed `/init` fails every run waiting for it, as developer errors; the container
    /// is not reused.
    fn fail_init(&mut self, answer: Answer, ctx: &mut Context<Self>) {
        let timeout_ms = self.ctx.config.init_timeout.as_millis() as u64;
        let oom = self.handle.as_ref().is_some_and(|h| self.ctx.factory.was_oom_killed(h));
        let runtime = self.runtime.as_ref().expect("started before init");
        let why = match &answer {
            Ok(_) => "init failed",
            failed => discard_reason(failed, oom),
        };
        let mut interpreted = runtime.interpret(answer, timeout_ms, oom, self.ctx.max_result_bytes);
        let detail = interpreted.result["error"].as_str().unwrap_or_default();
        self.ctx.discards.discarded(self.spec.id.0, &self.spec.action_path, why, &format!("/init: {detail}"));
        if interpreted.outcome != Outcome::DeveloperError {
            interpreted = Interpreted {
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
            let window = logs.map(|h| h.logs.open(tag_of(&run)));
            let fut = async move {
                let limit = run.meta.limits.logs as usize * 1024 * 1024;
                let lines = match window {
                    Some(w) => w.collect(logs_wait.min(Duration::from_millis(200)), limit).await,
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

    /// Hands a run to the runtime, initialising it first with the run's action.
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
        let runtime = self.runtime.clone().expect("started before run");
        let handle = self.handle.clone().expect("started before run");
        let factory = self.ctx.factory.clone();
        let (log_wait, max_result) = (self.ctx.config.log_sentinel_wait, self.ctx.max_result_bytes);
        let container = self.spec.id;
        let discards = self.ctx.discards.clone();
        let window = handle.logs.open(tag_of(&run));
        let fut = async move {
            let answer = runtime.run(&run, Duration::from_millis(timeout_ms)).await;
            let oom = !runtime.answered(&answer) && factory.was_oom_killed(&handle);
            let why = discard_reason(&answer, oom);
            let failed = answer.as_ref().err().map(ToString::to_string);
            let interpreted = runtime.interpret(answer, timeout_ms, oom, max_result);
            if !interpreted.reusable {
                let said = interpreted.result["error"].as_str().unwrap_or_default();
                let detail = failed.unwrap_or_else(|| said.to_string());
                discards.discarded(container.0, &format!("{}/{}", run.meta.namespace, run.meta.name), why, &detail);
            }
            // A failed container may never write its sentinels: do not wait long for them.
            let wait = if interpreted.reusable { log_wait } else { log_wait.min(Duration::from_millis(200)) };
            let lines = window.collect(wait, run.meta.limits.logs as usize * 1024 * 1024).await;
            (run, interpreted, lines)
        };
        ctx.spawn(fut.into_actor(self).map(move |(run, interpreted, lines), act, _| {
            act.running -= 1;
            let reusable = interpreted.reusable;
            if act.running == 0 && act.state == ProxyState::Running {
                act.state = ProxyState::Ready;
            }
            let record =
                build_record(&run, fields, interpreted.outcome, interpreted.result, lines, interpreted.timed_out);
            run.completion.finish(record);
            act.report(ProxyReport::Finished { container, job, reusable });
        }));
    }
}

/// The activation id a run's lines may start with: only where runs may overlap does `/init`
/// ask the runtime to tag them (see `protocol::openwhisk::init`); elsewhere none, and the
/// window has nothing to look for.
fn tag_of(run: &RunJob) -> &str {
    if run.action.limits.concurrency > 1 {
        &run.meta.activation_id
    } else {
        ""
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
            match created {
                Ok(handle) => {
                    let at = handle.ready_at;
                    let protocol = act.ctx.protocols.get(&act.spec.kind).copied().unwrap_or_default();
                    act.runtime = Some(Arc::new(Runtime::new(protocol, &handle.transport, act.ctx.max_result_bytes)));
                    act.handle = Some(handle);
                    act.state = ProxyState::Started;
                    act.report(ProxyReport::Started { container: act.spec.id, ok: true, at });
                }
                Err(reason) => {
                    act.ctx.discards.discarded(
                        act.spec.id.0,
                        &act.spec.action_path,
                        "create failed",
                        &reason.to_string(),
                    );
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
        match self.state {
            // The pool sent a resume before this run: it goes once the container runs again.
            ProxyState::Pausing | ProxyState::Resuming => self.parked.push((msg.job, msg.run, began)),
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

impl Handler<Pause> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, _: Pause, ctx: &mut Context<Self>) {
        self.pause(ctx);
    }
}

impl Handler<Resume> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, _: Resume, ctx: &mut Context<Self>) {
        self.resume(ctx);
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
