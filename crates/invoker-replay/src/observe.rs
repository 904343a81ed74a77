//! The fleet as the replay watches it while the calls run: the capacity manager's invokers and
//! their states (`GET /v1/capacity`), and the idle memory each invoker registers in etcd, every
//! [`EVERY`]. From them: invoker-seconds (an invoker costs from when it is asked for until it is
//! gone, as the simulator counts), idle memory-time, the decisions and their reversals, and how
//! long an invoker takes from being asked for to serving (the simulator's provisioning latency).

use crate::cluster::{Cluster, ADMIN_KEY, PREFIX};
use invoker_etcd::client::Etcd;
use invoker_etcd::kv::ClusterKv as _;
use invoker_wire::cluster::InvokerRecord;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// How often the fleet is looked at.
const EVERY: Duration = Duration::from_millis(100);
/// Every this many looks, each registered invoker's `/metrics` is read too.
const SCRAPE_EVERY: u64 = 10;

/// What the watch saw.
#[derive(Clone, Debug, Default)]
pub struct FleetSeen {
    pub invoker_seconds: f64,
    pub invokers_max: usize,
    /// Idle containers' memory, integrated (MB·s).
    pub idle_mb_s: f64,
    /// A drain within the reversal window of a growth, or a growth within it of a drain.
    pub reversals: u64,
    /// Each invoker's time from being asked for (first seen provisioning) to its registration
    /// showing its node (a scheduler may place on it).
    pub start_latencies: Vec<Duration>,
    /// Looks that failed (the manager or etcd did not answer in time).
    pub missed_looks: u64,
    /// Each look: seconds from the start, and how many invokers the group had.
    pub counts: Vec<(f64, usize)>,
    /// The demand the manager's last round took and the target it set, integrated (MB·s).
    pub demand_mb_s: f64,
    pub target_mb_s: f64,
    /// Each look's seconds from the start, and the manager's demand and target then (MB).
    pub manager: Vec<(f64, u64, u64)>,
    /// Per invoker, its containers' removals as its `/metrics` last said: (seconds in all,
    /// how many).
    pub removals: BTreeMap<String, (f64, u64)>,
    /// The calls that found no invoker with room, as the scheduler's `/metrics` said at the
    /// end: (seconds they waited in all, how many).
    pub room_waits: Option<(f64, u64)>,
}

impl FleetSeen {
    /// The mean time from a pool's asking a container to go to its being gone, over every
    /// invoker's removals (`None` when none was seen).
    pub fn remove_latency(&self) -> Option<Duration> {
        let (seconds, count) = self.removals.values().fold((0.0, 0), |(s, n), (ds, dn)| (s + ds, n + dn));
        (count > 0).then(|| Duration::from_secs_f64(seconds / count as f64))
    }

    /// The invokers the group had, averaged over each `minute` (a minute of the trace,
    /// compressed) up to `horizon`, to one decimal.
    pub fn invokers_by_minute(&self, minute: Duration, horizon: Duration) -> Vec<f64> {
        let minute = minute.as_secs_f64().max(1e-6);
        let buckets = ((horizon.as_secs_f64() / minute) as usize).max(1);
        let mut sums = vec![(0.0, 0usize); buckets];
        for &(at, count) in &self.counts {
            if let Some(bucket) = sums.get_mut((at / minute) as usize) {
                bucket.0 += count as f64;
                bucket.1 += 1;
            }
        }
        sums.into_iter().map(|(sum, n)| if n == 0 { 0.0 } else { (sum / n as f64 * 10.0).round() / 10.0 }).collect()
    }

    /// The manager's demand and target as looked at, averaged over each minute (MB).
    pub fn manager_by_minute(&self, minute: Duration, horizon: Duration) -> Vec<(u64, u64)> {
        let minute = minute.as_secs_f64().max(1e-6);
        let buckets = ((horizon.as_secs_f64() / minute) as usize).max(1);
        let mut sums = vec![(0u64, 0u64, 0u64); buckets];
        for &(at, demand, target) in &self.manager {
            if let Some(bucket) = sums.get_mut((at / minute) as usize) {
                *bucket = (bucket.0 + demand, bucket.1 + target, bucket.2 + 1);
            }
        }
        sums.into_iter().map(|(d, t, n)| (d / n.max(1), t / n.max(1))).collect()
    }
}

pub struct Watch {
    task: tokio::task::JoinHandle<FleetSeen>,
}

impl Watch {
    /// Watches from now until `horizon` has passed: the slice's length, over which the
    /// simulator counts the fleet too.
    pub fn start(cluster: &Cluster, reversal: Duration, horizon: Duration) -> Watch {
        let capacity = format!("{}/v1/capacity", cluster.capacity);
        let etcd = Etcd::new(std::slice::from_ref(&cluster.etcd_url));
        let until = Instant::now() + horizon;
        let pids = cluster.work.join("capacity").join("invokers");
        Watch { task: tokio::spawn(watch(capacity, etcd.ok(), pids, reversal, until)) }
    }

    /// What it saw, once the horizon has passed.
    pub async fn seen(self) -> FleetSeen {
        self.task.await.unwrap_or_default()
    }
}

/// One look: the default group's invokers and their states, and every registered invoker's
/// idle memory.
/// One look at the fleet.
struct Look {
    /// The default group's invokers and their states.
    states: BTreeMap<String, String>,
    /// The demand and the target of the manager's last round (MB).
    demand_mb: u64,
    target_mb: u64,
    /// Every registered invoker's idle memory.
    idle_mb: u64,
    /// Each registered invoker's id and API.
    apis: Vec<(String, String)>,
    /// The invokers whose registration shows their node: a scheduler may place on them.
    serving: std::collections::BTreeSet<String>,
}

