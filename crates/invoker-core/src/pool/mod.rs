//! The pool core: every scheduling decision of the invoker, as a pure function of events.
//!
//! `PoolCore::handle(event, now)` returns the effects the caller must carry out. It reads no
//! clock and does no I/O, so the actor, the simulator and the property tests drive the same
//! code. Per activation the work is O(log n): warm containers sit in per-key ordered sets
//! (LIFO for idle ones, most-loaded-first for concurrent ones), idle containers in one global
//! LRU, deadlines in one ordered set. Only cold-start placement looks at the nodes.

mod dirty_offers;
mod estimates;
mod hybrid;
mod idle_stack;
mod keep_alive;
mod nodes;
mod offers;
mod prewarming;
#[cfg(test)]
mod proptests;
mod provisioned;
#[cfg(test)]
mod provisioned_tests;
mod provisioning;
mod slab;
mod stems;
#[cfg(test)]
mod tests;
mod types;

pub use keep_alive::{FixedKeepAlive, GreedyDual, IdleSpell, KeepAlivePolicy, Live};
pub use nodes::NodeView;
pub use types::*;

use estimates::{served_before_a_start, Ewma};
use idle_stack::IdleStack;
use invoker_ids::{ContainerId, CreateFailure, JobId, NodeId, Time};
use nodes::{Nodes, Placement};
use rustc_hash::FxHashMap;
use slab::Slab;
use smallvec::SmallVec;
use std::collections::{BTreeSet, VecDeque};
use stems::Stems;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Starting,
    Ready,
    Removing,
}

/// Kept to one cache line (the slab aligns each to 64 bytes), since a warm activation at a
/// hundred thousand containers is bound by the memory it touches: times are whole
/// microseconds, and what is the same for all of a key's containers (their concurrency) is
/// read from the key.
#[derive(Debug)]
struct Container {
    owner: Owner,
    node: NodeId,
    memory_mb: u32,
    phase: Phase,
    /// Must not take new work: it failed, or the pool is draining.
    retiring: bool,
    /// Frozen while idle (an `Effect::Pause` went out); its next job is preceded by a resume.
    paused: bool,
    /// It has run a job (one that has not is a pre-warm, or a start its job did not need).
    ran: bool,
    /// Jobs running, with when each was dispatched (microseconds since the epoch).
    running: SmallVec<[(JobId, u64); 1]>,
    /// Microseconds since the epoch.
    created_at: u64,
}

const _: () = assert!(std::mem::size_of::<Option<Container>>() <= 64, "a container is one cache line");

/// The policy `config.keep_alive` names, with its parameters.
pub fn policy_for(config: &CoreConfig) -> Box<dyn KeepAlivePolicy> {
    match config.keep_alive {
        KeepAliveKind::Fixed => Box::new(FixedKeepAlive::new(config.idle_timeout)),
        KeepAliveKind::GreedyDual => Box::new(GreedyDual::new(config.keep_alive_params.max_idle)),
        KeepAliveKind::Hybrid => {
            Box::new(hybrid::HybridHistogram::new(config.keep_alive_params.clone(), config.idle_timeout))
        }
    }
}

/// A container `make_room` may remove, with its idle spell (none for a stem container).
type Victim = (ContainerId, Option<IdleSpell>);

/// The cold-start cost the keep-alive policy is told before any container has started.
const UNKNOWN_START_COST: std::time::Duration = std::time::Duration::from_millis(500);

/// A [`Time`] as whole microseconds, the resolution the core keeps per container.
fn micros(t: Time) -> u64 {
    u64::try_from(t.as_micros()).unwrap_or(u64::MAX)
}

#[derive(Debug, Default)]
struct KeyState {
    idle: IdleStack,
    /// Ready containers running some jobs but below their concurrency, by load.
    partial: BTreeSet<(usize, ContainerId)>,
    starting: u32,
    /// Waiting jobs in arrival order; may hold ids already expired (skipped when popped).
    waiting: VecDeque<JobId>,
    /// Waiting patient jobs ([`Job::patient`]), in arrival order, taken after `waiting`.
    patient: VecDeque<JobId>,
    /// Live jobs in `waiting` and `patient`.
    waiting_live: usize,
    /// Since when some of its jobs have waited without a break (cleared when none waits): a
    /// queue that callers refill as fast as busy containers drain it never gets old jobs, but
    /// stays full, which says as surely that the busy containers do not keep up.
    backlog_since: Option<Time>,
    containers: u32,
    concurrency: u32,
    memory_mb: u32,
    /// Queued in `PoolCore::blocked`, waiting for resources or a start slot on a node.
    blocked: bool,
    /// The prewarm class whose stem containers this key may adopt.
    stem: Option<StemId>,
    /// Since when its jobs have waited for room on some node (cleared when it gets a start).
    room_wait_since: Option<Time>,
    run_time: Ewma,
    start_time: Ewma,
    /// Whether `rechecks` holds this key (its waiting jobs rely on busy containers until then).
    recheck_pending: bool,
    /// Activations since the key was last forgotten (for the keep-alive policy).
    activations: u32,
    /// Its jobs' own idle bound ([`Job::idle_timeout`]).
    idle_timeout: Option<std::time::Duration>,
    /// Its action is gone ([`Event::Retire`]): none of its containers is kept idle.
    retired: bool,
    /// Jobs of the key running now (dispatched, not finished), and the most that may
    /// ([`Job::max_running`]).
    running: u32,
    cap: Option<u32>,
    tenant: TenantId,
    provisioned: provisioned::Provisioned,
}

impl KeyState {
    /// A waiting job left its queue (ran, expired or was refused); the last one ends the backlog.
    fn one_waits_less(&mut self) {
        self.waiting_live -= 1;
        if self.waiting_live == 0 {
            self.backlog_since = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.containers == 0 && self.waiting_live == 0 && !self.blocked && !self.provisioned.keeps_any()
    }

    /// What its jobs (or its provisioning) say of it: the memory of a container, the runs one
    /// takes at once, the most that may run, and whose it is.
    fn shape(&mut self, memory_mb: u32, concurrency: u32, max_running: Option<u32>, tenant: TenantId) {
        self.memory_mb = memory_mb;
        self.concurrency = concurrency.max(1);
        self.cap = max_running.map(|cap| cap.max(1));
        self.tenant = tenant;
    }

    /// A job of it arrived: what the job says of the key, and one activation more.
    fn arrived(&mut self, job: &Job) {
        self.shape(job.memory_mb, job.concurrency, job.max_running, job.tenant);
        self.stem = job.stem;
        self.idle_timeout = job.idle_timeout;
        self.activations = self.activations.saturating_add(1);
    }

    /// Whether it may run one more job now.
    fn below_cap(&self) -> bool {
        self.cap.is_none_or(|cap| self.running < cap)
    }

    /// A container of the key that takes a job now: the most loaded that has room, else the
    /// idle one used last.
    fn take_free(&mut self, containers: &Slab<Container>) -> Option<ContainerId> {
        self.partial.last().map(|&(_, c)| c).or_else(|| self.idle.pop(|id, seq| containers.has_mark(&id, seq)))
    }

    /// The waiting jobs it may run as soon as they have a container: all of them, or those
    /// its cap leaves room for.
    fn runnable(&self) -> usize {
        match self.cap {
            Some(cap) => self.waiting_live.min(cap.saturating_sub(self.running) as usize),
            None => self.waiting_live,
        }
    }
}

/// Why a container is started for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ahead {
    /// For its waiting jobs.
    No,
    /// Ahead of a call the keep-alive policy predicts.
    Predicted,
    /// One of its provisioned containers.
    Provisioned,
}

