//! Where accepted activations run: an invoker's own pool, or a scheduler's invokers. The
//! intake (`activation`) holds one, chosen in `app.rs`, and knows nothing of which; the pool's
//! handle and the scheduler's dispatcher implement it, below the intake.

use super::RunJob;
use futures_util::future::BoxFuture;
use invoker_wire::model::Action;
use std::sync::Arc;

pub trait Runner: Send + Sync + 'static {
    /// Hands `run` over; `Err` when it was refused and ended with a record already.
    fn submit(&self, run: RunJob) -> Result<(), Refused>;

    /// A queued call, durable already: it waits for room rather than being refused. One the
    /// runner cannot take (it is stopping) stays queued for the next start.
    fn submit_queued(&self, run: RunJob) -> BoxFuture<'_, ()>;

    /// The action `namespace/name` was deleted (`kept: None`) or saved as `kept`: no container
    /// of another revision runs anything again, and the idle ones go now.
    fn retire_action<'a>(&'a self, namespace: &'a str, name: &'a str, kept: Option<&'a Action>) -> BoxFuture<'a, ()>;

    /// Keeps `count` containers of `action` (this revision) provisioned; zero keeps none.
    fn provision(&self, action: Arc<Action>, count: u32) -> BoxFuture<'_, ()>;

    /// Whether its runs happen in other processes that keep their records (a scheduler's
    /// invokers): a call a restart interrupted is asked of them, not retried here.
    fn records_elsewhere(&self) -> bool;
}

/// Where a runner puts a blocking call that found no room within its wait, on a fleet that
/// can grow: the durable queue, as an asynchronous call waits (the intake's, which holds its
/// bounds and policy). The caller is answered that it was accepted, as OpenWhisk answers a
/// blocking call that outlasts its wait, rather than refused.
pub trait KeepQueued: Send + Sync + 'static {
    /// Journals `run` (accepted, blocking, not started) as a queued call and tells its caller;
    /// gives it back, with why, when the queue cannot take it (one of its bounds).
    fn keep(&self, run: RunJob) -> Kept;
}

/// What [`KeepQueued::keep`] did with a call.
pub enum Kept {
    /// Journaled as a queued call, its caller answered: to be handed on as one.
    Queued(RunJob),
    /// Not taken, and why: its caller still waits for its end.
    NotTaken(RunJob, String),
}

/// Why a runner did not take a job; its record is written already (`queue_full`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The pool's mailbox is full.
    PoolFull,
    /// The scheduler has its most activations in flight.
    SchedulerFull,
}
