//! One container's life, decided without I/O: events in (the factory created it, the runtime
//! answered, the pool's core decided a pause), effects out (call the runtime, pause it, tell the
//! pool). The actor in `mod.rs` carries the effects out and feeds their results back; it keeps
//! the runs' payloads and the container's handle, and decides nothing.
//!
//! The states are OpenWhisk's ContainerProxy's. The pool's core decides what runs where and
//! when a container pauses, resumes or goes; this core applies those decisions to the one
//! container it owns, and is the only place its state lives. What it guarantees, whatever the
//! order the answers come in (`proptests.rs`): no run reaches the runtime of a container that
//! is paused, pausing, resuming or removed; every run the pool sent gets exactly one answer to
//! the pool, a `Finished`, or the container's `Removed` while it ran; a failed create ends with
//! `Removed`, so that the pool forgets the container; nothing is reported after `Removed`.

use invoker_ids::{CreateFailure, JobId};

/// The OpenWhisk ContainerProxy states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyState {
    /// The factory is creating the container.
    Starting,
    /// Created, never run.
    Started,
    Running,
    /// Idle between runs.
    Ready,
    Pausing,
    Paused,
    Resuming,
    Removing,
    /// Removed and reported: the actor stops.
    Removed,
}

/// What happened to the container, or what the pool's core decided for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// `failure`: `None` when the container is ready, otherwise why not.
    Created {
        failure: Option<CreateFailure>,
    },
    /// The pool sent a run here.
    RunArrived(JobId),
    InitAnswered {
        ok: bool,
    },
    /// A run ended (its record is written): from the runtime, or failed without reaching it.
    RunAnswered {
        job: JobId,
        reusable: bool,
    },
    PauseDecided,
    Paused {
        ok: bool,
    },
    ResumeDecided,
    Resumed {
        ok: bool,
    },
    RemoveDecided,
    /// The factory saw the container end on its own.
    Gone,
    /// The factory removed it.
    Destroyed,
}

/// Why a run ends without reaching the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailCause {
    /// `/init` failed: a developer error, as OpenWhisk's.
    InitFailed,
    /// The container could not be resumed: nothing ran, a whisk error.
    ResumeFailed,
    /// The container was being removed.
    Removed,
}

/// What the actor carries out, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Give the runtime its action's code: the action of run `with`.
    Init {
        with: JobId,
    },
    /// Give the runtime the code of the action the container was created for, before any run
    /// (a provisioned container): answered with `InitAnswered`.
    InitAhead,
    /// Call the runtime with the run; `first`: the first run of this container (its start
    /// kind is cold or prewarm, not warm).
    Run {
        job: JobId,
        first: bool,
    },
    /// End the run with a record of `cause`, then answer `RunAnswered`.
    Fail {
        job: JobId,
        cause: FailCause,
        first: bool,
    },
    Pause,
    Resume,
    Destroy,
    ReportStarted {
        failure: Option<CreateFailure>,
    },
    ReportFinished {
        job: JobId,
        reusable: bool,
    },
    ReportRemoved,
    Stop,
}

/// Whether the runtime holds the action's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Init {
    NotYet,
    InProgress,
    Done,
}

/// The state of one container and of the runs the pool sent it.
#[derive(Debug)]
pub struct ProxyCore {
    state: ProxyState,
    init: Init,
    /// Runs the pool sent that have not answered yet, wherever they are.
    admitted: usize,
    /// Waiting for the container to be created or initialised.
    waiting: Vec<JobId>,
    /// Waiting for a resume.
    parked: Vec<JobId>,
    /// A resume was decided while the pause was still under way.
    resume_wanted: bool,
    /// A run has been sent to the runtime.
    ran: bool,
    /// Initialised as it is created, before the pool hears it started (a provisioned
    /// container): no run of it pays for a start.
    ahead: bool,
    /// Its initialisation ahead failed: the pool hears the start failed once it is destroyed.
    ahead_failed: bool,
}

impl Default for ProxyCore {
    /// A container of a protocol that initialises (OpenWhisk's).
    fn default() -> Self {
        ProxyCore::new(true)
    }
}