/// A node kept for a key that waited too long for room (see `CoreConfig::claim_after`).
#[derive(Debug)]
struct Claim {
    key: KeyId,
    node: NodeId,
}

#[derive(Debug)]
struct Waiting {
    key: KeyId,
    deadline: Time,
    patient: bool,
}

/// Counts of what the pool holds, for health, metrics and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    pub starting: usize,
    pub idle: usize,
    pub busy: usize,
    pub removing: usize,
    pub waiting: usize,
    pub blocked_keys: usize,
    /// Stem containers not yet adopted (also in `starting` while they start, never in `idle`).
    pub prewarm: usize,
    /// The memory those stems hold on their nodes (their class's), what no action runs in.
    pub prewarm_mb: u64,
}

/// A key with a cap or provisioned containers ([`PoolCore::controlled_keys`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlledKey {
    pub key: KeyId,
    pub cap: Option<u32>,
    /// Its jobs running, and waiting (for the cap or a container).
    pub running: u32,
    pub waiting: usize,
    /// Its provisioned containers wanted, and up (starting or ready).
    pub provisioned: u32,
    pub provisioned_up: u32,
}

/// One container as the pool view shows it.
#[derive(Clone, Debug)]
pub struct ContainerView {
    pub id: ContainerId,
    pub owner: Owner,
    pub node: NodeId,
    pub memory_mb: u32,
    pub state: ContainerState,
    pub running: usize,
    pub created_at: Time,
    /// Idle (or paused): since when, and until when the keep-alive policy keeps it, if it says.
    pub idle: Option<(Time, Option<Time>)>,
    /// One of its action's provisioned containers.
    pub provisioned: bool,
}

/// A container's state as the pool's view (`/v1/pool`, the cluster registration) shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    Starting,
    /// A stem container, started ahead of any action.
    Prewarm,
    Idle,
    Paused,
    Busy,
    Removing,
}

impl ContainerState {
    /// Idle or paused: its memory is the pool's to take back when it needs the room.
    pub fn is_idle(self) -> bool {
        matches!(self, ContainerState::Idle | ContainerState::Paused)
    }

    /// Holds an action's code and takes its runs (idle, paused or busy).
    pub fn runs_an_action(self) -> bool {
        self.is_idle() || self == ContainerState::Busy
    }
}

#[derive(Debug)]
pub struct PoolCore {
    config: CoreConfig,
    containers: Slab<Container>,
    keys: FxHashMap<KeyId, KeyState>,
    waiting: FxHashMap<JobId, Waiting>,
    /// How many of `waiting` are patient: the rest count against `max_waiting`.
    patient_waiting: usize,
    deadlines: BTreeSet<(Time, JobId)>,
    /// Decides when idle containers go and which go first to make room. It learns of every
    /// idle spell and checks spells against the slab marks lazily, so a warm activation never
    /// searches it.
    keep_alive: Box<dyn KeepAlivePolicy>,
    idle_total: usize,
    /// Containers starting and being removed, kept as phases change so that the counts are
    /// O(1): health, metrics and the cluster registry read them every few hundred ms.
    starting_total: usize,
    removing_total: usize,
    /// Bumped whenever a container starts or stops running an action (ready and a key's), so
    /// that a reader of that set (the cluster registry) rebuilds it only when it changed.
    warm_generation: u64,
    blocked: VecDeque<KeyId>,
    nodes: Nodes,
    stems: Stems,
    claim: Option<Claim>,
    /// Start times over all keys, for keys that have not started a container yet.
    start_time: Ewma,
    /// Keys whose waiting jobs rely on busy containers, by when that reliance is overdue.
    rechecks: BTreeSet<(Time, KeyId)>,
    /// Keys forgotten since the caller last asked (see [`PoolCore::take_forgotten_keys`]).
    forgotten: Vec<KeyId>,
    next_idle_seq: u64,
    /// Idle spells to pause when they last `pause_grace`: (due, container, the spell's mark),
    /// in due order since the grace is one for all; a spell that ended is skipped when due.
    pauses: VecDeque<(Time, ContainerId, u64)>,
    /// Idle spells of keys with their own idle bound, to end when it passes: (due, container,
    /// the spell's mark), in due order; a spell that ended is skipped when due.
    own_expiries: BTreeSet<(Time, ContainerId, u64)>,
    draining: bool,
    /// Idle containers removed to make room for another action's start.
    evictions: u64,
    /// Containers the keep-alive policy had started ahead of a predicted call.
    prewarms_started: u64,
    /// Pre-warms that found no room and asked for evictions: tried once more at the next tick.
    prewarm_retries: Vec<KeyId>,
    /// Keys short of their provisioned containers, each with whether it waits for room (rather
    /// than a backoff): tried again at every tick and stats update.
    provisioning: std::collections::BTreeMap<KeyId, bool>,
    /// Keys whose [`PoolCore::offer`] may have changed since the caller last asked
    /// ([`PoolCore::take_offer_changes`]), and whether every key's may have.
    offers: dirty_offers::Dirty,
}

impl PoolCore {
    pub fn new(config: CoreConfig) -> Self {
        let keep_alive = policy_for(&config);
        Self::with_keep_alive(config, keep_alive)
    }

