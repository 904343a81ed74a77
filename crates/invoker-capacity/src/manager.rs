//! `invoker capacity`: one active manager per cluster (a lease-held key in etcd; a second
//! waits as standby and takes over within the lease's TTL). It watches the invokers'
//! registrations and the schedulers' demand reports (`cluster::mirror`: a range each, then
//! etcd's watch). Every `[capacity] tick`, and at once when a report shows a burst, it turns
//! each group's demand into a target with its predictor, lets the group's decision core decide,
//! and carries the decisions out: the control plane starts and stops invokers; drains are the
//! operators' drain keys, which every scheduler already honours.

use crate::metrics::{CapacityMetrics, DecisionLabel, GroupLabel, GroupState};
use invoker_core::capacity::packing::{packed_demand_mb, CallsByMb};
use invoker_core::capacity::{default_hold, drain_order, GroupConfig};
use invoker_core::capacity::{Action, Decision, Event, GroupCore, GroupCounts, GroupSpec, MemberState, Sighting};
use invoker_core::predictor::{quick, AnyPredictor, Predictor};
use invoker_etcd::claim::{claim_key, ClaimError};
use invoker_etcd::kv::ClusterKv;
use invoker_etcd::kv::LeaseId;
use invoker_etcd::mirror::Snapshot;
use invoker_factory::plane::{ControlPlane, InvokerSpec};
use invoker_wire::cluster::Health;
use invoker_wire::cluster::{capacity_leader_key, drain_key, invoker_key, DemandReport, DrainMark, InvokerRecord};
use invoker_wire::model::epoch_ms;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Decisions kept per group for `GET /v1/capacity`.
const KEPT_DECISIONS: usize = 32;

/// While a group's reported demand is past what it has, how often its round is run again.
const BURST_RECHECK: Duration = Duration::from_millis(200);

/// What `GET /v1/capacity` shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CapacityStatus {
    /// Whether this manager is the active one (else it waits as standby).
    pub leader: bool,
    pub groups: Vec<GroupStatus>,
    /// Rounds decided so far: the live view sends what changed when it moves.
    #[serde(skip)]
    pub rounds: Rounds,
}

/// A signal that moves at each round (`/v1/live` waits on it, no loop over the state).
#[derive(Clone, Debug)]
pub struct Rounds(pub tokio::sync::watch::Sender<u64>);

impl Default for Rounds {
    fn default() -> Self {
        Rounds(tokio::sync::watch::Sender::new(0))
    }
}

/// One round of a group, for the live view's chart.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sample {
    pub at_ms: u64,
    pub demand_mb: u64,
    pub target_mb: u64,
    pub active: u32,
    pub provisioning: u32,
    pub draining: u32,
}

/// How far back the chart goes, and at most how many rounds it keeps (bursts re-decide
/// between ticks).
const HISTORY: Duration = Duration::from_secs(3600);
const HISTORY_MAX: usize = 7200;

#[derive(Clone, Debug, Serialize)]
pub struct GroupStatus {
    pub name: String,
    pub tags: Vec<String>,
    pub predictor: &'static str,
    pub control_plane: invoker_core::capacity::ControlPlaneKind,
    /// How long the target must stay an invoker below what is active before one is drained:
    /// the group's `scale_down_after`, or its control plane's when it sets none.
    pub scale_down_after_ms: u64,
    /// How soon an invoker asked for comes up, as the predictor plans: the control plane's
    /// figure, until the median of the group's last starts says otherwise across
    /// [`invoker_core::predictor::QUICK_LEAD`].
    pub lead_ms: u64,
    pub demand_mb: u64,
    pub target_mb: u64,
    pub target_invokers: u32,
    pub counts: GroupCounts,
    /// Invoker id → its state.
    pub invokers: BTreeMap<String, &'static str>,
    /// The last decisions, newest last.
    pub decisions: VecDeque<DecisionLog>,
    /// The last invoker that could not start, and why (provisioning is held meanwhile).
    pub last_failed_start: Option<DecisionLog>,
    /// Its rounds over the last hour, oldest first (the live view's, not `/v1/capacity`'s).
    #[serde(skip)]
    pub history: VecDeque<Sample>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DecisionLog {
    pub at_ms: u64,
    pub action: String,
    pub reason: String,
}

/// The identity a manager claims the leader key with (the fields [`claim_key`] reads).
#[derive(Serialize)]
struct LeaderRecord<'a> {
    api: &'a str,
    boot_id: String,
    pid: u32,
}