async fn look(capacity: &str, etcd: Option<&Etcd>) -> Option<Look> {
    let (status, body) = crate::client::get(capacity, Some(ADMIN_KEY)).await.ok()?;
    if status != 200 {
        return None;
    }
    let answer: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let group = answer["groups"].as_array()?.iter().find(|g| g["name"] == "default")?;
    let states = group["invokers"]
        .as_object()?
        .iter()
        .map(|(id, state)| (id.clone(), state.as_str().unwrap_or_default().to_string()))
        .collect();
    let records: Vec<InvokerRecord> = match etcd {
        Some(etcd) => {
            let prefix = format!("{PREFIX}/invokers/");
            let registered = tokio::time::timeout(Duration::from_secs(2), etcd.get_prefix(&prefix)).await.ok()?.ok()?;
            registered.iter().filter_map(|(_, value)| serde_json::from_str::<InvokerRecord>(value).ok()).collect()
        }
        None => Vec::new(),
    };
    let idle_mb = records.iter().flat_map(|r| &r.nodes).map(|n| n.idle_mb).sum();
    let serving = records.iter().filter(|r| !r.nodes.is_empty()).map(|r| r.id.clone()).collect();
    let apis = records.into_iter().map(|r| (r.id, r.api)).collect();
    let (demand_mb, target_mb) = (group["demand_mb"].as_u64().unwrap_or(0), group["target_mb"].as_u64().unwrap_or(0));
    Some(Look { states, demand_mb, target_mb, idle_mb, apis, serving })
}

/// What an invoker's `/metrics` says of its containers' removals: (seconds in all, how many).
async fn removals(api: &str) -> Option<(f64, u64)> {
    histogram(api, "invoker_container_remove_seconds").await
}

/// What the scheduler's `/metrics` says of the calls that found no invoker with room: (seconds
/// they waited in all, how many), placed or refused at `wait_for_room`.
pub async fn room_waits(scheduler: &str) -> Option<(f64, u64)> {
    histogram(scheduler, "scheduler_room_wait_seconds").await
}

/// A histogram's sum and count from the `/metrics` of the process at `api`.
async fn histogram(api: &str, name: &str) -> Option<(f64, u64)> {
    let url = format!("{}/metrics", api.trim_end_matches('/'));
    let (status, body) = crate::client::get(&url, Some(ADMIN_KEY)).await.ok()?;
    if status != 200 {
        return None;
    }
    let text = String::from_utf8_lossy(&body);
    let value = |suffix: &str| {
        let prefix = format!("{name}_{suffix} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)?.trim().parse::<f64>().ok())
    };
    Some((value("sum")?, value("count")? as u64))
}

async fn watch(
    capacity: String,
    etcd: Option<Etcd>,
    pids: std::path::PathBuf,
    reversal: Duration,
    until: Instant,
) -> FleetSeen {
    let mut seen = FleetSeen::default();
    let mut before: BTreeMap<String, String> = BTreeMap::new();
    let mut asked_at: BTreeMap<String, Instant> = BTreeMap::new();
    let (mut last_grown, mut last_drained): (Option<Instant>, Option<Instant>) = (None, None);
    let began = Instant::now();
    let mut looks = 0u64;
    let mut last_look = began;
    loop {
        tokio::time::sleep(EVERY).await;
        if Instant::now() >= until {
            break;
        }
        let Some(Look { states: now_states, demand_mb, target_mb, idle_mb, apis, serving }) =
            look(&capacity, etcd.as_ref()).await
        else {
            seen.missed_looks += 1;
            continue;
        };
        looks += 1;
        if looks.is_multiple_of(SCRAPE_EVERY) {
            for (id, api) in apis {
                if let Some(counted) = removals(&api).await {
                    seen.removals.insert(id, counted);
                }
            }
        }
        let now = Instant::now();
        let dt = now.duration_since(last_look).as_secs_f64();
        last_look = now;
        seen.invoker_seconds += now_states.len() as f64 * dt;
        seen.invokers_max = seen.invokers_max.max(now_states.len());
        seen.counts.push((now.duration_since(began).as_secs_f64(), now_states.len()));
        seen.idle_mb_s += idle_mb as f64 * dt;
        seen.demand_mb_s += demand_mb as f64 * dt;
        seen.manager.push((now.duration_since(began).as_secs_f64(), demand_mb, target_mb));
        seen.target_mb_s += target_mb as f64 * dt;
        for (id, state) in &now_states {
            let was = before.get(id).map(String::as_str);
            let grew = match (was, state.as_str()) {
                (None, state) => {
                    if state == "provisioning" {
                        asked_at.insert(id.clone(), now);
                    }
                    true
                }
                (Some("draining"), "active") => true,
                _ => false,
            };
            if grew {
                if last_drained.is_some_and(|t| now < t + reversal) {
                    seen.reversals += 1;
                }
                last_grown = Some(now);
            }
            if state == "draining" && was != Some("draining") {
                if last_grown.is_some_and(|t| now < t + reversal) {
                    seen.reversals += 1;
                }
                last_drained = Some(now);
            }
        }
        // Up once its registration shows its node (what a scheduler places by), not once the
        // manager's next round calls it active (up to a tick later); started when the local
        // plane spawned it and wrote its pid file (the manager's status shows it only after its
        // round, when a fast invoker may already be up).
        for id in &serving {
            if asked_at.remove(id).is_some() {
                let spawned = std::fs::metadata(pids.join(format!("{id}.pid"))).and_then(|m| m.modified());
                if let Ok(Ok(took)) = spawned.map(|at| std::time::SystemTime::now().duration_since(at)) {
                    seen.start_latencies.push(took);
                }
            }
        }
        before = now_states;
    }
    seen
}
