//! The scheduler's own key, `{prefix}/schedulers/{id}` under a lease: invokers read its address
//! there when they fetch an action it sent them. The id is unique, as an invoker's is: a second
//! scheduler with a live one's id refuses to start.

use invoker_etcd::claim::boot_id;
use invoker_etcd::claim::{claim_key, ClaimError};
use invoker_etcd::kv::ClusterKv;
use invoker_etcd::kv::LeaseId;
use invoker_wire::cluster::{scheduler_key, SchedulerRecord};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub struct Presence<K: ClusterKv> {
    kv: K,
    key: String,
    record: SchedulerRecord,
    ttl: Duration,
    lease: Option<LeaseId>,
    renewed: Instant,
}

impl<K: ClusterKv> Presence<K> {
    pub fn new(kv: K, prefix: &str, id: &str, api: String, ttl: Duration) -> Self {
        let record = SchedulerRecord { id: id.to_string(), api, boot_id: boot_id(), pid: std::process::id() };
        Presence { kv, key: scheduler_key(prefix, id), record, ttl, lease: None, renewed: Instant::now() }
    }

    /// Takes the key under a new lease; refused when a live scheduler holds it.
    pub async fn claim(&mut self) -> Result<(), ClaimError> {
        let lease = self.kv.grant(self.ttl).await.map_err(|e| ClaimError::Etcd(e.to_string()))?;
        let value = serde_json::to_string(&self.record).expect("a record serialises");
        if let Err(e) =
            claim_key(&self.kv, &self.key, &value, lease, ("scheduler", "[scheduler] id", &self.record.id)).await
        {
            let _ = self.kv.revoke(lease).await;
            return Err(e);
        }
        self.lease = Some(lease);
        self.renewed = Instant::now();
        Ok(())
    }

    /// Keeps the key until `stop` (renewing the lease, claiming again when it was lost), then
    /// revokes it.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut complained: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(self.ttl / 4) => {}
            }
            if self.renewed.elapsed() >= self.ttl {
                self.lease = None;
            }
            let step = match self.lease {
                Some(lease) => match self.kv.keep_alive(lease).await {
                    Ok(Some(_)) => {
                        self.renewed = Instant::now();
                        Ok(())
                    }
                    Ok(None) => {
                        self.lease = None;
                        Ok(())
                    }
                    Err(e) => Err(ClaimError::Etcd(e.to_string())),
                },
                None => self.claim().await,
            };
            if let Err(e) = step {
                if complained.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!("the scheduler's registration: {e} (retrying)");
                    complained = Some(Instant::now());
                }
            }
        }
        if let Some(lease) = self.lease.take() {
            let _ = self.kv.revoke(lease).await;
        }
    }
}