impl ProxyCore {
    /// `initialises`: the protocol gives a container its code before the first run (see
    /// `RuntimeProtocol::initialises`); if not, a created container runs at once.
    pub fn new(initialises: bool) -> Self {
        ProxyCore {
            state: ProxyState::Starting,
            init: if initialises { Init::NotYet } else { Init::Done },
            admitted: 0,
            waiting: Vec::new(),
            parked: Vec::new(),
            resume_wanted: false,
            ran: false,
            ahead: false,
            ahead_failed: false,
        }
    }

    /// A provisioned container's: created and initialised (where its protocol initialises)
    /// before the pool hears it started, so that its first run is as warm as any other.
    pub fn initialised_ahead(initialises: bool) -> Self {
        ProxyCore { ahead: true, ..ProxyCore::new(initialises) }
    }
}

/// What one event decides: a warm run's events decide one or two effects, kept inline.
pub type Effects = smallvec::SmallVec<[Effect; 4]>;

impl ProxyCore {
    pub fn state(&self) -> ProxyState {
        self.state
    }

    pub fn handle(&mut self, event: Event) -> Effects {
        let mut fx = Effects::new();
        if self.state == ProxyState::Removed {
            return fx;
        }
        match event {
            Event::Created { failure } => self.on_created(failure, &mut fx),
            Event::RunArrived(job) => self.on_run(job, &mut fx),
            Event::InitAnswered { ok } => self.on_init(ok, &mut fx),
            Event::RunAnswered { job, reusable } => self.on_answered(job, reusable, &mut fx),
            Event::PauseDecided => self.on_pause_decided(&mut fx),
            Event::Paused { ok } => self.on_paused(ok, &mut fx),
            Event::ResumeDecided => self.resume(&mut fx),
            Event::Resumed { ok } => self.on_resumed(ok, &mut fx),
            Event::RemoveDecided => self.remove(&mut fx),
            Event::Gone if self.admitted == 0 => self.remove(&mut fx),
            Event::Gone => {} // its runs fail on their own, and retire it
            Event::Destroyed => {
                self.state = ProxyState::Removed;
                if self.ahead_failed {
                    fx.push(Effect::ReportStarted { failure: Some(CreateFailure::InitFailed) });
                }
                fx.extend([Effect::ReportRemoved, Effect::Stop]);
            }
        }
        fx
    }

    fn on_created(&mut self, failure: Option<CreateFailure>, fx: &mut Effects) {
        if self.state != ProxyState::Starting {
            return;
        }
        if self.ahead && self.init == Init::InProgress {
            return; // told twice: the first is being initialised
        }
        if failure.is_none() && self.ahead && self.init == Init::NotYet {
            // Still starting, as the pool sees it, until the runtime holds the code.
            self.init = Init::InProgress;
            fx.push(Effect::InitAhead);
            return;
        }
        self.report_started(failure, fx);
    }

    fn report_started(&mut self, failure: Option<CreateFailure>, fx: &mut Effects) {
        fx.push(Effect::ReportStarted { failure });
        if failure.is_some() {
            // Nothing to destroy; the pool holds the container until it hears it is gone.
            self.fail_waiting(FailCause::Removed, fx);
            self.state = ProxyState::Removed;
            fx.extend([Effect::ReportRemoved, Effect::Stop]);
            return;
        }
        self.state = ProxyState::Started;
        let waiting = std::mem::take(&mut self.waiting);
        if !waiting.is_empty() {
            self.state = ProxyState::Running;
            for job in waiting {
                self.dispatch(job, fx);
            }
        }
    }

    fn on_run(&mut self, job: JobId, fx: &mut Effects) {
        self.admitted += 1;
        match self.state {
            ProxyState::Starting => self.waiting.push(job),
            ProxyState::Pausing | ProxyState::Resuming => self.parked.push(job),
            ProxyState::Paused => {
                self.parked.push(job);
                self.resume(fx);
            }
            ProxyState::Removing | ProxyState::Removed => {
                fx.push(Effect::Fail { job, cause: FailCause::Removed, first: self.first() });
            }
            ProxyState::Started | ProxyState::Running | ProxyState::Ready => {
                self.state = ProxyState::Running;
                self.dispatch(job, fx);
            }
        }
    }

