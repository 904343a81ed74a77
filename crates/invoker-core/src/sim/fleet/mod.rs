//! The fleet simulator: a whole cluster in virtual time. The scheduler's placement
//! ([`crate::placement::place`]) spreads a trace's calls over invokers, each running
//! the pool core the invoker runs on one node, and the capacity manager's decision core
//! ([`crate::capacity::GroupCore`]) with a predictor grows and shrinks the fleet from the
//! demand the scheduler reports, through a control plane that takes `provision_latency` to
//! bring an invoker up. Beside those policies, in the same run: fixed fleets sized for the
//! trace's peak and for its mean, the per-minute oracle (see [`oracle`]), and the continuous
//! packing and memory floors (see [`floors`]), against which every cost is also given.
//!
//! What it models of the real parts, and what it leaves out:
//! - the scheduler places only where an invoker has room (idle containers count as room, as
//!   the invoker record's `room_mb` does; where the call fits in free memory first,
//!   as [`crate::placement::place`] prefers), keeps what fits nowhere waiting for
//!   `wait_for_room` and then keeps it in its durable queue (its caller answered 202: it waits
//!   on, for the queue's six hours at most), refusing only a call larger than an invoker, and
//!   reports its demand (in flight, waiting, refused
//!   since the last report, in MB and by call size) at most every 200 ms, as the scheduler's
//!   demand ledger does; the manager takes what those calls need packed whole on invokers
//!   ([`crate::capacity::packing`]), not their megabytes;
//! - the manager runs a round every `tick`, and between ticks as a report comes that puts the
//!   demand past what the group has, and every 200 ms while that lasts, as `invoker capacity`
//!   (which watches the reports) does;
//! - an invoker costs from the moment it is asked for until it is removed; a draining one takes
//!   no new work and is removed once idle (or at its drain deadline: what it still runs is
//!   counted as killed, as the scheduler ends it with a record);
//! - the scheduler sees every invoker's room at once (no etcd lag), and each invoker is one
//!   node whose stats its pool sees every pool tick and as soon as a container goes (as the
//!   one-host factories publish them);
//! - a container's start and removal take `[cluster] start_latency` and `remove_latency`, or,
//!   from `invoker replay`, starts drawn from those it measured on the real cluster.

pub mod count_oracle;
pub mod floors;
pub mod oracle;

use super::host::Host;
use super::scenario::{Fleet, Scenario, ScenarioError, Standby};
use super::timeline::Timeline;
use super::workload::{self, Call, Rng};
use crate::capacity::packing::{packed_demand_mb, CallTally};
use crate::capacity::{Action, DrainOrder, Event as GroupEvent, GroupCore, GroupSpec, Sighting};
use crate::placement::{place, ActionNeeds, InvokerView, PlacementConfig};
use crate::pool::{CoreConfig, Effect, Event, Job, KeyId, Owner, PoolCore, RejectReason};
use crate::predictor::{AnyPredictor, Predictor, PredictorKind};
use floors::Floors;
use invoker_ids::{ContainerId, CreateFailure, JobId, NodeId, NodeStatsUpdate};
use oracle::DemandProfile;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// How often a scheduler reports its demand at most.
const REPORT_EVERY: Duration = crate::capacity::REPORT_EVERY;
/// While the reported demand is past what the group has, how often the manager's round runs.
const BURST_RECHECK: Duration = Duration::from_millis(200);
/// How long a call kept in the durable queue past `wait_for_room` waits on for room: the
/// queue's default maximum event age (`[queue] max_event_age`).
const KEPT_FOR: Duration = Duration::from_secs(6 * 3600);

/// A call that waited longer than this before it ran is counted as delayed.
const DELAYED: Duration = Duration::from_secs(1);
/// A drain this soon after the group grew (an invoker asked for or taken back), or a growth
/// this soon after a drain, undoes the decision before it. Five minutes: a drain can come no
/// sooner than `scale_down_after` (60 s) after a rise, so a shorter window sees nothing.
const REVERSAL: Duration = Duration::from_secs(300);

/// The thresholds a run counts against: a call delayed past `delayed_over`, a decision undone
/// within `reversal`. The trace's own (1 s, 5 minutes) unless the calls were compressed in
/// time (a replay's slice, `invoker replay`), when they shrink by the same factor.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub delayed_over: Duration,
    pub reversal: Duration,
    /// A minute of the trace.
    pub minute: Duration,
}

impl Scale {
    /// The thresholds of a trace compressed `factor` times.
    pub fn compressed(factor: f64) -> Scale {
        let factor = factor.max(1.0);
        let minute = Duration::from_secs(60).div_f64(factor);
        Scale { delayed_over: DELAYED.div_f64(factor), reversal: REVERSAL.div_f64(factor), minute }
    }
}

/// One managed fleet on `calls` as given (a replay's slice, already compressed in time) over
/// `horizon`: the group's own predictor and headroom, each invoker up a time drawn from
/// `invoker_starts` after it is asked for, the delays and reversals counted against `scale`. What `invoker replay` sets beside what
/// really happened: the same summary as each entry of [`compare`] (its bounds, per-minute and
/// continuous, are of the compressed calls).
pub fn managed_run(
    scenario: &Scenario,
    fleet: &Fleet,
    calls: &[Call],
    horizon: Duration,
    invoker_starts: &[Duration],
    scale: Scale,
    host: &dyn Host,
) -> Value {
    let minutes = (horizon.as_secs() / 60 + 1) as usize;
    let floors = Floors::of(calls, horizon, fleet.group.invoker_memory_mb);
    let profile = DemandProfile::of(calls, minutes);
    let oracle_seconds =
        profile.oracle_invokers(fleet.group.invoker_memory_mb).iter().map(|&n| u64::from(n) * 60).sum();
    let bounds = Bounds { oracle_seconds, floors };
    let sizing = Sizing::Managed(fleet.group.predictor, fleet.group.headroom_mb);
    let mut sorted = invoker_starts.to_vec();
    sorted.sort_unstable();
    // The predictors plan `lead` ahead: the typical start, as the manager's own figure for a plane.
    let latency = sorted.get(sorted.len() / 2).copied().unwrap_or(Duration::from_secs(1));
    let plane = PlaneModel { provision: latency, standby: None, drain_order: DrainOrder::LeastBusy };
    let mut sim = prepared(scenario, fleet, calls, horizon, sizing, plane, scale);
    sim.latency_sample = sorted;
    sim.run_timed(host);
    let mut summary = sim.summary(&bounds);
    summary["activations"] = json!(calls.len());
    summary["invoker_seconds_exact"] = json!(sim.invoker_seconds_exact());
    summary["idle_gb_s_exact"] = json!(sim.counts.idle_mb_us as f64 / 1024.0 / 1e6);
    summary["invokers_by_minute"] = json!(sim.invokers_by_minute());
    let (demand, target) = sim.demand_and_target_means();
    summary["demand_mb_mean"] = json!(demand.round());
    summary["target_mb_mean"] = json!(target.round());
    // Its rounds over the slice's first trace minutes (when, the demand it took, the target).
    let early: Vec<(f64, u64, u64)> = sim
        .counts
        .rounds
        .iter()
        .take_while(|r| r.0 < scale.minute * EARLY_MINUTES)
        .map(|&(at, demand, target)| ((at.as_secs_f64() * 1000.0).round() / 1000.0, demand, target))
        .collect();
    summary["first_rounds"] = json!(early);
    summary["manager_by_minute"] = json!(sim.manager_by_minute());
    summary["refused_by_minute"] = by_minute(&sim.counts.refused_at, scale.minute);
    let mut waited: Vec<Duration> = sim.counts.waits_us.iter().map(|&us| Duration::from_micros(us)).collect();
    summary["waits_ms"] = quantiles_ms(&mut waited);
    let waits = &sim.counts.room_waits;
    summary["room_waits"] = json!(waits.len());
    summary["room_wait_seconds"] = json!(waits.iter().map(Duration::as_secs_f64).sum::<f64>());
    summary["delayed_by_minute"] = by_minute(&sim.counts.delayed_at, scale.minute);
    summary
}

