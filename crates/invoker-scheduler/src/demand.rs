//! What this scheduler needs of the fleet, per tag set, for the capacity manager: the memory
//! of the activations it has in flight on invokers, of those waiting for an invoker with room,
//! and of those it refused for lack of room since its last report, and all of them by the
//! memory one takes (the manager packs them: each must fit whole). Counted as activations
//! come and go (a map update under a lock), published by [`report`] every [`REPORT_EVERY`]
//! (200 ms) at most (at once, within that bound, when an activation starts waiting), off the
//! activation path, under a lease of its own.

use invoker_core::capacity::packing::CallTally;
use invoker_etcd::kv::ClusterKv;
use invoker_wire::cluster::{demand_key, DemandReport, Needs, TagNeeds};
use invoker_wire::model::epoch_ms;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use invoker_core::capacity::REPORT_EVERY;

#[derive(Default)]
pub struct DemandLedger {
    by_tags: Mutex<BTreeMap<Vec<String>, Tracked>>,
    /// An activation started waiting for room: the report goes out as soon as the 200 ms
    /// since the last one allow, not at the next period.
    waiting: tokio::sync::Notify,
}

/// One tag set's needs in MB, and its calls by size.
#[derive(Default)]
struct Tracked {
    needs: Needs,
    calls: CallTally,
}

/// Which count an activation moves.
#[derive(Clone, Copy, Debug)]
pub enum Stage {
    InFlight,
    Waiting,
}

impl DemandLedger {
    pub fn add(&self, tags: &[String], stage: Stage, mb: u64) {
        let mut by_tags = self.by_tags.lock();
        // The tag set is copied only the first time it is seen (not once per activation).
        if !by_tags.contains_key(tags) {
            by_tags.insert(tags.to_vec(), Tracked::default());
        }
        let Tracked { needs, calls } = by_tags.get_mut(tags).expect("inserted above");
        calls.came(mb);
        match stage {
            Stage::InFlight => needs.in_flight_mb += mb,
            Stage::Waiting => {
                needs.waiting_mb += mb;
                self.waiting.notify_one();
            }
        }
    }

    pub fn remove(&self, tags: &[String], stage: Stage, mb: u64) {
        let mut by_tags = self.by_tags.lock();
        if let Some(Tracked { needs, calls }) = by_tags.get_mut(tags) {
            calls.went(mb);
            match stage {
                Stage::InFlight => needs.in_flight_mb = needs.in_flight_mb.saturating_sub(mb),
                Stage::Waiting => needs.waiting_mb = needs.waiting_mb.saturating_sub(mb),
            }
        }
    }

    pub fn refused(&self, tags: &[String], mb: u64) {
        let mut by_tags = self.by_tags.lock();
        let tracked = by_tags.entry(tags.to_vec()).or_default();
        tracked.needs.refused_mb += mb;
        tracked.calls.refused(mb);
    }

    /// The needs now; the refusals counted since the last call go into it and are reset, and
    /// tag sets with nothing left are dropped.
    pub fn take(&self) -> Vec<TagNeeds> {
        let mut by_tags = self.by_tags.lock();
        let needs = by_tags
            .iter_mut()
            .map(|(tags, t)| {
                let needs = Needs { calls_by_mb: t.calls.report(), ..t.needs.clone() };
                TagNeeds { tags: tags.clone(), needs }
            })
            .collect();
        by_tags.retain(|_, t| {
            t.needs.refused_mb = 0;
            t.needs.in_flight_mb > 0 || t.needs.waiting_mb > 0
        });
        needs
    }
}

/// Puts `{prefix}/demand/{id}` whenever the needs changed, under a lease of its own kept alive,
/// until `stop`; then revokes it.
pub async fn report<K: ClusterKv>(
    kv: K,
    prefix: String,
    id: String,
    ttl: Duration,
    ledger: std::sync::Arc<DemandLedger>,
    stop: CancellationToken,
) {
    let key = demand_key(&prefix, &id);
    let mut lease = None;
    let mut renewed = Instant::now();
    let mut last: Option<Vec<TagNeeds>> = None;
    let mut complained: Option<Instant> = None;
    let mut put_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(REPORT_EVERY) => {}
            _ = ledger.waiting.notified() => {
                // At most one report every REPORT_EVERY.
                let since = put_at.map_or(REPORT_EVERY, |t| t.elapsed());
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(REPORT_EVERY.saturating_sub(since)) => {}
                }
            }
        }
        let needs = ledger.take();
        let step = async {
            if lease.is_some() && renewed.elapsed() >= ttl {
                lease = None;
                last = None;
            }
            if let Some(l) = lease {
                if renewed.elapsed() >= ttl / 3 {
                    match kv.keep_alive(l).await.map_err(|e| e.to_string())? {
                        Some(_) => renewed = Instant::now(),
                        None => {
                            lease = None;
                            last = None;
                        }
                    }
                }
            }
            if last.as_ref() == Some(&needs) {
                return Ok(());
            }
            let l = match lease {
                Some(l) => l,
                None => {
                    let l = kv.grant(ttl).await.map_err(|e| e.to_string())?;
                    renewed = Instant::now();
                    lease = Some(l);
                    l
                }
            };
            let report = DemandReport { scheduler: id.clone(), at_ms: epoch_ms(), needs: needs.clone() };
            let value = serde_json::to_string(&report).expect("a report serialises");
            kv.put(&key, &value, Some(l)).await.map_err(|e| e.to_string())?;
            put_at = Some(Instant::now());
            last = Some(needs);
            Ok::<(), String>(())
        };
        if let Err(e) = step.await {
            if complained.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                tracing::warn!("the scheduler's demand report: {e} (retrying)");
                complained = Some(Instant::now());
            }
        }
    }
    if let Some(l) = lease {
        let _ = kv.revoke(l).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_reported_once_and_empty_tag_sets_go() {
        let ledger = DemandLedger::default();
        let gpu = vec!["gpu".to_string()];
        ledger.add(&[], Stage::InFlight, 256);
        ledger.add(&gpu, Stage::Waiting, 512);
        ledger.refused(&gpu, 128);
        let first = ledger.take();
        assert_eq!(first.len(), 2);
        let g = first.iter().find(|n| n.tags == gpu).unwrap();
        let calls = BTreeMap::from([(512, 1), (128, 1)]);
        assert_eq!(g.needs, Needs { in_flight_mb: 0, waiting_mb: 512, refused_mb: 128, calls_by_mb: calls });
        // The refusal is reported once; the waiting call stays until it goes.
        let again = ledger.take();
        let calls = BTreeMap::from([(512, 1)]);
        assert_eq!(again.iter().find(|n| n.tags == gpu).unwrap().needs.calls_by_mb, calls);
        ledger.remove(&gpu, Stage::Waiting, 512);
        let second = ledger.take();
        assert_eq!(second.iter().find(|n| n.tags == gpu).unwrap().needs, Needs::default(), "reported at zero once");
        assert!(ledger.take().iter().all(|n| n.tags != gpu), "then gone");
        ledger.remove(&[], Stage::InFlight, 256);
        ledger.take();
        assert!(ledger.take().is_empty());
    }
}
