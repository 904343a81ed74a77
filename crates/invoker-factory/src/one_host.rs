//! The node stats of a factory that runs every container on one host and sees no other use of
//! its memory (process, Docker): free is the capacity minus the declared limits of the live
//! containers, published whenever a container comes or goes and on every `observe`.

use super::contract::{Epoch, StatsReceiver};
use invoker_ids::{NodeId, NodeStatsUpdate, Time};
use tokio::sync::watch;

pub struct OneHost {
    pub node: NodeId,
    pub capacity_mb: u64,
    pub epoch: Epoch,
    stats: watch::Sender<Vec<NodeStatsUpdate>>,
}

impl OneHost {
    pub fn new(node: NodeId, capacity_mb: u64, epoch: Epoch) -> Self {
        let (stats, _) = watch::channel(Vec::new());
        OneHost { node, capacity_mb, epoch, stats }
    }

    pub fn subscribe(&self) -> StatsReceiver {
        self.stats.subscribe()
    }

    pub fn now(&self) -> Time {
        self.epoch.now()
    }

    /// Publishes the host's one node with `limits_mb`, the limits of the live containers, taken.
    pub fn publish(&self, limits_mb: impl Iterator<Item = u32>) {
        let used: u64 = limits_mb.map(u64::from).sum();
        self.stats.send_replace(vec![NodeStatsUpdate {
            node: self.node.clone(),
            capacity_mb: self.capacity_mb,
            free_mb: self.capacity_mb.saturating_sub(used),
            observed_at: self.now(),
        }]);
    }
}
