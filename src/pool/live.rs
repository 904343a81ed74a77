//! The pool's side of the live view: a container's row each time the core touches it, the
//! nodes and the queue every half second, and the whole view once for a new viewer. Nothing is
//! built while nobody watches.

use super::status::{ControlledAction, PoolStatus};
use bytes::Bytes;
use invoker_core::pool::{ContainerState, ContainerView, Effect, Event, NodeView};
use invoker_ids::{ContainerId, Time};
use invoker_job::RunJob;
use serde::Serialize;

/// How often the nodes and the queue are sent while somebody watches.
pub(crate) const POOL_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// Waiting activations listed, the oldest first.
const WAITING_SHOWN: usize = 100;

/// A container as the view shows it; times in milliseconds since the epoch.
#[derive(Serialize)]
pub(crate) struct ContainerRow {
    id: u64,
    action: String,
    node: String,
    memory_mb: u32,
    state: ContainerState,
    running: usize,
    provisioned: bool,
    created_ms: u64,
    idle_since_ms: Option<u64>,
    keep_until_ms: Option<u64>,
}

#[derive(Serialize)]
pub(crate) struct Waiting {
    activation_id: String,
    action: String,
    waited_ms: u64,
    /// An asynchronous call from the durable queue (nobody waits on it), not a blocking one.
    queued: bool,
}

#[derive(Serialize)]
pub(crate) struct PoolRow {
    draining: bool,
    starting: usize,
    idle: usize,
    prewarm: usize,
    prewarm_mb: u64,
    busy: usize,
    removing: usize,
    waiting: usize,
    nodes: Vec<NodeView>,
    /// The oldest waiting activations, at most [`WAITING_SHOWN`].
    queue: Vec<Waiting>,
    /// The actions with a cap or provisioned containers (each a handful of numbers).
    actions: Vec<ControlledAction>,
}

#[derive(Serialize)]
struct Snapshot {
    pool: PoolRow,
    containers: Vec<ContainerRow>,
}

/// The containers an event or an effect names.
pub(crate) fn touched(event: &Event) -> Option<ContainerId> {
    match event {
        Event::Started { container, .. }
        | Event::Finished { container, .. }
        | Event::Removed(container)
        | Event::Taken { container, .. } => Some(*container),
        _ => None,
    }
}

pub(crate) fn touched_by(effect: &Effect) -> Option<ContainerId> {
    match effect {
        Effect::Create { container, .. }
        | Effect::Dispatch { container, .. }
        | Effect::Remove { container }
        | Effect::Pause { container }
        | Effect::Resume { container } => Some(*container),
        Effect::Reject { .. } => None,
    }
}

/// A container's row; `action` names its action (or its stem), `wall` turns core time into
/// milliseconds since the epoch.
pub(crate) fn container_row(view: ContainerView, action: String, wall: impl Fn(Time) -> u64) -> ContainerRow {
    ContainerRow {
        id: view.id.0,
        action,
        node: view.node.0.to_string(),
        memory_mb: view.memory_mb,
        state: view.state,
        running: view.running,
        provisioned: view.provisioned,
        created_ms: wall(view.created_at),
        idle_since_ms: view.idle.map(|(since, _)| wall(since)),
        keep_until_ms: view.idle.and_then(|(_, until)| until).map(wall),
    }
}

/// The nodes, the counts, the oldest waiting activations, and the controlled actions.
pub(crate) fn pool_row<'a>(
    status: PoolStatus,
    waiting: impl Iterator<Item = &'a RunJob>,
    actions: Vec<ControlledAction>,
) -> PoolRow {
    let mut queue: Vec<&RunJob> = waiting.collect();
    // The oldest few of what may be a queue of many thousands, without sorting them all.
    if queue.len() > WAITING_SHOWN {
        queue.select_nth_unstable_by_key(WAITING_SHOWN, |run| run.accepted);
        queue.truncate(WAITING_SHOWN);
    }
    queue.sort_by_key(|run| run.accepted);
    let queue = queue
        .into_iter()
        .take(WAITING_SHOWN)
        .map(|run| Waiting {
            activation_id: run.meta.activation_id.clone(),
            action: format!("{}/{}", run.meta.namespace, run.meta.name),
            waited_ms: run.accepted.elapsed().as_millis() as u64,
            queued: run.queued.is_some(),
        })
        .collect();
    PoolRow {
        draining: status.draining,
        starting: status.starting,
        idle: status.idle,
        prewarm: status.prewarm,
        prewarm_mb: status.prewarm_mb,
        busy: status.busy,
        removing: status.removing,
        waiting: status.waiting,
        nodes: status.nodes,
        queue,
        actions,
    }
}

/// A new viewer's first event.
pub(crate) fn snapshot(pool: PoolRow, containers: Vec<ContainerRow>) -> Bytes {
    invoker_live::frame("snapshot", &Snapshot { pool, containers })
}
