//! The names every part of the invoker shares: the decision cores (`invoker-core`), the
//! backends, the wire and the invoker itself. Kept below all of them, so that a backend names
//! a container or a node without importing the pool core.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

/// The disk of an action that names none (`limits.disk_default_mb`'s own default): the prewarm
/// classes and the simulators' calls ask for it too.
pub const DEFAULT_DISK_MB: u32 = 256;

/// Time since the pool's epoch. Monotonic: the caller never passes a smaller `now`.
pub type Time = Duration;

/// One activation waiting to run, as the pool sees it (the payload stays with the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

/// A container the pool decided to create. Assigned by the core, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId(pub u64);

/// A node of the cluster, as the factory names it (a host, a Mesos agent, a k8s node).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub Arc<str>);

impl NodeId {
    pub fn new(name: &str) -> Self {
        NodeId(Arc::from(name))
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A full snapshot of one node, as the cluster manager last reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatsUpdate {
    pub node: NodeId,
    /// Memory the node offers to action containers in total.
    pub capacity_mb: u64,
    /// Memory free for new containers at `observed_at`.
    pub free_mb: u64,
    /// When the cluster manager observed it (not when it reached us: stats lag).
    pub observed_at: Time,
}

/// Why a container could not be had: different things to the user (what to fix, or to wait
/// for) and to the pool (a cluster that is full is not an invoker that is broken).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateFailure {
    /// The cluster refused it (no room on the node after all, a kubelet's refusal).
    Refused,
    /// Its image cannot be had (not in the registry, not pullable).
    Image,
    /// Its image was built on the engine under another namespace's name: a local image runs
    /// only for the namespace it is named after.
    ImageNotOwned,
    /// It did not become ready within the factory's bound.
    NotReady,
    /// Anything else (the runtime exited, the sandbox failed).
    Failed,
    /// A container initialised as it is created (a provisioned one): its action's `/init`
    /// failed. The action's fault, not the invoker's.
    InitFailed,
}