    /// To the runtime, initialising it first with the run's action.
    fn dispatch(&mut self, job: JobId, fx: &mut Effects) {
        match self.init {
            Init::Done => self.send(job, fx),
            Init::InProgress => self.waiting.push(job),
            Init::NotYet => {
                self.init = Init::InProgress;
                fx.push(Effect::Init { with: job });
                self.waiting.push(job);
            }
        }
    }

    fn send(&mut self, job: JobId, fx: &mut Effects) {
        fx.push(Effect::Run { job, first: self.first() });
        self.ran = true;
    }

    /// Whether the next run is the one that pays for the container's start.
    fn first(&self) -> bool {
        !self.ran && !self.ahead
    }

    fn on_init(&mut self, ok: bool, fx: &mut Effects) {
        if self.init != Init::InProgress || self.state == ProxyState::Removing {
            return;
        }
        if self.state == ProxyState::Starting {
            // Initialised ahead: now it is started, or it goes and its start failed.
            if ok {
                self.init = Init::Done;
                return self.report_started(None, fx);
            }
            self.ahead_failed = true;
            self.fail_waiting(FailCause::InitFailed, fx);
            self.state = ProxyState::Removing;
            fx.push(Effect::Destroy);
            return;
        }
        if ok {
            self.init = Init::Done;
            for job in std::mem::take(&mut self.waiting) {
                self.send(job, fx);
            }
        } else {
            // The container is not reused: the pool retires it when it hears the runs failed.
            self.init = Init::NotYet;
            self.fail_waiting(FailCause::InitFailed, fx);
        }
    }

    fn fail_waiting(&mut self, cause: FailCause, fx: &mut Effects) {
        let first = self.first();
        for job in std::mem::take(&mut self.waiting).into_iter().chain(std::mem::take(&mut self.parked)) {
            fx.push(Effect::Fail { job, cause, first });
        }
    }

    fn on_answered(&mut self, job: JobId, reusable: bool, fx: &mut Effects) {
        self.admitted = self.admitted.saturating_sub(1);
        if self.admitted == 0 && self.state == ProxyState::Running {
            self.state = ProxyState::Ready;
        }
        fx.push(Effect::ReportFinished { job, reusable });
    }

    /// Only an idle, ready container pauses; the pool's core never asks for another.
    fn on_pause_decided(&mut self, fx: &mut Effects) {
        if self.state != ProxyState::Ready || self.admitted > 0 {
            return;
        }
        self.state = ProxyState::Pausing;
        fx.push(Effect::Pause);
    }

    fn on_paused(&mut self, ok: bool, fx: &mut Effects) {
        if self.state != ProxyState::Pausing {
            return;
        }
        if !ok {
            // It stays unpaused, and runs on.
            return self.release_parked(fx);
        }
        self.state = ProxyState::Paused;
        if self.resume_wanted || !self.parked.is_empty() {
            self.resume(fx);
        }
    }

    /// Resumes a paused container; one still pausing resumes once it has paused.
    fn resume(&mut self, fx: &mut Effects) {
        match self.state {
            ProxyState::Paused => {
                self.resume_wanted = false;
                self.state = ProxyState::Resuming;
                fx.push(Effect::Resume);
            }
            ProxyState::Pausing => self.resume_wanted = true,
            _ => {}
        }
    }

    fn on_resumed(&mut self, ok: bool, fx: &mut Effects) {
        if self.state != ProxyState::Resuming {
            return;
        }
        if ok {
            self.release_parked(fx);
        } else {
            // Nothing ran: its runs get whisk errors (safe to retry) and the container, given
            // up, is retired by the pool when it hears them.
            self.fail_waiting(FailCause::ResumeFailed, fx);
        }
    }

    fn release_parked(&mut self, fx: &mut Effects) {
        self.state = if self.admitted > 0 { ProxyState::Running } else { ProxyState::Ready };
        for job in std::mem::take(&mut self.parked) {
            self.dispatch(job, fx);
        }
    }

