//! The invoker's registration in etcd. One task beside the pool: every `publish_interval` it
//! reads the pool's snapshot (one message to the pool, never one per activation), puts the
//! invoker's record when it changed and the keys of the containers that came and went, and
//! keeps the lease alive. etcd down or slow costs activations nothing: every call is bounded,
//! a failure is logged, and once etcd answers again a lease that expired meanwhile is replaced
//! and every key is put again.

use crate::activation::ActivationService;
use crate::config::ClusterConfig;
use crate::pool::actor::PoolHandle;
use crate::pool::status::ContainerSummary;
use invoker_etcd::claim::{boot_id, claim_key, ClaimError};
use invoker_etcd::kv::ClusterKv;
use invoker_etcd::kv::LeaseId;
use invoker_factory::contract::StatsReceiver;
use invoker_wire::cluster::Health;
use invoker_wire::cluster::{container_key, drain_key, invoker_key, DrainMark, InvokerRecord, NodeHeadroom};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What the registration says of this invoker besides the pool's state.
#[derive(Clone, Debug)]
pub struct Identity {
    pub invoker_id: String,
    pub api: String,
    pub tags: Vec<String>,
    /// The smallest action's memory: below it the invoker is overloaded.
    pub min_mb: u64,
}

pub struct Registrar<K: ClusterKv> {
    kv: K,
    config: ClusterConfig,
    identity: Identity,
    lease: Option<LeaseId>,
    /// When the lease was last renewed (or granted).
    renewed: Instant,
    /// What etcd holds of this invoker, as last put under the current lease.
    published: Option<InvokerRecord>,
    containers: BTreeMap<u64, String>,
    /// The pool's warm generation `containers` is in step with (`None`: not yet, or the
    /// keys went with a lease), so that an unchanged pool costs no view of its containers.
    synced: Option<u64>,
    /// When the last failure was logged (failures repeat every interval while etcd is away).
    last_complaint: Option<Instant>,
    /// This machine's boot, read once.
    boot_id: String,
    /// The operator's last word on draining this invoker, as seen in its drain key, and the
    /// file in the data dir that keeps it across restarts. Put back should etcd lose it.
    operator_drain: Option<DrainMark>,
    drain_file: Option<PathBuf>,
    /// The factory's node stats, when what the invoker offers follows its pod's memory limit:
    /// it is in the cluster only while that leaves something (a standby pod's does not), and a
    /// resize is published as it comes, not at the next interval.
    offer: Option<StatsReceiver>,
    /// Its idle containers were shed for the capacity manager's drain now in force.
    shed: bool,
}

/// How soon a round comes again when the pool had not yet seen the memory the factory offers.
const CATCH_UP: Duration = Duration::from_millis(50);

/// The memory every node of the snapshot offers to actions.
fn offered_mb(stats: &StatsReceiver) -> u64 {
    stats.borrow().iter().map(|n| n.capacity_mb).sum()
}

/// Returns once the memory offered differs from `before` (never without a followed offer, or
/// once its factory is gone).
async fn offer_changed(offer: &mut Option<StatsReceiver>, before: u64) {
    let Some(stats) = offer else { return std::future::pending().await };
    loop {
        if stats.changed().await.is_err() {
            return std::future::pending().await;
        }
        if offered_mb(stats) != before {
            return;
        }
    }
}

impl<K: ClusterKv> Registrar<K> {
    pub fn new(kv: K, config: ClusterConfig, identity: Identity) -> Self {
        Registrar {
            kv,
            config,
            identity,
            lease: None,
            renewed: Instant::now(),
            published: None,
            containers: BTreeMap::new(),
            synced: None,
            last_complaint: None,
            boot_id: boot_id(),
            operator_drain: None,
            drain_file: None,
            offer: None,
            shed: false,
        }
    }

    /// Follows what the invoker offers in `stats` (its factory's): out of the cluster while it
    /// offers nothing, each change published at once.
    pub fn following_offer(mut self, stats: StatsReceiver) -> Self {
        self.offer = Some(stats);
        self
    }

