//! The node stats of a factory that runs every container on one host and sees no other use of
//! its memory (process, Docker): free is the capacity minus the declared limits of the ready
//! containers, published whenever a container is counted or uncounted and on every `observe`.
//!
//! A container counts from its readiness, not from the create's first step. The pool reserves a
//! starting container's memory itself and takes it off the stats until stats observed at or
//! after its `ready_at` come (`invoker_core::pool`): stats that showed it while it started
//! counted it twice, and a node with starts in flight looked fuller by their memory for the
//! whole start, so that calls waited or idle containers went for room that was there (issue
//! 61's fleet runs: a quarter of the delayed calls). What makes this exact is the
//! order: a container's stamp is later than every snapshot published before it was counted, and
//! every snapshot from its stamp on shows it.

use super::contract::{Epoch, StatsReceiver};
use invoker_ids::{ContainerId, NodeId, NodeStatsUpdate, Time};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::watch;

pub struct OneHost {
    pub node: NodeId,
    pub epoch: Epoch,
    stats: watch::Sender<Vec<NodeStatsUpdate>>,
    /// The counted containers' limits and the last snapshot's stamp, under one lock: counts
    /// and snapshots are ordered by it.
    counted: Mutex<Counted>,
}

struct Counted {
    limits_mb: HashMap<ContainerId, u32>,
    last_observed: Time,
    /// What the node offers: fixed, unless the invoker follows its pod's memory limit
    /// (`set_capacity`).
    capacity_mb: u64,
}

impl OneHost {
    pub fn new(node: NodeId, capacity_mb: u64, epoch: Epoch) -> Self {
        let (stats, _) = watch::channel(Vec::new());
        let counted = Counted { limits_mb: HashMap::new(), last_observed: Time::ZERO, capacity_mb };
        OneHost { node, epoch, stats, counted: Mutex::new(counted) }
    }

    pub fn capacity_mb(&self) -> u64 {
        self.counted.lock().capacity_mb
    }

    /// The node offers `mb` from now on (the invoker's pod was resized); publishes when that
    /// changed, and answers whether it did. Containers counted stay: a node that shrank below
    /// them shows no free memory until they go.
    pub fn set_capacity(&self, mb: u64) -> bool {
        let mut counted = self.counted.lock();
        if counted.capacity_mb == mb {
            return false;
        }
        counted.capacity_mb = mb;
        let now = self.now();
        self.publish_locked(&mut counted, now);
        true
    }

    pub fn subscribe(&self) -> StatsReceiver {
        self.stats.subscribe()
    }

    pub fn now(&self) -> Time {
        self.epoch.now()
    }

    /// Counts a ready container and publishes; answers its stamp (the handle's `ready_at`):
    /// every snapshot observed at or after it shows the container, none observed before it
    /// does.
    pub fn count(&self, id: ContainerId, memory_mb: u32) -> Time {
        let mut counted = self.counted.lock();
        // Strictly after the last snapshot, which did not show it (a clock read twice in a
        // row may answer the same instant).
        let stamp = self.now().max(counted.last_observed + Duration::from_nanos(1));
        counted.limits_mb.insert(id, memory_mb);
        self.publish_locked(&mut counted, stamp);
        stamp
    }

    /// The container's memory is free again (its processes are gone); publishes.
    pub fn uncount(&self, id: ContainerId) {
        let mut counted = self.counted.lock();
        if counted.limits_mb.remove(&id).is_some() {
            let now = self.now();
            self.publish_locked(&mut counted, now);
        }
    }

    /// Publishes a fresh snapshot.
    pub fn publish(&self) {
        let mut counted = self.counted.lock();
        let now = self.now();
        self.publish_locked(&mut counted, now);
    }

    fn publish_locked(&self, counted: &mut Counted, at: Time) {
        let observed_at = at.max(counted.last_observed);
        counted.last_observed = observed_at;
        let used: u64 = counted.limits_mb.values().map(|&mb| u64::from(mb)).sum();
        self.stats.send_replace(vec![NodeStatsUpdate {
            node: self.node.clone(),
            capacity_mb: counted.capacity_mb,
            free_mb: counted.capacity_mb.saturating_sub(used),
            observed_at,
        }]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn host() -> OneHost {
        OneHost::new(NodeId::new("local"), 1024, Epoch(Instant::now()))
    }

    fn latest(rx: &StatsReceiver) -> NodeStatsUpdate {
        rx.borrow()[0].clone()
    }

    #[test]
    fn a_container_counts_from_its_stamp_and_no_snapshot_before_it_shows_it() {
        let host = host();
        let rx = host.subscribe();
        host.publish();
        let before = latest(&rx);
        let stamp = host.count(ContainerId(1), 256);
        assert!(before.observed_at < stamp, "a stamp is later than every earlier snapshot");
        assert_eq!(before.free_mb, 1024);
        let at = latest(&rx);
        assert_eq!((at.free_mb, at.observed_at), (768, stamp), "the count publishes, stamped at it");
        host.publish();
        assert!(latest(&rx).observed_at >= stamp);
        assert_eq!(latest(&rx).free_mb, 768);
        host.uncount(ContainerId(1));
        assert_eq!(latest(&rx).free_mb, 1024);
        host.uncount(ContainerId(1));
        assert_eq!(latest(&rx).free_mb, 1024, "an unknown container changes nothing");
    }

    #[test]
    fn stamps_and_snapshots_never_go_back_in_time() {
        let host = host();
        let rx = host.subscribe();
        let mut last = Time::ZERO;
        for i in 0..1_000 {
            let stamp = host.count(ContainerId(i), 1);
            assert!(stamp > last, "each count strictly after the snapshot before it");
            host.publish();
            let observed = latest(&rx).observed_at;
            assert!(observed >= stamp);
            last = observed;
        }
        assert_eq!(latest(&rx).free_mb, 24);
    }

    #[test]
    fn a_new_capacity_publishes_once_and_keeps_what_is_counted() {
        let host = host();
        let rx = host.subscribe();
        host.count(ContainerId(1), 256);
        assert!(host.set_capacity(2048));
        assert_eq!((latest(&rx).capacity_mb, latest(&rx).free_mb), (2048, 1792));
        assert!(!host.set_capacity(2048), "the same figure is no change");
        assert!(host.set_capacity(128));
        assert_eq!((latest(&rx).capacity_mb, latest(&rx).free_mb), (128, 0), "shrunk below what runs: none free");
        host.uncount(ContainerId(1));
        assert_eq!(latest(&rx).free_mb, 128);
    }
}
