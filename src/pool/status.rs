//! What the pool tells of itself: its counts and nodes (health, `/health`, the registry), every
//! container (the admin's view), and the containers of an action (the registry's keys). Plain
//! data, apart from the actor that answers with it, so that its readers need no actor.

use invoker_core::pool::{ContainerState, NodeView};
use invoker_wire::cluster::Health;

#[derive(Clone, Debug, serde::Serialize)]
pub struct ContainerSummary {
    pub id: u64,
    pub action: String,
    /// The action's revision (0 for a prewarm container no action has adopted).
    pub revision: u64,
    pub node: String,
    pub memory_mb: u32,
    pub state: ContainerState,
    pub running: usize,
    /// One of its action's provisioned containers.
    pub provisioned: bool,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct PoolStatus {
    pub draining: bool,
    pub starting: usize,
    pub idle: usize,
    /// Prewarm (stem) containers not yet adopted, starting or ready.
    pub prewarm: usize,
    /// The memory they hold.
    pub prewarm_mb: u64,
    pub busy: usize,
    pub removing: usize,
    pub waiting: usize,
    /// Action keys with jobs that no container already coming will take, whose start waits
    /// for room or a start slot.
    pub blocked: usize,
    pub nodes: Vec<NodeView>,
    /// Container creations that failed in a row, other than refusals (reset by one that
    /// succeeds): the invoker or its runtime is broken.
    pub create_failures_in_a_row: u32,
    /// Creations the cluster refused in a row (no room on the node after all): the invoker is
    /// full, not broken.
    pub create_refusals_in_a_row: u32,
    /// Action keys (action revision, kind, memory, concurrency) the pool tracks now.
    pub action_keys: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct PoolSnapshot {
    #[serde(flatten)]
    pub status: PoolStatus,
    pub containers: Vec<ContainerSummary>,
    /// The actions with a cap (`max-concurrency`, `reserved-concurrency`) the pool holds now.
    pub capped: Vec<CappedAction>,
    /// The actions that keep provisioned containers here (`provisioned-concurrency`).
    pub provisioned: Vec<ProvisionedAction>,
}

/// An action with a cap or provisioned containers, as the pool holds it now (the live view).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ControlledAction {
    pub action: String,
    pub revision: u64,
    pub cap: Option<u32>,
    /// Its runs now, and its calls waiting (for the cap, or for a container).
    pub running: u32,
    pub waiting: usize,
    /// Its provisioned containers wanted (0: none), and up (created or being initialised).
    pub provisioned: u32,
    pub provisioned_up: u32,
}

/// An action's provisioned containers, as the pool keeps them now.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProvisionedAction {
    pub action: String,
    pub revision: u64,
    /// How many it keeps...
    pub count: u32,
    /// ...how many are created (or being created and initialised)...
    pub up: u32,
    /// ...and the action's runs now, on them or on its other containers.
    pub in_use: u32,
}

/// An action with a cap, as the pool holds it now.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CappedAction {
    pub action: String,
    pub revision: u64,
    pub cap: u32,
    pub running: u32,
    /// Calls waiting: for the cap, or for a container.
    pub waiting: usize,
}

/// The containers that run an action (idle, paused or busy), as of `generation`.
#[derive(Clone, Debug)]
pub struct WarmContainers {
    pub generation: u64,
    pub containers: Vec<ContainerSummary>,
}

/// Creations failing in a row before the invoker calls itself unhealthy (refused in a row:
/// overloaded).
const UNHEALTHY_AFTER_FAILURES: u32 = 3;

impl PoolStatus {
    /// The largest container any node could launch now.
    pub fn launchable_mb(&self) -> u64 {
        self.nodes.iter().map(|n| n.launchable_mb).max().unwrap_or(0)
    }

    /// `draining` is the intake's; `min_mb` the smallest action's memory. A job waiting while
    /// idle containers are removed to make its room is not overload, nor one waiting for a
    /// container already starting for it: only jobs no container coming will take, with no
    /// room for another. (Counting every waiting job, a node filled by its own starts said
    /// overloaded for as long as they took, and schedulers stopped placing on it.)
    pub fn health(&self, draining: bool, min_mb: u64) -> Health {
        let room = self.nodes.iter().map(|n| n.launchable_mb + n.idle_mb).max().unwrap_or(0);
        if draining || self.draining {
            Health::Draining
        } else if self.create_failures_in_a_row >= UNHEALTHY_AFTER_FAILURES {
            Health::Unhealthy
        } else if (self.blocked > 0 && room < min_mb) || self.create_refusals_in_a_row >= UNHEALTHY_AFTER_FAILURES {
            Health::Overloaded
        } else {
            Health::Healthy
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `waiting` jobs, each blocked (none has a container starting for it).
    fn status(waiting: usize, launchable_mb: u64, idle_mb: u64) -> PoolStatus {
        PoolStatus {
            draining: false,
            starting: 0,
            idle: 1,
            prewarm: 0,
            prewarm_mb: 0,
            busy: 1,
            removing: 0,
            waiting,
            blocked: waiting,
            nodes: vec![NodeView {
                node: "n".into(),
                capacity_mb: 2048,
                free_mb: launchable_mb,
                committed_mb: 0,
                reserved_mb: 0,
                removing_mb: 0,
                starts_in_flight: 0,
                stale: false,
                launchable_mb,
                idle_mb,
            }],
            create_failures_in_a_row: 0,
            create_refusals_in_a_row: 0,
            action_keys: 1,
        }
    }

    #[test]
    fn a_job_waiting_for_idle_containers_to_go_is_not_overload() {
        assert_eq!(status(1, 0, 256).health(false, 128), Health::Healthy, "an idle container makes room");
        assert_eq!(status(1, 0, 0).health(false, 128), Health::Overloaded, "all of it busy");
        assert_eq!(status(0, 0, 0).health(false, 128), Health::Healthy, "nothing waits");
        assert_eq!(status(1, 0, 0).health(true, 128), Health::Draining);
    }

    /// Issue 61: a node full of its own starts, each for a job that waits for it, is not
    /// overloaded: a scheduler that read it so stopped placing there until the next record.
    #[test]
    fn a_job_waiting_for_its_starting_container_is_not_overload() {
        let starting = PoolStatus { starting: 2, blocked: 0, ..status(2, 0, 0) };
        assert_eq!(starting.health(false, 128), Health::Healthy);
        let beyond = PoolStatus { blocked: 1, ..starting };
        assert_eq!(beyond.health(false, 128), Health::Overloaded, "a third job no start will take");
    }

    #[test]
    fn creations_refused_in_a_row_are_overload_and_other_failures_in_a_row_unhealth() {
        let refused = PoolStatus { create_refusals_in_a_row: 3, ..status(0, 2048, 0) };
        assert_eq!(refused.health(false, 128), Health::Overloaded, "the cluster has no room, the invoker works");
        let failed = PoolStatus { create_failures_in_a_row: 3, ..refused.clone() };
        assert_eq!(failed.health(false, 128), Health::Unhealthy);
        let few = PoolStatus { create_refusals_in_a_row: 2, create_failures_in_a_row: 2, ..refused };
        assert_eq!(few.health(false, 128), Health::Healthy);
    }
}
