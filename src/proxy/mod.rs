//! ContainerProxy: one actor per container. It carries out what its pure core (`core/`)
//! decides: it creates the container through the factory, initialises it, runs the activations
//! the pool dispatches to it, builds their records, pauses, resumes and removes the container,
//! and tells the pool what happened. It keeps the runs' payloads and the container's handle;
//! the container's state is the core's alone.
//!
//! Network I/O never runs inside `ctx.wait`: every call is spawned with `ctx.spawn`, and its
//! result comes back to the actor as an event, so a long `/run` never blocks a removal or
//! other runs.

mod discard;
pub mod protocol;
mod record;

use crate::config::ProxyConfig;
use crate::factory::Factory;
use actix::prelude::*;
pub use discard::DiscardLog;
use invoker_factory::kinds::RuntimeProtocol;
use invoker_job::RunJob;

use invoker_core::proxy::{Effect, Event, FailCause, ProxyCore, ProxyState};
use invoker_factory::contract::ContainerFactory;
use invoker_factory::contract::ContainerHandle;
use invoker_factory::contract::ContainerSpec;
use invoker_factory::logs::{Ends, LogBuffer, LogWindow};
use invoker_ids::{ContainerId, CreateFailure, JobId, NodeId};
use invoker_wire::model::{epoch_ms, Action, Outcome, Rejection, StartKind};
use invoker_wire::params::Params;
use protocol::{discard_reason, Answer, Interpreted, Runtime};
use record::{build_record, RecordFields};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::field::Empty;
use tracing::Span;

/// How long a run whose caller must hear of its start waits for the caller to pass the word
/// on (the shim writing a line on a connection it holds): past it, the caller is taken as
/// gone and nothing starts.
const START_ACK_WAIT: Duration = Duration::from_secs(5);

/// What a proxy reports to the pool.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub enum ProxyReport {
    /// `failure`: `None` when the container is ready.
    Started {
        container: ContainerId,
        failure: Option<CreateFailure>,
        at: invoker_ids::Time,
    },
    Finished {
        container: ContainerId,
        job: JobId,
        reusable: bool,
    },
    Removed {
        container: ContainerId,
    },
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

pub struct ContainerProxy {
    spec: ContainerSpec,
    node: NodeId,
    ctx: ProxyContext,
    /// What the container's runtime speaks, which decides what the core waits for.
    protocol: RuntimeProtocol,
    core: ProxyCore,
    /// `None` until the factory made the container, and again once it is destroyed.
    created: Option<Created>,
    /// The runs the pool sent, until they reach the runtime or fail.
    runs: HashMap<JobId, (RunJob, Instant)>,
    create_ms: u64,
    init_ms: Option<u64>,
    /// What a failed `/init` answered, for the records of the runs it fails.
    init_failure: Option<Interpreted>,
    /// Why the container could not be resumed.
    resume_failure: String,
    /// Started as a prewarm (stem) container: its first run is a prewarm start, whose path
    /// held no container creation.
    prewarmed: bool,
    /// The creation's span, until the factory answers (and the runtime holds the code, for a
    /// container initialised ahead).
    creating: Span,
    /// The action a provisioned container is initialised with as it is created.
    ahead: Option<Arc<Action>>,
}

/// The container once the factory made it: its handle, and the client of its runtime.
#[derive(Clone)]
struct Created {
    handle: ContainerHandle,
    runtime: Arc<Runtime>,
}

impl ContainerProxy {
    pub fn new(spec: ContainerSpec, node: NodeId, ctx: ProxyContext, prewarmed: bool, creating: Span) -> Self {
        let protocol = ctx.protocols.get(&spec.kind).copied().unwrap_or_default();
        ContainerProxy {
            spec,
            node,
            ctx,
            protocol,
            core: ProxyCore::new(protocol.initialises()),
            created: None,
            runs: HashMap::new(),
            create_ms: 0,
            init_ms: None,
            init_failure: None,
            resume_failure: String::new(),
            prewarmed,
            creating,
            ahead: None,
        }
    }

    /// A provisioned container of `action`: created and initialised before the pool hears it
    /// started, so that every run of it is warm.
    pub fn initialised_ahead(mut self, action: Arc<Action>) -> Self {
        self.core = ProxyCore::initialised_ahead(self.protocol.initialises());
        self.ahead = Some(action);
        self
    }

    pub fn state(&self) -> ProxyState {
        self.core.state()
    }

