//! The node ledger: what each node has free, by the cluster's stats and by our own accounts.
//!
//! Two views bound what may be placed on a node, and a container goes only where both agree:
//! - by capacity: the node's capacity minus the memory of every container we hold there
//!   (committed from the decision to create until the removal is confirmed);
//! - by stats: the free memory the cluster last reported minus our reservations, the
//!   containers the report cannot show yet (created, but not started before it was observed),
//!   plus the memory of our removals decided after it was observed. A removal decided before
//!   it may already show in it: that memory is room coming (no other container is evicted for
//!   it) but not free until a later report.
//!
//! Stats older than the TTL count as nothing free. The launchability buffer is kept free in both.

use invoker_ids::{ContainerId, NodeId, NodeStatsUpdate, Time};
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::time::Duration;

#[derive(Debug)]
struct NodeState {
    capacity_mb: u64,
    free_mb: u64,
    observed_at: Time,
    committed_mb: u64,
    reserved_mb: u64,
    removing_mb: u64,
    starts: u32,
    /// Our containers the stats may not show yet, with the time they were seen started.
    unconfirmed: FxHashMap<ContainerId, (u32, Option<Time>)>,
    /// Removals under way, with the time each was decided.
    removal_decided: FxHashMap<ContainerId, Time>,
    /// Memory of removals that completed but that the stats may not show free yet: stats
    /// observed before the removal was decided cannot include it; later ones are taken to.
    freed_unseen: StatsPending,
    /// Memory of removals that completed after stats observed since their decision: those
    /// stats may show it free or not (the Kubernetes factory's show it before it reports the
    /// pod gone; the simulator's do not). Not free for placement, which could count it twice,
    /// but room coming, so that no other container is evicted for it: the next stats say.
    freed_maybe_shown: StatsPending,
    /// Memory of our idle (or paused) containers here: what the pool may take back for a
    /// start, which health and the cluster's headroom count as room.
    idle_mb: u64,
}

/// One node as the pool sees it, for health and the pool view.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NodeView {
    pub node: String,
    pub capacity_mb: u64,
    pub free_mb: u64,
    pub committed_mb: u64,
    pub reserved_mb: u64,
    pub removing_mb: u64,
    pub starts_in_flight: u32,
    pub stale: bool,
    /// What a new container could still take on this node now.
    pub launchable_mb: u64,
    /// Memory held by idle (or paused) containers, which the pool removes when it needs room.
    pub idle_mb: u64,
}

/// Memory freed by our removals, each stamped, that stats observed at or after its stamp are
/// taken to show.
#[derive(Debug, Default)]
struct StatsPending {
    entries: Vec<(Time, u64)>,
    mb: u64,
}

impl StatsPending {
    fn add(&mut self, at: Time, memory_mb: u32) {
        self.entries.push((at, u64::from(memory_mb)));
        self.mb += u64::from(memory_mb);
    }

    /// Drops what stats observed at `observed_at` show.
    fn settle(&mut self, observed_at: Time) {
        let mut shown = 0;
        self.entries.retain(|&(at, mb)| {
            let seen = at <= observed_at;
            if seen {
                shown += mb;
            }
            !seen
        });
        self.mb -= shown;
    }
}

pub(super) enum Placement {
    On(NodeId),
    /// Some node has room but already as many starts in flight as allowed.
    StartsCapped,
    NoRoom,
}

#[derive(Debug)]
pub(super) struct Nodes {
    nodes: FxHashMap<NodeId, NodeState>,
    largest_capacity_mb: Option<u64>,
    buffer_mb: u64,
    ttl: Duration,
    max_starts: u32,
    /// Every node by its headroom (ignoring staleness, which is checked when a node is picked),
    /// so that placement is a range query, O(log nodes), not a scan.
    by_headroom: BTreeSet<(i64, NodeId)>,
}

impl Nodes {
    pub(super) fn new(buffer_mb: u64, ttl: Duration, max_starts: u32) -> Self {
        Nodes {
            nodes: FxHashMap::default(),
            largest_capacity_mb: None,
            buffer_mb,
            ttl,
            max_starts,
            by_headroom: BTreeSet::new(),
        }
    }

    /// Changes one node and keeps the headroom index in step.
    fn change<R>(&mut self, node: &NodeId, f: impl FnOnce(&mut NodeState) -> R) -> Option<R> {
        let buffer = self.buffer_mb;
        let n = self.nodes.get_mut(node)?;
        let before = raw_headroom(n, buffer);
        let result = f(n);
        let after = raw_headroom(n, buffer);
        if before != after {
            self.by_headroom.remove(&(before, node.clone()));
            self.by_headroom.insert((after, node.clone()));
        }
        Some(result)
    }

