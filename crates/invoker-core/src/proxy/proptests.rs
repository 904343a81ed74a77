//! Random interleavings of the factory's and the runtime's answers and of the pool's
//! decisions, against a model of the container that knows the truth (is it paused, is it gone).
//!
//! Invariants: no run reaches the runtime unless the container is created, initialised,
//! running (not paused, pausing or resuming) and not being removed; every run the pool sent
//! gets exactly one answer, `Finished`, or `Removed` while it was in the runtime, never both; a
//! failed create ends with `Removed`; nothing is reported after `Removed`. A container
//! initialised ahead (a provisioned one) reports started only once initialised, and none of
//! its runs is a first run.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Clone, Debug)]
enum Op {
    Create { ok: bool },
    Arrive,
    AnswerInit { ok: bool },
    AnswerRun { pick: usize, reusable: bool },
    AnswerFail { pick: usize },
    DecidePause,
    AnswerPause { ok: bool },
    DecideResume,
    AnswerResume { ok: bool },
    DecideRemove,
    Gone,
    AnswerDestroy,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => prop::bool::weighted(0.8).prop_map(|ok| Op::Create { ok }),
        5 => Just(Op::Arrive),
        2 => prop::bool::weighted(0.8).prop_map(|ok| Op::AnswerInit { ok }),
        5 => (any::<usize>(), prop::bool::weighted(0.8)).prop_map(|(pick, reusable)| Op::AnswerRun { pick, reusable }),
        3 => any::<usize>().prop_map(|pick| Op::AnswerFail { pick }),
        2 => Just(Op::DecidePause),
        2 => prop::bool::weighted(0.8).prop_map(|ok| Op::AnswerPause { ok }),
        2 => Just(Op::DecideResume),
        2 => prop::bool::weighted(0.8).prop_map(|ok| Op::AnswerResume { ok }),
        1 => Just(Op::DecideRemove),
        1 => Just(Op::Gone),
        1 => Just(Op::AnswerDestroy),
    ]
}

/// What is under way, and what is true of the container.
#[derive(Default)]
struct World {
    next_job: u64,
    creating: bool,
    /// The factory made it (its `Created` came, ok).
    made: bool,
    ahead: bool,
    init_in_flight: bool,
    initialised: bool,
    in_runtime: Vec<JobId>,
    failing: Vec<JobId>,
    pausing: bool,
    paused: bool,
    resuming: bool,
    destroying: bool,
    removed: bool,
    answers: HashMap<JobId, u32>,
    lost: Vec<JobId>,
    arrived: Vec<JobId>,
}

impl World {
    fn apply(&mut self, effects: Effects) -> Result<(), TestCaseError> {
        for effect in effects {
            prop_assert!(!self.removed || effect == Effect::Stop, "{effect:?} after Removed");
            match effect {
                Effect::Init { .. } => {
                    prop_assert!(!self.creating && !self.init_in_flight, "an init while creating or initialising");
                    self.init_in_flight = true;
                }
                Effect::InitAhead => {
                    prop_assert!(self.ahead && self.made && !self.init_in_flight, "an init ahead out of turn");
                    self.init_in_flight = true;
                }
                Effect::Run { job, first } => {
                    prop_assert!(!(self.ahead && first), "a run of a container initialised ahead paid for its start");
                    let reachable = !self.creating && self.initialised && !self.destroying;
                    let running = !self.paused && !self.pausing && !self.resuming;
                    prop_assert!(reachable && running, "{job:?} sent to a container that cannot run it");
                    self.in_runtime.push(job);
                }
                Effect::Fail { job, .. } => self.failing.push(job),
                Effect::Pause => {
                    prop_assert!(self.in_runtime.is_empty(), "a pause with runs in the runtime");
                    self.pausing = true;
                }
                Effect::Resume => {
                    prop_assert!(self.paused && !self.resuming);
                    self.resuming = true;
                }
                Effect::Destroy => {
                    prop_assert!(!self.destroying, "destroyed twice");
                    self.destroying = true;
                }
                Effect::ReportStarted { failure } => {
                    prop_assert!(
                        !(self.ahead && failure.is_none() && !self.initialised),
                        "a container initialised ahead reported started before it was initialised"
                    );
                    self.creating = false;
                }
                Effect::ReportFinished { job, .. } => *self.answers.entry(job).or_default() += 1,
                Effect::ReportRemoved => {
                    // What had not answered ends with the container (the actor stops under it).
                    self.lost.append(&mut self.in_runtime);
                    self.lost.append(&mut self.failing);
                    self.removed = true;
                }
                Effect::Stop => prop_assert!(self.removed, "stopped before Removed"),
            }
        }
        Ok(())
    }

