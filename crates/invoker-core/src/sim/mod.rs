//! The simulator: the same pure pool core the invoker runs, driven in virtual time against a
//! simulated cluster (nodes that refuse what does not fit, start latencies that grow with
//! parallel starts, node stats that lag behind reality), fed by a scenario's calls. It prints
//! what happened: nothing may be lost, and nothing may be placed beyond what a node holds.
//!
//! `invoker simulate --scenario scenarios/<name>.toml`

pub mod fleet;
mod host;
mod provisioned;
pub mod scenario;
pub mod sweep;
mod timeline;
pub mod workload;

use crate::pool::CoreConfig as PoolConfig;
use crate::pool::StartRule;
use crate::pool::{Effect, Event, Job, KeyId, Owner, PoolCore, RejectReason};
pub use host::Host;
use invoker_ids::{ContainerId, CreateFailure, JobId, NodeId, NodeStatsUpdate};
use scenario::{KeepAliveChoice, Scenario, ScenarioError};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use timeline::Timeline;
use workload::Call;

/// Every simulated action is of this kind, so a scenario's `[[pool.prewarm]]` entries name it.
pub const SIM_KIND: &str = "native";

#[derive(Clone, Copy, Debug)]
enum Ev {
    Arrive(usize),
    /// A start finishing; the number is the start's version (a later start on the node slows
    /// it down and reschedules it, and the stale event is ignored).
    Ready(ContainerId, bool, u32),
    Done(ContainerId, JobId),
    Removed(ContainerId),
    Stats,
    Tick,
}

struct SimNode {
    id: NodeId,
    capacity_mb: u64,
    used_mb: u64,
    max_used_mb: u64,
    /// Starts in flight on the node: each slows the others by `start_per_inflight_ms`.
    starting: Vec<ContainerId>,
}

struct SimContainer {
    node: usize,
    memory_mb: u64,
    ready_at: Duration,
    version: u32,
    ran: bool,
    /// Created as a prewarm (stem) container: its first run is a prewarm start.
    stem: bool,
    idle_since: Option<Duration>,
    /// Resumed for the run dispatched next, which starts `resume_latency` later.
    resuming: bool,
    created_at: Duration,
    /// Started by the keep-alive policy ahead of a predicted call.
    prewarm: bool,
    /// One of its function's provisioned containers: initialised as it started.
    provisioned: bool,
}

struct SimJob {
    call: usize,
    arrived: Duration,
}

#[derive(Default)]
struct Counts {
    completed: u64,
    rejected_503: u64,
    failed: u64,
    cold: u64,
    warm: u64,
    prewarm: u64,
    started: u64,
    refused: u64,
    waits_us: Vec<u64>,
    idle_mb_us: u128,
    /// Per action: (cold starts, dispatches).
    per_action: Vec<(u64, u64)>,
    pauses: u64,
    resumes: u64,
    /// The start times cold activations waited for, summed (µs).
    cold_overhead_us: u128,
    /// Containers the keep-alive policy pre-warmed that took a call, and that went unused.
    prewarms_used: u64,
    prewarms_wasted: u64,
    /// Calls that found a provisioned container never used before (each a cold start saved),
    /// and the idle memory-time of provisioned containers (within `idle_mb_us`).
    provisioned_first_uses: u64,
    idle_provisioned_mb_us: u128,
    /// The memory-time stems held before their first call, or until removed unused (within
    /// `idle_mb_us`).
    idle_stem_mb_us: u128,
}

struct Sim<'a> {
    scenario: &'a Scenario,
    pool: PoolConfig,
    calls: Vec<Call>,
    core: PoolCore,
    now: Duration,
    timeline: Timeline<Ev>,
    nodes: Vec<SimNode>,
    node_index: HashMap<NodeId, usize>,
    containers: HashMap<ContainerId, SimContainer>,
    jobs: HashMap<JobId, SimJob>,
    /// Node usage as it was at each stats tick, for stats that lag.
    history: VecDeque<(Duration, Vec<u64>)>,
    arrived: usize,
    /// Idle memory is counted up to here (the end of the workload).
    horizon: Duration,
    counts: Counts,
    /// The functions kept provisioned from the start: (action, memory), and how many each.
    provision: Vec<(u32, u32)>,
    provision_count: u32,
}

