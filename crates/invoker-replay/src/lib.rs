//! `invoker replay`: a trace's calls through a live cluster on this machine, beside the
//! simulator's account of the same calls.
//!
//! Every figure about the capacity manager and keep-alive comes from the simulator, which is only
//! as true as its model of what surrounds the pure cores (how long an invoker takes to come up,
//! when stats and demand reports arrive, what a cold start costs). The replay checks that model
//! on the real thing: it starts etcd, a scheduler and `invoker capacity` on the local control
//! plane (which starts `invoker serve` processes on the process factory), makes each function of
//! the trace an action of its memory, sends the calls compressed in time by a factor (each run
//! lasting its trace duration divided by it, each call placed in its minute as the simulator's
//! arrival model places it, same seed), watches the fleet while they run, and stops everything it
//! started. Then the simulator runs the same compressed calls with the timings the replay
//! measured (an invoker's start to its registration, a cold start) and both verdicts are printed
//! side by side ([`verdict`]).
//!
//! Bounded: at most `--max-calls` calls, the slice's length plus a drain window, loopback only.

#![forbid(unsafe_code)]

mod client;
mod cluster;
mod drive;
mod observe;
pub mod verdict;

use invoker_core::sim::fleet::Scale;
use invoker_core::sim::scenario::{Scenario, Workload};
use invoker_core::sim::workload::{self, Call};
use invoker_core::sim::Host;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// A fleet scenario (`scenarios/replay-50.toml`): its `[workload]` a trace, its `[pool]` and
    /// `[fleet]` what the cluster runs, in the replay's own (compressed) time.
    #[arg(long)]
    pub scenario: PathBuf,
    /// How many times faster than the trace the calls come and run.
    #[arg(long, default_value_t = 60.0)]
    pub factor: f64,
    /// Replay the trace's first minutes only (the scenario's when not given).
    #[arg(long)]
    pub minutes: Option<u32>,
    /// At most this many calls (the first ones).
    #[arg(long, default_value_t = 100_000)]
    pub max_calls: usize,
    /// Where the cluster keeps its files (a fresh temporary directory when not given; removed
    /// at the end unless `--keep`).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    #[arg(long)]
    pub keep: bool,
    /// The `etcd` binary to start (found on the `PATH` when not given; `scripts/etcd.sh`
    /// installs Debian's).
    #[arg(long, default_value = "etcd")]
    pub etcd_binary: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("replay: --factor must be at least 1 (was {0})")]
    Factor(f64),
    #[error("replay: the scenario's workload must be a trace, and it must have a [fleet] section")]
    NotAFleetTrace,
    #[error("replay: {0}")]
    Scenario(#[from] invoker_core::sim::scenario::ScenarioError),
    #[error("replay: {what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("replay: {0}")]
    Cluster(String),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ReplayError {
    let what = what.into();
    move |source| ReplayError::Io { what, source }
}

/// The calls of the slice, compressed: each comes and runs `factor` times sooner, and asks for
/// at least `memory_min_mb` and at most an invoker's memory (what an action may declare).
pub fn compressed_calls(
    scenario: &Scenario,
    factor: f64,
    max_calls: usize,
    memory: (u32, u32),
    host: &dyn Host,
) -> Result<Vec<Call>, ReplayError> {
    let (calls, _) = workload::calls(&scenario.workload, scenario.seed, host)?;
    Ok(calls
        .into_iter()
        .take(max_calls)
        .map(|c| Call {
            at: c.at.div_f64(factor),
            run: c.run.div_f64(factor),
            memory_mb: c.memory_mb.clamp(memory.0, memory.1),
            action: c.action,
        })
        .collect())
}

/// Replays the scenario's slice through a live cluster, then the simulator on the same calls;
/// returns both verdicts side by side.
pub async fn replay(
    args: &ReplayArgs,
    mut scenario: Scenario,
    host: &dyn Host,
) -> Result<serde_json::Value, ReplayError> {
    if args.factor.is_nan() || args.factor < 1.0 {
        return Err(ReplayError::Factor(args.factor));
    }
    if let Some(minutes) = args.minutes {
        scenario.replay_first_minutes(minutes);
    }
    let Some(fleet) = scenario.fleet.as_ref() else { return Err(ReplayError::NotAFleetTrace) };
    if !matches!(scenario.workload, Workload::Trace { .. }) {
        return Err(ReplayError::NotAFleetTrace);
    }
    let memory = (cluster::MEMORY_MIN_MB, fleet.group.invoker_memory_mb as u32);
    let calls = compressed_calls(&scenario, args.factor, args.max_calls, memory, host)?;
    let scale = Scale::compressed(args.factor);
    // The slice's whole minutes, compressed: both sides count the fleet over it.
    let last = calls.last().map_or(Duration::ZERO, |c| c.at.mul_f64(args.factor));
    let horizon = Duration::from_secs((last.as_secs() / 60 + 1) * 60).div_f64(args.factor);
    let cluster = cluster::Cluster::start(args, &scenario).await?;
    let outcome = async {
        let actions = drive::create_actions(&cluster, &calls).await?;
        let watch = observe::Watch::start(&cluster, scale.reversal, horizon);
        let outcomes = drive::send(&cluster, &calls, &actions, args.factor).await;
        let mut fleet_seen = watch.seen().await;
        fleet_seen.room_waits = observe::room_waits(&cluster.scheduler).await;
        Ok::<_, ReplayError>((outcomes, fleet_seen))
    }
    .await;
    cluster.stop().await;
    let (outcomes, fleet_seen) = outcome?;
    let measured = verdict::Measured::of(&calls, &outcomes, &fleet_seen);
    let real = verdict::Verdict::of_replay(&calls, &outcomes, &fleet_seen, &measured, scale, args.factor);
    // The simulator with what the replay measured: an invoker's node is the group's, each cold
    // start one the replay's took, each removal as long as theirs; each call holds its container
    // and its scheduler's demand for its run and what a warm call costs beyond it (at 60× a run
    // of a few milliseconds is held a good part longer than it runs).
    scenario.cluster.node_memory_mb = fleet.group.invoker_memory_mb;
    scenario.cluster.start_latency = measured.cold_start();
    scenario.cluster.start_latency_sample = measured.cold_starts.clone();
    scenario.cluster.remove_latency = measured.remove_latency;
    let held: Vec<Call> = calls.iter().map(|c| Call { run: c.run + measured.warm_overhead_mean, ..*c }).collect();
    let fleet = scenario.fleet.as_ref().ok_or(ReplayError::NotAFleetTrace)?;
    let simulated =
        invoker_core::sim::fleet::managed_run(&scenario, fleet, &held, horizon, &measured.invoker_starts, scale, host);
    let by_minute = (fleet_seen.invokers_by_minute(scale.minute, horizon), simulated["invokers_by_minute"].clone());
    let manager = verdict::managers(&fleet_seen, &simulated, scale, horizon);
    let troubles = verdict::troubles(&calls, &outcomes, &measured, scale, &simulated);
    let simulated = verdict::Verdict::of_simulator(&simulated, args.factor);
    let mut verdict =
        verdict::side_by_side(&scenario, args.factor, calls.len(), &measured, (&real, &simulated), by_minute);
    verdict["manager"] = manager;
    verdict["troubles"] = troubles;
    // Looks at the fleet the manager or etcd did not answer in time: its figures miss them.
    verdict["missed_looks"] = serde_json::json!(fleet_seen.missed_looks);
    Ok(verdict)
}

/// How long after its last call is sent the replay waits for the answers still out.
pub(crate) const DRAIN: Duration = Duration::from_secs(75);
