//! The vocabulary of the pool core: what goes in (events) and what comes out (effects).
//!
//! Nothing here knows about HTTP, actors or clocks. Time is a [`Time`] since an epoch that
//! the caller chooses (the actor's start, or the simulator's zero), so the same core runs in
//! real and in virtual time. The names the core shares with the backends and the wire (a
//! container, a node, a job, the time, a node's stats, a failed create) are `invoker-ids`'.

use invoker_ids::{ContainerId, CreateFailure, JobId, NodeId, NodeStatsUpdate, Time};
use smallvec::SmallVec;
use std::time::Duration;

/// An interned action key: containers of one key are interchangeable for its jobs
/// (same namespace, action, revision, kind, memory, concurrency). The caller interns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u32);

/// An interned tenant (an OpenWhisk namespace): the pool shares its room fairly between the
/// tenants that want it. The caller interns; one tenant for all is a pool without tenants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub u32);

/// A configured class of prewarmed containers ("stem cells"): an index into
/// [`CoreConfig::prewarm`]. A stem container is started for a kind and memory, not an action,
/// and is adopted by the first action of that kind and memory that would otherwise start cold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StemId(pub u32);

/// Whom a container belongs to: an action key, or (until a job adopts it) a prewarm class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    Key(KeyId),
    Stem(StemId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: JobId,
    pub key: KeyId,
    /// The action's declared memory limit: what a container of this key occupies on a node.
    pub memory_mb: u32,
    /// How many jobs one container of this key may run at once (the action's concurrency limit).
    pub concurrency: u32,
    /// After this the job is answered 503 if it has not been dispatched.
    pub deadline: Time,
    /// The prewarm class whose containers this job's action may adopt (same kind and memory).
    pub stem: Option<StemId>,
    /// The action's own bound on an idle container's life (an Fn function's `idle_timeout`):
    /// its containers go once idle this long, whatever the keep-alive policy would keep.
    pub idle_timeout: Option<Duration>,
    /// An asynchronous call from the invoker's durable queue: nobody waits on it, so it yields
    /// to its key's blocking calls (they are dispatched first), and it is bounded by that
    /// queue rather than by [`CoreConfig::max_waiting`]. Its `deadline` is its maximum age.
    pub patient: bool,
    /// The most jobs of its key that may run at once (the action's `max-concurrency`): past
    /// it, a job waits for one to end, and no container is started for it.
    pub max_running: Option<u32>,
    /// Whose it is: a tenant holding less than its share of the pool claims room from one
    /// holding more at once, without waiting [`CoreConfig::claim_after`].
    pub tenant: TenantId,
}

/// What the caller reports to the core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Arrived(Job),
    /// A job its caller handed straight to `container`, the one [`PoolCore::offer`] last named
    /// for the job's key (the warm path's one hand-off, see `docs/architecture.md`): the core
    /// counts it as an arrival it dispatched there itself, and stays the one owner of what
    /// runs where. Said before any other event, so no decision is taken on the container as
    /// idle after it was taken.
    Taken {
        job: Job,
        container: ContainerId,
    },
    /// The factory finished creating `container`: ready for work (since `at`, stamped by the
    /// factory in the time base of its node stats), or failed.
    Started {
        container: ContainerId,
        /// `None`: ready; otherwise why not.
        failure: Option<CreateFailure>,
        at: Time,
    },
    /// A dispatched job ended. `reusable` is false when the container must not run anything
    /// again (timeout, crash, out of memory, bad response).
    Finished {
        container: ContainerId,
        job: JobId,
        reusable: bool,
    },
    /// The container is gone: destroyed after `Remove`, or died on its own. Its in-flight jobs
    /// must have been reported `Finished` before; any that were not are rejected as lost.
    Removed(ContainerId),
    NodeStats(NodeStatsUpdate),
    /// Time passed: expire deadlines and idle containers.
    Tick,
    /// Stop taking work: reject what waits, remove idle containers, retire the rest when done.
    Drain,
    /// The invoker is given back for a while (drained by the capacity manager, its pod to be
    /// shrunk to standby, which a kubelet does only once what the pod uses fits): the idle
    /// containers the keep-alive policy holds go now. Nothing else changes: work still waits and
    /// runs, provisioned and prewarmed containers stay.
    ShedIdle,
    /// The key's action is gone (deleted, or replaced by a newer revision): its idle containers
    /// go now, its busy ones once their runs end; jobs already waiting still run.
    Retire(KeyId),
    /// Keep this many containers of the key created and initialised at all times (the
    /// action's `provisioned-concurrency`); zero keeps none. Said again whenever it changes.
    Provision(Provision),
}

/// An action's provisioned containers ([`Event::Provision`]): the key's shape (what its jobs
/// would say of it) and how many to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Provision {
    pub key: KeyId,
    pub count: u32,
    pub memory_mb: u32,
    pub concurrency: u32,
    pub max_running: Option<u32>,
    pub tenant: TenantId,
}