    /// Reports are never refused: each answers one decision of the core (a start, a run, a
    /// removal), so there are never more than the containers and their runs, and the core must
    /// hear every one of them to keep its ledger true.
    fn report(&self, report: ProxyReport) {
        self.ctx.pool.do_send(report);
    }

    /// The core's decisions on `event`, carried out in order.
    fn apply(&mut self, event: Event, ctx: &mut Context<Self>) {
        for effect in self.core.handle(event) {
            match effect {
                Effect::Init { with } => self.start_init(with, ctx),
                Effect::InitAhead => self.init_ahead(ctx),
                Effect::Run { job, first } => self.start_run(job, first, ctx),
                Effect::Fail { job, cause, first } => self.fail_run(job, cause, first, ctx),
                Effect::Pause => self.pause(ctx),
                Effect::Resume => self.resume(ctx),
                Effect::Destroy => self.destroy(ctx),
                Effect::ReportStarted { failure } => {
                    let at = self.created.as_ref().map(|c| c.handle.ready_at).unwrap_or_default();
                    self.report(ProxyReport::Started { container: self.spec.id, failure, at });
                }
                Effect::ReportFinished { job, reusable } => {
                    self.report(ProxyReport::Finished { container: self.spec.id, job, reusable });
                }
                Effect::ReportRemoved => self.report(ProxyReport::Removed { container: self.spec.id }),
                Effect::Stop => ctx.stop(),
            }
        }
    }

    fn start_init(&mut self, with: JobId, ctx: &mut Context<Self>) {
        let Some((run, _)) = self.runs.get(&with) else { return };
        let (action, span) = (run.action.clone(), self.stage_span(run, Stage::Init));
        self.send_init(action, span, ctx);
    }

    /// Initialises a provisioned container with its action before any run. A failure is logged
    /// as every discarded container's is, and the pool hears that the start failed once the
    /// container is destroyed.
    fn init_ahead(&mut self, ctx: &mut Context<Self>) {
        let Some(action) = self.ahead.clone() else { return };
        let span = tracing::info_span!(parent: &self.creating, "init", container = self.spec.id.0);
        self.send_init(action, span, ctx);
    }

    /// `/init` with `action`'s code, timed, its failure interpreted for the runs it fails; the
    /// core hears the answer.
    fn send_init(&mut self, action: Arc<Action>, span: Span, ctx: &mut Context<Self>) {
        let Some(created) = &self.created else { return };
        let runtime = created.runtime.clone();
        let (api_host, timeout) = (self.ctx.api_host.clone(), self.ctx.config.init_timeout);
        let began = Instant::now();
        let fut = async move { runtime.init(&action, &api_host, timeout).await };
        ctx.spawn(fut.into_actor(self).map(move |answer, act, ctx| {
            act.init_ms = Some(began.elapsed().as_millis() as u64);
            let ok = match answer {
                Ok(()) => true,
                Err(failed) => {
                    let failure = act.interpret_init_failure(failed);
                    invoker_telemetry::failed(&span, failure.result.error().as_deref().unwrap_or("init failed"));
                    act.init_failure = Some(failure);
                    false
                }
            };
            drop(span);
            // A container initialised ahead is created once its runtime holds the code.
            act.creating = Span::none();
            act.apply(Event::InitAnswered { ok }, ctx);
        }));
    }

    /// A failed `/init` is a developer error for every run waiting for it; the container is
    /// not reused.
    fn interpret_init_failure(&self, answer: Answer) -> Interpreted {
        let timeout_ms = self.ctx.config.init_timeout.as_millis() as u64;
        let failed_to_initialise = || Interpreted {
            outcome: Outcome::DeveloperError,
            reusable: false,
            timed_out: false,
            result: json!({ "error": "The action failed to initialise." }).into(),
        };
        // `/init` is sent only to a created container; said again for the compiler.
        let Some(Created { handle, runtime }) = &self.created else { return failed_to_initialise() };
        let oom = self.ctx.factory.was_oom_killed(handle);
        let why = match &answer {
            Ok(_) => "init failed",
            failed => discard_reason(failed, oom),
        };
        let interpreted = runtime.interpret(answer, timeout_ms, oom, self.ctx.max_result_bytes);
        let detail = interpreted.result.error().unwrap_or_default();
        self.ctx.discards.discarded(self.spec.id.0, &self.spec.action_path, why, &format!("/init: {detail}"));
        if interpreted.outcome == Outcome::DeveloperError {
            return interpreted;
        }
        failed_to_initialise()
    }