    pub(super) fn update(&mut self, update: NodeStatsUpdate, now: Time) {
        let observed_at = update.observed_at.min(now);
        if !self.nodes.contains_key(&update.node) {
            let n = NodeState {
                capacity_mb: 0,
                free_mb: 0,
                observed_at: Time::ZERO,
                committed_mb: 0,
                reserved_mb: 0,
                removing_mb: 0,
                starts: 0,
                unconfirmed: FxHashMap::default(),
                removal_decided: FxHashMap::default(),
                freed_unseen: StatsPending::default(),
                freed_maybe_shown: StatsPending::default(),
                idle_mb: 0,
            };
            self.by_headroom.insert((raw_headroom(&n, self.buffer_mb), update.node.clone()));
            self.nodes.insert(update.node.clone(), n);
        }
        self.change(&update.node, |n| {
            if observed_at < n.observed_at {
                return; // an older snapshot overtaken by a newer one
            }
            n.capacity_mb = update.capacity_mb;
            n.free_mb = update.free_mb;
            n.observed_at = observed_at;
            let mut confirmed = 0;
            n.unconfirmed.retain(|_, &mut (mem, started)| {
                let seen = started.is_some_and(|t| t <= observed_at);
                if seen {
                    confirmed += u64::from(mem);
                }
                !seen
            });
            n.reserved_mb -= confirmed;
            n.freed_unseen.settle(observed_at);
            n.freed_maybe_shown.settle(observed_at);
        });
        self.largest_capacity_mb = self.nodes.values().map(|n| n.capacity_mb).max();
    }

    pub(super) fn largest_capacity_mb(&self) -> Option<u64> {
        self.largest_capacity_mb
    }

    /// What every node offers in all (less the buffer each keeps).
    pub(super) fn total_capacity_mb(&self) -> u64 {
        self.nodes.values().map(|n| n.capacity_mb.saturating_sub(self.buffer_mb)).sum()
    }

    /// Best fit: the fresh node with the least room that still fits, so large holes stay free.
    /// `claimed` is a node kept for a starving action: skipped.
    pub(super) fn place(&self, memory_mb: u32, now: Time, claimed: Option<&NodeId>) -> Placement {
        let mut capped = false;
        for (_, id) in self.by_headroom.range((i64::from(memory_mb), NodeId::new(""))..) {
            let n = &self.nodes[id];
            if !self.is_fresh(n, now) || claimed == Some(id) {
                continue;
            }
            if n.starts >= self.max_starts {
                capped = true;
                continue;
            }
            return Placement::On(id.clone());
        }
        if capped {
            Placement::StartsCapped
        } else {
            Placement::NoRoom
        }
    }

    /// The node to keep for an action that has waited too long for room: of the fresh nodes
    /// that could ever hold it, the one with the most headroom. Rare, so a scan is fine.
    pub(super) fn claim_target(&self, memory_mb: u32, now: Time) -> Option<NodeId> {
        self.by_headroom
            .iter()
            .rev()
            .map(|(_, id)| (id, &self.nodes[id]))
            .find(|(_, n)| self.is_fresh(n, now) && n.capacity_mb >= u64::from(memory_mb) + self.buffer_mb)
            .map(|(id, _)| id.clone())
    }

    /// True when removals already under way will leave room for `memory_mb` on some node.
    pub(super) fn room_coming(&self, memory_mb: u32, now: Time) -> bool {
        self.nodes.values().any(|n| {
            let coming = n.removing_mb + n.freed_maybe_shown.mb;
            coming > 0 && self.is_fresh(n, now) && self.headroom(n, now) + coming as i64 >= i64::from(memory_mb)
        })
    }

    pub(super) fn fits_after_freeing(&self, node: &NodeId, memory_mb: u32, freed_mb: u64, now: Time) -> bool {
        self.nodes.get(node).is_some_and(|n| {
            let coming = n.removing_mb + n.freed_maybe_shown.mb + freed_mb;
            self.is_fresh(n, now) && self.headroom(n, now) + coming as i64 >= i64::from(memory_mb)
        })
    }

    pub(super) fn reserve(&mut self, node: &NodeId, id: ContainerId, memory_mb: u32) {
        let placed = self.change(node, |n| {
            n.committed_mb += u64::from(memory_mb);
            n.reserved_mb += u64::from(memory_mb);
            n.starts += 1;
            n.unconfirmed.insert(id, (memory_mb, None));
        });
        placed.expect("placed on a known node");
    }