/// Runs a scenario to the end and returns its JSON summary; with `compare_start_rules`, one
/// summary per rule under `rules`.
pub fn run(scenario: &Scenario, host: &dyn Host) -> Result<Value, ScenarioError> {
    if let Some(fleet) = &scenario.fleet {
        return fleet::compare(scenario, fleet, host);
    }
    if let Some(comparison) = &scenario.compare_provisioned {
        let mut run =
            |pool, size, provision: &[(u32, u32)], count| simulate(scenario, pool, size, provision, count, host);
        return provisioned::compare(scenario, comparison, &mut run);
    }
    if let Some(choices) = &scenario.compare_keep_alive {
        return compare_keep_alive(scenario, choices, host);
    }
    let node_mb = scenario.cluster.node_memory_mb;
    let Some(rules) = &scenario.compare_start_rules else {
        return run_with(scenario, scenario.pool.clone(), node_mb, host);
    };
    let mut out = serde_json::Map::new();
    for &rule in rules {
        let mut pool = scenario.pool.clone();
        pool.start_rule = rule;
        if rule != StartRule::Capped {
            // The systems these rules come from do not cap starts per node either.
            pool.max_starts_per_node = u32::MAX;
        }
        let name = serde_json::to_value(rule).ok().and_then(|v| v.as_str().map(str::to_string));
        let name = name.expect("a start rule serialises to its name");
        out.insert(name, run_with(scenario, pool, node_mb, host)?);
    }
    Ok(json!({ "scenario": scenario.name, "rules": out }))
}

/// Every policy on every node size, on the same workload: one section per node size, one
/// entry per policy, each with its ratios to the first policy (the baseline) on that size;
/// with `sweep_fixed_minutes`, the fixed keep-alives' curve per node size (`fixed_curve`, beside
/// the sections) and each policy's overhead over the curve's at its own idle memory
/// (`vs_fixed_curve`).
fn compare_keep_alive(
    scenario: &Scenario,
    choices: &[KeepAliveChoice],
    host: &dyn Host,
) -> Result<Value, ScenarioError> {
    let sizes = scenario.node_sizes_mb.clone().unwrap_or_else(|| vec![scenario.cluster.node_memory_mb]);
    let mut out = serde_json::Map::new();
    let mut curves = serde_json::Map::new();
    for size in sizes {
        let mut section = serde_json::Map::new();
        let mut baseline: Option<(f64, f64)> = None;
        for choice in choices {
            let mut summary = run_with(scenario, choice.applied_to(&scenario.pool), size, host)?;
            let overhead = summary["cold_start_overhead_s"].as_f64().unwrap_or(0.0);
            let idle = summary["idle_memory_gb_s"].as_f64().unwrap_or(0.0);
            let (base_overhead, base_idle) = *baseline.get_or_insert((overhead, idle));
            let ratio = |base: f64, this: f64| ((base / this.max(1e-9)) * 100.0).round() / 100.0;
            summary["overhead_reduction_vs_baseline"] = json!(ratio(base_overhead, overhead));
            summary["idle_memory_reduction_vs_baseline"] = json!(ratio(base_idle, idle));
            section.insert(choice.name.clone(), summary);
        }
        if let Some(minutes) = &scenario.sweep_fixed_minutes {
            let mut curve = Vec::new();
            for &m in minutes {
                let pool = PoolConfig {
                    keep_alive: crate::pool::KeepAliveKind::Fixed,
                    idle_timeout: Duration::from_secs_f64(m * 60.0),
                    ..scenario.pool.clone()
                };
                let summary = run_with(scenario, pool, size, host)?;
                curve.push(sweep::CurvePoint {
                    minutes: m,
                    idle_gb_s: summary["idle_memory_gb_s"].as_f64().unwrap_or(0.0),
                    overhead_s: summary["cold_start_overhead_s"].as_f64().unwrap_or(0.0),
                });
            }
            for entry in section.values_mut() {
                let idle = entry["idle_memory_gb_s"].as_f64().unwrap_or(0.0);
                let overhead = entry["cold_start_overhead_s"].as_f64().unwrap_or(0.0);
                entry["vs_fixed_curve"] = json!(sweep::ratio_to_curve(&curve, idle, overhead));
            }
            let points: Vec<Value> = curve
                .iter()
                .map(|p| json!({"minutes": p.minutes, "idle_memory_gb_s": p.idle_gb_s, "cold_start_overhead_s": p.overhead_s}))
                .collect();
            curves.insert(format!("{size}"), Value::Array(points));
        }
        out.insert(format!("{size}"), Value::Object(section));
    }
    let mut result = json!({ "scenario": scenario.name, "node_mb": out });
    if !curves.is_empty() {
        result["fixed_curve"] = Value::Object(curves);
    }
    Ok(result)
}