struct GroupLoop {
    name: String,
    config: GroupConfig,
    /// Its plane gives back only the newest invoker's memory (see `ManagerSettings`).
    newest_only: bool,
    /// Its plane's lead is a standby pod's (see `ManagerSettings`).
    standby: bool,
    core: GroupCore,
    predictor: AnyPredictor,
    /// The invokers this manager drained (their drain keys are its to take back).
    drains: BTreeSet<String>,
    /// When each invoker was asked for (for the provisioning latency).
    asked: HashMap<String, Instant>,
    /// The lead the predictor and the hold were built with, and the last starts timed.
    lead: Duration,
    starts: VecDeque<Duration>,
    /// Invokers being stopped by the control plane: a registration still there is not taken
    /// for one that came up; [`Event::Gone`] once the plane is done and it left etcd.
    stopping: Arc<Mutex<HashMap<String, bool>>>,
    /// Invokers this manager drained that are now forgotten: their drain keys go before the
    /// round's decisions are carried out (their names may be asked for again in it). Not
    /// before they are gone: a control plane may have to keep one running a while after its
    /// removal (a StatefulSet's pod below the highest), and it must stay drained meanwhile.
    forgotten_drains: Vec<String>,
    status: GroupStatus,
}

/// How many of a group's last starts are kept, and how many it takes to judge its plane.
const STARTS_KEPT: usize = 16;
const STARTS_JUDGED: usize = 5;

impl GroupLoop {
    /// An invoker of the group came up `took` after it was asked for. Once the median of its
    /// last starts puts the plane on the other side of [`invoker_core::predictor::QUICK_LEAD`]
    /// than the lead it was counted at (a Kubernetes plane whose resizes come slower than
    /// counted, a slow host's local plane), the predictor is built again for the measured lead,
    /// and a group that sets no hold takes that lead's ([`default_hold`]).
    fn started(&mut self, took: Duration, metrics: &CapacityMetrics) {
        metrics.provisioning_seconds.observe(took.as_secs_f64());
        self.starts.push_back(took);
        if self.starts.len() > STARTS_KEPT {
            self.starts.pop_front();
        }
        if self.starts.len() < STARTS_JUDGED {
            return;
        }
        let mut sorted: Vec<Duration> = self.starts.iter().copied().collect();
        sorted.sort_unstable();
        let measured = sorted[sorted.len() / 2];
        if quick(measured) == quick(self.lead) {
            return;
        }
        let settings = if quick(measured) { "a quick plane's" } else { "a slow plane's" };
        tracing::warn!(
            group = %self.name,
            "its invokers come up in {measured:?} (the median of its last {} starts), not the {:?} counted: \
             {settings} settings from now on",
            sorted.len(),
            self.lead
        );
        self.lead = measured;
        self.predictor = self.config.predictor.build(measured);
        self.core.set_drain_order(drain_order(measured, self.newest_only));
        self.status.lead_ms = measured.as_millis() as u64;
        if self.config.scale_down_after.is_none() {
            let hold = default_hold(measured, self.standby);
            self.core.set_scale_down_after(hold);
            self.status.scale_down_after_ms = hold.as_millis() as u64;
        }
    }
}