    /// A core with another keep-alive policy than the fixed idle timeout.
    pub fn with_keep_alive(config: CoreConfig, keep_alive: Box<dyn KeepAlivePolicy>) -> Self {
        PoolCore {
            nodes: Nodes::new(config.buffer_mb, config.stats_ttl, config.max_starts_per_node),
            stems: Stems::new(&config.prewarm),
            claim: None,
            start_time: Ewma::default(),
            rechecks: BTreeSet::new(),
            forgotten: Vec::new(),
            config,
            containers: Slab::default(),
            keys: FxHashMap::default(),
            waiting: FxHashMap::default(),
            patient_waiting: 0,
            deadlines: BTreeSet::new(),
            keep_alive,
            idle_total: 0,
            starting_total: 0,
            removing_total: 0,
            warm_generation: 0,
            blocked: VecDeque::new(),
            next_idle_seq: 0,
            pauses: VecDeque::new(),
            own_expiries: BTreeSet::new(),
            draining: false,
            evictions: 0,
            prewarms_started: 0,
            prewarm_retries: Vec::new(),
            provisioning: Default::default(),
            offers: dirty_offers::Dirty::default(),
        }
    }

    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    pub fn handle(&mut self, event: Event, now: Time) -> Effects {
        let mut fx = Effects::new();
        let before = self.offers_before(&event);
        match event {
            Event::Arrived(job) => self.on_arrived(job, now, &mut fx),
            Event::Taken { job, container } => self.on_taken(job, container, now, &mut fx),
            Event::Started { container, failure, at } => self.on_started(container, failure, at.min(now), now, &mut fx),
            Event::Finished { container, job, reusable } => self.on_finished(container, job, reusable, now, &mut fx),
            Event::Removed(container) => self.on_removed(container, now, &mut fx),
            Event::NodeStats(update) => {
                self.nodes.update(update, now);
                // Provisioned starts first: a blocked key's jobs count its provisioned starts.
                self.provision_wanting(now, &mut fx);
                self.retry_blocked(now, &mut fx);
                self.replenish_stems(now, &mut fx);
            }
            Event::Tick => self.on_tick(now, &mut fx),
            Event::Drain => self.on_drain(now, &mut fx),
            Event::ShedIdle => {
                let idle: Vec<ContainerId> = self.idle_by_eviction_order().collect();
                for id in idle {
                    self.retire(id, now, &mut fx);
                }
            }
            Event::Retire(key) => self.on_retire(key, now, &mut fx),
            Event::Provision(provision) => self.on_provision(provision, now, &mut fx),
        }
        self.offers_after(before, &fx);
        fx
    }

    /// Idle containers removed so far to make room for another action.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Containers started so far ahead of a call the keep-alive policy predicted.
    pub fn prewarms_started(&self) -> u64 {
        self.prewarms_started
    }

    pub fn container_count(&self) -> usize {
        self.containers.len()
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// True when nothing is running, starting, waiting or being removed.
    pub fn is_quiet(&self) -> bool {
        self.waiting.is_empty() && self.containers.values().all(|c| c.phase == Phase::Ready && c.running.is_empty())
    }

    /// O(1): from totals kept as containers change phase.
    pub fn counts(&self) -> PoolCounts {
        let (stems_ready, stems_starting) = self.stems.totals();
        let prewarm_mb = self.stems.memory_mb();
        PoolCounts {
            starting: self.starting_total,
            idle: self.idle_total,
            busy: self.containers.len() - self.starting_total - self.removing_total - self.idle_total - stems_ready,
            removing: self.removing_total,
            waiting: self.waiting.len(),
            blocked_keys: self.blocked.len(),
            prewarm: stems_ready + stems_starting,
            prewarm_mb,
        }
    }

    /// Changes whenever the set of containers that run an action (ready, a key's) changes.
    pub fn warm_generation(&self) -> u64 {
        self.warm_generation
    }

    /// The counts by a scan of every container: what [`PoolCore::counts`] must equal.
    #[cfg(test)]
    pub(super) fn counts_scanned(&self) -> PoolCounts {
        let mut counts =
            PoolCounts { waiting: self.waiting.len(), blocked_keys: self.blocked.len(), ..PoolCounts::default() };
        for c in self.containers.values() {
            if matches!(c.owner, Owner::Stem(_)) && c.phase != Phase::Removing {
                counts.prewarm += 1;
                counts.prewarm_mb += u64::from(c.memory_mb);
                if c.phase == Phase::Ready {
                    continue;
                }
            }
            match c.phase {
                Phase::Starting => counts.starting += 1,
                Phase::Removing => counts.removing += 1,
                Phase::Ready if c.running.is_empty() => counts.idle += 1,
                Phase::Ready => counts.busy += 1,
            }
        }
        counts
    }

    /// Every container with its key, node, phase and load (for the pool view; O(n)).
    pub fn containers(&self) -> Vec<ContainerView> {
        let mut views: Vec<ContainerView> = self.containers.iter().map(|(id, c)| self.view(id, c)).collect();
        views.sort_by_key(|v| v.id);
        views
    }

    /// One container as [`Self::containers`] shows it; `None` once it is gone.
    pub fn container(&self, id: ContainerId) -> Option<ContainerView> {
        self.containers.get(&id).map(|c| self.view(id, c))
    }

    fn view(&self, id: ContainerId, c: &Container) -> ContainerView {
        let state = match c.phase {
            Phase::Starting => ContainerState::Starting,
            Phase::Removing => ContainerState::Removing,
            Phase::Ready if matches!(c.owner, Owner::Stem(_)) => ContainerState::Prewarm,
            Phase::Ready if c.paused => ContainerState::Paused,
            Phase::Ready if c.running.is_empty() => ContainerState::Idle,
            Phase::Ready => ContainerState::Busy,
        };
        let idle = match state.is_idle() {
            true => self.containers.mark(&id).and_then(|seq| self.keep_alive.spell(seq)),
            false => None,
        };
        let provisioned = match c.owner {
            Owner::Key(key) => self.keys.get(&key).is_some_and(|k| k.provisioned.holds(id)),
            Owner::Stem(_) => false,
        };
        ContainerView {
            id,
            owner: c.owner,
            node: c.node.clone(),
            memory_mb: c.memory_mb,
            state,
            running: c.running.len(),
            created_at: std::time::Duration::from_micros(c.created_at),
            idle,
            provisioned,
        }
    }

    pub fn nodes(&self, now: Time) -> Vec<NodeView> {
        self.nodes.views(now)
    }

    /// Jobs waiting and containers starting for one key (for tests and the pool view).
    pub fn key_load(&self, key: KeyId) -> (usize, u32) {
        self.keys.get(&key).map_or((0, 0), |k| (k.waiting_live, k.starting))
    }

    /// The capped keys: each with its cap, its jobs running and its jobs waiting.
    pub fn capped_keys(&self) -> impl Iterator<Item = (KeyId, u32, u32, usize)> + '_ {
        self.keys.iter().filter_map(|(&id, k)| Some((id, k.cap?, k.running, k.waiting_live)))
    }