    /// Runs that have not reached the runtime end now; those in it end when the factory
    /// removes the container under them (and the pool counts them lost with the container).
    fn remove(&mut self, fx: &mut Effects) {
        if self.state == ProxyState::Removing {
            return;
        }
        self.fail_waiting(FailCause::Removed, fx);
        if self.state == ProxyState::Starting {
            // Gone, the factory says, while it still creates it: the create is dropped with
            // the actor, and the pool hears at once that it is gone. Nothing leaks: a factory
            // reports gone only what it saw end (a pod deleted, a task lost), and the pool's
            // core never decides to remove a container still starting (its property tests
            // hold it to that). A wait for the create would hold the pool's memory for as long
            // as the factory's bound when the create cannot end.
            self.state = ProxyState::Removed;
            fx.extend([Effect::ReportRemoved, Effect::Stop]);
            return;
        }
        self.state = ProxyState::Removing;
        fx.push(Effect::Destroy);
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: u64) -> JobId {
        JobId(n)
    }

    fn created() -> ProxyCore {
        let mut core = ProxyCore::default();
        assert_eq!(core.handle(Event::Created { failure: None }).to_vec(), [Effect::ReportStarted { failure: None }]);
        core
    }

    #[test]
    fn the_first_run_initialises_then_runs_cold_and_the_next_runs_warm() {
        let mut core = created();
        assert_eq!(core.handle(Event::RunArrived(job(1))).to_vec(), [Effect::Init { with: job(1) }]);
        assert_eq!(core.handle(Event::RunArrived(job(2))).to_vec(), [], "waits for /init");
        assert_eq!(
            core.handle(Event::InitAnswered { ok: true }).to_vec(),
            [Effect::Run { job: job(1), first: true }, Effect::Run { job: job(2), first: false }]
        );
        assert_eq!(core.handle(Event::RunAnswered { job: job(1), reusable: true }).to_vec().len(), 1);
        assert_eq!(core.state(), ProxyState::Running);
        core.handle(Event::RunAnswered { job: job(2), reusable: true });
        assert_eq!(core.state(), ProxyState::Ready);
        assert_eq!(core.handle(Event::RunArrived(job(3))).to_vec(), [Effect::Run { job: job(3), first: false }]);
    }

    /// A provisioned container: initialised before the pool hears it started, so its first
    /// run is warm; a failed initialisation destroys it, then says the start failed.
    #[test]
    fn a_container_initialised_ahead_is_started_only_once_initialised_and_runs_warm() {
        let mut core = ProxyCore::initialised_ahead(true);
        assert_eq!(core.handle(Event::Created { failure: None }).to_vec(), [Effect::InitAhead]);
        assert_eq!(core.state(), ProxyState::Starting);
        assert_eq!(core.handle(Event::InitAnswered { ok: true }).to_vec(), [Effect::ReportStarted { failure: None }]);
        assert_eq!(core.handle(Event::RunArrived(job(1))).to_vec(), [Effect::Run { job: job(1), first: false }]);

        let mut core = ProxyCore::initialised_ahead(true);
        core.handle(Event::Created { failure: None });
        assert_eq!(core.handle(Event::InitAnswered { ok: false }).to_vec(), [Effect::Destroy]);
        assert_eq!(
            core.handle(Event::Destroyed).to_vec(),
            [Effect::ReportStarted { failure: Some(CreateFailure::InitFailed) }, Effect::ReportRemoved, Effect::Stop]
        );

        // A protocol that does not initialise (Fn's): started as soon as it is created.
        let mut core = ProxyCore::initialised_ahead(false);
        assert_eq!(core.handle(Event::Created { failure: None }).to_vec(), [Effect::ReportStarted { failure: None }]);
        assert_eq!(core.handle(Event::RunArrived(job(1))).to_vec(), [Effect::Run { job: job(1), first: false }]);
    }