    fn pick(list: &mut Vec<JobId>, pick: usize) -> Option<JobId> {
        (!list.is_empty()).then(|| list.remove(pick % list.len()))
    }
}

fn run(initialises: bool, ahead: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut core = if ahead { ProxyCore::initialised_ahead(initialises) } else { ProxyCore::new(initialises) };
    let mut w = World { creating: true, initialised: !initialises, ahead, ..World::default() };
    for op in ops {
        if w.removed {
            break;
        }
        let event = match op {
            Op::Create { ok } if w.creating && !w.made => {
                w.made = ok;
                Event::Created { failure: (!ok).then_some(CreateFailure::Failed) }
            }
            Op::Arrive => {
                let job = JobId(w.next_job);
                w.next_job += 1;
                w.arrived.push(job);
                Event::RunArrived(job)
            }
            Op::AnswerInit { ok } if w.init_in_flight => {
                w.init_in_flight = false;
                w.initialised = ok;
                Event::InitAnswered { ok }
            }
            Op::AnswerRun { pick, reusable } => match World::pick(&mut w.in_runtime, pick) {
                Some(job) => Event::RunAnswered { job, reusable },
                None => continue,
            },
            Op::AnswerFail { pick } => match World::pick(&mut w.failing, pick) {
                Some(job) => Event::RunAnswered { job, reusable: false },
                None => continue,
            },
            Op::DecidePause => Event::PauseDecided,
            Op::AnswerPause { ok } if w.pausing => {
                w.pausing = false;
                w.paused = ok;
                Event::Paused { ok }
            }
            Op::DecideResume => Event::ResumeDecided,
            Op::AnswerResume { ok } if w.resuming => {
                w.resuming = false;
                w.paused = !ok;
                Event::Resumed { ok }
            }
            Op::DecideRemove => Event::RemoveDecided,
            Op::Gone => Event::Gone,
            Op::AnswerDestroy if w.destroying => Event::Destroyed,
            _ => continue,
        };
        let created_failed = matches!(event, Event::Created { failure: Some(_) });
        w.apply(core.handle(event))?;
        if created_failed {
            prop_assert!(w.removed, "a failed create ends with Removed");
        }
    }
    // Whatever is left under way answers, and the pool removes the container.
    if !w.removed {
        if w.creating && !w.made {
            w.made = true;
            w.apply(core.handle(Event::Created { failure: None }))?;
        }
        if w.init_in_flight {
            w.init_in_flight = false;
            w.initialised = true;
            w.apply(core.handle(Event::InitAnswered { ok: true }))?;
        }
        w.apply(core.handle(Event::RemoveDecided))?;
        for _ in 0..64 {
            let event = if let Some(job) = w.failing.pop() {
                Event::RunAnswered { job, reusable: false }
            } else if let Some(job) = w.in_runtime.pop() {
                Event::RunAnswered { job, reusable: false }
            } else if w.pausing {
                w.pausing = false;
                Event::Paused { ok: true }
            } else if w.resuming {
                w.resuming = false;
                Event::Resumed { ok: true }
            } else {
                break;
            };
            w.apply(core.handle(event))?;
        }
        if w.destroying && !w.removed {
            w.apply(core.handle(Event::Destroyed))?;
        }
    }
    prop_assert!(w.removed, "the container ends removed");
    for job in &w.arrived {
        let finished = w.answers.get(job).copied().unwrap_or(0);
        let lost = u32::from(w.lost.contains(job));
        prop_assert_eq!(finished + lost, 1, "{:?}: {} finished, {} lost with the container", job, finished, lost);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn no_run_reaches_a_container_that_cannot_run_it_and_every_run_is_answered_once(
        initialises in prop::bool::weighted(0.8),
        ahead in prop::bool::weighted(0.3),
        ops in prop::collection::vec(op(), 1..80)
    ) {
        run(initialises, ahead, ops)?;
    }
}