    /// Ends a run that never reached the runtime with its record, then tells the core.
    fn fail_run(&mut self, job: JobId, cause: FailCause, first: bool, ctx: &mut Context<Self>) {
        let Some((run, began)) = self.runs.remove(&job) else { return };
        let fields = self.record_fields(&run, began, first);
        self.trace_container(&run, &fields);
        let (outcome, result) = match cause {
            FailCause::InitFailed => match &self.init_failure {
                Some(failed) => (Outcome::DeveloperError, failed.result.clone()),
                None => (Outcome::DeveloperError, json!({ "error": "The action failed to initialise." }).into()),
            },
            FailCause::ResumeFailed => (
                Outcome::WhiskError,
                json!({ "error": format!("the container could not be resumed: {}", self.resume_failure) }).into(),
            ),
            FailCause::Removed => {
                (Outcome::WhiskError, json!({ "error": "the container was removed before the run could start" }).into())
            }
        };
        // The failed `/init` may have written why to its logs; nothing else did.
        let window = match (cause, &self.created) {
            (FailCause::InitFailed, Some(created)) => Some(self.open_window(&run, &created.handle.logs)),
            _ => None,
        };
        let wait = self.ctx.config.log_sentinel_wait.min(Duration::from_millis(200));
        let logs = self.stage_span(&run, Stage::Logs);
        let fut = async move {
            let limit = run.meta.limits.logs as usize * 1024 * 1024;
            let _logs = logs;
            let lines = match window {
                Some(w) => w.collect(wait, limit).await,
                None => Vec::new(),
            };
            (run, lines)
        };
        ctx.spawn(fut.into_actor(self).map(move |(run, lines), act, ctx| {
            let record = build_record(&run, fields, outcome, result, lines, false);
            run.completion.finish(record);
            act.apply(Event::RunAnswered { job, reusable: false }, ctx);
        }));
    }

    fn record_fields(&self, run: &RunJob, began: Instant, first: bool) -> RecordFields {
        RecordFields {
            container: self.spec.id,
            start_kind: match (first, self.prewarmed) {
                (false, _) => StartKind::Warm,
                (true, false) => StartKind::Cold,
                (true, true) => StartKind::Prewarm,
            },
            create_ms: (first && !self.prewarmed).then_some(self.create_ms),
            init_ms: if first { self.init_ms } else { None },
            wait_ms: began.duration_since(run.accepted).as_millis() as u64,
            start: epoch_ms().saturating_sub(began.elapsed().as_millis() as u64),
            began,
        }
    }

    fn stage_span(&self, run: &RunJob, stage: Stage) -> Span {
        stage_span(run, self.spec.id, stage)
    }

    /// Says on the activation's span where it ran and how it started.
    fn trace_container(&self, run: &RunJob, fields: &RecordFields) {
        let span = run.completion.trace().span();
        if span.is_disabled() {
            return;
        }
        span.record("container", self.spec.id.0);
        span.record("node", &*self.node.0);
        span.record("start", fields.start_kind.as_str());
    }

    /// The window of `run`'s lines on its container's `logs`, opened as it is handed over.
    fn open_window(&self, run: &RunJob, logs: &Arc<LogBuffer>) -> LogWindow {
        if !self.protocol.marks_log_ends() {
            logs.open_sequential(Ends::Time)
        } else if run.action.limits.concurrency > 1 {
            logs.open(tag_of(run))
        } else {
            logs.open_sequential(Ends::Sentinels)
        }
    }

    /// Starts a run; one whose caller must hear of it first (a scheduler's queued call) waits
    /// for the caller's acknowledgement, and does not start if the caller is gone.
    fn start_run(&mut self, job: JobId, first: bool, ctx: &mut Context<Self>) {
        let Some((mut run, began)) = self.runs.remove(&job) else { return };
        let Some(notice) = run.start_notice.take() else { return self.run_now(job, run, began, first, ctx) };
        let (ack, acked) = tokio::sync::oneshot::channel();
        if notice.send(ack).is_err() {
            return self.unstarted(job, run, ctx);
        }
        let acked = async move { matches!(tokio::time::timeout(START_ACK_WAIT, acked).await, Ok(Ok(()))) };
        ctx.spawn(acked.into_actor(self).map(move |acked, act, ctx| match acked {
            true => act.run_now(job, run, began, first, ctx),
            false => act.unstarted(job, run, ctx),
        }));
    }