/// Why a job was answered without running. Every one of these means nothing ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The action's memory is larger than any node could ever hold.
    NeverFits { memory_mb: u32, largest_node_mb: u64 },
    /// The job waited until its deadline without a container.
    DeadlineExceeded,
    /// The waiting buffer is full.
    QueueFull,
    /// The container created for it failed to start.
    CreateFailed(CreateFailure),
    /// The invoker is shutting down.
    Draining,
    /// The container it was running on vanished without reporting the job finished.
    ContainerLost,
    /// It waited until its deadline while its key ran as many jobs as it may (`cap`).
    Capped { cap: u32 },
}

/// What the core asks the caller to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Create {
        container: ContainerId,
        owner: Owner,
        memory_mb: u32,
        node: NodeId,
        /// Started ahead of a call the keep-alive policy predicts, for no waiting job.
        prewarm: bool,
        /// One of its key's provisioned containers: initialised as it is created (before the
        /// core hears it started), never expired or evicted, replaced when it goes.
        provisioned: bool,
    },
    /// Comes right before the `Dispatch` of a job to a paused container: the job waits for
    /// the resume.
    Resume {
        container: ContainerId,
    },
    Dispatch {
        job: JobId,
        container: ContainerId,
    },
    /// Freeze an idle container: it keeps its memory and uses no CPU until its next job.
    Pause {
        container: ContainerId,
    },
    Remove {
        container: ContainerId,
    },
    Reject {
        job: JobId,
        reason: RejectReason,
    },
}

pub type Effects = SmallVec<[Effect; 4]>;

/// Tunables of the core: the `[pool]` section of the invoker's config (and of the simulator's
/// scenarios), read straight into this type. Durations are in the core's time base.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoreConfig {
    /// Container starts in flight for one action key at most.
    pub max_starts_per_action: u32,
    /// Container starts in flight on one node at most.
    pub max_starts_per_node: u32,
    /// Jobs waiting for a container, over all keys, at most.
    pub max_waiting: usize,
    /// An idle container is removed after this long unused.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// How long a job may wait for a container before it is answered without running (503).
    #[serde(with = "humantime_serde")]
    pub wait_deadline: Duration,
    /// Node stats older than this count as nothing free.
    #[serde(with = "humantime_serde")]
    pub stats_ttl: Duration,
    /// How often the core is told that time passed (deadlines, idle timeouts, prewarm).
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// Memory kept free on every node (the launchability buffer).
    pub buffer_mb: u64,
    /// When jobs that wait for an action start new containers: `capped` (ours); `one_each` and
    /// `first_up` are the rules of OpenWhisk and Fn, for comparisons in the simulator.
    pub start_rule: StartRule,
    /// Prewarm classes (`[[pool.prewarm]]`); a job's `stem` indexes this list.
    pub prewarm: Vec<PrewarmSpec>,
    /// An action blocked for room this long claims a node: other actions start nothing there,
    /// and their containers there retire when their runs end, until it has started. This is
    /// what keeps a large action from being overtaken forever by small ones.
    #[serde(with = "humantime_serde")]
    pub claim_after: Duration,
    /// An idle container is paused after this long without a job, and resumed by the next;
    /// zero never pauses. Not a `[pool]` key: the invoker sets it from `[proxy] pause_grace`,
    /// the simulator from its cluster's `pause_grace`, where what a pause costs is known.
    #[serde(skip)]
    pub pause_grace: Duration,
    /// Which idle containers are kept, for how long, and which go first when room is needed.
    pub keep_alive: KeepAliveKind,
    /// The parameters of the policies that have any (`[pool.keep_alive_params]`).
    pub keep_alive_params: KeepAliveParams,
}

/// The keep-alive policies (`pool.keep_alive`); the live invoker and the simulator build the
/// same policy objects from it ([`super::policy_for`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepAliveKind {
    /// `idle_timeout`, least recently used evicted first: OpenWhisk's and Fn's.
    Fixed,
    /// FaasCache's greedy-dual-size-frequency: kept while memory allows (or up to `max_idle`);
    /// the lowest `clock + frequency × start cost / memory` is evicted first.
    GreedyDual,
    /// Serverless in the Wild's hybrid histogram: per action, unload after a run and pre-warm
    /// before the next one the histogram of idle times predicts, or keep to its tail. The
    /// default, with its window priced (`keep_alive_params.window`).
    #[default]
    Hybrid,
}

/// How the hybrid policy draws an action's window (pre-warm, then keep) from its histogram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HybridWindow {
    /// The window that costs least on the histogram: idle memory-time, plus each cold start
    /// at `start_second_worth_gb_s` per second of its start. An action whose idle times are
    /// spread keeps little; one whose calls come back at a steady gap is pre-warmed for it.
    #[default]
    Priced,
    /// Serverless in the Wild's: pre-warm at the head percentile, keep to the tail one, each
    /// with the margin, once the histogram is peaked enough (`cv_threshold`).
    Percentiles,
}