/// What a manager is told besides its etcd and control plane.
pub struct ManagerSettings {
    pub prefix: String,
    /// How often each group decides (`[capacity] tick`).
    pub tick: Duration,
    /// Group name → its bounds and pace (`[capacity.groups]`, checked by the invoker's config).
    pub groups: BTreeMap<String, GroupConfig>,
    /// The invokers' `publish_interval`: a drained report is trusted two of these after the drain.
    pub publish_interval: Duration,
    pub lease_ttl: Duration,
    /// This manager's API address, in the leader key.
    pub api: String,
    /// How long the control plane takes to bring an invoker up (the predictors plan that far
    /// ahead).
    pub lead: Duration,
    /// The plane gives back only its newest invoker's memory (a StatefulSet without standby
    /// pods): groups drain the newest first, whatever their lead (`drain_order`).
    pub newest_only: bool,
    /// The plane's `lead` is that of its standby pods (grown in place); past them invokers come
    /// at a new pod's pace, so a group that sets no hold keeps its invokers longer
    /// (`default_hold`).
    pub standby: bool,
}

pub struct Manager<K: ClusterKv, P: ControlPlane> {
    kv: K,
    settings: ManagerSettings,
    plane: Arc<P>,
    started: Instant,
    groups: Vec<GroupLoop>,
    pub status: Arc<Mutex<CapacityStatus>>,
    pub metrics: Arc<CapacityMetrics>,
}

/// The group a tag set's demand belongs to: no tags, `default`; else the group whose tags
/// hold them all, the one with the fewest tags first (the closest fit).
pub fn group_for<'g>(tags: &[String], groups: &'g BTreeMap<String, GroupConfig>) -> Option<&'g str> {
    if tags.is_empty() {
        return groups.contains_key("default").then_some("default");
    }
    groups
        .iter()
        .filter(|(_, g)| tags.iter().all(|t| g.tags.contains(t)))
        .min_by_key(|(_, g)| g.tags.len())
        .map(|(name, _)| name.as_str())
}

impl<K: ClusterKv + Clone, P: ControlPlane> Manager<K, P> {
    pub fn new(kv: K, settings: ManagerSettings, plane: P) -> Self {
        Manager {
            kv,
            settings,
            plane: Arc::new(plane),
            started: Instant::now(),
            groups: Vec::new(),
            status: Arc::default(),
            metrics: Arc::default(),
        }
    }

    fn fresh_groups(&self) -> Vec<GroupLoop> {
        self.settings
            .groups
            .iter()
            .map(|(name, g)| {
                // The invokers' reports lag a decision by up to two publish intervals.
                let spec = GroupSpec {
                    settle: 2 * self.settings.publish_interval,
                    drain_order: drain_order(self.settings.lead, self.settings.newest_only),
                    ..g.spec(name, self.settings.lead, self.settings.standby)
                };
                GroupLoop {
                    name: name.clone(),
                    config: g.clone(),
                    newest_only: self.settings.newest_only,
                    standby: self.settings.standby,
                    status: GroupStatus {
                        name: name.clone(),
                        tags: g.tags.clone(),
                        predictor: g.predictor.name(),
                        control_plane: g.control_plane,
                        scale_down_after_ms: spec.scale_down_after.as_millis() as u64,
                        lead_ms: self.settings.lead.as_millis() as u64,
                        demand_mb: 0,
                        target_mb: 0,
                        target_invokers: 0,
                        counts: GroupCounts::default(),
                        invokers: BTreeMap::new(),
                        decisions: VecDeque::new(),
                        last_failed_start: None,
                        history: VecDeque::new(),
                    },
                    core: GroupCore::new(spec),
                    predictor: g.predictor.build(self.settings.lead),
                    drains: BTreeSet::new(),
                    asked: HashMap::new(),
                    lead: self.settings.lead,
                    starts: VecDeque::new(),
                    stopping: Arc::default(),
                    forgotten_drains: Vec::new(),
                }
            })
            .collect()
    }

