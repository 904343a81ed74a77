//! Carries out a scheduler's provisioned asks (`provisioned.rs` decides them): computes them
//! from its actions and its view of the cluster, keeps them in etcd under a lease of its own,
//! and counts their memory as demand.

use super::demand::Stage;
use super::provisioned::assign;
use super::Dispatcher;
use invoker_etcd::kv::{ClusterKv, LeaseId};
use invoker_wire::cluster::{cluster_revision, provisioned_key, Health, ProvisionedEntry};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the asks are computed again when nothing says they changed (a lease renewal, a
/// scheduler's slice after an etcd error).
const EVERY: Duration = Duration::from_secs(2);

/// One ask: what its key says, and the demand it stands for.
#[derive(Clone, PartialEq)]
struct Ask {
    value: String,
    tags: Vec<String>,
    memory_mb: u64,
    count: u32,
}

impl Dispatcher {
    /// What this scheduler asks of every invoker now, by key.
    fn provisioned_asks(&self) -> BTreeMap<String, Ask> {
        let mut asks = BTreeMap::new();
        let actions = self.provisioned.all();
        if actions.is_empty() {
            return asks;
        }
        let view = self.directory.current();
        let taking: Vec<(&str, &[String])> = view
            .invokers
            .values()
            .filter(|r| matches!(r.health, Health::Healthy | Health::Overloaded))
            .filter(|r| !view.drained.contains(&r.id) && !self.stalls.contains(&r.id))
            .map(|r| (r.id.as_str(), r.tags.as_slice()))
            .collect();
        for (action, wanted) in actions {
            let needs = super::needs_of(&action);
            let mut tags = needs.tags.clone();
            tags.sort_unstable();
            let tagged: Vec<&str> =
                taking.iter().filter(|(_, has)| tags.iter().all(|t| has.contains(t))).map(|(id, _)| *id).collect();
            let invokers = match (tagged.is_empty(), needs.strict) {
                (true, false) => taking.iter().map(|(id, _)| *id).collect(),
                _ => tagged,
            };
            let name = format!("{}/{}", action.namespace, action.name);
            let revision = cluster_revision(&self.id, action.revision, action.updated);
            for (invoker, count) in assign(&name, wanted, &self.id, &view.schedulers, &invokers) {
                let key = provisioned_key(&self.prefix, &invoker, &self.id, &action.namespace, &action.name);
                let value = serde_json::to_string(&ProvisionedEntry { revision, count }).expect("an entry serialises");
                asks.insert(key, Ask { value, tags: tags.clone(), memory_mb: needs.memory_mb, count });
            }
        }
        asks
    }

    /// Publishes this scheduler's asks whenever they change (an action saved or deleted, the
    /// invokers or the schedulers read anew), under a lease of its own, until `stop`; then
    /// revokes it, and the asks go with it.
    pub async fn publish_provisioned(self: Arc<Self>, ttl: Duration, stop: CancellationToken) {
        let mut readings = self.directory.readings();
        let mut written: BTreeMap<String, Ask> = BTreeMap::new();
        let mut counted: BTreeMap<String, Ask> = BTreeMap::new();
        let mut lease: Option<(LeaseId, Instant)> = None;
        let mut complained: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(EVERY) => {}
                _ = self.provisioned.changed.notified() => {}
                _ = readings.changed() => {}
            }
            let asks = self.provisioned_asks();
            self.count_demand(&counted, &asks);
            counted = asks.clone();
            if let Err(e) = self.write_asks(&asks, &mut written, &mut lease, ttl).await {
                if complained.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!("the scheduler's provisioned containers: {e} (retrying)");
                    complained = Some(Instant::now());
                }
            }
        }
        self.count_demand(&counted, &BTreeMap::new());
        if let Some((l, _)) = lease {
            let _ = self.kv.revoke(l).await;
        }
    }

    /// What the asks stand for, as in-flight demand: what `before` counted goes, `now` comes.
    fn count_demand(&self, before: &BTreeMap<String, Ask>, now: &BTreeMap<String, Ask>) {
        for (key, ask) in before {
            if now.get(key) != Some(ask) {
                (0..ask.count).for_each(|_| self.demand.remove(&ask.tags, Stage::InFlight, ask.memory_mb));
            }
        }
        for (key, ask) in now {
            if before.get(key) != Some(ask) {
                (0..ask.count).for_each(|_| self.demand.add(&ask.tags, Stage::InFlight, ask.memory_mb));
            }
        }
    }

    /// Brings etcd to `asks`: keys that changed are put, those gone deleted. A lost lease took
    /// every key with it: all are put again under a new one.
    async fn write_asks(
        &self,
        asks: &BTreeMap<String, Ask>,
        written: &mut BTreeMap<String, Ask>,
        lease: &mut Option<(LeaseId, Instant)>,
        ttl: Duration,
    ) -> Result<(), String> {
        if let Some((l, renewed)) = *lease {
            if renewed.elapsed() >= ttl {
                *lease = None;
            } else if renewed.elapsed() >= ttl / 3 {
                match self.kv.keep_alive(l).await.map_err(|e| e.to_string())? {
                    Some(_) => *lease = Some((l, Instant::now())),
                    None => *lease = None,
                }
            }
        }
        if lease.is_none() {
            written.clear();
            if asks.is_empty() {
                return Ok(());
            }
            *lease = Some((self.kv.grant(ttl).await.map_err(|e| e.to_string())?, Instant::now()));
        }
        let (l, _) = lease.expect("granted above");
        let gone: Vec<String> = written.keys().filter(|k| !asks.contains_key(*k)).cloned().collect();
        for key in gone {
            self.kv.delete(&key).await.map_err(|e| e.to_string())?;
            written.remove(&key);
        }
        for (key, ask) in asks {
            if written.get(key).map(|a| &a.value) != Some(&ask.value) {
                self.kv.put(key, &ask.value, Some(l)).await.map_err(|e| e.to_string())?;
                written.insert(key.clone(), ask.clone());
            }
        }
        Ok(())
    }
}