/// `[pool.keep_alive_params]`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeepAliveParams {
    /// greedy_dual: an idle container goes after this long even when memory allows keeping it;
    /// unset: only when room is needed (FaasCache).
    #[serde(with = "humantime_serde")]
    pub max_idle: Option<Duration>,
    /// hybrid: the histogram's range, 4 h...
    #[serde(with = "humantime_serde")]
    pub range: Duration,
    /// ...in bins of this width, 30 s (at most 1,440 bins; the paper's are 1 min).
    #[serde(with = "humantime_serde")]
    pub bin: Duration,
    /// hybrid: how the window is drawn from the histogram ("priced").
    pub window: HybridWindow,
    /// hybrid, priced: the idle memory-time (GB·s) a second of cold start is worth keeping
    /// (300: what the fixed 10 minutes spends on a 256 MB action that starts in 500 ms).
    pub start_second_worth_gb_s: f64,
    /// hybrid, percentiles: the pre-warm comes at this percentile of the idle times (5)...
    pub head_percentile: f64,
    /// ...and the container stays to this one (99).
    pub tail_percentile: f64,
    /// hybrid: the pre-warm comes this fraction earlier, the keep-alive lasts this fraction
    /// longer (0.1).
    pub margin: f64,
    /// hybrid: idle times seen before the histogram is trusted (10).
    pub min_samples: u32,
    /// hybrid: the coefficient of variation of the bin counts below which the histogram is
    /// too flat to trust (2.0).
    pub cv_threshold: f64,
    /// hybrid: the fraction of idle times beyond the range above which the histogram is not
    /// trusted (0.5).
    pub out_of_range_threshold: f64,
}

impl Default for KeepAliveParams {
    fn default() -> Self {
        KeepAliveParams {
            max_idle: None,
            range: Duration::from_secs(4 * 3600),
            bin: Duration::from_secs(30),
            window: HybridWindow::Priced,
            start_second_worth_gb_s: 300.0,
            head_percentile: 5.0,
            tail_percentile: 99.0,
            margin: 0.1,
            min_samples: 10,
            cv_threshold: 2.0,
            out_of_range_threshold: 0.5,
        }
    }
}

impl CoreConfig {
    /// Gives every prewarm class that names no disk `default_mb` (the config's default).
    pub fn fill_prewarm_disk(&mut self, default_mb: u32) {
        for class in self.prewarm.iter_mut().filter(|c| c.disk_mb == 0) {
            class.disk_mb = default_mb;
        }
    }

    /// The prewarm class a job of this kind, memory and disk may adopt.
    pub fn stem_for(&self, kind: &str, memory_mb: u32, disk_mb: u32) -> Option<StemId> {
        let index =
            self.prewarm.iter().position(|p| p.kind == kind && p.memory_mb == memory_mb && p.disk_mb == disk_mb)?;
        Some(StemId(index as u32))
    }
}

/// How many stem containers of one class to keep ready: started and uninitialised, adopted by
/// actions of `kind`, `memory_mb` and `disk_mb` that would start cold.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrewarmSpec {
    /// What the class's containers run; the core only passes it on to whoever creates them.
    pub kind: String,
    pub memory_mb: u32,
    /// The disk its containers get; unset in the config, `limits.disk_default_mb` (filled in
    /// when the config is read).
    #[serde(default)]
    pub disk_mb: u32,
    /// Kept ready when the class is not reactive; the starting count when it is.
    #[serde(default)]
    pub count: u32,
    #[serde(default)]
    pub reactive: Option<ReactivePrewarm>,
}

/// OpenWhisk's reactive prewarm: every `window`, the count becomes
/// `min + (cold starts of the class in the window / threshold) * increment`, within `max`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReactivePrewarm {
    pub min: u32,
    pub max: u32,
    #[serde(default = "one")]
    pub threshold: u32,
    #[serde(default = "one")]
    pub increment: u32,
    #[serde(with = "humantime_serde", default = "one_minute")]
    pub window: Duration,
}

fn one() -> u32 {
    1
}

fn one_minute() -> Duration {
    Duration::from_secs(60)
}

/// When waiting jobs start containers. Only `Capped` is meant for production; the others are
/// the rules of the systems we compare against, kept so the simulator can run them side by
/// side on the same core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StartRule {
    /// Ours: while waiting jobs outnumber what the starting containers will take, with at most
    /// `max_starts_per_action` starts in flight per action.
    #[default]
    Capped,
    /// One container for every job that cannot run at once, without a cap (OpenWhisk's
    /// default invoker).
    OneEach,
    /// Fn's herd guard: while an action has no container up, its first start must finish before
    /// another begins; then one per waiting job beyond those starting.
    FirstUp,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            max_starts_per_action: 4,
            max_starts_per_node: 8,
            max_waiting: 10_000,
            idle_timeout: Duration::from_secs(600),
            wait_deadline: Duration::from_secs(60),
            stats_ttl: Duration::from_secs(60),
            tick: Duration::from_millis(100),
            buffer_mb: 0,
            start_rule: StartRule::Capped,
            prewarm: Vec::new(),
            claim_after: Duration::from_secs(1),
            pause_grace: Duration::ZERO,
            keep_alive: KeepAliveKind::Hybrid,
            keep_alive_params: KeepAliveParams::default(),
        }
    }
}