    /// Whether the invoker offers anything (always, when its offer is fixed).
    fn offers(&self) -> bool {
        self.offer.as_ref().is_none_or(|stats| offered_mb(stats) > 0)
    }

    /// Leaves the cluster (the lease revoked: the record, its containers' keys and the id's
    /// claim go with it) until the invoker offers memory again.
    async fn stand_by(&mut self) {
        let Some(lease) = self.lease.take() else { return };
        tracing::info!(key = %self.key(), "standing by: no memory to offer until the pod is resized; out of the cluster");
        if let Err(e) = self.kv.revoke(lease).await {
            tracing::warn!("leaving the cluster: {e} (the lease expires within its TTL)");
        }
        self.published = None;
        self.containers.clear();
        self.synced = None;
    }

    /// Keeps the operator's drains in `path` (the invoker's data dir), and takes the one kept
    /// there by a run before.
    pub fn with_drain_file(mut self, path: PathBuf) -> Self {
        match std::fs::read_to_string(&path) {
            Ok(text) => self.operator_drain = serde_json::from_str(&text).ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), "reading the operator's drain kept there: {e}"),
        }
        self.drain_file = Some(path);
        self
    }

    /// Whether this invoker is drained, from its drain key's value (`None`: etcd has no key).
    /// An operator's mark is kept; with none in etcd while the kept one drains (etcd restarted
    /// empty, or a member lost its data), the kept one is put back: the operator's drain stands
    /// until the operator takes it back.
    async fn drained(&mut self, value: Option<&str>) -> Result<bool, ClaimError> {
        let Some(mark) = value.map(DrainMark::read) else {
            let Some(kept) = self.operator_drain.as_ref().filter(|m| m.drained) else { return Ok(false) };
            tracing::warn!(invoker = %self.identity.invoker_id, "etcd lost the operator's drain of this invoker; putting it back");
            let drain = drain_key(&self.config.prefix, &self.identity.invoker_id);
            self.kv.put(&drain, &kept.to_value(), None).await.map_err(|e| ClaimError::Etcd(e.to_string()))?;
            return Ok(true);
        };
        if mark.by_operator() && self.operator_drain.as_ref() != Some(&mark) {
            self.keep(&mark);
            self.operator_drain = Some(mark.clone());
        }
        Ok(mark.drained)
    }

    /// Writes `mark` to the drain file (a failure is logged: etcd still has it).
    fn keep(&self, mark: &DrainMark) {
        let Some(path) = &self.drain_file else { return };
        let partial = path.with_extension("partial");
        let written = std::fs::write(&partial, mark.to_value()).and_then(|()| std::fs::rename(&partial, path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), "keeping the operator's drain: {e}");
        }
    }

    fn key(&self) -> String {
        invoker_key(&self.config.prefix, &self.identity.invoker_id)
    }

    fn record(&self, health: Health, nodes: Vec<NodeHeadroom>) -> InvokerRecord {
        InvokerRecord {
            id: self.identity.invoker_id.clone(),
            api: self.identity.api.clone(),
            tags: self.identity.tags.clone(),
            health,
            nodes,
            boot_id: self.boot_id.clone(),
            pid: std::process::id(),
        }
    }

    /// Puts a key for each container that runs an action (warm affinity for the schedulers)
    /// and deletes the keys of those gone.
    async fn sync_containers(&mut self, warm: &[ContainerSummary], lease: LeaseId) -> Result<(), ClaimError> {
        let etcd = |e: K::Error| ClaimError::Etcd(e.to_string());
        let mut now: BTreeMap<u64, (String, u32)> = BTreeMap::new();
        for c in warm {
            let Some((ns, action)) = c.action.split_once('/') else { continue };
            let key = container_key(&self.config.prefix, ns, action, c.revision, &self.identity.invoker_id, c.id);
            now.insert(c.id, (key, c.memory_mb));
        }
        let gone: Vec<(u64, String)> =
            self.containers.iter().filter(|(id, _)| !now.contains_key(id)).map(|(id, k)| (*id, k.clone())).collect();
        for (id, key) in gone {
            self.kv.delete(&key).await.map_err(etcd)?;
            self.containers.remove(&id);
        }
        for (id, (key, memory_mb)) in now {
            if self.containers.contains_key(&id) {
                continue;
            }
            let value = serde_json::json!({ "memory_mb": memory_mb });
            self.kv.put(&key, &value.to_string(), Some(lease)).await.map_err(etcd)?;
            self.containers.insert(id, key);
        }
        Ok(())
    }

    /// Takes the invoker's key under a new lease. A key held by a live invoker is refused;
    /// one held by a dead run of this invoker on this machine (a crash, then a restart within
    /// the lease's TTL) is taken over.
    pub async fn claim(&mut self) -> Result<(), ClaimError> {
        let claimed = self.claim_under_new_lease().await;
        let failure = claimed.as_ref().err().map(ToString::to_string);
        invoker_telemetry::moment("etcd.lease.granted", &self.key(), failure.as_deref());
        claimed
    }

    async fn claim_under_new_lease(&mut self) -> Result<(), ClaimError> {
        let lease = self.kv.grant(self.config.lease_ttl).await.map_err(|e| ClaimError::Etcd(e.to_string()))?;
        // Again after a lost lease: the record as last published, headroom and all, so that no
        // scheduler reads this invoker without room between this put and the round's next.
        let record = self.published.clone().unwrap_or_else(|| self.record(Health::Healthy, Vec::new()));
        let value = serde_json::to_string(&record).expect("a record serialises");
        if let Err(e) =
            claim_key(&self.kv, &self.key(), &value, lease, ("invoker", "--invoker-id", &self.identity.invoker_id))
                .await
        {
            let _ = self.kv.revoke(lease).await;
            return Err(e);
        }
        self.lease = Some(lease);
        self.renewed = Instant::now();
        self.published = Some(record);
        self.containers.clear();
        self.synced = None;
        Ok(())
    }

    /// Gives the id back at once (its lease revoked, every key with it): for an invoker that
    /// claimed it and then did not start.
    pub async fn release(mut self) {
        if let Some(lease) = self.lease.take() {
            let _ = self.kv.revoke(lease).await;
        }
    }

    /// Keeps the registration of the invoker `service` belongs to until `stop`, then revokes
    /// the lease (every key goes at once).
    pub async fn run(mut self, service: ActivationService, pool: PoolHandle, stop: CancellationToken) {
        let interval = self.config.publish_interval;
        let drain = drain_key(&self.config.prefix, &self.identity.invoker_id);
        let mut drains = self.kv.mirror(&drain, stop.child_token());
        loop {
            // The first round at once: until it, the record has no headroom and no scheduler
            // (or capacity manager) counts the invoker as serving.
            let drained = {
                let watched = drains.borrow_and_update();
                watched.current.then(|| watched.entries.get(&drain).cloned())
            };
            let offered = self.offer.as_ref().map_or(0, offered_mb);
            if !self.offers() {
                self.stand_by().await;
            } else if let Err(e) = self.step(&service, &pool, drained).await {
                self.complain(&e);
            }
            // The pool may not have taken a resize in yet when this round read it: soon again.
            let behind = self.offer.is_some()
                && self
                    .published
                    .as_ref()
                    .is_some_and(|r| r.nodes.iter().map(|n| n.capacity_mb).sum::<u64>() != offered);
            let next = if behind { CATCH_UP.min(interval) } else { interval };
            // A drain (or its end), and a resize, are published as they come, not at the next
            // interval.
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(next) => {}
                _ = drains.changed() => {}
                _ = offer_changed(&mut self.offer, offered) => {}
            }
        }
        if let Some(lease) = self.lease.take() {
            let _ = self.kv.revoke(lease).await;
        }
    }

    fn complain(&mut self, e: &ClaimError) {
        let quiet = self.last_complaint.is_some_and(|t| t.elapsed() < Duration::from_secs(10));
        if !quiet {
            tracing::warn!("cluster registration: {e} (activations go on; retrying)");
            self.last_complaint = Some(Instant::now());
        }
    }

    /// One round: (re)claim when there is no live lease, renew it when a third of the TTL
    /// passed, put what changed. `drain`: the value of this invoker's drain key, as the watch
    /// of it says (none while the watch is not current: read it).
    async fn step(
        &mut self,
        service: &ActivationService,
        pool: &PoolHandle,
        drain: Option<Option<String>>,
    ) -> Result<(), ClaimError> {
        let etcd = |e: K::Error| ClaimError::Etcd(e.to_string());
        let ttl = self.config.lease_ttl;
        if self.lease.is_some() && self.renewed.elapsed() >= ttl {
            // Cut off for longer than the TTL: etcd has dropped the lease and every key.
            invoker_telemetry::moment("etcd.lease.lost", &self.key(), Some("not renewed within its TTL"));
            self.lease = None;
        }
        if let Some(lease) = self.lease {
            if self.renewed.elapsed() >= ttl / 3 {
                match self.kv.keep_alive(lease).await.map_err(etcd)? {
                    Some(_) => self.renewed = Instant::now(),
                    None => {
                        invoker_telemetry::moment(
                            "etcd.lease.lost",
                            &self.key(),
                            Some("etcd no longer knows the lease"),
                        );
                        self.lease = None
                    }
                }
            }
        }
        if self.lease.is_none() {
            self.claim().await?;
            tracing::info!(key = %self.key(), "registered in etcd");
            self.last_complaint = None;
        }
        let lease = self.lease.expect("claimed above");
        let Some(status) = pool.status().await else { return Ok(()) };
        let drain = match drain {
            Some(value) => value,
            None => {
                let drain = drain_key(&self.config.prefix, &self.identity.invoker_id);
                self.kv.get(&drain).await.map_err(etcd)?.map(|(value, _)| value)
            }
        };
        let drained = self.drained(drain.as_deref()).await?;
        // Given back by the capacity manager, an invoker whose pod is to shrink to standby sheds
        // its idle containers: a kubelet shrinks a pod only once what it uses fits.
        let by_manager = drained && drain.as_deref().map(DrainMark::read).is_some_and(|m| !m.by_operator());
        if self.offer.is_some() && by_manager && status.busy == 0 && status.waiting == 0 && !self.shed {
            pool.shed_idle().await;
            self.shed = true;
        }
        self.shed &= drained;
        let health = if drained {
            // An operator's drain: no scheduler sends new work; what runs finishes.
            if status.busy == 0 && status.waiting == 0 {
                Health::Drained
            } else {
                Health::Draining
            }
        } else {
            service.health(status.health(service.is_draining(), self.identity.min_mb))
        };
        let nodes = status
            .nodes
            .iter()
            .map(|n| NodeHeadroom {
                node: n.node.to_string(),
                launchable_mb: n.launchable_mb,
                free_mb: n.free_mb,
                capacity_mb: n.capacity_mb,
                idle_mb: n.idle_mb,
            })
            .collect();
        if let Some(warm) = pool.warm_since(self.synced).await {
            self.sync_containers(&warm.containers, lease).await?;
            self.synced = Some(warm.generation);
        }
        // After the containers' keys: a record whose headroom counts a container is never
        // read before that container's key.
        let record = self.record(health, nodes);
        if self.published.as_ref() != Some(&record) {
            let value = serde_json::to_string(&record).expect("a record serialises");
            self.kv.put(&self.key(), &value, Some(lease)).await.map_err(etcd)?;
            self.published = Some(record);
        }
        Ok(())
    }
}