/// The 50th, 90th, 95th and 99th percentiles of `waits`, in milliseconds to a tenth:
/// `{"p50": 0.4, ...}` (all 0 when there are none).
pub fn quantiles_ms(waits: &mut [Duration]) -> Value {
    waits.sort_unstable();
    let at = |p: f64| match waits.len() {
        0 => 0.0,
        n => {
            let i = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
            (waits[i].as_secs_f64() * 10_000.0).round() / 10.0
        }
    };
    json!({ "p50": at(0.5), "p90": at(0.9), "p95": at(0.95), "p99": at(0.99) })
}

/// How many of `times` fall in each minute (of the trace, `minute` long), the minutes with
/// none left out: `{"118": 3, ...}`. Where a replay's two sides part, by minute.
pub fn by_minute(times: &[Duration], minute: Duration) -> Value {
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    for t in times {
        *counts.entry((t.as_micros() / minute.as_micros().max(1)) as u64).or_default() += 1;
    }
    json!(counts)
}

/// The trace minutes a replay's side by side shows the manager's rounds of.
pub const EARLY_MINUTES: u32 = 5;

/// One of `sample` drawn at random, or `otherwise` when it is empty: a latency as measured
/// (`invoker replay`), else the scenario's figure.
fn drawn(rng: &mut Rng, sample: &[Duration], otherwise: Duration) -> Duration {
    match sample.len() {
        0 => otherwise,
        n => sample[rng.between(0, n as u64 - 1) as usize],
    }
}

/// The control plane a managed fleet grows on.
#[derive(Clone, Copy, Debug)]
struct PlaneModel {
    /// How long a new invoker takes to come up.
    provision: Duration,
    standby: Option<Standby>,
    drain_order: DrainOrder,
}

impl PlaneModel {
    /// How long the group waits for an invoker it asks for while a standby one is there: what
    /// its predictor and its hold are built for.
    fn lead(&self) -> Duration {
        self.standby.map_or(self.provision, |s| s.resize_latency)
    }
}

/// The plane's standby pods: those up and those coming, both held (their request) from the
/// moment they are asked for, integrated as MB·µs.
struct StandbyPods {
    spec: Standby,
    ready: u32,
    coming: u32,
    since: Duration,
    held_mb_us: u128,
}

impl StandbyPods {
    fn new(spec: Standby) -> Self {
        StandbyPods { spec, ready: 0, coming: 0, since: Duration::ZERO, held_mb_us: 0 }
    }

    /// Adds what the pods held since the last change, before one.
    fn account(&mut self, now: Duration) {
        self.held_mb_us = self.mb_us(now);
        self.since = now;
    }

    /// What they held up to `until`.
    fn mb_us(&self, until: Duration) -> u128 {
        let pods = u128::from(self.ready + self.coming);
        self.held_mb_us + pods * u128::from(self.spec.memory_mb) * until.saturating_sub(self.since).as_micros()
    }
}

/// How a run sizes its fleet.
#[derive(Clone, Copy, Debug)]
enum Sizing {
    Fixed(u32),
    /// A predictor, and the group's headroom (MB).
    Managed(PredictorKind, u64),
}

/// The whole comparison: the trace's profile, then per control plane one entry per policy.
pub fn compare(scenario: &Scenario, fleet: &Fleet, host: &dyn Host) -> Result<Value, ScenarioError> {
    let (calls, _) = workload::calls(&scenario.workload, scenario.seed, host)?;
    let minutes = calls.last().map_or(0, |c| c.at.as_secs() / 60 + 1) as usize;
    let profile = DemandProfile::of(&calls, minutes);
    let invoker_mb = fleet.group.invoker_memory_mb;
    let oracle_invokers = profile.oracle_invokers(invoker_mb);
    let oracle_seconds: u64 = oracle_invokers.iter().map(|&n| u64::from(n) * 60).sum();
    let floors = Floors::of(&calls, Duration::from_secs(minutes as u64 * 60), invoker_mb);
    let bounds = Bounds { oracle_seconds, floors };
    let floors = &bounds.floors;
    let mut fixed = BTreeMap::new();
    // Sized for the peak's calls as they pack, not only its megabytes (which hold fewer).
    let peak = profile.fixed_for_peak(invoker_mb).max(floors.packing_max as u32);
    for (name, n) in [("fixed-peak", peak), ("fixed-mean", profile.fixed_for_mean(invoker_mb))] {
        let plane = PlaneModel { provision: Duration::ZERO, standby: None, drain_order: DrainOrder::LeastBusy };
        fixed.insert(name, run(scenario, fleet, &calls, minutes, Sizing::Fixed(n), plane, host));
    }
    let mut planes = serde_json::Map::new();
    for plane in &fleet.planes {
        let mut section = serde_json::Map::new();
        let mut oracle = json!({
            "invoker_seconds": oracle_seconds,
            "invokers_max": oracle_invokers.iter().max().copied().unwrap_or(0),
        });
        bounds.compare(&mut oracle, oracle_seconds as f64);
        section.insert("oracle".into(), oracle);
        let mut packing = json!({
            "invoker_seconds": floors.packing_seconds.round(),
            "invokers_max": floors.packing_max,
        });
        bounds.compare(&mut packing, floors.packing_seconds);
        section.insert("packing_floor".into(), packing);
        let mut memory = json!({ "invoker_seconds": floors.memory_seconds.round() });
        bounds.compare(&mut memory, floors.memory_seconds);
        section.insert("memory_floor".into(), memory);
        let mut first_fit = json!({
            "invoker_seconds": floors.first_fit_seconds.round(),
            "invokers_max": floors.first_fit_max,
        });
        bounds.compare(&mut first_fit, floors.first_fit_seconds);
        section.insert("first_fit_ideal".into(), first_fit);
        // What no fleet that delays no call can beat on this plane, knowing every call to come.
        let ahead = floors.ahead(plane.provision_latency);
        for (name, seconds) in
            [("memory_floor_ahead", ahead.memory_seconds), ("first_fit_ahead", ahead.first_fit_seconds)]
        {
            let mut entry = json!({ "invoker_seconds": seconds.round() });
            bounds.compare(&mut entry, seconds);
            section.insert(name.into(), entry);
        }
        let vs_ahead = |seconds: f64| (seconds / ahead.memory_seconds.max(1.0) * 100.0).round() / 100.0;
        section.insert("count_oracle".into(), counted(&calls, &bounds, fleet, plane, scenario, minutes));
        for (name, result) in &fixed {
            section.insert((*name).into(), result.summary(&bounds));
        }
        // `windowed` at each headroom: (invoker-seconds, calls delayed, cold starts).
        let mut windowed: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
        let mut managed = Vec::new();
        for &kind in &fleet.predictors {
            for &headroom in &fleet.headrooms_mb() {
                let sizing = Sizing::Managed(kind, headroom);
                let model = PlaneModel {
                    provision: plane.provision_latency,
                    standby: plane.standby,
                    drain_order: plane.drain_order,
                };
                let result = run(scenario, fleet, &calls, minutes, sizing, model, host);
                if kind == PredictorKind::Windowed {
                    let c = &result.counts;
                    windowed.insert(headroom, (result.invoker_seconds(), c.delayed, c.cold));
                }
                let name = match headroom {
                    h if h == fleet.group.headroom_mb => kind.name().to_string(),
                    h => format!("{}+{h}MB", kind.name()),
                };
                let mut summary = result.summary(&bounds);
                summary["vs_memory_floor_ahead"] = json!(vs_ahead(result.invoker_seconds_exact()));
                section.insert(name.clone(), summary);
                managed.push((kind, headroom, name));
            }
        }
        for (kind, headroom, name) in managed {
            let entry = section.get_mut(&name).expect("inserted above");
            let ratio = entry["vs_packing_floor"].as_f64().unwrap_or(f64::MAX);
            let delayed_pct = entry["delayed_over_1s_pct"].as_f64().unwrap_or(100.0);
            let clean = entry["refused"] == 0 && entry["lost"] == 0 && entry["killed_at_drain_deadline"] == 0;
            // Issue 47's goal for the default predictor.
            entry["meets_goal"] = json!(ratio <= 1.4 && delayed_pct <= 0.5 && clean);
            if let Some(&(seconds, delayed, cold)) = windowed.get(&headroom).filter(|_| kind != PredictorKind::Windowed)
            {
                let mine = |key: &str| entry[key].as_u64().unwrap_or(u64::MAX);
                let (s, d, c) = (mine("invoker_seconds"), mine("delayed_over_1s"), mine("cold_starts"));
                let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
                entry["vs_windowed"] = json!({
                    "invoker_seconds": round3(s as f64 / seconds.max(1) as f64),
                    "delayed_over_1s": round3(d as f64 / delayed.max(1) as f64),
                    "cold_starts": round3(c as f64 / cold.max(1) as f64),
                });
                // Better on cost, delays and cold starts together: none worse, one better.
                let none_worse = s <= seconds && d <= delayed && c <= cold;
                entry["beats_windowed"] = json!(none_worse && (s, d, c) != (seconds, delayed, cold));
            }
        }
        let name = match plane.standby {
            None => format!("{} ({:?})", plane.name, plane.provision_latency),
            Some(s) => format!(
                "{} ({:?}, {} standby of {} MB resized in {:?})",
                plane.name, plane.provision_latency, s.pods, s.memory_mb, s.resize_latency
            ),
        };
        planes.insert(name, Value::Object(section));
    }
    Ok(json!({
        "scenario": scenario.name,
        "trace": {
            "minutes": minutes,
            "activations": calls.len(),
            "mean_mb": profile.mean_mb.round(),
            "peak_mb": profile.peak_mb_per_minute.iter().max().copied().unwrap_or(0),
        },
        "invoker_memory_mb": invoker_mb,
        "planes": planes,
    }))
}

