//! Scenario files (`scenarios/*.toml`): the simulated cluster, the pool's settings and the
//! workload. Unknown keys are refused, as in the invoker's own config.

use crate::pool::CoreConfig as PoolConfig;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The `[pool]` section of the invoker's own config, with the same defaults.
    #[serde(default)]
    pub pool: PoolConfig,
    /// Run the scenario once per start rule and report each (the herd comparison).
    #[serde(default)]
    pub compare_start_rules: Option<Vec<crate::pool::StartRule>>,
    /// Run the scenario once per keep-alive policy listed here and node size in
    /// `node_sizes_mb`, and report each (the keep-alive comparison); the first is the baseline.
    #[serde(default)]
    pub compare_keep_alive: Option<Vec<KeepAliveChoice>>,
    /// The node sizes of the keep-alive comparison (the cluster's own when not given).
    #[serde(default)]
    pub node_sizes_mb: Option<Vec<u64>>,
    /// With the keep-alive comparison: fixed keep-alives of these many minutes run too, per
    /// node size, tracing the curve each policy is judged against (`vs_fixed_curve`).
    /// Fractions (0.25: 15 s) reach the idle memory of a policy that holds less than a minute.
    #[serde(default)]
    pub sweep_fixed_minutes: Option<Vec<f64>>,
    /// Provision the functions that start cold most (or are called most) under each keep-alive
    /// policy, and report what that saves and what it costs beside the policy alone.
    #[serde(default)]
    pub compare_provisioned: Option<ProvisionedComparison>,
    pub cluster: Cluster,
    pub workload: Workload,
    /// Each call's memory rounded up to the first of these it fits (MB, ascending; a call
    /// larger than the last keeps its own): the sizes a platform offers (OpenWhisk's are
    /// chosen from a few), which a stem of `[[pool.prewarm]]` must match exactly. Unset, each
    /// function asks for its trace's own average.
    #[serde(default)]
    pub memory_classes: Option<Vec<u32>>,
    /// A fleet of invokers under the capacity manager instead of one invoker: `[cluster]`
    /// then describes one invoker's node.
    #[serde(default)]
    pub fleet: Option<Fleet>,
}

/// The fleet comparison: one invoker group, replayed under each predictor (and the fixed
/// fleets and the oracle) once per control plane's provisioning latency.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// The group, as a `[capacity.groups.<name>]` section says it (its `predictor` is
    /// ignored: every one in `predictors` is run).
    pub group: crate::capacity::GroupConfig,
    #[serde(default = "all_predictors")]
    pub predictors: Vec<crate::predictor::PredictorKind>,
    pub planes: Vec<Plane>,
    /// The scheduler's `wait_for_room`: an activation no invoker has room for waits this long
    /// before it is kept in the durable queue (answered 202, still waiting: `kept_past_wait`).
    #[serde(with = "humantime_serde")]
    pub wait_for_room: Duration,
    /// The capacity manager's `[capacity] tick`.
    #[serde(default = "default_capacity_tick", with = "humantime_serde")]
    pub tick: Duration,
    /// Each predictor is also run with these `headroom_mb` (entries `<predictor>+<n>MB`),
    /// beside the group's own.
    #[serde(default)]
    pub compare_headroom_mb: Vec<u64>,
}

impl Fleet {
    /// The headrooms each predictor runs with: the group's, then the compared ones.
    pub fn headrooms_mb(&self) -> Vec<u64> {
        let mut all = vec![self.group.headroom_mb];
        all.extend(self.compare_headroom_mb.iter().filter(|h| **h != self.group.headroom_mb));
        all
    }
}

/// A control plane, as the fleet comparison sees it: how long an invoker takes to come up.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plane {
    pub name: String,
    #[serde(with = "humantime_serde")]
    pub provision_latency: Duration,
    /// Invokers kept started but small, that the group grows by resizing.
    #[serde(default)]
    pub standby: Option<Standby>,
    /// `newest` where only the newest invoker gives its memory back (a StatefulSet without
    /// standby pods): a shrinking group drains the newest first. `least_busy` (the default):
    /// any, so the group's lead decides (`crate::capacity::drain_order`).
    #[serde(default)]
    pub drain_order: crate::capacity::DrainOrder,
}

/// Standby invokers: started (their pod scheduled, image pulled, process up) but holding only
/// their own memory, so that the group grows by resizing one in place (`resize_latency`, as
/// Kubernetes' in-place pod resize does) rather than starting one (`provision_latency`). One
/// taken is replaced by a new one, which takes `provision_latency`; an invoker removed goes with
/// its pod (a pod shrunk back would keep what its containers hold).
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Standby {
    pub pods: u32,
    #[serde(with = "humantime_serde")]
    pub resize_latency: Duration,
    /// What one holds while it waits (its pod's request), MB: counted in the fleet's cost.
    pub memory_mb: u64,
}