fn run_with(
    scenario: &Scenario,
    pool: PoolConfig,
    node_memory_mb: u64,
    host: &dyn Host,
) -> Result<Value, ScenarioError> {
    Ok(simulate(scenario, pool, node_memory_mb, &[], 0, host)?.summary)
}

/// Runs the scenario with `provision` (action, memory) kept provisioned, `count` each.
fn simulate(
    scenario: &Scenario,
    pool: PoolConfig,
    node_memory_mb: u64,
    provision: &[(u32, u32)],
    count: u32,
    host: &dyn Host,
) -> Result<provisioned::Outcome, ScenarioError> {
    let began = host.elapsed();
    let (mut calls, actions) = workload::calls(&scenario.workload, scenario.seed, host)?;
    if let Some(classes) = &scenario.memory_classes {
        for call in &mut calls {
            call.memory_mb = classes.iter().copied().find(|&c| c >= call.memory_mb).unwrap_or(call.memory_mb);
        }
    }
    let core = PoolCore::new(crate::pool::CoreConfig { pause_grace: scenario.cluster.pause_grace, ..pool.clone() });
    let nodes: Vec<SimNode> = (0..scenario.cluster.nodes)
        .map(|i| SimNode {
            id: NodeId::new(&format!("node{i}")),
            capacity_mb: node_memory_mb,
            used_mb: 0,
            max_used_mb: 0,
            starting: Vec::new(),
        })
        .collect();
    let node_index = nodes.iter().enumerate().map(|(i, n)| (n.id.clone(), i)).collect();
    let horizon = calls.last().map_or(Duration::ZERO, |c| c.at);
    let mut sim = Sim {
        scenario,
        pool,
        calls,
        core,
        now: Duration::ZERO,
        timeline: Timeline::default(),
        nodes,
        node_index,
        containers: HashMap::new(),
        jobs: HashMap::new(),
        history: VecDeque::new(),
        arrived: 0,
        horizon,
        counts: Counts { per_action: vec![(0, 0); actions as usize], ..Counts::default() },
        provision: provision.to_vec(),
        provision_count: count,
    };
    let mut memory_mb = vec![0; actions as usize];
    for call in &sim.calls {
        memory_mb[call.action as usize] = call.memory_mb;
    }
    sim.run();
    let summary = sim.summary(host.elapsed().saturating_sub(began));
    Ok(provisioned::Outcome { summary, per_action: std::mem::take(&mut sim.counts.per_action), memory_mb })
}