    pub(super) fn start_finished(&mut self, node: &NodeId) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.starts -= 1;
        }
    }

    /// The container is ready since `at`: stats observed from then on show it (the factory's
    /// contract, `ContainerHandle::ready_at`). The latest stats, if observed since, already do:
    /// kept reserved until the next, it would count twice (a one-host factory publishes as a
    /// container becomes ready, and its stats may come before the container's report does).
    pub(super) fn confirm_started(&mut self, node: &NodeId, id: ContainerId, at: Time) {
        self.change(node, |n| {
            if n.observed_at >= at {
                if let Some((memory_mb, _)) = n.unconfirmed.remove(&id) {
                    n.reserved_mb -= u64::from(memory_mb);
                }
            } else if let Some((_, started)) = n.unconfirmed.get_mut(&id) {
                *started = Some(at);
            }
        });
    }

    pub(super) fn removing(&mut self, node: &NodeId, id: ContainerId, memory_mb: u32, now: Time) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.removing_mb += u64::from(memory_mb);
            n.removal_decided.insert(id, now);
        }
    }

    pub(super) fn release(&mut self, node: &NodeId, id: ContainerId, memory_mb: u32, was_removing: bool, now: Time) {
        self.change(node, |n| {
            n.committed_mb -= u64::from(memory_mb);
            if n.unconfirmed.remove(&id).is_some() {
                n.reserved_mb -= u64::from(memory_mb);
            }
            if was_removing {
                n.removing_mb -= u64::from(memory_mb);
            }
            // Stats observed before the decision cannot show the memory free; those observed
            // since may, so it is not counted free until newer ones come (counted now, it could
            // be counted twice: two containers where one fits).
            match n.removal_decided.remove(&id) {
                Some(decided) if decided > n.observed_at => n.freed_unseen.add(decided, memory_mb),
                Some(_) => n.freed_maybe_shown.add(now, memory_mb),
                None => {}
            }
        });
    }

    pub(super) fn views(&self, now: Time) -> Vec<NodeView> {
        let mut views: Vec<NodeView> = self
            .nodes
            .iter()
            .map(|(id, n)| NodeView {
                node: id.to_string(),
                capacity_mb: n.capacity_mb,
                free_mb: n.free_mb,
                committed_mb: n.committed_mb,
                reserved_mb: n.reserved_mb,
                removing_mb: n.removing_mb,
                starts_in_flight: n.starts,
                stale: !self.is_fresh(n, now),
                launchable_mb: self.headroom(n, now).max(0) as u64,
                idle_mb: n.idle_mb,
            })
            .collect();
        views.sort_by(|a, b| a.node.cmp(&b.node));
        views
    }

    /// A container on `node` became idle (`true`) or stopped being idle. Headroom does not
    /// change: an idle container holds its memory until it is removed.
    pub(super) fn idle_changed(&mut self, node: &NodeId, memory_mb: u32, idle: bool) {
        if let Some(n) = self.nodes.get_mut(node) {
            if idle {
                n.idle_mb += u64::from(memory_mb);
            } else {
                n.idle_mb -= u64::from(memory_mb);
            }
        }
    }

    /// The headroom index holds exactly one entry per node, with its current headroom.
    #[cfg(test)]
    pub(super) fn index_matches(&self) -> bool {
        self.by_headroom.len() == self.nodes.len()
            && self
                .nodes
                .iter()
                .all(|(id, n)| self.by_headroom.contains(&(raw_headroom(n, self.buffer_mb), id.clone())))
    }

    fn is_fresh(&self, n: &NodeState, now: Time) -> bool {
        n.observed_at + self.ttl >= now
    }

    fn headroom(&self, n: &NodeState, now: Time) -> i64 {
        if !self.is_fresh(n, now) {
            return i64::MIN / 2;
        }
        raw_headroom(n, self.buffer_mb)
    }
}

/// What a new container could take on a node whose stats are fresh: the least of what our own
/// accounts and the cluster's stats (minus what they cannot show yet) leave, minus the buffer.
fn raw_headroom(n: &NodeState, buffer_mb: u64) -> i64 {
    let by_capacity = n.capacity_mb as i64 - buffer_mb as i64 - n.committed_mb as i64;
    let by_stats = (n.free_mb + n.freed_unseen.mb) as i64 - n.reserved_mb as i64 - buffer_mb as i64;
    by_capacity.min(by_stats)
}