    /// The keys with a cap or provisioned containers, as the live view and the metrics show
    /// them.
    pub fn controlled_keys(&self) -> impl Iterator<Item = ControlledKey> + '_ {
        self.keys.iter().filter(|(_, k)| k.cap.is_some() || k.provisioned.keeps_any()).map(|(&key, k)| ControlledKey {
            key,
            cap: k.cap,
            running: k.running,
            waiting: k.waiting_live,
            provisioned: k.provisioned.target,
            provisioned_up: k.provisioned.up(),
        })
    }

    /// The cap `key`'s jobs wait for now, if it runs at its cap with jobs waiting.
    pub fn waits_for_cap(&self, key: KeyId) -> Option<u32> {
        let k = self.keys.get(&key)?;
        k.cap.filter(|&cap| k.running >= cap && k.waiting_live > 0)
    }

    /// Whether the core holds anything of `key` (containers, waiting jobs, a blocked start).
    pub fn has_key(&self, key: KeyId) -> bool {
        self.keys.contains_key(&key)
    }

    /// The keys the core forgot (nothing of theirs is left) since the last call, so that the
    /// caller can forget what it keeps per key too.
    pub fn take_forgotten_keys(&mut self) -> Vec<KeyId> {
        std::mem::take(&mut self.forgotten)
    }

    /// Jobs, or provisioned containers, wait for room: nothing is started ahead of a call.
    fn room_wanted(&self) -> bool {
        !self.blocked.is_empty() || self.provisions_want_room()
    }

    /// True when some action's jobs wait for room (or a start slot) on the nodes: O(1), for a
    /// factory that asks its cluster for resources only on demand.
    pub fn waiting_for_room(&self) -> bool {
        !self.blocked.is_empty()
    }

    /// True when a job of `key` could be dispatched right now without waiting.
    pub fn has_free_container(&self, key: KeyId) -> bool {
        self.keys.get(&key).is_some_and(|k| k.idle.live() > 0 || !k.partial.is_empty())
    }

    fn on_arrived(&mut self, job: Job, now: Time, fx: &mut Effects) {
        if self.draining {
            fx.push(Effect::Reject { job: job.id, reason: RejectReason::Draining });
            return;
        }
        if let Some(largest) = self.nodes.largest_capacity_mb() {
            if u64::from(job.memory_mb) + self.config.buffer_mb > largest {
                let reason = RejectReason::NeverFits { memory_mb: job.memory_mb, largest_node_mb: largest };
                fx.push(Effect::Reject { job: job.id, reason });
                return;
            }
        }
        self.keep_alive.arrived(job.key, now);
        let key = self.keys.entry(job.key).or_default();
        key.arrived(&job);
        let free = if key.below_cap() { key.take_free(&self.containers) } else { None };
        if let Some(container) = free {
            self.dispatch(container, job.id, now, fx);
            self.settle(container, now);
            return;
        }
        if !job.patient && self.waiting.len() - self.patient_waiting >= self.config.max_waiting {
            fx.push(Effect::Reject { job: job.id, reason: RejectReason::QueueFull });
            return;
        }
        if job.patient {
            self.patient_waiting += 1;
            key.patient.push_back(job.id);
        } else {
            key.waiting.push_back(job.id);
        }
        key.waiting_live += 1;
        key.backlog_since.get_or_insert(now);
        self.waiting.insert(job.id, Waiting { key: job.key, deadline: job.deadline, patient: job.patient });
        self.deadlines.insert((job.deadline, job.id));
        self.maybe_start(job.key, now, fx);
    }

    fn on_started(&mut self, id: ContainerId, failure: Option<CreateFailure>, at: Time, now: Time, fx: &mut Effects) {
        let Some(c) = self.containers.get_mut(&id) else { return };
        if c.phase != Phase::Starting {
            return;
        }
        // Ready now, or gone.
        self.starting_total -= 1;
        let key_id = match c.owner {
            Owner::Key(key_id) => key_id,
            Owner::Stem(stem) => return self.on_stem_started(id, stem, failure.is_none(), at, now, fx),
        };
        let (node, memory_mb) = (c.node.clone(), c.memory_mb);
        self.nodes.start_finished(&node);
        if self.keys.get(&key_id).is_some_and(|k| k.provisioned.holds(id)) {
            match failure {
                Some(_) => self.provisioned_gone(key_id, id, true, now),
                None => self.provisioned_started(key_id, id),
            }
        }
        let c = self.containers.get_mut(&id).expect("checked above");
        let key = self.keys.get_mut(&key_id).expect("a container's key exists");
        key.starting -= 1;
        if let Some(failure) = failure {
            self.containers.remove(&id);
            key.containers -= 1;
            self.nodes.release(&node, id, memory_mb, false, now);
            // The job that asked for this container gets a clear answer now, not at its deadline.
            let concurrency = key.concurrency as usize;
            let still_coming = key.starting as usize * concurrency;
            let excess = key.waiting_live.saturating_sub(still_coming).min(concurrency);
            for _ in 0..excess {
                if let Some(job) = self.pop_waiting(key_id) {
                    fx.push(Effect::Reject { job, reason: RejectReason::CreateFailed(failure) });
                }
            }
            self.maybe_start(key_id, now, fx);
            self.gc_key(key_id);
        } else {
            let took = at.saturating_sub(Time::from_micros(c.created_at));
            key.start_time.add(took);
            self.start_time.add(took);
            c.phase = Phase::Ready;
            self.warm_generation += 1;
            self.nodes.confirm_started(&node, id, at);
            if self.draining {
                c.retiring = true;
            }
            self.fill(id, now, fx);
            self.settle_or_retire(id, now, fx);
            // A start slot is free again: jobs still waiting beyond what is starting may need
            // another container.
            self.maybe_start(key_id, now, fx);
        }
        self.retry_blocked(now, fx);
    }

    fn on_finished(&mut self, id: ContainerId, job: JobId, reusable: bool, now: Time, fx: &mut Effects) {
        let Some(c) = self.containers.get_mut(&id) else { return };
        let Some(pos) = c.running.iter().position(|&(j, _)| j == job) else { return };
        self.unsettle(id);
        let c = self.containers.get_mut(&id).expect("checked above");
        let (_, dispatched) = c.running.swap_remove(pos);
        if let Owner::Key(key) = c.owner {
            if let Some(key) = self.keys.get_mut(&key) {
                key.run_time.add(now.saturating_sub(Time::from_micros(dispatched)));
                key.running = key.running.saturating_sub(1);
            }
        }
        if !reusable {
            c.retiring = true;
        }
        let make_way = self.claim.as_ref().is_some_and(|claim| {
            claim.node == c.node
                && c.owner != Owner::Key(claim.key)
                && !c.retiring
                && !matches!(c.owner, Owner::Key(k) if self.keys.get(&k).is_some_and(|k| k.provisioned.holds(id)))
                && self.keys.get(&claim.key).is_some_and(|k| {
                    k.waiting_live > 0 && !self.nodes.fits_after_freeing(&claim.node, k.memory_mb, 0, now)
                })
        });
        if make_way {
            // Its key's waiting jobs get a container elsewhere; the node is kept for the claim.
            c.retiring = true;
        }
        let owner = c.owner;
        self.fill(id, now, fx);
        self.settle_or_retire(id, now, fx);
        // A capped key's free containers first: a container started for a job that one of
        // them then takes is one too many (the property test found it, a container making way
        // for a claim while its key's provisioned one stood idle behind the cap).
        if let Owner::Key(key) = owner {
            self.run_below_cap(key, now, fx);
        }
        if let (true, Owner::Key(key)) = (make_way, owner) {
            self.maybe_start(key, now, fx);
        }
        // An idle container is something a blocked key may evict to make room.
        if self.containers.is_marked(&id) {
            self.retry_blocked(now, fx);
        }
    }

    fn on_removed(&mut self, id: ContainerId, now: Time, fx: &mut Effects) {
        self.unsettle(id);
        let Some(c) = self.containers.remove(&id) else { return };
        match c.phase {
            Phase::Starting => self.starting_total -= 1,
            Phase::Removing => self.removing_total -= 1,
            Phase::Ready if matches!(c.owner, Owner::Key(_)) => self.warm_generation += 1,
            Phase::Ready => {}
        }
        if let (Owner::Key(key_id), false) = (c.owner, c.running.is_empty()) {
            if let Some(key) = self.keys.get_mut(&key_id) {
                key.running = key.running.saturating_sub(c.running.len() as u32);
            }
        }
        for (job, _) in c.running {
            fx.push(Effect::Reject { job, reason: RejectReason::ContainerLost });
        }
        if let Owner::Key(key_id) = c.owner {
            if self.keys.get(&key_id).is_some_and(|k| k.provisioned.holds(id)) {
                self.provisioned_gone(key_id, id, false, now);
            }
        }
        if c.phase == Phase::Starting {
            self.nodes.start_finished(&c.node);
        }
        self.nodes.release(&c.node, id, c.memory_mb, c.phase == Phase::Removing, now);
        match c.owner {
            Owner::Key(key_id) => {
                let key = self.keys.get_mut(&key_id).expect("a container's key exists");
                key.containers -= 1;
                if c.phase == Phase::Starting {
                    key.starting -= 1;
                }
                self.run_below_cap(key_id, now, fx);
                self.maybe_start(key_id, now, fx);
                self.gc_key(key_id);
            }
            Owner::Stem(stem) => self.stems.forget(stem, id, c.phase == Phase::Starting),
        }
        self.retry_blocked(now, fx);
    }

    fn on_tick(&mut self, now: Time, fx: &mut Effects) {
        while let Some(&(deadline, job)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(w) = self.waiting.remove(&job) {
                self.patient_waiting -= usize::from(w.patient);
                let key = self.keys.get_mut(&w.key).expect("a waiting job's key exists");
                key.one_waits_less();
                if key.waiting.len() + key.patient.len() > 2 * key.waiting_live + 32 {
                    let live = &self.waiting;
                    key.waiting.retain(|j| live.contains_key(j));
                    key.patient.retain(|j| live.contains_key(j));
                }
                // Held back by its cap rather than for want of a container: said so.
                let reason = match key.cap {
                    Some(cap) if key.running >= cap => RejectReason::Capped { cap },
                    _ => RejectReason::DeadlineExceeded,
                };
                fx.push(Effect::Reject { job, reason });
                self.gc_key(w.key);
            }
        }
        loop {
            let containers = &self.containers;
            let live = |s: &IdleSpell| containers.has_mark(&s.container, s.seq);
            let Some(spell) = self.keep_alive.expired(now, &live) else { break };
            self.retire(spell.container, now, fx);
        }
        while let Some(&(due, id, seq)) = self.own_expiries.first() {
            if due > now {
                break;
            }
            self.own_expiries.pop_first();
            if self.containers.has_mark(&id, seq) {
                self.retire(id, now, fx);
            }
        }
        for key in std::mem::take(&mut self.prewarm_retries) {
            self.prewarm_key(key, false, now, fx);
        }
        while let Some(key) = self.keep_alive.prewarm_due(now) {
            self.prewarm_key(key, true, now, fx);
        }
        while let Some(key) = self.keep_alive.released(now) {
            self.gc_key(key);
        }
        while let Some(&(at, key_id)) = self.rechecks.first() {
            if at > now {
                break;
            }
            self.rechecks.pop_first();
            if let Some(key) = self.keys.get_mut(&key_id) {
                key.recheck_pending = false;
                self.maybe_start(key_id, now, fx);
            }
        }
        self.pause_due(now, fx);
        self.provision_wanting(now, fx);
        self.update_claim(now);
        self.resize_stems(now, fx);
        self.replenish_stems(now, fx);
    }

    /// Pauses the containers idle for `pause_grace` since their last job.
    fn pause_due(&mut self, now: Time, fx: &mut Effects) {
        while let Some(&(due, id, seq)) = self.pauses.front() {
            if due > now {
                break;
            }
            self.pauses.pop_front();
            if !self.containers.has_mark(&id, seq) {
                continue; // it took a job (or went) since
            }
            let c = self.containers.get_mut(&id).expect("a marked container exists");
            if !c.paused {
                c.paused = true;
                fx.push(Effect::Pause { container: id });
            }
        }
    }

    /// Drops a claim whose key no longer waits for room, and lets a key that has waited for
    /// room beyond `claim_after` claim a node: the one with the fewest containers, then the one
    /// that waited longest. A key with none is starving; one with containers is being served,
    /// and a flood of its calls (a queue of them) would otherwise always be the oldest waiter.
    ///
    /// Between tenants the share is fair: a key whose tenant holds less than an equal share of
    /// the pool's memory, while another tenant holds more than its own, claims at once rather
    /// than after `claim_after`, and keys claim in the order of what their tenants hold, least
    /// first. So a tenant flooding the pool delays another's call by about one of its runs.
    fn update_claim(&mut self, now: Time) {
        if self.blocked.is_empty() {
            self.claim = None;
            return;
        }
        let (held, share) = self.tenant_shares();
        let tenant_mb = |key: &KeyState| held.get(&key.tenant).copied().unwrap_or(0);
        let someone_over = held.values().any(|&mb| mb > share);
        // The claim stands while its key still waits for room, unless a key whose tenant holds
        // less (or, of the same tenant, with fewer containers) may take it over.
        let standing = self.claim.as_ref().and_then(|claim| {
            let key = self.keys.get(&claim.key).filter(|k| k.blocked && k.waiting_live > 0)?;
            Some((tenant_mb(key), key.containers))
        });
        if standing.is_none() {
            self.claim = None;
        }
        let first = self
            .blocked
            .iter()
            .filter_map(|&key_id| {
                let key = self.keys.get(&key_id)?;
                let since = key.room_wait_since?;
                let below_share = someone_over && tenant_mb(key) < share;
                // A tenant at or over its share waiting for more claims nothing while another
                // is below its own: its claim would take that tenant's containers.
                let others_below = held.iter().any(|(&t, &mb)| t != key.tenant && mb < share);
                let waited = since + self.config.claim_after <= now && !(tenant_mb(key) >= share && others_below);
                let eligible = key.waiting_live > 0 && (below_share || waited);
                eligible.then_some(((tenant_mb(key), key.containers), since, key_id, key.memory_mb))
            })
            .min();
        if let Some((held, _, key, memory_mb)) = first {
            if standing.is_some_and(|standing| standing <= held) {
                return;
            }
            self.claim = self.nodes.claim_target(memory_mb, now).map(|node| Claim { key, node });
        }
    }

    /// The memory each tenant's containers hold, of the tenants with containers or waiting
    /// jobs (those the pool is shared between), and an equal share of the pool's memory. A scan
    /// of the keys: only while some wait for room.
    fn tenant_shares(&self) -> (FxHashMap<TenantId, u64>, u64) {
        let mut held: FxHashMap<TenantId, u64> = FxHashMap::default();
        for key in self.keys.values().filter(|k| k.containers > 0 || k.waiting_live > 0) {
            *held.entry(key.tenant).or_default() += u64::from(key.containers) * u64::from(key.memory_mb);
        }
        let share = self.nodes.total_capacity_mb() / (held.len() as u64).max(1);
        (held, share)
    }

    /// The node other keys than `key_id` must leave alone, if a key has claimed one.
    fn claimed_against(&self, key_id: Option<KeyId>) -> Option<&NodeId> {
        self.claim.as_ref().filter(|c| Some(c.key) != key_id).map(|c| &c.node)
    }

    fn on_drain(&mut self, now: Time, fx: &mut Effects) {
        self.draining = true;
        let mut jobs: Vec<(Time, JobId)> = std::mem::take(&mut self.deadlines).into_iter().collect();
        jobs.sort();
        for (_, job) in jobs {
            if let Some(w) = self.waiting.remove(&job) {
                self.patient_waiting -= usize::from(w.patient);
                if let Some(key) = self.keys.get_mut(&w.key) {
                    key.one_waits_less();
                    key.waiting.clear();
                    key.patient.clear();
                }
                fx.push(Effect::Reject { job, reason: RejectReason::Draining });
            }
        }
        let mut idle: Vec<ContainerId> = self.idle_by_eviction_order().collect();
        // Provisioned ones are idle outside the keep-alive policy's order.
        let containers = &self.containers;
        let provisioned = self.keys.values().flat_map(|k| k.provisioned.ids());
        idle.extend(provisioned.filter(|id| containers.is_marked(id)));
        idle.extend(self.stems.take_all_ready());
        for id in idle {
            self.retire(id, now, fx);
        }
        for c in self.containers.values_mut() {
            c.retiring = true;
        }
    }

    /// Removes the key's idle containers and marks the rest to go once their runs end: no
    /// container of a deleted action or an older revision takes a job after its waiting ones.
    fn on_retire(&mut self, key_id: KeyId, now: Time, fx: &mut Effects) {
        let Some(key) = self.keys.get_mut(&key_id) else { return };
        key.retired = true;
        key.provisioned.target = 0;
        self.provisioning.remove(&key_id);
        let owned: Vec<ContainerId> =
            self.containers.iter().filter(|(_, c)| c.owner == Owner::Key(key_id)).map(|(id, _)| id).collect();
        for id in owned {
            let c = &self.containers[&id];
            if c.phase == Phase::Ready && c.running.is_empty() {
                self.retire(id, now, fx);
            } else {
                // Out of its key's free containers too: a busy one with room took the key's
                // next job while it retired (the offers' property test found it).
                self.unsettle(id);
                self.containers.get_mut(&id).expect("listed above").retiring = true;
            }
        }
        self.keep_alive.forget(key_id);
        self.gc_key(key_id);
    }

    /// Starts containers for `key` while its waiting jobs outnumber what is already starting,
    /// within the start caps, making room by eviction if that alone makes it fit.
    fn maybe_start(&mut self, key_id: KeyId, now: Time, fx: &mut Effects) {
        loop {
            let Some(key) = self.keys.get(&key_id) else { return };
            if key.blocked || key.runnable() <= key.starting as usize * key.concurrency as usize {
                return;
            }
            if let Some(overdue_at) = self.busy_containers_will_serve(key_id, now) {
                return self.recheck_at(key_id, overdue_at);
            }
            let key = &self.keys[&key_id];
            if let Some(stem) = key.stem {
                if self.adopt_stem(key_id, stem, now, fx) {
                    continue;
                }
            }
            let key = &self.keys[&key_id];
            let up = key.containers - key.starting;
            let held_back = match self.config.start_rule {
                StartRule::Capped => key.starting >= self.config.max_starts_per_action,
                StartRule::OneEach => false,
                StartRule::FirstUp => up == 0 && key.starting > 0,
            };
            if held_back {
                return; // retried when one of its starts finishes
            }
            let memory_mb = key.memory_mb;
            match self.nodes.place(memory_mb, now, self.claimed_against(Some(key_id))) {
                Placement::On(node) => {
                    let key = self.keys.get_mut(&key_id).expect("checked above");
                    key.room_wait_since = None;
                    if let Some(stem) = key.stem {
                        self.stems.missed(stem);
                    }
                    if self.claim.as_ref().is_some_and(|c| c.key == key_id) {
                        self.claim = None;
                    }
                    self.create_for_key(key_id, node, now, Ahead::No, fx);
                }
                Placement::StartsCapped => return self.block(key_id),
                Placement::NoRoom => {
                    // Whether or not eviction makes room, the key waits for an event: the
                    // removals it asked for, or a stats update showing room from elsewhere.
                    let key = self.keys.get_mut(&key_id).expect("checked above");
                    key.room_wait_since.get_or_insert(now);
                    self.make_room(key_id, memory_mb, now, fx);
                    return self.block(key_id);
                }
            }
        }
    }

    /// Under our start rule: when the key's busy containers are expected to take every waiting
    /// job the starting ones will not, before a new container would be ready, the time at
    /// which that expectation is overdue: jobs have waited without a break for a start's time
    /// (the oldest waiting job, or callers that refill the queue as it drains).
    fn busy_containers_will_serve(&self, key_id: KeyId, now: Time) -> Option<Time> {
        if self.config.start_rule != StartRule::Capped {
            return None;
        }
        let key = &self.keys[&key_id];
        let run = key.run_time.get()?;
        let start = key.start_time.get().or(self.start_time.get())?;
        let busy = (key.containers - key.starting) as usize;
        let concurrency = key.concurrency as usize;
        let covered = key.starting as usize * concurrency + served_before_a_start(busy, concurrency, run, start);
        if busy == 0 || key.waiting_live > covered {
            return None;
        }
        // Set by the first of the jobs waiting now, or before them: no later than the oldest.
        let since = key.backlog_since?;
        Some(since + start).filter(|&overdue_at| overdue_at > now)
    }

    fn recheck_at(&mut self, key_id: KeyId, at: Time) {
        let key = self.keys.get_mut(&key_id).expect("checked by the caller");
        if !key.recheck_pending {
            key.recheck_pending = true;
            self.rechecks.insert((at, key_id));
        }
    }

    /// A container of `key` on `node`, for its waiting jobs or `ahead` of them.
    fn create_for_key(&mut self, key_id: KeyId, node: NodeId, now: Time, ahead: Ahead, fx: &mut Effects) {
        let key = self.keys.get_mut(&key_id).expect("key exists");
        key.starting += 1;
        key.containers += 1;
        let memory_mb = key.memory_mb;
        self.create(Owner::Key(key_id), memory_mb, node, now, ahead, fx);
    }

    /// Starts a container for `key` ahead of the call its keep-alive policy predicts (the policy
    /// says how many): only when no job of it waits and no action waits for room. Where it does
    /// not fit, idle containers are evicted as for any start (in the policy's order), and it is
    /// tried once more at the next tick (`first_try`); then it is dropped.
    fn prewarm_key(&mut self, key_id: KeyId, first_try: bool, now: Time, fx: &mut Effects) {
        let Some(key) = self.keys.get(&key_id) else { return };
        let wanted =
            !self.draining && !key.retired && !self.room_wanted() && key.waiting_live == 0 && key.memory_mb > 0;
        let memory_mb = key.memory_mb;
        if wanted {
            match self.nodes.place(memory_mb, now, self.claimed_against(Some(key_id))) {
                Placement::On(node) => {
                    self.prewarms_started += 1;
                    return self.create_for_key(key_id, node, now, Ahead::Predicted, fx);
                }
                Placement::NoRoom if first_try => {
                    self.make_room(key_id, memory_mb, now, fx);
                    self.prewarm_retries.push(key_id);
                    return;
                }
                Placement::NoRoom | Placement::StartsCapped => {}
            }
        }
        self.gc_key(key_id);
    }

    fn create(
        &mut self,
        owner: Owner,
        memory_mb: u32,
        node: NodeId,
        now: Time,
        ahead: Ahead,
        fx: &mut Effects,
    ) -> ContainerId {
        let provisioned = ahead == Ahead::Provisioned;
        let id = self.containers.insert(Container {
            owner,
            node: node.clone(),
            memory_mb,
            phase: Phase::Starting,
            retiring: false,
            paused: false,
            ran: false,
            running: SmallVec::new(),
            created_at: micros(now),
        });
        self.starting_total += 1;
        self.nodes.reserve(&node, id, memory_mb);
        if let (Owner::Key(key), true) = (owner, provisioned) {
            self.keys.get_mut(&key).expect("a container's key exists").provisioned.add(id);
        }
        let prewarm = ahead == Ahead::Predicted;
        fx.push(Effect::Create { container: id, owner, memory_mb, node, prewarm, provisioned });
        id
    }

    /// Evicts least recently used idle containers of other keys, but only if what they free
    /// covers the shortfall on one node, and only if removals already under way do not.
    fn make_room(&mut self, key_id: KeyId, memory_mb: u32, now: Time, fx: &mut Effects) {
        if self.nodes.room_coming(memory_mb, now) {
            return;
        }
        let mut freed: FxHashMap<NodeId, (u64, Vec<Victim>)> = FxHashMap::default();
        let mut chosen = None;
        let claimed = self.claimed_against(Some(key_id));
        let tenant = self.keys.get(&key_id).map(|k| k.tenant).unwrap_or_default();
        // Read only if another tenant's idle container comes up.
        let mut shares: Option<(FxHashMap<TenantId, u64>, u64)> = None;
        // Idle containers of other keys first, in the keep-alive policy's order; unadopted
        // stem containers last, since they hold memory for work that may never come.
        let containers = &self.containers;
        let idle = self.keep_alive.eviction_order().filter(|s| containers.has_mark(&s.container, s.seq));
        let candidates = idle.map(|s| (s.container, Some(s))).chain(self.stems.ready().map(|id| (id, None)));
        for (id, spell) in candidates {
            let c = &self.containers[&id];
            if c.owner == Owner::Key(key_id) || claimed == Some(&c.node) {
                continue;
            }
            // A tenant at or over its share of the pool does not evict the idle containers of
            // one below its own: the flood does not take another tenant's warm container.
            if let Some(owner) = match c.owner {
                Owner::Key(owner) => self.keys.get(&owner).map(|k| k.tenant).filter(|&t| t != tenant),
                Owner::Stem(_) => None,
            } {
                let (held, share) = shares.get_or_insert_with(|| self.tenant_shares());
                let of = |t: TenantId| held.get(&t).copied().unwrap_or(0);
                if of(tenant) >= *share && of(owner) < *share {
                    continue;
                }
            }
            let entry = freed.entry(c.node.clone()).or_default();
            entry.0 += u64::from(c.memory_mb);
            entry.1.push((id, spell));
            if self.nodes.fits_after_freeing(&c.node, memory_mb, entry.0, now) {
                chosen = Some(c.node.clone());
                break;
            }
        }
        let Some(node) = chosen else { return };
        let (_, victims) = freed.remove(&node).expect("chosen node has victims");
        for (id, spell) in victims {
            if let Owner::Stem(stem) = self.containers[&id].owner {
                self.stems.unready(stem, id);
            }
            if let Some(spell) = spell {
                self.keep_alive.evicted(&spell);
                self.evictions += 1;
            }
            self.retire(id, now, fx);
        }
    }

    fn block(&mut self, key_id: KeyId) {
        if let Some(key) = self.keys.get_mut(&key_id) {
            if !key.blocked {
                key.blocked = true;
                self.blocked.push_back(key_id);
            }
        }
    }

    fn retry_blocked(&mut self, now: Time, fx: &mut Effects) {
        if self.blocked.is_empty() {
            return;
        }
        let blocked = std::mem::take(&mut self.blocked);
        for key_id in blocked {
            if let Some(key) = self.keys.get_mut(&key_id) {
                key.blocked = false;
                self.maybe_start(key_id, now, fx);
                self.gc_key(key_id);
            }
        }
    }

    /// Gives waiting jobs of the container's key to it, up to its concurrency.
    fn fill(&mut self, id: ContainerId, now: Time, fx: &mut Effects) {
        let c = &self.containers[&id];
        let Owner::Key(key_id) = c.owner else { return };
        if c.retiring || c.phase != Phase::Ready {
            return;
        }
        let concurrency = self.keys[&key_id].concurrency as usize;
        while self.containers[&id].running.len() < concurrency && self.keys[&key_id].below_cap() {
            let Some(job) = self.pop_waiting(key_id) else { break };
            self.dispatch(id, job, now, fx);
        }
    }

    /// A capped key whose running jobs dropped below its cap: its waiting jobs go to its free
    /// containers (those the cap held them from), and containers start for the rest it may run.
    fn run_below_cap(&mut self, key_id: KeyId, now: Time, fx: &mut Effects) {
        loop {
            let Some(key) = self.keys.get_mut(&key_id) else { return };
            if key.cap.is_none() || key.waiting_live == 0 || !key.below_cap() {
                return;
            }
            let Some(container) = key.take_free(&self.containers) else { return self.maybe_start(key_id, now, fx) };
            let Some(job) = self.pop_waiting(key_id) else { return };
            self.dispatch(container, job, now, fx);
            self.settle(container, now);
        }
    }

    fn pop_waiting(&mut self, key_id: KeyId) -> Option<JobId> {
        let key = self.keys.get_mut(&key_id)?;
        // A blocking call before an asynchronous one: its caller waits, the queue's does not.
        while let Some(job) = key.waiting.pop_front().or_else(|| key.patient.pop_front()) {
            if let Some(w) = self.waiting.remove(&job) {
                self.patient_waiting -= usize::from(w.patient);
                self.deadlines.remove(&(w.deadline, job));
                key.one_waits_less();
                return Some(job);
            }
        }
        None
    }

    fn dispatch(&mut self, id: ContainerId, job: JobId, now: Time, fx: &mut Effects) {
        self.unsettle(id);
        let c = self.containers.get_mut(&id).expect("dispatch to a known container");
        c.running.push((job, micros(now)));
        c.ran = true;
        if let Some(key) = match c.owner {
            Owner::Key(key) => self.keys.get_mut(&key),
            Owner::Stem(_) => None,
        } {
            key.running += 1;
        }
        if c.paused {
            c.paused = false;
            fx.push(Effect::Resume { container: id });
        }
        fx.push(Effect::Dispatch { job, container: id });
    }

    /// Idle containers in the keep-alive policy's eviction order.
    fn idle_by_eviction_order(&self) -> impl Iterator<Item = ContainerId> + '_ {
        let containers = &self.containers;
        self.keep_alive.eviction_order().filter(|s| containers.has_mark(&s.container, s.seq)).map(|s| s.container)
    }

    /// Removes a ready container from the idle and partial indexes (before its load changes).
    fn unsettle(&mut self, id: ContainerId) {
        let Some(c) = self.containers.get(&id) else { return };
        let Owner::Key(key_id) = c.owner else { return };
        let running = c.running.len();
        let Some(key) = self.keys.get_mut(&key_id) else { return };
        if self.containers.take_mark(&id) {
            key.idle.ended();
            self.idle_total -= 1;
            let c = &self.containers[&id];
            self.nodes.idle_changed(&c.node, c.memory_mb, false);
        }
        key.partial.remove(&(running, id));
    }

    /// Puts a ready container back into the index that matches its load.
    fn settle(&mut self, id: ContainerId, now: Time) {
        let c = self.containers.get_mut(&id).expect("settle a known container");
        let Owner::Key(key_id) = c.owner else { return };
        if c.phase != Phase::Ready || c.retiring {
            return;
        }
        let (running, memory_mb, fresh) = (c.running.len(), c.memory_mb, !c.ran);
        if running == 0 {
            self.nodes.idle_changed(&c.node, memory_mb, true);
        }
        let key = self.keys.get_mut(&key_id).expect("a container's key exists");
        let concurrency = key.concurrency as usize;
        if running == 0 {
            let seq = self.next_idle_seq;
            self.next_idle_seq += 1;
            self.containers.set_mark(&id, seq);
            let containers = &self.containers;
            key.idle.push(seq, id, |id, seq| containers.has_mark(&id, seq));
            self.idle_total += 1;
            let grace = self.config.pause_grace;
            if !grace.is_zero() {
                self.pauses.push_back((now + grace, id, seq));
            }
            if key.provisioned.holds(id) {
                return; // kept whatever the keep-alive policy or its own idle bound would say
            }
            let start_cost = key.start_time.get().or(self.start_time.get()).unwrap_or(UNKNOWN_START_COST);
            // A key's activations shared over its containers: the tenth container of a burst
            // is worth a tenth of the first, or a hot action's idle surplus would stay forever.
            let frequency = key.activations / key.containers.max(1);
            self.keep_alive.idle(IdleSpell {
                seq,
                container: id,
                key: key_id,
                memory_mb,
                since: now,
                frequency,
                start_cost,
                fresh,
            });
            if let Some(bound) = key.idle_timeout {
                self.own_expiries.insert((now + bound, id, seq));
            }
            let containers = &self.containers;
            self.keep_alive.compact(self.idle_total, &|s: &IdleSpell| containers.has_mark(&s.container, s.seq));
        } else if running < concurrency {
            key.partial.insert((running, id));
        }
    }

    fn settle_or_retire(&mut self, id: ContainerId, now: Time, fx: &mut Effects) {
        let c = &self.containers[&id];
        let retired = matches!(c.owner, Owner::Key(key) if self.keys.get(&key).is_some_and(|k| k.retired));
        if c.retiring || retired {
            if c.running.is_empty() {
                self.retire(id, now, fx);
            }
        } else {
            self.settle(id, now);
        }
    }

    fn retire(&mut self, id: ContainerId, now: Time, fx: &mut Effects) {
        self.unsettle(id);
        let c = self.containers.get_mut(&id).expect("retire a known container");
        if c.phase == Phase::Removing {
            return;
        }
        if matches!(c.owner, Owner::Key(_)) && c.phase == Phase::Ready {
            self.warm_generation += 1;
        }
        c.phase = Phase::Removing;
        c.retiring = true;
        self.removing_total += 1;
        self.nodes.removing(&c.node, id, c.memory_mb, now);
        let owner = c.owner;
        fx.push(Effect::Remove { container: id });
        if let Owner::Key(key_id) = owner {
            if self.keys.get(&key_id).is_some_and(|k| k.provisioned.holds(id)) {
                self.provisioned_gone(key_id, id, false, now);
            }
        }
    }

    /// Forgets a key that holds nothing, so that the map stays as large as the live keys.
    fn gc_key(&mut self, key_id: KeyId) {
        if self.keys.get(&key_id).is_some_and(KeyState::is_empty) && !self.keep_alive.holds(key_id) {
            self.keys.remove(&key_id);
            self.forgotten.push(key_id);
            self.keep_alive.forget(key_id);
        }
    }
}
