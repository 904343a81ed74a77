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

/// What the watch saw.
#[derive(Clone, Debug, Default)]
pub struct FleetSeen {
    pub invoker_seconds: f64,
    pub invokers_max: usize,
    /// Idle containers' memory, integrated (MB·s).
    pub idle_mb_s: f64,
    /// Invokers asked for, or taken back from a drain.
    pub grown: u64,
    pub drained: u64,
    pub removed: u64,
    /// A drain within the reversal window of a growth, or a growth within it of a drain.
    pub reversals: u64,
    /// Each invoker's time from being asked for to serving (active).
    pub start_latencies: Vec<Duration>,
    /// Looks that failed (the manager or etcd did not answer in time).
    pub missed_looks: u64,
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
        Watch { task: tokio::spawn(watch(capacity, etcd.ok(), reversal, until)) }
    }

    /// What it saw, once the horizon has passed.
    pub async fn seen(self) -> FleetSeen {
        self.task.await.unwrap_or_default()
    }
}

/// One look: the default group's invokers and their states, and every registered invoker's
/// idle memory.
async fn look(capacity: &str, etcd: Option<&Etcd>) -> Option<(BTreeMap<String, String>, u64)> {
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
    let idle_mb = match etcd {
        Some(etcd) => {
            let registered =
                tokio::time::timeout(Duration::from_secs(2), etcd.get_prefix(&format!("{PREFIX}/invokers/")))
                    .await
                    .ok()?
                    .ok()?;
            registered
                .iter()
                .filter_map(|(_, value)| serde_json::from_str::<InvokerRecord>(value).ok())
                .flat_map(|r| r.nodes)
                .map(|n| n.idle_mb)
                .sum()
        }
        None => 0,
    };
    Some((states, idle_mb))
}

async fn watch(capacity: String, etcd: Option<Etcd>, reversal: Duration, until: Instant) -> FleetSeen {
    let mut seen = FleetSeen::default();
    let mut before: BTreeMap<String, String> = BTreeMap::new();
    let mut asked_at: BTreeMap<String, Instant> = BTreeMap::new();
    let (mut last_grown, mut last_drained): (Option<Instant>, Option<Instant>) = (None, None);
    let mut last_look = Instant::now();
    loop {
        tokio::time::sleep(EVERY).await;
        if Instant::now() >= until {
            break;
        }
        let Some((now_states, idle_mb)) = look(&capacity, etcd.as_ref()).await else {
            seen.missed_looks += 1;
            continue;
        };
        let now = Instant::now();
        let dt = now.duration_since(last_look).as_secs_f64();
        last_look = now;
        seen.invoker_seconds += now_states.len() as f64 * dt;
        seen.invokers_max = seen.invokers_max.max(now_states.len());
        seen.idle_mb_s += idle_mb as f64 * dt;
        for (id, state) in &now_states {
            let was = before.get(id).map(String::as_str);
            let grew = match (was, state.as_str()) {
                (None, _) => {
                    asked_at.insert(id.clone(), now);
                    true
                }
                (Some("draining"), "active") => true,
                _ => false,
            };
            if grew {
                seen.grown += 1;
                if last_drained.is_some_and(|t| now < t + reversal) {
                    seen.reversals += 1;
                }
                last_grown = Some(now);
            }
            if state == "draining" && was != Some("draining") {
                seen.drained += 1;
                if last_grown.is_some_and(|t| now < t + reversal) {
                    seen.reversals += 1;
                }
                last_drained = Some(now);
            }
            if state == "active" && was == Some("provisioning") {
                if let Some(at) = asked_at.remove(id) {
                    seen.start_latencies.push(now.duration_since(at));
                }
            }
        }
        seen.removed += before.keys().filter(|id| !now_states.contains_key(*id)).count() as u64;
        before = now_states;
    }
    seen
}