fn all_predictors() -> Vec<crate::predictor::PredictorKind> {
    use crate::predictor::PredictorKind;
    vec![PredictorKind::Conservative, PredictorKind::Windowed, PredictorKind::Seasonal]
}

fn default_capacity_tick() -> Duration {
    Duration::from_secs(1)
}

/// The provisioned comparison (`[compare_provisioned]`): for every keep-alive policy (those of
/// `compare_keep_alive`, or the pool's own) and node size, the policy alone, then with the top
/// `k` functions provisioned, for each `k` in `top_k`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionedComparison {
    pub top_k: Vec<u32>,
    /// Provisioned containers per chosen function.
    #[serde(default = "one")]
    pub count: u32,
    #[serde(default)]
    pub select: ProvisionSelect,
}

/// Which functions are "latency-critical", the ones provisioned: judged on the policy's own
/// run without provisioning (what an operator would look at before choosing).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProvisionSelect {
    /// Those with the most cold starts.
    #[default]
    MostColdStarts,
    /// Those with the most calls.
    MostCalls,
}

fn one() -> u32 {
    1
}

/// One policy of a keep-alive comparison: a name, and the `[pool]` keys it changes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepAliveChoice {
    pub name: String,
    pub keep_alive: crate::pool::KeepAliveKind,
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    #[serde(default)]
    pub keep_alive_params: Option<crate::pool::KeepAliveParams>,
    /// Stems (`[[pool.prewarm]]`) for this choice alone, in place of the pool's: the same
    /// policy with and without them, side by side.
    #[serde(default)]
    pub prewarm: Option<Vec<crate::pool::PrewarmSpec>>,
}

impl KeepAliveChoice {
    /// `pool` with the keys this choice changes.
    pub fn applied_to(&self, pool: &PoolConfig) -> PoolConfig {
        let mut pool = pool.clone();
        if let Some(prewarm) = &self.prewarm {
            pool.prewarm = prewarm.clone();
            // Simulated calls ask for the default disk, as a stem does unless it says.
            pool.fill_prewarm_disk(invoker_ids::DEFAULT_DISK_MB);
        }
        pool.keep_alive = self.keep_alive;
        if let Some(timeout) = self.idle_timeout {
            pool.idle_timeout = timeout;
        }
        if let Some(params) = &self.keep_alive_params {
            pool.keep_alive_params = params.clone();
        }
        pool
    }
}

fn default_seed() -> u64 {
    7
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub nodes: u32,
    pub node_memory_mb: u64,
    /// A container start takes this long, plus `start_per_inflight_ms` for every other start
    /// in flight on its node when it begins (engines slow down under parallel starts).
    #[serde(with = "humantime_serde")]
    pub start_latency: Duration,
    #[serde(default)]
    pub start_per_inflight_ms: u64,
    #[serde(default = "default_remove", with = "humantime_serde")]
    pub remove_latency: Duration,
    /// The cluster publishes node stats this often...
    #[serde(default = "default_stats_every", with = "humantime_serde")]
    pub stats_every: Duration,
    /// ...describing the cluster as it was this long ago.
    #[serde(default, with = "humantime_serde")]
    pub stats_lag: Duration,
    /// An idle container is paused after this long (the invoker's `[proxy] pause_grace`);
    /// zero, the default here, never pauses.
    #[serde(default, with = "humantime_serde")]
    pub pause_grace: Duration,
    /// What resuming a paused container adds before its next run starts.
    #[serde(default, with = "humantime_serde")]
    pub resume_latency: Duration,
    /// Container starts as measured on a real cluster (`invoker replay`): when given, the fleet
    /// simulator draws each start's latency from them instead of taking `start_latency`.
    #[serde(skip)]
    pub start_latency_sample: Vec<Duration>,
}

fn default_remove() -> Duration {
    Duration::from_millis(10)
}

fn default_stats_every() -> Duration {
    Duration::from_millis(100)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
pub enum Workload {
    /// `actions` actions of `memory_mb` (min..=max), called in `bursts` bursts of `burst_size`
    /// calls spread over `burst_spread`, one burst every `burst_every`.
    Bursts {
        actions: u32,
        memory_mb: [u32; 2],
        run_ms: [u64; 2],
        bursts: u32,
        burst_size: u32,
        #[serde(with = "humantime_serde")]
        burst_every: Duration,
        #[serde(with = "humantime_serde")]
        burst_spread: Duration,
    },
    /// `calls` simultaneous first calls to one action.
    Herd { calls: u32, memory_mb: u32, run_ms: u64 },
    /// An Azure Functions 2019 sample (`N_inv.csv`, `N_run.csv`, `N_mem.csv` in `dir`).
    Trace {
        dir: PathBuf,
        functions: u32,
        /// Replay only the first minutes (all 1,440 when not given).
        #[serde(default)]
        minutes: Option<u32>,
        #[serde(default = "default_timeout")]
        timeout_ms: u64,
        /// Where in its minute each call of the trace comes (the trace counts calls per minute
        /// only).
        #[serde(default)]
        arrivals: Arrivals,
        /// Only one half of the sample's functions (all when not given).
        #[serde(default)]
        half: Option<Half>,
        /// Each minute's calls this many times over (a stress: the same functions, their
        /// rates scaled); 1 when not given.
        #[serde(default = "once")]
        rate: u32,
    },
}

/// One of two halves of a trace's functions, split by a hash of each function's name
/// (FNV-1a of `HashFunction`): a setting tuned on one half is judged on the other, so that a
/// figure is not one of the functions it was tuned on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Half {
    A,
    B,
}