/// The count oracle's cheapest confidence that delays at most [`COUNT_ORACLE_DELAYED_PCT`] of
/// the calls on `plane` (the fewest delays when none does), with its cost against the bounds.
fn counted(
    calls: &[Call],
    bounds: &Bounds,
    fleet: &Fleet,
    plane: &super::scenario::Plane,
    scenario: &Scenario,
    minutes: usize,
) -> Value {
    let zs: Vec<f64> = (0..=50).map(|i| f64::from(i) * 0.1).collect();
    let grace = DELAYED.saturating_sub(scenario.cluster.start_latency);
    let horizon = Duration::from_secs(minutes as u64 * 60);
    let runs = count_oracle::sweep(
        calls,
        horizon,
        fleet.group.invoker_memory_mb,
        plane.provision_latency,
        grace,
        Duration::from_secs(60),
        &zs,
    );
    let pct = |delayed: u64| delayed as f64 * 100.0 / calls.len().max(1) as f64;
    let within = runs.iter().filter(|r| pct(r.delayed) <= COUNT_ORACLE_DELAYED_PCT);
    let best = within
        .min_by(|a, b| a.invoker_seconds.total_cmp(&b.invoker_seconds))
        .or_else(|| runs.iter().min_by_key(|r| r.delayed))
        .copied()
        .unwrap_or(count_oracle::CountOracle { z: 0.0, invoker_seconds: 0.0, delayed: 0 });
    let mut entry = json!({
        "z": (best.z * 10.0).round() / 10.0,
        "invoker_seconds": best.invoker_seconds.round(),
        "delayed_over_1s": best.delayed,
        "delayed_over_1s_pct": (pct(best.delayed) * 100.0).round() / 100.0,
    });
    bounds.compare(&mut entry, best.invoker_seconds);
    entry
}

/// The delay goal the count oracle is sized for (issue 61's, in % of calls).
const COUNT_ORACLE_DELAYED_PCT: f64 = 0.5;

/// What every fleet's invoker-seconds are divided by: the per-minute oracle, and the
/// continuous packing and memory floors.
struct Bounds {
    oracle_seconds: u64,
    floors: Floors,
}

impl Bounds {
    /// `entry`'s cost against each bound (`vs_oracle`, `vs_packing_floor`, `vs_memory_floor`).
    fn compare(&self, entry: &mut Value, invoker_seconds: f64) {
        let ratio = |floor: f64| (invoker_seconds / floor.max(1.0) * 100.0).round() / 100.0;
        entry["vs_oracle"] = json!(ratio(self.oracle_seconds as f64));
        entry["vs_packing_floor"] = json!(ratio(self.floors.packing_seconds));
        entry["vs_memory_floor"] = json!(ratio(self.floors.memory_seconds));
    }
}

fn run<'a>(
    scenario: &'a Scenario,
    fleet: &'a Fleet,
    calls: &'a [Call],
    minutes: usize,
    sizing: Sizing,
    plane: PlaneModel,
    host: &dyn Host,
) -> FleetSim<'a> {
    let scale = Scale { delayed_over: DELAYED, reversal: REVERSAL, minute: Duration::from_secs(60) };
    let horizon = Duration::from_secs(minutes as u64 * 60);
    let mut sim = prepared(scenario, fleet, calls, horizon, sizing, plane, scale);
    sim.run_timed(host);
    sim
}

/// A fleet ready to run: its group core and predictor, and the fixed invokers up.
fn prepared<'a>(
    scenario: &'a Scenario,
    fleet: &'a Fleet,
    calls: &'a [Call],
    horizon: Duration,
    sizing: Sizing,
    plane: PlaneModel,
    scale: Scale,
) -> FleetSim<'a> {
    let lead = plane.lead();
    let group = match sizing {
        Sizing::Fixed(_) => None,
        Sizing::Managed(kind, headroom_mb) => {
            let newest_only = plane.drain_order == DrainOrder::Newest;
            let drain_order = crate::capacity::drain_order(lead, newest_only);
            let spec =
                GroupSpec { headroom_mb, drain_order, ..fleet.group.spec("default", lead, plane.standby.is_some()) };
            Some((GroupCore::new(spec), kind.build(lead)))
        }
    };
    let standby = match sizing {
        Sizing::Managed(..) => plane.standby.map(StandbyPods::new),
        Sizing::Fixed(_) => None,
    };
    let mut sim = FleetSim {
        scenario,
        fleet,
        calls,
        latency: plane.provision,
        latency_sample: Vec::new(),
        standby,
        scale,
        horizon,
        now: Duration::ZERO,
        timeline: Timeline::default(),
        invokers: Vec::new(),
        by_id: HashMap::new(),
        jobs: HashMap::new(),
        waiting: BTreeMap::new(),
        ledger: Ledger::default(),
        group,
        last_round: None,
        next_check: None,
        rng: Rng::new(scenario.seed),
        arrived: 0,
        counts: Counts::default(),
    };
    if let Sizing::Fixed(n) = sizing {
        for i in 0..n {
            let index = sim.add_invoker(format!("fixed-{i}"));
            sim.up(index);
        }
    }
    sim
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Arrive(usize),
    Ready(usize, ContainerId),
    Done(usize, ContainerId, JobId),
    Removed(usize, ContainerId),
    /// A provisioned invoker registered.
    Up(usize),
    /// A standby pod came up.
    StandbyUp,
    /// The manager's look at the demand (a round when a tick passed or a burst waits).
    Check,
    Report,
    PoolTick,
    GiveUp(JobId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Provisioning,
    Active,
    Draining,
    Removed,
}

struct SimContainer {
    action: Option<u32>,
    memory_mb: u64,
    ran: bool,
    /// In the node's stats: from its readiness on, as a one-host factory counts it
    /// (`invoker_factory::one_host`).
    shown: bool,
}

struct SimInvoker {
    id: String,
    phase: Phase,
    core: PoolCore,
    node: NodeId,
    /// Every container's memory, starting ones included: what the node holds.
    used_mb: u64,
    /// The ready containers' memory: what its stats show.
    shown_mb: u64,
    containers: HashMap<ContainerId, SimContainer>,
    /// Containers per action, and this scheduler's calls per action there (placement's view).
    containers_of: HashMap<u32, u32>,
    running_of: HashMap<u32, u32>,
    jobs: u32,
    asked_at: Duration,
    removed_at: Option<Duration>,
    /// The manager has been told it is gone.
    forgotten: bool,
}