    /// Ends a run whose caller was gone before it could start: nothing ran, and the container
    /// takes its next run.
    fn unstarted(&mut self, job: JobId, run: RunJob, ctx: &mut Context<Self>) {
        tracing::info!(activation = %run.meta.activation_id, "its scheduler was gone before it started: not run");
        run.reject_because(Rejection::CallerGone, &Rejection::CallerGone.message());
        self.apply(Event::RunAnswered { job, reusable: true }, ctx);
    }

    fn run_now(&mut self, job: JobId, mut run: RunJob, began: Instant, first: bool, ctx: &mut Context<Self>) {
        let fields = self.record_fields(&run, began, first);
        self.trace_container(&run, &fields);
        let running = self.stage_span(&run, Stage::Run);
        let to_action = run.completion.trace().pass_on(&running);
        run.completion.trace_mut().set_to_action(to_action);
        let timeout_ms = run.meta.limits.timeout;
        // The core runs nothing before the container is created; said again for the compiler.
        let Some(Created { handle, runtime }) = self.created.clone() else {
            self.runs.insert(job, (run, began));
            return self.fail_run(job, FailCause::Removed, first, ctx);
        };
        let factory = self.ctx.factory.clone();
        let max_result = self.ctx.max_result_bytes;
        let container = self.spec.id;
        let discards = self.ctx.discards.clone();
        let mut window = self.open_window(&run, &handle.logs);
        let stream = run.stream.take();
        let fut = async move {
            let answer = runtime.run(&run, stream, Duration::from_millis(timeout_ms)).await;
            // The runtime has the call: its body (the parameters, a slice of the caller's
            // request) is not held while the answer is read into a record and its logs come.
            run.params = Params::empty();
            run.request = None;
            window.close_at_answer();
            let oom = !runtime.within_protocol(&answer) && factory.was_oom_killed(&handle);
            let why = discard_reason(&answer, oom);
            let failed = answer.as_ref().err().map(ToString::to_string);
            let interpreted = runtime.interpret(answer, timeout_ms, oom, max_result);
            if !interpreted.reusable {
                let detail = failed.unwrap_or_else(|| interpreted.result.error().unwrap_or_default());
                invoker_telemetry::failed(&running, &detail);
                discards.discarded(container.0, &format!("{}/{}", run.meta.namespace, run.meta.name), why, &detail);
            }
            drop(running);
            (run, interpreted, window)
        };
        ctx.spawn(fut.into_actor(self).map(move |(run, interpreted, window), act, ctx| {
            act.end_run(job, run, fields, interpreted, window, ctx);
        }));
    }

    /// Ends a run whose answer is in. Its record is whole at once when its lines are all in
    /// (a pipe read to its end, sentinels that came with the answer); otherwise the caller is
    /// answered now, and the record stored once its lines came. A reusable container takes its
    /// next run at once either way; one given up keeps its lines' source until they are in.
    fn end_run(
        &mut self,
        job: JobId,
        mut run: RunJob,
        fields: RecordFields,
        interpreted: Interpreted,
        window: LogWindow,
        ctx: &mut Context<Self>,
    ) {
        let Interpreted { outcome, reusable, timed_out, result } = interpreted;
        let limit = run.meta.limits.logs as usize * 1024 * 1024;
        let logs = stage_span(&run, self.spec.id, Stage::Logs);
        if window.is_complete() {
            let lines = window.take(limit);
            drop(logs);
            let record = build_record(&run, fields, outcome, result, lines, timed_out);
            run.completion.finish(record);
            return self.apply(Event::RunAnswered { job, reusable }, ctx);
        }
        let mut record = build_record(&run, fields, outcome, result, Vec::new(), timed_out);
        run.completion.answer(&mut record);
        // A failed container may never write its sentinels: do not wait long for them.
        let log_wait = self.ctx.config.log_sentinel_wait;
        let wait = if reusable { log_wait } else { log_wait.min(Duration::from_millis(200)) };
        let collect = async move {
            record.logs = window.collect(wait, limit).await;
            drop(logs);
            run.completion.finish(record);
        };
        if reusable {
            // Not the actor's: the record is finished even if the container goes meanwhile.
            actix::spawn(collect);
            self.apply(Event::RunAnswered { job, reusable }, ctx);
        } else {
            ctx.spawn(collect.into_actor(self).map(move |(), act, ctx| {
                act.apply(Event::RunAnswered { job, reusable }, ctx);
            }));
        }
    }