impl Half {
    /// Whether the function named `name` is of this half.
    pub fn holds(self, name: &str) -> bool {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        (hash & 1 == 0) == (self == Half::A)
    }
}

impl std::str::FromStr for Half {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "a" => Ok(Half::A),
            "b" => Ok(Half::B),
            _ => Err(format!("half: '{s}' must be a or b")),
        }
    }
}

/// How a trace's calls of one minute are placed within it. The Azure sample counts calls per
/// minute; where in the minute they came it does not say, and a claim about bursts within a
/// minute depends on this choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrivals {
    /// Each call at a uniformly random instant of its minute.
    #[default]
    Uniform,
    /// A Poisson process at the minute's rate: its count varies around the trace's (given
    /// the count, Poisson arrivals are uniform, so this adds the count's variance).
    Poisson,
    /// All within the minute's first second, as timer triggers on the minute fire.
    MinuteStart,
    /// Each function's calls within one second of the minute fixed for that function (a timer
    /// at that second, or a client on a schedule): a burst that returns at the same second.
    FixedSecond,
}

fn once() -> u32 {
    1
}

fn default_timeout() -> u64 {
    600_000
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("scenario {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("scenario {path}: {0}", path = .1)]
    Parse(String, String),
    #[error("trace {path}: {reason}")]
    Trace { path: String, reason: String },
}

impl Scenario {
    /// Cuts a trace scenario to its first `minutes` (a short replay of a day-long scenario);
    /// other workloads are left whole.
    pub fn replay_first_minutes(&mut self, minutes: u32) {
        if let Workload::Trace { minutes: m, .. } = &mut self.workload {
            *m = Some(minutes);
        }
    }

    /// Scales a trace's rates: each minute's calls `rate` times over (at least once); other
    /// workloads are left whole.
    pub fn rate_times(&mut self, rate: u32) {
        if let Workload::Trace { rate: r, .. } = &mut self.workload {
            *r = rate.max(1);
        }
    }

    /// Keeps only `half` of a trace's functions; other workloads are left whole.
    pub fn only_half(&mut self, half: Half) {
        if let Workload::Trace { half: h, .. } = &mut self.workload {
            *h = Some(half);
        }
    }

    /// A scenario read from `path` (the host reads and parses the file), made ready: a trace
    /// directory is resolved against the scenario's own folder, and what does not hold together
    /// is refused.
    pub fn checked(mut self, path: &Path) -> Result<Scenario, ScenarioError> {
        let scenario = &mut self;
        if let Workload::Trace { dir, .. } = &mut scenario.workload {
            if dir.is_relative() {
                *dir = path.parent().unwrap_or(Path::new(".")).join(&*dir);
            }
        }
        // Simulated calls ask for the default disk, as the prewarm classes do unless they say.
        scenario.pool.fill_prewarm_disk(invoker_ids::DEFAULT_DISK_MB);
        if scenario.cluster.nodes == 0 || scenario.cluster.node_memory_mb == 0 {
            let reason = "cluster.nodes and cluster.node_memory_mb must be above 0".into();
            return Err(ScenarioError::Read { path: path.display().to_string(), reason });
        }
        if scenario.sweep_fixed_minutes.iter().flatten().any(|m| !(m.is_finite() && *m > 0.0 && *m <= 10_080.0)) {
            let reason = "sweep_fixed_minutes: each must be above 0 and at most a week (10080)".into();
            return Err(ScenarioError::Read { path: path.display().to_string(), reason });
        }
        if let Some(fleet) = &scenario.fleet {
            let bad = |reason: String| ScenarioError::Read { path: path.display().to_string(), reason };
            if scenario.cluster.nodes != 1 || scenario.cluster.node_memory_mb != fleet.group.invoker_memory_mb {
                return Err(bad("a fleet's invoker is one node: cluster.nodes = 1 and cluster.node_memory_mb = \
                     fleet.group.invoker_memory_mb"
                    .into()));
            }
            fleet.group.validate("default").map_err(|e| bad(format!("fleet.group: {e}")))?;
            if fleet.planes.is_empty() || fleet.predictors.is_empty() {
                return Err(bad("fleet.planes and fleet.predictors: at least one each".into()));
            }
        }
        Ok(self)
    }
}