struct FleetJob {
    call: usize,
    arrived: Duration,
    /// Its place in the scheduler's queue (arrival order) while it waits.
    seq: u64,
    on: Option<usize>,
    tried: BTreeSet<String>,
    /// Past `wait_for_room` without room: kept in the durable queue (its caller answered 202),
    /// waiting on until it is placed or its maximum event age passes.
    kept: bool,
}

/// The scheduler's demand ledger, and what it last reported: as the scheduler's, the memory
/// and the calls by size, whose packing the manager takes as the demand.
#[derive(Default)]
struct Ledger {
    in_flight_mb: u64,
    waiting_mb: u64,
    refused_mb: u64,
    calls: CallTally,
    reported_mb: u64,
    last_report: Option<Duration>,
    report_due: bool,
}

#[derive(Default)]
struct Counts {
    completed: u64,
    refused: u64,
    /// Calls past `wait_for_room` kept in the durable queue rather than refused, and why each
    /// found no room ([`FleetSim::why_no_room`]).
    kept: u64,
    kept_why: BTreeMap<&'static str, u64>,
    killed: u64,
    failed: u64,
    delayed: u64,
    cold: u64,
    waits_us: Vec<u64>,
    /// When each refused call and each delayed one arrived.
    refused_at: Vec<Duration>,
    /// How long each call that found no invoker with room waited for one (placed or refused
    /// at `wait_for_room`), as the scheduler's `scheduler_room_wait_seconds` counts.
    room_waits: Vec<Duration>,
    delayed_at: Vec<Duration>,
    provisioned: u64,
    drained: u64,
    reactivated: u64,
    removed: u64,
    reversals: u64,
    /// When the group last grew (an invoker asked for or taken back), and last drained one.
    last_grown: Option<Duration>,
    last_drained: Option<Duration>,
    /// Memory held by idle containers, integrated (MB·µs), sampled every pool tick.
    idle_mb_us: u128,
    invokers_max: usize,
    wall: Duration,
    /// Each manager's round: when, the demand it took (MB) and the target it set.
    rounds: Vec<(Duration, u64, u64)>,
}

struct FleetSim<'a> {
    scenario: &'a Scenario,
    fleet: &'a Fleet,
    calls: &'a [Call],
    latency: Duration,
    /// Invoker starts as measured (`invoker replay`): each drawn from these when given.
    latency_sample: Vec<Duration>,
    standby: Option<StandbyPods>,
    scale: Scale,
    horizon: Duration,
    now: Duration,
    timeline: Timeline<Ev>,
    invokers: Vec<SimInvoker>,
    /// The latest invoker of each name (a name is reused once its invoker is gone).
    by_id: HashMap<String, usize>,
    jobs: HashMap<JobId, FleetJob>,
    /// Calls waiting for room, in arrival order.
    waiting: BTreeMap<u64, JobId>,
    ledger: Ledger,
    group: Option<(GroupCore, AnyPredictor)>,
    last_round: Option<Duration>,
    /// When the manager looks next (an earlier look it moved is stale).
    next_check: Option<Duration>,
    rng: Rng,
    arrived: usize,
    counts: Counts,
}