impl Sim<'_> {
    fn at(&mut self, when: Duration, ev: Ev) {
        self.timeline.at(when, ev);
    }

    fn run(&mut self) {
        self.publish_stats();
        for (action, memory_mb) in std::mem::take(&mut self.provision) {
            let provision = crate::pool::Provision {
                key: KeyId(action),
                count: self.provision_count,
                memory_mb,
                concurrency: 1,
                max_running: None,
                tenant: crate::pool::TenantId::default(),
            };
            self.apply(Event::Provision(provision));
        }
        self.at(Duration::ZERO, Ev::Stats);
        self.at(Duration::ZERO, Ev::Tick);
        for (i, call) in self.calls.iter().enumerate() {
            self.timeline.at(call.at, Ev::Arrive(i));
        }
        while let Some((when, ev)) = self.timeline.next() {
            self.now = when;
            match ev {
                Ev::Arrive(i) => self.arrive(i),
                Ev::Ready(c, ok, version) => {
                    let current = self.containers.get(&c).map(|c| c.version);
                    if !ok || current == Some(version) {
                        self.ready(c, ok);
                    }
                }
                Ev::Done(c, job) => self.done(c, job),
                Ev::Removed(c) => self.removed(c),
                Ev::Stats => {
                    self.publish_stats();
                    if !self.finished() {
                        self.at(self.now + self.scenario.cluster.stats_every, Ev::Stats);
                    }
                }
                Ev::Tick => {
                    self.apply(Event::Tick);
                    if !self.finished() {
                        self.at(self.now + self.pool.tick, Ev::Tick);
                    }
                }
            }
        }
    }

    /// Every call arrived and was answered: only the periodic events would go on.
    fn finished(&self) -> bool {
        self.arrived == self.calls.len() && self.jobs.is_empty()
    }

    fn apply(&mut self, event: Event) {
        let effects = self.core.handle(event, self.now);
        for effect in effects {
            match effect {
                Effect::Create { container, owner, memory_mb, node, prewarm, provisioned } => {
                    let stem = matches!(owner, Owner::Stem(_));
                    self.create(container, memory_mb, &node, stem, prewarm);
                    if let Some(c) = self.containers.get_mut(&container) {
                        c.provisioned = provisioned;
                    }
                }
                Effect::Dispatch { job, container } => self.dispatch(job, container),
                Effect::Pause { .. } => self.counts.pauses += 1,
                Effect::Resume { container } => {
                    self.counts.resumes += 1;
                    if let Some(c) = self.containers.get_mut(&container) {
                        c.resuming = true;
                    }
                }
                Effect::Remove { container } => {
                    if let Some(c) = self.containers.get_mut(&container) {
                        if c.prewarm && !c.ran {
                            self.counts.prewarms_wasted += 1;
                        }
                        if let Some(since) = c.idle_since.take() {
                            let spent = idle(c.memory_mb, since, self.now, self.horizon);
                            self.counts.add_idle(spent, c);
                        }
                    }
                    self.at(self.now + self.scenario.cluster.remove_latency, Ev::Removed(container));
                }
                Effect::Reject { job, reason } => {
                    self.jobs.remove(&job);
                    match reason {
                        RejectReason::NeverFits { .. } => self.counts.failed += 1,
                        _ => self.counts.rejected_503 += 1,
                    }
                }
            }
        }
    }

    fn arrive(&mut self, i: usize) {
        self.arrived += 1;
        let call = self.calls[i];
        let id = JobId(i as u64);
        self.jobs.insert(id, SimJob { call: i, arrived: self.now });
        let job = Job {
            id,
            key: KeyId(call.action),
            memory_mb: call.memory_mb,
            concurrency: 1,
            deadline: self.now + self.pool.wait_deadline,
            stem: self.pool.stem_for(SIM_KIND, call.memory_mb, invoker_ids::DEFAULT_DISK_MB),
            idle_timeout: None,
            patient: false,
            max_running: None,
            tenant: crate::pool::TenantId::default(),
        };
        self.apply(Event::Arrived(job));
    }

    /// The cluster's side of a create: it refuses what does not fit on the node now.
    fn create(&mut self, container: ContainerId, memory_mb: u32, node: &NodeId, stem: bool, prewarm: bool) {
        let Some(&n) = self.node_index.get(node) else {
            self.counts.refused += 1;
            self.at(self.now, Ev::Ready(container, false, 0));
            return;
        };
        let memory_mb = u64::from(memory_mb);
        let sim_node = &mut self.nodes[n];
        if sim_node.used_mb + memory_mb > sim_node.capacity_mb {
            self.counts.refused += 1;
            self.at(self.now, Ev::Ready(container, false, 0));
            return;
        }
        sim_node.used_mb += memory_mb;
        sim_node.max_used_mb = sim_node.max_used_mb.max(sim_node.used_mb);
        // Every start overlapping this one takes longer, and this one takes longer for each.
        let slowdown = Duration::from_millis(self.scenario.cluster.start_per_inflight_ms);
        let in_flight = std::mem::take(&mut sim_node.starting);
        let ready_at = self.now + self.scenario.cluster.start_latency + slowdown * in_flight.len() as u32;
        for &other in &in_flight {
            if let Some(c) = self.containers.get_mut(&other) {
                c.ready_at += slowdown;
                c.version += 1;
                let (at, version) = (c.ready_at, c.version);
                self.at(at, Ev::Ready(other, true, version));
            }
        }
        let sim_node = &mut self.nodes[n];
        sim_node.starting = in_flight;
        sim_node.starting.push(container);
        self.containers.insert(
            container,
            SimContainer {
                node: n,
                memory_mb,
                ready_at,
                version: 0,
                ran: false,
                stem,
                idle_since: None,
                resuming: false,
                created_at: self.now,
                prewarm,
                provisioned: false,
            },
        );
        self.at(ready_at, Ev::Ready(container, true, 0));
    }

    fn ready(&mut self, container: ContainerId, ok: bool) {
        if ok {
            self.counts.started += 1;
            if let Some(c) = self.containers.get_mut(&container) {
                c.idle_since = Some(self.now);
                self.nodes[c.node].starting.retain(|&s| s != container);
            }
        }
        self.apply(Event::Started { container, failure: (!ok).then_some(CreateFailure::Failed), at: self.now });
    }

    fn dispatch(&mut self, job: JobId, container: ContainerId) {
        let Some(j) = self.jobs.get(&job) else { return };
        let call = self.calls[j.call];
        let c = self.containers.get_mut(&container).expect("dispatch to a created container");
        let resume =
            if std::mem::take(&mut c.resuming) { self.scenario.cluster.resume_latency } else { Duration::ZERO };
        self.counts.waits_us.push((self.now + resume - j.arrived).as_micros() as u64);
        if let Some(since) = c.idle_since.take() {
            let spent = idle(c.memory_mb, since, self.now, self.horizon);
            self.counts.add_idle(spent, c);
        }
        let per_action = &mut self.counts.per_action[call.action as usize];
        per_action.1 += 1;
        if c.ran {
            self.counts.warm += 1;
        } else if c.provisioned {
            self.counts.provisioned_first_uses += 1;
            self.counts.warm += 1;
            c.ran = true;
        } else if c.prewarm {
            self.counts.prewarms_used += 1;
            self.counts.warm += 1;
            c.ran = true;
        } else if c.stem {
            self.counts.prewarm += 1;
            c.ran = true;
        } else {
            self.counts.cold += 1;
            per_action.0 += 1;
            c.ran = true;
            self.counts.cold_overhead_us += (c.ready_at - c.created_at).as_micros();
        }
        self.at(self.now + resume + call.run, Ev::Done(container, job));
    }

    fn done(&mut self, container: ContainerId, job: JobId) {
        self.jobs.remove(&job);
        self.counts.completed += 1;
        if let Some(c) = self.containers.get_mut(&container) {
            c.idle_since = Some(self.now);
        }
        self.apply(Event::Finished { container, job, reusable: true });
    }

    fn removed(&mut self, container: ContainerId) {
        if let Some(c) = self.containers.remove(&container) {
            self.nodes[c.node].used_mb -= c.memory_mb;
        }
        self.apply(Event::Removed(container));
    }

    /// Records the cluster as it is now and tells the pool how it was `stats_lag` ago.
    fn publish_stats(&mut self) {
        let lag = self.scenario.cluster.stats_lag;
        self.history.push_back((self.now, self.nodes.iter().map(|n| n.used_mb).collect()));
        while self.history.len() > 1 && self.history[1].0 + lag <= self.now {
            self.history.pop_front();
        }
        let Some((observed_at, used)) = self.history.front().cloned() else { return };
        if observed_at + lag > self.now {
            return;
        }
        for (i, used_mb) in used.into_iter().enumerate() {
            let node = &self.nodes[i];
            let update = NodeStatsUpdate {
                node: node.id.clone(),
                capacity_mb: node.capacity_mb,
                free_mb: node.capacity_mb.saturating_sub(used_mb),
                observed_at,
            };
            self.apply(Event::NodeStats(update));
        }
    }

    fn summary(&mut self, wall: Duration) -> Value {
        for container in self.containers.values_mut() {
            if let Some(since) = container.idle_since.take() {
                let spent = idle(container.memory_mb, since, self.horizon, self.horizon);
                self.counts.add_idle(spent, container);
            }
        }
        let c = &mut self.counts;
        c.waits_us.sort_unstable();
        let pct = |v: &[u64], p: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
            (v[i] as f64 / 100.0).round() / 10.0
        };
        let activations = self.calls.len() as u64;
        let lost = activations - c.completed - c.rejected_503 - c.failed;
        let buffer = self.pool.buffer_mb;
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| json!({"node": n.id.to_string(), "capacity_mb": n.capacity_mb, "max_committed_mb": n.max_used_mb}))
            .collect();
        let within = self.nodes.iter().all(|n| n.max_used_mb + buffer <= n.capacity_mb);
        let mut per_function: Vec<f64> =
            c.per_action.iter().filter(|(_, n)| *n > 0).map(|(cold, n)| *cold as f64 / *n as f64 * 100.0).collect();
        per_function.sort_by(|a, b| a.total_cmp(b));
        let p75_function = per_function
            .get(((per_function.len() as f64 * 0.75).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0);
        let dispatched = (c.cold + c.warm + c.prewarm).max(1) as f64;
        json!({
            "scenario": self.scenario.name,
            "activations": activations,
            "completed": c.completed,
            "rejected_503": c.rejected_503,
            "failed": c.failed,
            "lost": lost,
            "cold_starts": c.cold,
            "warm_starts": c.warm,
            "prewarm_starts": c.prewarm,
            "containers_started": c.started,
            "pauses": c.pauses,
            "resumes": c.resumes,
            "launches_refused_by_cluster": c.refused,
            "nodes": nodes,
            "max_committed_within_capacity_minus_buffer": within,
            "wait_p50_ms": pct(&c.waits_us, 0.5),
            "wait_p99_ms": pct(&c.waits_us, 0.99),
            "cold_start_pct": (c.cold as f64 / dispatched * 1000.0).round() / 10.0,
            "cold_start_pct_p75_function": (p75_function * 10.0).round() / 10.0,
            "idle_memory_gb_s": (c.idle_mb_us as f64 / 1024.0 / 1e6 * 10.0).round() / 10.0,
            "cold_start_overhead_s": (c.cold_overhead_us as f64 / 1e6 * 10.0).round() / 10.0,
            "evictions": self.core.evictions(),
            "prewarms_started": self.core.prewarms_started(),
            "prewarms_used": c.prewarms_used,
            "prewarms_wasted": c.prewarms_wasted,
            "provisioned_first_uses": c.provisioned_first_uses,
            "idle_memory_provisioned_gb_s": (c.idle_provisioned_mb_us as f64 / 1024.0 / 1e6 * 10.0).round() / 10.0,
            // Of the calls that found no warm container, the share a stem took (a cold start
            // hidden, not a fast one), and the memory-time the stems held waiting.
            "stem_share_of_first_starts_pct": (c.prewarm as f64 / (c.prewarm + c.cold).max(1) as f64 * 1000.0).round() / 10.0,
            "idle_memory_stems_gb_s": (c.idle_stem_mb_us as f64 / 1024.0 / 1e6 * 10.0).round() / 10.0,
            "virtual_seconds": self.now.as_secs(),
            "wall_ms": wall.as_millis() as u64,
        })
    }
}

impl Counts {
    fn add_idle(&mut self, mb_us: u128, c: &SimContainer) {
        self.idle_mb_us += mb_us;
        if c.provisioned {
            self.idle_provisioned_mb_us += mb_us;
        }
        if c.stem && !c.ran {
            self.idle_stem_mb_us += mb_us;
        }
    }
}

/// MB·µs of idle memory between `since` and `until`, counted within the workload's horizon.
fn idle(memory_mb: u64, since: Duration, until: Duration, horizon: Duration) -> u128 {
    let until = until.min(horizon);
    if until <= since {
        return 0;
    }
    u128::from(memory_mb) * (until - since).as_micros()
}
