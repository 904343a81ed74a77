//! The warm path's one hand-off: a job whose action has an offered container (idle and
//! unpaused, or running fewer runs than it takes) goes from the caller's task straight to that
//! container's proxy, without a message to the pool and a turn of its mailbox. The pool's core
//! named the container ([`PoolCore::offer`](invoker_core::pool::PoolCore::offer)); the actor
//! keeps its offers here after every event it applies; a take removes the offer and leaves
//! the job's [`Event::Taken`] for the actor, which applies it before any other event, so the
//! core stays the one owner of what runs where and decides nothing on a container it thinks
//! idle after it was taken.
//!
//! Sound because the pool, its proxies and the HTTP front door share the invoker's one thread
//! (`app.rs`): a take never happens while the actor applies an event, between its decision
//! and the offers it publishes after. The lock is for `Sync`, never contended.

use crate::proxy::{ContainerProxy, Run};
use actix::Addr;
use invoker_core::pool::{CoreConfig, Event, Job, KeyId, StemId, TenantId};
use invoker_factory::contract::Epoch;
use invoker_ids::{ContainerId, JobId, Time};
use invoker_job::RunJob;
use invoker_wire::model::Action;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a job of an offered key says of it to the core (all but its id and times).
#[derive(Clone, Copy)]
pub(super) struct JobShape {
    pub key: KeyId,
    pub memory_mb: u32,
    pub concurrency: u32,
    pub max_running: Option<u32>,
    pub tenant: TenantId,
    pub stem: Option<StemId>,
    pub idle_timeout: Option<std::time::Duration>,
}

impl JobShape {
    /// A job of `action` under `key`, as the actor interned it (the runs a container takes, the
    /// tenant, the key's own idle bound).
    pub(super) fn of(
        key: KeyId,
        action: &Action,
        (concurrency, tenant, idle_timeout): (u32, TenantId, Option<std::time::Duration>),
        config: &CoreConfig,
    ) -> Self {
        let l = &action.limits;
        JobShape {
            key,
            memory_mb: l.memory,
            concurrency,
            max_running: action.max_concurrency(),
            tenant,
            stem: config.stem_for(&action.exec.kind, l.memory, l.disk),
            idle_timeout,
        }
    }

    /// The job `id` of this shape, waiting until `deadline`.
    pub(super) fn job(self, id: JobId, deadline: Time, patient: bool) -> Job {
        Job {
            id,
            key: self.key,
            memory_mb: self.memory_mb,
            concurrency: self.concurrency,
            deadline,
            stem: self.stem,
            idle_timeout: self.idle_timeout,
            patient,
            max_running: self.max_running,
            tenant: self.tenant,
        }
    }
}

/// One key's offer: the container, its proxy, and the action allocation the key keeps (a
/// caller's action is found by its address, sound while the offer keeps it alive; a caller
/// holding another copy of the same revision goes through the pool, as the actor's own
/// lookup by address does).
struct Offer {
    action: Arc<Action>,
    container: ContainerId,
    proxy: Addr<ContainerProxy>,
    shape: JobShape,
}

#[derive(Default)]
struct Table {
    /// By the address of the key's action.
    offers: FxHashMap<usize, Offer>,
    /// Each offered key's entry in `offers`.
    by_key: FxHashMap<KeyId, usize>,
    /// Jobs taken and not yet told to the core.
    taken: Vec<(Job, ContainerId)>,
}

pub(super) struct HandOff {
    table: Mutex<Table>,
    /// Job ids, for the actor's jobs and the ones taken here alike.
    next_job: AtomicU64,
    epoch: Epoch,
}

impl HandOff {
    pub(super) fn new(epoch: Epoch) -> Self {
        HandOff { table: Mutex::default(), next_job: AtomicU64::new(1), epoch }
    }

    pub(super) fn next_job(&self) -> JobId {
        JobId(self.next_job.fetch_add(1, Ordering::Relaxed))
    }

    /// Hands `run` to its action's offered container, if there is one; otherwise gives it
    /// back. A queued call, or one whose caller must hear of its start, goes through the pool.
    pub(super) fn take(&self, run: RunJob) -> Option<RunJob> {
        if run.queued.is_some() || run.start_notice.is_some() {
            return Some(run);
        }
        let mut table = self.table.lock();
        let Some(offer) = table.offers.remove(&(Arc::as_ptr(&run.action) as usize)) else { return Some(run) };
        table.by_key.remove(&offer.shape.key);
        debug_assert!(Arc::ptr_eq(&offer.action, &run.action), "an offer found by another action's address");
        let id = self.next_job();
        // Dispatched now: it never waits.
        let job = offer.shape.job(id, self.epoch.now(), false);
        table.taken.push((job, offer.container));
        drop(table);
        // Bounded by the core as every run sent to a proxy is: the container was offered
        // because it has room for one more.
        offer.proxy.do_send(Run { job: id, run });
        None
    }

    /// The jobs taken since the last call, as the core's events.
    pub(super) fn taken(&self) -> Vec<Event> {
        let mut table = self.table.lock();
        if table.taken.is_empty() {
            return Vec::new();
        }
        table.taken.drain(..).map(|(job, container)| Event::Taken { job, container }).collect()
    }

    /// Offers `container` of the key `shape` names, for jobs of `action`.
    pub(super) fn offer(
        &self,
        action: Arc<Action>,
        container: ContainerId,
        proxy: Addr<ContainerProxy>,
        shape: JobShape,
    ) {
        let mut table = self.table.lock();
        let address = Arc::as_ptr(&action) as usize;
        if let Some(old) = table.by_key.insert(shape.key, address) {
            table.offers.remove(&old);
        }
        table.offers.insert(address, Offer { action, container, proxy, shape });
    }

    /// The key has no offer now.
    pub(super) fn withdraw(&self, key: KeyId) {
        let mut table = self.table.lock();
        if let Some(address) = table.by_key.remove(&key) {
            table.offers.remove(&address);
        }
    }
}