impl FleetSim<'_> {
    fn at(&mut self, when: Duration, ev: Ev) {
        self.timeline.at(when, ev);
    }

    /// Runs to the end, timed by the host's stopwatch (`wall_ms`).
    fn run_timed(&mut self, host: &dyn Host) {
        let began = host.elapsed();
        self.run();
        self.counts.wall = host.elapsed().saturating_sub(began);
    }

    fn run(&mut self) {
        for (i, call) in self.calls.iter().enumerate() {
            self.timeline.at(call.at, Ev::Arrive(i));
        }
        self.at(Duration::ZERO, Ev::PoolTick);
        self.replenish_standby();
        if self.group.is_some() {
            self.next_check = Some(Duration::ZERO);
            self.at(Duration::ZERO, Ev::Check);
        }
        while let Some((when, ev)) = self.timeline.next() {
            self.now = when;
            match ev {
                Ev::Arrive(i) => self.arrive(i),
                Ev::Ready(i, c) => self.ready(i, c),
                Ev::Done(i, c, job) => self.done(i, c, job),
                Ev::Removed(i, c) => self.container_removed(i, c),
                Ev::Up(i) => self.up(i),
                Ev::StandbyUp => {
                    if let Some(s) = self.standby.as_mut() {
                        s.account(self.now);
                        s.coming -= 1;
                        s.ready += 1;
                    }
                }
                // Stale: a report moved the manager's next look.
                Ev::Check if self.next_check != Some(self.now) => {}
                Ev::Check => self.check(),
                Ev::Report => {
                    self.report();
                    if self.bursting() {
                        self.check();
                    }
                }
                Ev::PoolTick => {
                    let tick = self.scenario.pool.tick.as_micros();
                    for i in 0..self.invokers.len() {
                        if matches!(self.invokers[i].phase, Phase::Active | Phase::Draining) {
                            let idle: u64 = self.invokers[i].core.nodes(self.now).iter().map(|n| n.idle_mb).sum();
                            self.counts.idle_mb_us += u128::from(idle) * tick;
                            self.publish_stats(i);
                            self.apply(i, Event::Tick);
                        }
                    }
                    if !self.finished() {
                        self.at(self.now + self.scenario.pool.tick, Ev::PoolTick);
                    }
                }
                Ev::GiveUp(job) => self.give_up(job),
            }
        }
    }

    fn finished(&self) -> bool {
        self.arrived == self.calls.len() && self.jobs.is_empty()
    }

    fn add_invoker(&mut self, id: String) -> usize {
        let config = CoreConfig { pause_grace: self.scenario.cluster.pause_grace, ..self.scenario.pool.clone() };
        let index = self.invokers.len();
        self.invokers.push(SimInvoker {
            node: NodeId::new(&format!("{id}/node")),
            id: id.clone(),
            phase: Phase::Provisioning,
            core: PoolCore::new(config),
            used_mb: 0,
            shown_mb: 0,
            containers: HashMap::new(),
            containers_of: HashMap::new(),
            running_of: HashMap::new(),
            jobs: 0,
            asked_at: self.now,
            removed_at: None,
            forgotten: false,
        });
        self.by_id.insert(id, index);
        let live = self.invokers.iter().filter(|i| i.phase != Phase::Removed).count();
        self.counts.invokers_max = self.counts.invokers_max.max(live);
        index
    }

    fn up(&mut self, i: usize) {
        if self.invokers[i].phase != Phase::Provisioning {
            return;
        }
        self.invokers[i].phase = Phase::Active;
        self.publish_stats(i);
        self.place_waiting();
    }

    fn publish_stats(&mut self, i: usize) {
        let inv = &self.invokers[i];
        let capacity_mb = self.scenario.cluster.node_memory_mb;
        let update = NodeStatsUpdate {
            node: inv.node.clone(),
            capacity_mb,
            free_mb: capacity_mb.saturating_sub(inv.shown_mb),
            observed_at: self.now,
        };
        self.apply(i, Event::NodeStats(update));
    }

    // --- the scheduler -------------------------------------------------------------------

    fn arrive(&mut self, index: usize) {
        self.arrived += 1;
        let id = JobId(index as u64);
        let job = FleetJob {
            call: index,
            arrived: self.now,
            seq: index as u64,
            on: None,
            tried: BTreeSet::new(),
            kept: false,
        };
        self.jobs.insert(id, job);
        if !self.try_place(id) {
            self.start_waiting(id);
        }
        self.ledger_changed();
    }

    /// Sends the call to an invoker with room, if one has it.
    fn try_place(&mut self, id: JobId) -> bool {
        let Some(job) = self.jobs.get(&id) else { return true };
        let call = self.calls[job.call];
        let views: Vec<InvokerView> = self
            .invokers
            .iter()
            .filter(|inv| inv.phase == Phase::Active)
            .map(|inv| {
                let nodes = inv.core.nodes(self.now);
                let room = nodes.iter().map(|n| n.launchable_mb + n.idle_mb).max().unwrap_or(0);
                InvokerView {
                    id: inv.id.clone(),
                    tags: Vec::new(),
                    healthy: true,
                    launchable_mb: room,
                    free_mb: nodes.iter().map(|n| n.launchable_mb).max().unwrap_or(0),
                    warm: inv.containers_of.get(&call.action).copied().unwrap_or(0),
                    in_flight: inv.running_of.get(&call.action).copied().unwrap_or(0),
                }
            })
            .collect();
        let needs = ActionNeeds { memory_mb: u64::from(call.memory_mb), ..ActionNeeds::default() };
        // The scheduler's own default split: the trace's actions are all managed, and the
        // fleet must not pay for a part they cannot use.
        let config = PlacementConfig::default();
        let rng = &mut self.rng;
        let Ok(placement) = place(&views, &needs, &config, &job.tried, &mut |n| rng.between(0, n as u64 - 1) as usize)
        else {
            return false;
        };
        let i = self.by_id[&placement.invoker];
        let inv = &mut self.invokers[i];
        inv.jobs += 1;
        *inv.running_of.entry(call.action).or_insert(0) += 1;
        self.ledger.in_flight_mb += u64::from(call.memory_mb);
        self.ledger.calls.came(u64::from(call.memory_mb));
        self.jobs.get_mut(&id).expect("checked above").on = Some(i);
        let job = Job {
            id,
            key: KeyId(call.action),
            memory_mb: call.memory_mb,
            concurrency: 1,
            deadline: self.now + self.scenario.pool.wait_deadline,
            stem: None,
            idle_timeout: None,
            patient: false,
            max_running: None,
            tenant: crate::pool::TenantId::default(),
        };
        self.apply(i, Event::Arrived(job));
        true
    }

    fn start_waiting(&mut self, id: JobId) {
        let job = &self.jobs[&id];
        let mb = u64::from(self.calls[job.call].memory_mb);
        self.waiting.insert(job.seq, id);
        self.ledger.waiting_mb += mb;
        self.ledger.calls.came(mb);
        self.at(self.now + self.fleet.wait_for_room, Ev::GiveUp(id));
    }

    /// Room may have appeared: the waiting calls go, in order, while they find room.
    fn place_waiting(&mut self) {
        while let Some((&seq, &id)) = self.waiting.first_key_value() {
            if !self.try_place(id) {
                break;
            }
            self.waiting.remove(&seq);
            self.counts.room_waits.push(self.now - self.jobs[&id].arrived);
            let mb = u64::from(self.calls[self.jobs[&id].call].memory_mb);
            self.ledger.waiting_mb -= mb;
            self.ledger.calls.went(mb);
            self.ledger_changed();
        }
    }

    /// A call waited `wait_for_room` without room. As the scheduler does, it is kept in the
    /// durable queue (waiting on, its demand still reported) unless no invoker could ever hold
    /// it (larger than one) or it is kept already and its maximum event age passed: refused.
    fn give_up(&mut self, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id).filter(|j| j.on.is_none()) else { return };
        if !self.waiting.contains_key(&job.seq) {
            return;
        }
        let mb = u64::from(self.calls[job.call].memory_mb);
        if !job.kept && mb <= self.fleet.group.invoker_memory_mb {
            job.kept = true;
            let expires = job.arrived + KEPT_FOR;
            self.counts.kept += 1;
            let why = self.why_no_room();
            *self.counts.kept_why.entry(why).or_insert(0) += 1;
            self.at(expires, Ev::GiveUp(id));
            return;
        }
        self.waiting.remove(&job.seq);
        let arrived = job.arrived;
        self.jobs.remove(&id);
        self.ledger.waiting_mb -= mb;
        self.ledger.refused_mb += mb;
        self.ledger.calls.went(mb);
        self.ledger.calls.refused(mb);
        self.counts.refused += 1;
        self.counts.refused_at.push(arrived);
        self.counts.room_waits.push(self.now - arrived);
        self.ledger_changed();
    }

    /// Why a call found no room for all of `wait_for_room`, as the fleet stands when it passed
    /// (a refusal before calls past it were kept): the group at its `max`; an invoker asked for
    /// and not yet up (the plane's lead); the demand reported past what the group has, and no
    /// invoker asked for yet (the manager's pace); or the manager counting the memory enough
    /// while no invoker has room for the call (packing, draining invokers, idle containers).
    fn why_no_room(&self) -> &'static str {
        let Some((core, _)) = &self.group else { return "fixed_fleet" };
        if core.have() >= self.fleet.group.max {
            "at_max"
        } else if self.invokers.iter().any(|inv| inv.phase == Phase::Provisioning) {
            "invoker_starting"
        } else if self.bursting() {
            "not_asked_yet"
        } else {
            "demand_counted_covered"
        }
    }

    /// The ledger changed: a report goes out as soon as the last one allows.
    fn ledger_changed(&mut self) {
        if self.group.is_none() || self.ledger.report_due {
            return;
        }
        self.ledger.report_due = true;
        let when = self.ledger.last_report.map_or(self.now, |last| (last + REPORT_EVERY).max(self.now));
        self.at(when, Ev::Report);
    }

    fn report(&mut self) {
        let invoker_mb = self.fleet.group.invoker_memory_mb;
        let l = &mut self.ledger;
        l.reported_mb = packed_demand_mb(l.in_flight_mb + l.waiting_mb + l.refused_mb, &l.calls.report(), invoker_mb);
        l.refused_mb = 0;
        l.last_report = Some(self.now);
        l.report_due = false;
    }

    /// The call leaves invoker `i` unrun (refused there) or done.
    fn leave(&mut self, i: usize, id: JobId) -> Option<FleetJob> {
        let mut job = self.jobs.remove(&id)?;
        let call = self.calls[job.call];
        let inv = &mut self.invokers[i];
        inv.jobs -= 1;
        if let Some(n) = inv.running_of.get_mut(&call.action) {
            *n -= 1;
        }
        self.ledger.in_flight_mb -= u64::from(call.memory_mb);
        self.ledger.calls.went(u64::from(call.memory_mb));
        job.on = None;
        self.ledger_changed();
        Some(job)
    }

    // --- the invokers ----------------------------------------------------------------------

    fn apply(&mut self, i: usize, event: Event) {
        let effects = self.invokers[i].core.handle(event, self.now);
        for effect in effects {
            match effect {
                Effect::Create { container, owner, memory_mb, .. } => self.create(i, container, owner, memory_mb),
                Effect::Dispatch { job, container } => self.dispatch(i, job, container),
                Effect::Pause { .. } | Effect::Resume { .. } => {}
                Effect::Remove { container } => {
                    self.at(self.now + self.scenario.cluster.remove_latency, Ev::Removed(i, container))
                }
                Effect::Reject { job, reason } => {
                    let Some(mut left) = self.leave(i, job) else { continue };
                    if let RejectReason::NeverFits { .. } = reason {
                        self.counts.failed += 1;
                        continue;
                    }
                    left.tried.insert(self.invokers[i].id.clone());
                    self.jobs.insert(job, left);
                    if !self.try_place(job) {
                        self.start_waiting(job);
                    }
                }
            }
        }
    }

    fn create(&mut self, i: usize, container: ContainerId, owner: Owner, memory_mb: u32) {
        let capacity = self.scenario.cluster.node_memory_mb;
        let inv = &mut self.invokers[i];
        let memory_mb = u64::from(memory_mb);
        if inv.used_mb + memory_mb > capacity {
            let refused = Event::Started { container, failure: Some(CreateFailure::Refused), at: self.now };
            self.apply(i, refused);
            return;
        }
        inv.used_mb += memory_mb;
        let action = match owner {
            Owner::Key(KeyId(action)) => Some(action),
            Owner::Stem(_) => None,
        };
        if let Some(action) = action {
            *inv.containers_of.entry(action).or_insert(0) += 1;
        }
        inv.containers.insert(container, SimContainer { action, memory_mb, ran: false, shown: false });
        let cluster = &self.scenario.cluster;
        let latency = drawn(&mut self.rng, &cluster.start_latency_sample, cluster.start_latency);
        self.at(self.now + latency, Ev::Ready(i, container));
    }

    /// The factory counts the container and publishes, then reports it ready.
    fn ready(&mut self, i: usize, container: ContainerId) {
        let inv = &mut self.invokers[i];
        if inv.phase == Phase::Removed {
            return;
        }
        if let Some(c) = inv.containers.get_mut(&container) {
            c.shown = true;
            inv.shown_mb += c.memory_mb;
        }
        self.publish_stats(i);
        self.apply(i, Event::Started { container, failure: None, at: self.now });
    }

    fn dispatch(&mut self, i: usize, id: JobId, container: ContainerId) {
        let Some(job) = self.jobs.get(&id) else { return };
        let call = self.calls[job.call];
        let waited = self.now - job.arrived;
        self.counts.waits_us.push(waited.as_micros() as u64);
        if waited > self.scale.delayed_over {
            self.counts.delayed += 1;
            self.counts.delayed_at.push(job.arrived);
        }
        if let Some(c) = self.invokers[i].containers.get_mut(&container) {
            if !c.ran {
                c.ran = true;
                self.counts.cold += 1;
            }
        }
        self.at(self.now + call.run, Ev::Done(i, container, id));
    }

    fn done(&mut self, i: usize, container: ContainerId, id: JobId) {
        if self.invokers[i].phase == Phase::Removed || self.leave(i, id).is_none() {
            return;
        }
        self.counts.completed += 1;
        self.apply(i, Event::Finished { container, job: id, reusable: true });
        self.place_waiting();
    }

    fn container_removed(&mut self, i: usize, container: ContainerId) {
        let inv = &mut self.invokers[i];
        if inv.phase == Phase::Removed {
            return;
        }
        if let Some(c) = inv.containers.remove(&container) {
            inv.used_mb -= c.memory_mb;
            if c.shown {
                inv.shown_mb -= c.memory_mb;
            }
            if let Some(n) = c.action.and_then(|a| inv.containers_of.get_mut(&a)) {
                *n -= 1;
            }
        }
        self.apply(i, Event::Removed(container));
        // The memory it held is free at once, as a one-host factory publishes its node's
        // stats whenever a container goes (`invoker_factory::one_host`), not at the next tick.
        self.publish_stats(i);
        self.place_waiting();
    }

    // --- the capacity manager ------------------------------------------------------------

    /// The manager wakes: a round when the tick is due or a burst waits; its next look at the
    /// next tick, or sooner while the burst lasts.
    fn check(&mut self) {
        if self.bursting() || self.last_round.is_none_or(|at| self.now >= at + self.fleet.tick) {
            self.round();
        }
        if self.finished() {
            return;
        }
        let mut next = self.last_round.map_or(self.now, |at| at + self.fleet.tick).max(self.now);
        if self.bursting() {
            next = next.min(self.now + BURST_RECHECK);
        }
        self.next_check = Some(next);
        self.at(next, Ev::Check);
    }

    /// Whether the reported demand is past the memory of what the group has or asked for.
    fn bursting(&self) -> bool {
        self.group.as_ref().is_some_and(|(core, _)| {
            self.ledger.reported_mb > u64::from(core.have()) * self.fleet.group.invoker_memory_mb
        })
    }

    fn round(&mut self) {
        self.last_round = Some(self.now);
        let Some((mut core, mut predictor)) = self.group.take() else { return };
        let now = self.now;
        let mut decisions = Vec::new();
        for inv in self.invokers.iter_mut().filter(|inv| !inv.forgotten) {
            let id = inv.id.clone();
            match inv.phase {
                Phase::Provisioning | Phase::Removed => {}
                Phase::Active => {
                    decisions.extend(core.handle(GroupEvent::Up { id: id.clone() }, now));
                    // What its registration says: its nodes' memory neither free nor idle.
                    let nodes = inv.core.nodes(now);
                    let busy_mb = nodes.iter().map(|n| n.capacity_mb.saturating_sub(n.free_mb + n.idle_mb)).sum();
                    decisions.extend(core.handle(GroupEvent::Busy { id: id.clone(), busy_mb }, now));
                }
                Phase::Draining if inv.jobs == 0 => {
                    decisions.extend(core.handle(GroupEvent::Drained { id: id.clone() }, now));
                }
                Phase::Draining => {}
            }
            // Who is gone is the core's rule, as for the manager: what the simulated invoker's
            // registration and process say of it.
            let removed = inv.phase == Phase::Removed;
            let seen = Sighting {
                registered: matches!(inv.phase, Phase::Active | Phase::Draining),
                running: Some(!removed),
                stopped: removed,
            };
            let state = core.members().find(|m| m.id == id).map(|m| m.state);
            match state {
                Some(state) if state.gone_when(seen) => {
                    inv.forgotten = true;
                    decisions.extend(core.handle(GroupEvent::Gone { id }, now));
                }
                None if removed => inv.forgotten = true,
                _ => {}
            }
        }
        let active_mb = u64::from(core.counts().active) * self.fleet.group.invoker_memory_mb;
        let target_mb = predictor.target_mb(now, self.ledger.reported_mb, active_mb);
        self.counts.rounds.push((now, self.ledger.reported_mb, target_mb));
        decisions.extend(core.handle(GroupEvent::Tick { target_mb }, now));
        self.group = Some((core, predictor));
        for decision in decisions {
            self.carry_out(decision.action);
        }
        self.place_waiting();
    }

    fn carry_out(&mut self, action: Action) {
        match action {
            Action::Provision { ids } => {
                for id in ids {
                    self.grew();
                    self.counts.provisioned += 1;
                    let i = self.add_invoker(id);
                    let latency = match self.standby.as_mut().filter(|s| s.ready > 0) {
                        Some(s) => {
                            s.account(self.now);
                            s.ready -= 1;
                            s.spec.resize_latency
                        }
                        None => drawn(&mut self.rng, &self.latency_sample, self.latency),
                    };
                    self.at(self.now + latency, Ev::Up(i));
                    self.replenish_standby();
                }
            }
            Action::Drain { id } => {
                let inv = &mut self.invokers[self.by_id[&id]];
                inv.phase = Phase::Draining;
                self.counts.drained += 1;
                if self.counts.last_grown.is_some_and(|t| self.now < t + self.scale.reversal) {
                    self.counts.reversals += 1;
                }
                self.counts.last_drained = Some(self.now);
            }
            Action::Reactivate { id } => {
                self.grew();
                let inv = &mut self.invokers[self.by_id[&id]];
                inv.phase = Phase::Active;
                self.counts.reactivated += 1;
            }
            Action::Remove { id } => {
                let i = self.by_id[&id];
                self.invokers[i].phase = Phase::Removed;
                self.invokers[i].removed_at = Some(self.now);
                self.counts.removed += 1;
                let killed: Vec<JobId> = self.jobs.iter().filter(|(_, j)| j.on == Some(i)).map(|(id, _)| *id).collect();
                for id in killed {
                    self.leave(i, id);
                    self.counts.killed += 1;
                }
            }
        }
    }

    /// New standby pods asked for until as many wait or come as the plane keeps.
    fn replenish_standby(&mut self) {
        let Some(s) = self.standby.as_mut() else { return };
        let mut asked = 0;
        while s.ready + s.coming < s.spec.pods {
            s.account(self.now);
            s.coming += 1;
            asked += 1;
        }
        for _ in 0..asked {
            self.at(self.now + self.latency, Ev::StandbyUp);
        }
    }

    /// The group grows by an invoker: a reversal when it drained one within [`REVERSAL`].
    fn grew(&mut self) {
        if self.counts.last_drained.is_some_and(|t| self.now < t + self.scale.reversal) {
            self.counts.reversals += 1;
        }
        self.counts.last_grown = Some(self.now);
    }

    // --- the summary -----------------------------------------------------------------------

    fn invoker_seconds(&self) -> u64 {
        self.invoker_seconds_exact() as u64
    }

    /// The invokers the group had (asked for and not yet removed), averaged over each minute of
    /// the trace up to the horizon, to one decimal.
    fn invokers_by_minute(&self) -> Vec<f64> {
        let minute = self.scale.minute.max(Duration::from_micros(1));
        let buckets = (self.horizon.as_micros() / minute.as_micros()).max(1) as usize;
        (0..buckets)
            .map(|b| {
                let (from, to) = (minute * b as u32, minute * (b as u32 + 1));
                let held: f64 = self
                    .invokers
                    .iter()
                    .map(|inv| {
                        let end = inv.removed_at.unwrap_or(self.horizon).min(to);
                        end.saturating_sub(inv.asked_at.max(from)).as_secs_f64()
                    })
                    .sum();
                (held / minute.as_secs_f64() * 10.0).round() / 10.0
            })
            .collect()
    }

    /// The manager's rounds, each as (from, until, demand, target): the demand it took and the
    /// target it set, held until the next round or the horizon.
    fn held_rounds(&self) -> impl Iterator<Item = (Duration, Duration, u64, u64)> + '_ {
        let rounds = &self.counts.rounds;
        rounds.iter().enumerate().map(|(i, &(at, demand, target))| {
            let until = rounds.get(i + 1).map_or(self.horizon, |r| r.0).min(self.horizon);
            (at, until, demand, target)
        })
    }

    /// The demand the manager's rounds took and the targets they set, each held until the
    /// next round, averaged over the horizon (MB).
    fn demand_and_target_means(&self) -> (f64, f64) {
        let (mut demand, mut target) = (0.0, 0.0);
        for (at, until, d, t) in self.held_rounds() {
            let held = until.saturating_sub(at).as_secs_f64();
            demand += d as f64 * held;
            target += t as f64 * held;
        }
        let span = self.horizon.as_secs_f64().max(1e-9);
        (demand / span, target / span)
    }

    /// The demand the manager's rounds took and the targets they set, each held until the
    /// next round, averaged over each minute of the trace up to the horizon (MB).
    fn manager_by_minute(&self) -> Vec<(u64, u64)> {
        let minute = self.scale.minute.max(Duration::from_micros(1));
        let buckets = (self.horizon.as_micros() / minute.as_micros()).max(1) as usize;
        let mut sums = vec![(0.0, 0.0); buckets];
        for (at, until, demand, target) in self.held_rounds() {
            let mut from = at;
            while from < until {
                let b = (from.as_micros() / minute.as_micros()) as usize;
                let end = (minute * (b as u32 + 1)).min(until);
                if let Some(bucket) = sums.get_mut(b) {
                    let held = (end - from).as_secs_f64();
                    bucket.0 += demand as f64 * held;
                    bucket.1 += target as f64 * held;
                }
                from = end;
            }
        }
        let span = minute.as_secs_f64();
        sums.into_iter().map(|(d, t)| ((d / span).round() as u64, (t / span).round() as u64)).collect()
    }

    /// Invoker-seconds up to the horizon, unrounded (a compressed replay's are few).
    fn invoker_seconds_exact(&self) -> f64 {
        let micros: u128 = self
            .invokers
            .iter()
            .map(|inv| {
                let end = inv.removed_at.unwrap_or(self.horizon).min(self.horizon);
                end.saturating_sub(inv.asked_at).as_micros()
            })
            .sum();
        let standby = self.standby.as_ref().map_or(0.0, |s| {
            let held = s.mb_us(self.horizon) as f64;
            held / self.fleet.group.invoker_memory_mb.max(1) as f64
        });
        (micros as f64 + standby) / 1e6
    }

    fn summary(&self, bounds: &Bounds) -> Value {
        let c = &self.counts;
        let mut waits = c.waits_us.clone();
        waits.sort_unstable();
        let pct = |p: f64| -> f64 {
            if waits.is_empty() {
                return 0.0;
            }
            let i = ((waits.len() as f64 * p).ceil() as usize).clamp(1, waits.len()) - 1;
            (waits[i] as f64 / 100.0).round() / 10.0
        };
        let activations = self.calls.len() as u64;
        let lost = activations - c.completed - c.refused - c.killed - c.failed;
        let seconds = self.invoker_seconds();
        let round2 = |x: f64| (x * 100.0).round() / 100.0;
        let mut entry = json!({
            "invoker_seconds": seconds,
            "invokers_max": c.invokers_max,
            "completed": c.completed,
            "refused": c.refused,
            "kept_past_wait": c.kept,
            "kept_why": c.kept_why,
            "killed_at_drain_deadline": c.killed,
            "failed": c.failed,
            "lost": lost,
            "delayed_over_1s": c.delayed,
            "delayed_over_1s_pct": round2(c.delayed as f64 / activations.max(1) as f64 * 100.0),
            "wait_p50_ms": pct(0.5),
            "wait_p99_ms": pct(0.99),
            "cold_starts": c.cold,
            // What the cold starts cost the calls that waited for them.
            "cold_start_seconds": (c.cold as f64 * self.scenario.cluster.start_latency.as_secs_f64()).round(),
            "idle_gb_s": (c.idle_mb_us as f64 / 1024.0 / 1e6).round(),
            "provisioned": c.provisioned,
            "drained": c.drained,
            "reactivated": c.reactivated,
            "removed": c.removed,
            "reversals": c.reversals,
            "wall_ms": c.wall.as_millis() as u64,
        });
        if let Some(standby) = &self.standby {
            let held = standby.mb_us(self.horizon) as f64 / self.fleet.group.invoker_memory_mb.max(1) as f64;
            // Included in `invoker_seconds`: what the standby pods held, in invokers' memory.
            entry["standby_invoker_seconds"] = json!((held / 1e6).round());
        }
        bounds.compare(&mut entry, seconds as f64);
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twelve 256 MB calls of 5 s at once, then nothing for ten minutes; invokers of 1 GiB.
    fn burst(predictors: &str, min: u32) -> Value {
        burst_of(predictors, min, 256, 12)
    }

    /// `size` calls of `mb` MB of 5 s at once, twice, ten minutes apart; invokers of 1 GiB.
    fn burst_of(predictors: &str, min: u32, mb: u32, size: u32) -> Value {
        let text = format!(
            "name = \"burst\"\n[cluster]\nnodes = 1\nnode_memory_mb = 1024\nstart_latency = \"500ms\"\n\
             [workload]\nkind = \"bursts\"\nactions = {size}\nmemory_mb = [{mb}, {mb}]\nrun_ms = [5000, 5000]\n\
             bursts = 2\nburst_size = {size}\nburst_every = \"10m\"\nburst_spread = \"1ms\"\n\
             [fleet]\nwait_for_room = \"30s\"\npredictors = {predictors}\n\
             [fleet.group]\nmin = {min}\nmax = 8\ninvoker_memory_mb = 1024\n\
             [[fleet.planes]]\nname = \"local\"\nprovision_latency = \"1s\"\n"
        );
        let scenario: Scenario = toml::from_str(&text).unwrap();
        let fleet = scenario.fleet.as_ref().unwrap();
        compare(&scenario, fleet, &crate::sim::host::NoFiles).unwrap()
    }

    /// `size` calls of `mb` MB of 5 s at once, twice, ten minutes apart, on a group of at most
    /// `max` invokers of 1 GiB whose scheduler waits `wait` for room.
    fn capped_burst(mb: u32, size: u32, max: u32, wait: &str) -> Value {
        let text = format!(
            "name = \"capped\"\n[cluster]\nnodes = 1\nnode_memory_mb = 1024\nstart_latency = \"500ms\"\n\
             [workload]\nkind = \"bursts\"\nactions = {size}\nmemory_mb = [{mb}, {mb}]\nrun_ms = [5000, 5000]\n\
             bursts = 2\nburst_size = {size}\nburst_every = \"10m\"\nburst_spread = \"1ms\"\n\
             [fleet]\nwait_for_room = \"{wait}\"\npredictors = [\"conservative\"]\n\
             [fleet.group]\nmin = 0\nmax = {max}\ninvoker_memory_mb = 1024\n\
             [[fleet.planes]]\nname = \"local\"\nprovision_latency = \"1s\"\n"
        );
        let scenario: Scenario = toml::from_str(&text).unwrap();
        compare(&scenario, scenario.fleet.as_ref().unwrap(), &crate::sim::host::NoFiles).unwrap()
    }

    /// Issue 79: a group at its `max` (one invoker: four 256 MB calls at once) and a scheduler
    /// that waits 2 s for room. The eight calls of each burst without room are kept in the
    /// queue past their wait, not refused, and run as the first ones end; a call larger than
    /// an invoker can never run and is refused.
    #[test]
    fn calls_past_their_wait_for_room_are_kept_and_run_and_only_what_never_fits_is_refused() {
        let s = capped_burst(256, 12, 1, "2s");
        let run = &s["planes"]["local (1s)"]["conservative"];
        assert_eq!((run["completed"].as_u64(), run["refused"].as_u64()), (Some(24), Some(0)), "{s}");
        assert_eq!(run["kept_past_wait"], 16, "{s}");
        assert_eq!(run["kept_why"], json!({ "at_max": 16 }), "{s}");
        assert_eq!(run["lost"], 0, "{s}");
        let s = capped_burst(2048, 2, 4, "2s");
        let run = &s["planes"]["local (1s)"]["conservative"];
        assert_eq!((run["completed"].as_u64(), run["refused"].as_u64()), (Some(0), Some(4)), "{s}");
        assert_eq!(run["kept_past_wait"], 0, "{s}");
    }

    #[test]
    fn a_burst_gets_its_invokers_at_once_and_gives_them_back_after_scale_down_after() {
        let s = burst("[\"conservative\"]", 0);
        let plane = &s["planes"]["local (1s)"];
        let run = &plane["conservative"];
        assert_eq!(run["completed"], 24, "{s}");
        assert_eq!((run["lost"].as_u64(), run["refused"].as_u64()), (Some(0), Some(0)), "{s}");
        // 12 × 256 MB = three invokers, asked for in one round, for each of the two bursts.
        assert_eq!(run["provisioned"], 6, "{s}");
        assert_eq!(run["invokers_max"], 3, "{s}");
        // The first burst's are drained and removed once `scale_down_after` passed; the trace
        // ends with the second's.
        assert_eq!((run["drained"].as_u64(), run["removed"].as_u64()), (Some(3), Some(3)), "{s}");
        // Every call waited for an invoker (1 s) and its container (0.5 s).
        assert_eq!(run["delayed_over_1s"], 24, "{s}");
        // Three invokers from the first burst to 60 s after its calls ended, and three from the
        // second to the trace's end (its eleventh minute).
        let seconds = run["invoker_seconds"].as_u64().unwrap();
        assert!((3 * 65 + 3 * 60..=3 * 68 + 3 * 60).contains(&seconds), "{seconds}: {s}");
        // The oracle holds three invokers in each burst's minute, the fixed fleet all the time,
        // and no call waits for an invoker there.
        assert_eq!(plane["oracle"]["invoker_seconds"], 2 * 3 * 60, "{s}");
        // Each of the first burst's three drains comes within five minutes of the growth
        // before it; the second burst's growth, nine minutes after those drains, undoes none.
        assert_eq!(run["reversals"], 3, "{s}");
        // Every call started a container of its own (12 at once, each 256 MB): 24 cold
        // starts of 500 ms; their containers idle until their invokers go.
        assert_eq!((run["cold_starts"].as_u64(), run["cold_start_seconds"].as_f64()), (Some(24), Some(12.0)), "{s}");
        assert!(run["idle_gb_s"].as_f64().unwrap() > 0.0, "{s}");
        assert_eq!(plane["fixed-peak"]["invoker_seconds"], 3 * 11 * 60, "{s}");
        assert!(plane["fixed-peak"]["delayed_over_1s"].as_u64().unwrap() < 24, "{s}");
    }

    #[test]
    fn standby_pods_bring_a_burst_its_invokers_in_a_resize_and_are_counted_in_the_cost() {
        let text = "name = \"burst\"\n[cluster]\nnodes = 1\nnode_memory_mb = 1024\nstart_latency = \"500ms\"\n\
             [workload]\nkind = \"bursts\"\nactions = 12\nmemory_mb = [256, 256]\nrun_ms = [5000, 5000]\n\
             bursts = 2\nburst_size = 12\nburst_every = \"10m\"\nburst_spread = \"1ms\"\n\
             [fleet]\nwait_for_room = \"30s\"\npredictors = [\"conservative\"]\n\
             [fleet.group]\nmin = 0\nmax = 8\ninvoker_memory_mb = 1024\n\
             [[fleet.planes]]\nname = \"pods\"\nprovision_latency = \"10s\"\n\
             [[fleet.planes]]\nname = \"three\"\nprovision_latency = \"10s\"\n\
             standby = { pods = 3, resize_latency = \"200ms\", memory_mb = 64 }\n\
             [[fleet.planes]]\nname = \"two\"\nprovision_latency = \"10s\"\n\
             standby = { pods = 2, resize_latency = \"200ms\", memory_mb = 64 }\n";
        let scenario: Scenario = toml::from_str(text).unwrap();
        let s = compare(&scenario, scenario.fleet.as_ref().unwrap(), &crate::sim::host::NoFiles).unwrap();
        let run = |plane: &str| s["planes"][plane]["conservative"].clone();
        let pods = run("pods (10s)");
        let three = run("three (10s, 3 standby of 64 MB resized in 200ms)");
        let two = run("two (10s, 2 standby of 64 MB resized in 200ms)");
        for r in [&pods, &three, &two] {
            assert_eq!((r["completed"].as_u64(), r["lost"].as_u64()), (Some(24), Some(0)), "{s}");
            assert_eq!(r["provisioned"], 6, "three invokers per burst: {s}");
        }
        // New pods: every call waits ten seconds. The standby pods start with the trace, so the
        // first burst waits for them as for new ones. Three standby: the second burst's three
        // invokers come in a resize, and its calls start within their second. Two: its third
        // invoker is a new pod, and the four calls that wait for it are late.
        assert_eq!(pods["delayed_over_1s"], 24, "{s}");
        assert_eq!(three["delayed_over_1s"], 12, "{s}");
        assert_eq!(two["delayed_over_1s"], 12 + 4, "{s}");
        // Three pods of 64 MB held the whole trace (eleven minutes): those taken are replaced,
        // and the invokers given back go with their pods.
        assert_eq!(three["standby_invoker_seconds"], (3.0 * 64.0 / 1024.0 * 660.0f64).round(), "{s}");
        assert!(pods.get("standby_invoker_seconds").is_none(), "{s}");
    }

    #[test]
    fn with_min_invokers_up_only_the_first_burst_waits_for_them() {
        let s = burst("[\"conservative\"]", 3);
        let run = &s["planes"]["local (1s)"]["conservative"];
        assert_eq!((run["completed"].as_u64(), run["provisioned"].as_u64()), (Some(24), Some(3)), "{s}");
        assert_eq!(run["removed"], 0, "{s}");
        // Asked for at the first round, with the first burst: the second finds them up.
        let delayed = run["delayed_over_1s"].as_u64().unwrap();
        assert!((12..24).contains(&delayed), "{s}");
    }

    /// Ten calls of 400 MB: 4,000 MB is four invokers of 1 GiB by memory, but two fit in one,
    /// so they take five. Counted in megabytes, the group asked for four and two calls waited
    /// for the first ones to end; counted by packing, it asks for five at once.
    #[test]
    fn a_replays_side_by_side_counts_by_minute_and_by_quantile() {
        let ms = Duration::from_millis;
        let minute = ms(1000);
        assert_eq!(by_minute(&[ms(10), ms(999), ms(1000), ms(3500)], minute), json!({"0": 2, "1": 1, "3": 1}));
        let mut waits: Vec<Duration> = (1..=100).rev().map(ms).collect();
        assert_eq!(quantiles_ms(&mut waits), json!({"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}));
        assert_eq!(quantiles_ms(&mut []), json!({"p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0}));
    }

    #[test]
    fn a_burst_is_sized_by_the_calls_that_fit_not_by_its_megabytes() {
        let s = burst_of("[\"conservative\"]", 0, 400, 10);
        let run = &s["planes"]["local (1s)"]["conservative"];
        assert_eq!((run["completed"].as_u64(), run["refused"].as_u64()), (Some(20), Some(0)), "{s}");
        assert_eq!(run["provisioned"], 10, "five for each burst: {s}");
        assert_eq!(run["invokers_max"], 5, "{s}");
        let floor = &s["planes"]["local (1s)"]["packing_floor"];
        assert_eq!(floor["invokers_max"], 5, "{s}");
        assert_eq!(s["planes"]["local (1s)"]["memory_floor"]["invoker_seconds"], 2.0 * 4.0 * 5.0, "{s}");
    }
}