    fn pause(&mut self, ctx: &mut Context<Self>) {
        let Some(handle) = self.created.as_ref().map(|c| c.handle.clone()) else { return };
        let factory = self.ctx.factory.clone();
        let fut = async move { factory.pause(&handle).await };
        ctx.spawn(fut.into_actor(self).map(|paused, act, ctx| {
            if let Err(e) = &paused {
                tracing::warn!(container = act.spec.id.0, "pause failed, the container stays unpaused: {e}");
            }
            act.apply(Event::Paused { ok: paused.is_ok() }, ctx);
        }));
    }

    fn resume(&mut self, ctx: &mut Context<Self>) {
        let Some(handle) = self.created.as_ref().map(|c| c.handle.clone()) else { return };
        let factory = self.ctx.factory.clone();
        let fut = async move { factory.resume(&handle).await };
        ctx.spawn(fut.into_actor(self).map(|resumed, act, ctx| {
            if let Err(e) = &resumed {
                act.resume_failure = e.to_string();
                act.ctx.discards.discarded(act.spec.id.0, &act.spec.action_path, "resume failed", &e.to_string());
            }
            act.apply(Event::Resumed { ok: resumed.is_ok() }, ctx);
        }));
    }

    fn destroy(&mut self, ctx: &mut Context<Self>) {
        let factory = self.ctx.factory.clone();
        let handle = self.created.take().map(|c| c.handle);
        let fut = async move {
            if let Some(handle) = handle {
                if let Err(e) = factory.destroy(&handle).await {
                    tracing::warn!(container = handle.id.0, "destroy failed: {e}");
                }
            }
        };
        ctx.spawn(fut.into_actor(self).map(|(), act, ctx| act.apply(Event::Destroyed, ctx)));
    }
}

/// A span of one of `run`'s stages on `container`, under its activation's span, from now.
fn stage_span(run: &RunJob, container: ContainerId, stage: Stage) -> Span {
    let (trace, container) = (run.completion.trace(), container.0);
    match stage {
        Stage::Init => {
            invoker_telemetry::stage_span!(
                trace,
                "init",
                container,
                "otel.status_code" = Empty,
                "otel.status_description" = Empty
            )
        }
        Stage::Run => invoker_telemetry::stage_span!(
            trace,
            "run",
            container,
            "otel.kind" = "client",
            "otel.status_code" = Empty,
            "otel.status_description" = Empty
        ),
        Stage::Logs => invoker_telemetry::stage_span!(trace, "logs", container),
    }
}

/// The stages of a run on a container that get a span of their own.
#[derive(Clone, Copy)]
enum Stage {
    Init,
    Run,
    Logs,
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
        let factory = self.ctx.factory.clone();
        let (spec, node) = (self.spec.clone(), self.node.clone());
        let began = Instant::now();
        let fut = async move { factory.create(&spec, &node).await };
        ctx.spawn(fut.into_actor(self).map(move |created, act, ctx| {
            act.create_ms = began.elapsed().as_millis() as u64;
            if let Err(reason) = &created {
                invoker_telemetry::failed(&act.creating, &reason.to_string());
            }
            if created.is_err() || act.ahead.is_none() {
                act.creating = Span::none();
            }
            let failure = match created {
                Ok(handle) => {
                    let runtime =
                        Runtime::new(act.protocol, &handle.transport, handle.peer.clone(), act.ctx.max_result_bytes);
                    act.created = Some(Created { handle, runtime: Arc::new(runtime) });
                    None
                }
                Err(reason) => {
                    let (id, path) = (act.spec.id.0, &act.spec.action_path);
                    act.ctx.discards.discarded(id, path, "create failed", &reason.to_string());
                    Some(reason.create_failure())
                }
            };
            act.apply(Event::Created { failure }, ctx);
        }));
    }
}

impl Handler<Run> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, Run { job, run }: Run, ctx: &mut Context<Self>) {
        self.runs.insert(job, (run, Instant::now()));
        self.apply(Event::RunArrived(job), ctx);
    }
}

impl Handler<Pause> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, _: Pause, ctx: &mut Context<Self>) {
        self.apply(Event::PauseDecided, ctx);
    }
}

impl Handler<Resume> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, _: Resume, ctx: &mut Context<Self>) {
        self.apply(Event::ResumeDecided, ctx);
    }
}

impl Handler<Gone> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, _: Gone, ctx: &mut Context<Self>) {
        self.apply(Event::Gone, ctx);
    }
}

impl Handler<Remove> for ContainerProxy {
    type Result = ();

    fn handle(&mut self, _: Remove, ctx: &mut Context<Self>) {
        self.apply(Event::RemoveDecided, ctx);
    }
}