    /// Leads when it can, standby otherwise, until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            let Some(lease) = self.acquire(&stop).await else { return };
            tracing::info!("the active capacity manager");
            invoker_telemetry::moment("capacity.leader", &self.settings.api, None);
            self.groups = self.fresh_groups();
            for id in self.plane.found() {
                for g in &mut self.groups {
                    if owns(&g.name, &id) {
                        g.core.handle(Event::Starting { id: id.clone() }, self.started.elapsed());
                    }
                }
            }
            self.take_back_drains().await;
            self.status.lock().leader = true;
            let lost = self.lead_until_lost(lease, &stop).await;
            self.status.lock().leader = false;
            if !lost {
                let _ = self.kv.revoke(lease).await;
                return;
            }
            tracing::warn!("lost the capacity manager's lease: standby");
            invoker_telemetry::moment("capacity.lease.lost", &self.settings.api, Some("the leader's lease was lost"));
        }
    }

    /// Deletes the drain keys a manager before this one wrote for its groups' invokers: this
    /// one starts with every invoker it finds active (it drains again what it still finds
    /// too many, after `scale_down_after`), and one left drained would take no work while
    /// counted as serving. An operator's drains (without `"by": "capacity"`) stay.
    async fn take_back_drains(&self) {
        let prefix = format!("{}/drain/", self.settings.prefix);
        let Ok(drains) = self.kv.get_prefix(&prefix).await else { return };
        for (key, value) in drains {
            let id = key.trim_start_matches(&prefix);
            let ours = !DrainMark::read(&value).by_operator();
            if ours && self.groups.iter().any(|g| owns(&g.name, id)) {
                tracing::info!(invoker = %id, "taking back a drain the manager before left");
                let _ = self.kv.delete(&key).await;
            }
        }
    }

    /// Waits until this manager holds the leader key; `None` when stopped first.
    async fn acquire(&self, stop: &CancellationToken) -> Option<LeaseId> {
        let key = capacity_leader_key(&self.settings.prefix);
        let record =
            LeaderRecord { api: &self.settings.api, boot_id: invoker_etcd::claim::boot_id(), pid: std::process::id() };
        let value = serde_json::to_string(&record).expect("a record serialises");
        let mut said_standby = false;
        // A standby claims again as soon as the leader's key goes (its lease revoked or
        // expired), and every third of a TTL besides.
        let watching = stop.child_token();
        let _watched = watching.clone().drop_guard();
        let mut leader = self.kv.mirror(&key, watching);
        loop {
            let claimed = async {
                let lease =
                    self.kv.grant(self.settings.lease_ttl).await.map_err(|e| ClaimError::Etcd(e.to_string()))?;
                match claim_key(&self.kv, &key, &value, lease, ("capacity manager", "[capacity]", "leader")).await {
                    Ok(()) => Ok(lease),
                    Err(e) => {
                        let _ = self.kv.revoke(lease).await;
                        Err(e)
                    }
                }
            };
            let taken = match claimed.await {
                Ok(lease) => return Some(lease),
                Err(ClaimError::IdTaken { api, pid, .. }) => {
                    if !said_standby {
                        tracing::info!("standby: the active capacity manager is {api} (pid {pid})");
                        said_standby = true;
                    }
                    true
                }
                Err(e) => {
                    tracing::warn!("claiming the capacity manager's key: {e} (retrying)");
                    false
                }
            };
            let gone = async {
                if !taken {
                    return std::future::pending().await;
                }
                // Not before a moment: the watch may not show the leader's claim yet.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = leader.wait_for(|s| s.current && !s.entries.contains_key(&key)).await;
            };
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(self.settings.lease_ttl / 3) => {}
                _ = gone => {}
            }
        }
    }

    /// Decides every tick while the lease lives; true when it was lost, false when stopped.
    /// Between ticks the demand reports are watched: a group whose demand is past what it has
    /// (or has asked for) gets its round as the report comes, and again every `BURST_RECHECK`
    /// while that lasts (a predictor may follow a rise only once it has lasted).
    async fn lead_until_lost(&mut self, lease: LeaseId, stop: &CancellationToken) -> bool {
        let mut renewed = Instant::now();
        let tick = self.settings.tick;
        let watching = stop.child_token();
        let _watched = watching.clone().drop_guard();
        let prefix = &self.settings.prefix;
        let mut reports = self.kv.mirror(&format!("{prefix}/demand/"), watching.clone());
        let mut registrations = self.kv.mirror(&format!("{prefix}/invokers/"), watching);
        // The first round once both are read (bounded: a round on what is known beats none).
        let both_read = async {
            let _ = reports.wait_for(|s| s.current).await;
            let _ = registrations.wait_for(|s| s.current).await;
        };
        let _ = tokio::time::timeout(tick, both_read).await;
        let (mut reports_open, mut registrations_open) = (true, true);
        let mut complained: Option<Instant> = None;
        let mut bursting = false;
        // The first round at once (a group below its min gets its invokers now).
        let mut last_round: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let until_tick = last_round.map_or(Duration::ZERO, |t| (t + tick).saturating_duration_since(now));
            let until_renewal = (renewed + self.settings.lease_ttl / 3).saturating_duration_since(now);
            let mut wait = until_tick.min(until_renewal);
            if bursting {
                wait = wait.min(BURST_RECHECK);
            }
            // A registration only times the starts it ends: the rounds keep their own pace.
            let mut sighting = false;
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(wait) => {}
                changed = reports.changed(), if reports_open => reports_open = changed.is_ok(),
                changed = registrations.changed(), if registrations_open => {
                    registrations_open = changed.is_ok();
                    self.sighted(&registrations.borrow_and_update());
                    sighting = true;
                }
            }
            if renewed.elapsed() >= self.settings.lease_ttl / 3 {
                match self.kv.keep_alive(lease).await {
                    Ok(Some(_)) => renewed = Instant::now(),
                    Ok(None) => return true,
                    Err(e) if renewed.elapsed() >= self.settings.lease_ttl => {
                        tracing::warn!("etcd: {e}; the lease is past its TTL");
                        return true;
                    }
                    Err(_) => {}
                }
            }
            bursting = self.a_burst_waits(&reports.borrow_and_update());
            let due = |every: Duration| last_round.is_none_or(|t| t.elapsed() >= every);
            if (!due(tick) && !bursting) || (sighting && !due(tick) && !due(BURST_RECHECK)) {
                continue;
            }
            last_round = Some(Instant::now());
            let (demand, invokers) = (reports.borrow().clone(), registrations.borrow().clone());
            if demand.current && invokers.current {
                self.round(&demand, &invokers).await;
                complained = None;
            } else if complained.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                tracing::warn!("etcd cannot be read: nothing decided until it can");
                complained = Some(Instant::now());
            }
            bursting = self.a_burst_waits(&reports.borrow());
        }
    }

    /// Invokers asked for that now serve (registered with their nodes): their start is timed
    /// as the registration comes, not at the next round (a tick or 200 ms later).
    fn sighted(&mut self, registrations: &Snapshot) {
        let prefix = &self.settings.prefix;
        for g in &mut self.groups {
            let serving: Vec<(String, Duration)> = g
                .asked
                .iter()
                .filter(|(id, _)| {
                    let value = registrations.entries.get(&invoker_key(prefix, id));
                    let record = value.and_then(|v| serde_json::from_str::<InvokerRecord>(v).ok());
                    record.is_some_and(|r| !r.nodes.is_empty())
                })
                .map(|(id, asked)| (id.clone(), asked.elapsed()))
                .collect();
            for (id, took) in serving {
                g.asked.remove(&id);
                g.started(took, &self.metrics);
            }
        }
    }

    /// Whether a group's demand, as `reports` say, is past the memory of what it has or has
    /// asked for.
    fn a_burst_waits(&self, reports: &Snapshot) -> bool {
        if !reports.current {
            return false;
        }
        let demand = self.demand_of(reports.entries.values().map(String::as_str));
        self.groups.iter().any(|g| {
            let have_mb = u64::from(g.core.have()) * g.config.invoker_memory_mb;
            demand.get(&g.name).is_some_and(|mb| *mb > have_mb)
        })
    }

    /// Each group's demand in MB, from the schedulers' reports: what their calls take in the
    /// group's invokers when each must fit whole on one (`packing::packed_demand_mb`).
    fn demand_of<'a>(&self, reports: impl Iterator<Item = &'a str>) -> BTreeMap<String, u64> {
        let groups = &self.settings.groups;
        let mut demand: BTreeMap<&str, (u64, CallsByMb)> = BTreeMap::new();
        for value in reports {
            let Ok(report) = serde_json::from_str::<DemandReport>(value) else { continue };
            for needs in report.needs {
                if let Some(group) = group_for(&needs.tags, groups) {
                    let (total_mb, calls) = demand.entry(group).or_default();
                    *total_mb += needs.needs.total_mb();
                    for (mb, n) in needs.needs.calls_by_mb {
                        *calls.entry(mb).or_insert(0) += n;
                    }
                }
            }
        }
        demand
            .into_iter()
            .map(|(name, (total_mb, calls))| {
                let invoker_mb = groups[name].invoker_memory_mb;
                (name.to_string(), packed_demand_mb(total_mb, &calls, invoker_mb))
            })
            .collect()
    }

    /// One round, on the registrations and the demand reports as watched: decide and carry
    /// out, for every group.
    async fn round(&mut self, reports: &Snapshot, registrations: &Snapshot) {
        let now = self.started.elapsed();
        let mut records: BTreeMap<String, InvokerRecord> = BTreeMap::new();
        for value in registrations.entries.values() {
            if let Ok(record) = serde_json::from_str::<InvokerRecord>(value) {
                records.insert(record.id.clone(), record);
            }
        }
        let demand = self.demand_of(reports.entries.values().map(String::as_str));
        let mut groups = std::mem::take(&mut self.groups);
        for g in &mut groups {
            let demand_mb = demand.get(&g.name).copied().unwrap_or(0);
            let decisions = self.decide(g, &records, demand_mb, now);
            self.carry_out(g, decisions).await;
            self.publish(g);
        }
        self.groups = groups;
        let mut status = self.status.lock();
        status.groups = self.groups.iter().map(|g| g.status.clone()).collect();
        status.rounds.0.send_modify(|n| *n += 1);
    }

    fn decide(
        &self,
        g: &mut GroupLoop,
        records: &BTreeMap<String, InvokerRecord>,
        demand_mb: u64,
        now: Duration,
    ) -> Vec<Decision> {
        let mut decisions = Vec::new();
        let stopping = g.stopping.lock().clone();
        let name = g.name.clone();
        for (id, record) in records.iter().filter(|(id, _)| owns(&name, id)) {
            // Up once it serves: an invoker claims its key before its factory starts, and
            // publishes its headroom after.
            if stopping.contains_key(id) || record.nodes.is_empty() {
                continue;
            }
            if let Some(asked) = g.asked.remove(id) {
                g.started(asked.elapsed(), &self.metrics);
            }
            decisions.extend(g.core.handle(Event::Up { id: id.clone() }, now));
            decisions.extend(g.core.handle(Event::Busy { id: id.clone(), busy_mb: record.busy_mb() }, now));
            // Whether a report is taken (settling after a reactivation, trusted after a drain) is
            // the core's to decide: `GroupSpec::settle`.
            let serving = matches!(record.health, Health::Healthy | Health::Overloaded);
            decisions.extend(g.core.handle(Event::Serving { id: id.clone(), serving }, now));
            if record.health == Health::Drained {
                decisions.extend(g.core.handle(Event::Drained { id: id.clone() }, now));
            }
        }
        let members: Vec<(String, MemberState)> = g.core.members().map(|m| (m.id.clone(), m.state)).collect();
        for (id, state) in members {
            let seen = Sighting {
                registered: records.contains_key(&id),
                running: self.plane.running(&id),
                stopped: stopping.get(&id) == Some(&true),
            };
            let gone = state.gone_when(seen);
            if gone {
                if let MemberState::Provisioning { .. } = state {
                    let why = self.plane.last_error(&id).unwrap_or_else(|| "no error it left".into());
                    tracing::warn!(invoker = %id, "exited before it registered: {why}");
                    let action = format!("{id} did not start");
                    g.status.last_failed_start = Some(DecisionLog { at_ms: epoch_ms(), action, reason: why });
                } else if state != MemberState::Removing {
                    tracing::warn!(invoker = %id, "an invoker of group {} is gone", g.name);
                }
                g.stopping.lock().remove(&id);
                if g.drains.remove(&id) {
                    g.forgotten_drains.push(id.clone());
                }
                g.asked.remove(&id);
                self.plane.forget(&id);
                g.core.handle(Event::Gone { id }, now);
            }
        }
        let active_mb = u64::from(g.core.counts().active) * g.config.invoker_memory_mb;
        let target_mb = g.predictor.target_mb(now, demand_mb, active_mb);
        decisions.extend(g.core.handle(Event::Tick { target_mb }, now));
        g.status.demand_mb = demand_mb;
        g.status.target_mb = target_mb;
        decisions
    }

    async fn carry_out(&self, g: &mut GroupLoop, decisions: Vec<Decision>) {
        for id in std::mem::take(&mut g.forgotten_drains) {
            if let Err(e) = self.kv.delete(&drain_key(&self.settings.prefix, &id)).await {
                tracing::warn!(invoker = %id, "taking back its drain: {e}");
            }
        }
        for decision in decisions {
            tracing::info!(group = %g.name, "{}: {}", decision.action, decision.reason);
            // The decision's span lasts while it is carried out (a provision, until the plane
            // has asked; a removal, until the invoker is stopped).
            let span = tracing::info_span!(
                target: invoker_telemetry::TARGET,
                parent: None,
                "capacity.decision",
                group = %g.name,
                action = %decision.action,
                reason = %decision.reason,
                demand_mb = g.status.demand_mb,
                target_mb = g.status.target_mb,
                "otel.status_code" = tracing::field::Empty,
                "otel.status_description" = tracing::field::Empty,
            );
            let kind = match &decision.action {
                Action::Provision { ids } => {
                    for id in ids {
                        g.asked.insert(id.clone(), Instant::now());
                        let spec = InvokerSpec {
                            id: id.clone(),
                            group: g.name.clone(),
                            tags: g.config.tags.clone(),
                            memory_mb: g.config.invoker_memory_mb,
                        };
                        if let Err(e) = self.plane.provision(&spec).await {
                            // Given up at the provision timeout, and asked for again.
                            tracing::warn!("{e}");
                            invoker_telemetry::failed(&span, &e.to_string());
                        }
                    }
                    "provision"
                }
                Action::Drain { id } => {
                    let value = DrainMark::capacity(epoch_ms()).to_value();
                    if let Err(e) = self.kv.put(&drain_key(&self.settings.prefix, id), &value, None).await {
                        tracing::warn!(invoker = %id, "draining: {e}");
                        invoker_telemetry::failed(&span, &e.to_string());
                    }
                    g.drains.insert(id.clone());
                    "drain"
                }
                Action::Reactivate { id } => {
                    if let Err(e) = self.kv.delete(&drain_key(&self.settings.prefix, id)).await {
                        tracing::warn!(invoker = %id, "reactivating: {e}");
                        invoker_telemetry::failed(&span, &e.to_string());
                    }
                    g.drains.remove(id);
                    "reactivate"
                }
                Action::Remove { id } => {
                    g.stopping.lock().insert(id.clone(), false);
                    let (plane, stopping, id) = (self.plane.clone(), g.stopping.clone(), id.clone());
                    let span = span.clone();
                    tokio::spawn(async move {
                        if let Err(e) = plane.remove(&id).await {
                            tracing::warn!("{e}");
                            invoker_telemetry::failed(&span, &e.to_string());
                        }
                        if let Some(done) = stopping.lock().get_mut(&id) {
                            *done = true;
                        }
                    });
                    "remove"
                }
            };
            self.metrics.decisions.get_or_create(&DecisionLabel { group: g.name.clone(), kind }).inc();
            g.status.decisions.push_back(DecisionLog {
                at_ms: epoch_ms(),
                action: decision.action.to_string(),
                reason: decision.reason,
            });
            if g.status.decisions.len() > KEPT_DECISIONS {
                g.status.decisions.pop_front();
            }
        }
    }

    fn publish(&self, g: &mut GroupLoop) {
        let counts = g.core.counts();
        g.status.counts = counts;
        g.status.target_invokers = g.core.target();
        g.status.invokers = g
            .core
            .members()
            .map(|m| {
                let state = match m.state {
                    MemberState::Provisioning { .. } => "provisioning",
                    MemberState::Active => "active",
                    MemberState::Draining { .. } => "draining",
                    MemberState::Removing => "removing",
                };
                (m.id.clone(), state)
            })
            .collect();
        for (state, n) in [
            ("provisioning", counts.provisioning),
            ("active", counts.active),
            ("draining", counts.draining),
            ("removing", counts.removing),
        ] {
            let label = GroupState { group: g.name.clone(), state };
            self.metrics.invokers.get_or_create(&label).set(i64::from(n));
        }
        let at_ms = epoch_ms();
        let history = &mut g.status.history;
        while history.front().is_some_and(|s| s.at_ms + HISTORY.as_millis() as u64 <= at_ms)
            || history.len() >= HISTORY_MAX
        {
            history.pop_front();
        }
        history.push_back(Sample {
            at_ms,
            demand_mb: g.status.demand_mb,
            target_mb: g.status.target_mb,
            active: counts.active,
            provisioning: counts.provisioning,
            draining: counts.draining,
        });
        let label = GroupLabel { group: g.name.clone() };
        self.metrics.demand_mb.get_or_create(&label).set(g.status.demand_mb as i64);
        self.metrics.target_mb.get_or_create(&label).set(g.status.target_mb as i64);
    }
}

/// Whether `id` is an invoker of group `name` (`<name>-<n>`).
fn owns(name: &str, id: &str) -> bool {
    invoker_core::capacity::ordinal_in(name, id).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_goes_to_the_closest_group_that_holds_its_tags() {
        let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let group = |t: &[&str]| GroupConfig { tags: tags(t), ..GroupConfig::default() };
        let groups = &BTreeMap::from([
            ("default".to_string(), group(&[])),
            ("gpu".to_string(), group(&["gpu"])),
            ("gpu-ssd".to_string(), group(&["gpu", "ssd"])),
        ]);
        assert_eq!(group_for(&[], groups), Some("default"));
        assert_eq!(group_for(&tags(&["gpu"]), groups), Some("gpu"));
        assert_eq!(group_for(&tags(&["ssd"]), groups), Some("gpu-ssd"));
        assert_eq!(group_for(&tags(&["tpu"]), groups), None);
        assert!(owns("gpu", "gpu-3") && !owns("gpu", "gpu-ssd-3") && !owns("gpu", "gpu-") && !owns("gpu", "gpux-1"));
    }
}