    #[test]
    fn a_failed_create_reports_removed_so_that_the_pool_forgets_it() {
        let mut core = ProxyCore::default();
        assert_eq!(
            core.handle(Event::Created { failure: Some(CreateFailure::Failed) }).to_vec(),
            [Effect::ReportStarted { failure: Some(CreateFailure::Failed) }, Effect::ReportRemoved, Effect::Stop]
        );
        assert_eq!(core.handle(Event::RunArrived(job(1))).to_vec(), [], "nothing after Removed");
    }

    #[test]
    fn a_failed_init_fails_every_waiting_run_as_a_developer_error() {
        let mut core = created();
        core.handle(Event::RunArrived(job(1)));
        core.handle(Event::RunArrived(job(2)));
        let cause = FailCause::InitFailed;
        assert_eq!(
            core.handle(Event::InitAnswered { ok: false }).to_vec(),
            [Effect::Fail { job: job(1), cause, first: true }, Effect::Fail { job: job(2), cause, first: true }]
        );
    }

    #[test]
    fn a_run_sent_while_pausing_waits_for_the_pause_then_the_resume() {
        let mut core = created();
        core.handle(Event::RunArrived(job(1)));
        core.handle(Event::InitAnswered { ok: true });
        core.handle(Event::RunAnswered { job: job(1), reusable: true });
        assert_eq!(core.handle(Event::PauseDecided).to_vec(), [Effect::Pause]);
        assert_eq!(core.handle(Event::ResumeDecided).to_vec(), [], "still pausing");
        assert_eq!(core.handle(Event::RunArrived(job(2))).to_vec(), []);
        assert_eq!(core.handle(Event::Paused { ok: true }).to_vec(), [Effect::Resume]);
        assert_eq!(core.handle(Event::Resumed { ok: true }).to_vec(), [Effect::Run { job: job(2), first: false }]);
    }

    #[test]
    fn a_failed_resume_fails_the_parked_runs_as_whisk_errors() {
        let mut core = created();
        core.handle(Event::RunArrived(job(1)));
        core.handle(Event::InitAnswered { ok: true });
        core.handle(Event::RunAnswered { job: job(1), reusable: true });
        core.handle(Event::PauseDecided);
        core.handle(Event::Paused { ok: true });
        assert_eq!(core.handle(Event::RunArrived(job(2))).to_vec(), [Effect::Resume]);
        let cause = FailCause::ResumeFailed;
        assert_eq!(
            core.handle(Event::Resumed { ok: false }).to_vec(),
            [Effect::Fail { job: job(2), cause, first: false }]
        );
    }

    #[test]
    fn a_removal_fails_what_waits_and_destroys_once() {
        let mut core = created();
        core.handle(Event::RunArrived(job(1)));
        let cause = FailCause::Removed;
        assert_eq!(
            core.handle(Event::RemoveDecided).to_vec(),
            [Effect::Fail { job: job(1), cause, first: true }, Effect::Destroy]
        );
        assert_eq!(core.handle(Event::RemoveDecided).to_vec(), []);
        assert_eq!(core.handle(Event::InitAnswered { ok: true }).to_vec(), [], "no run after the removal");
        assert_eq!(core.handle(Event::Destroyed).to_vec(), [Effect::ReportRemoved, Effect::Stop]);
    }

    #[test]
    fn a_removal_or_a_gone_during_creation_is_reported_at_once() {
        for event in [Event::RemoveDecided, Event::Gone] {
            let mut core = ProxyCore::default();
            assert_eq!(core.handle(event).to_vec(), [Effect::ReportRemoved, Effect::Stop], "{event:?}");
            assert_eq!(core.handle(Event::Created { failure: None }).to_vec(), [], "nothing after Removed");
        }
    }

    #[test]
    fn a_protocol_without_init_runs_the_first_run_at_once() {
        let mut core = ProxyCore::new(false);
        assert_eq!(core.handle(Event::RunArrived(job(1))).to_vec(), [], "waits for the container");
        assert_eq!(
            core.handle(Event::Created { failure: None }).to_vec(),
            [Effect::ReportStarted { failure: None }, Effect::Run { job: job(1), first: true }]
        );
        assert_eq!(core.handle(Event::RunArrived(job(2))).to_vec(), [Effect::Run { job: job(2), first: false }]);
    }
}
