//! The pool's side of the live view: a container's row each time the core touches it, the
//! nodes and the queue every half second, and the whole view once for a new viewer. Nothing is
//! built while nobody watches.

use super::{ContainerPool, LiveSnapshot};
use crate::pool::core::{ContainerId, ContainerState, ContainerView, Effect, Event, NodeView, Owner, Time};
use actix::prelude::*;
use bytes::Bytes;
use serde::Serialize;
use smallvec::SmallVec;

/// How often the nodes and the queue are sent while somebody watches.
pub(super) const POOL_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// Waiting activations listed, the oldest first.
const WAITING_SHOWN: usize = 100;

/// A container as the view shows it; times in milliseconds since the epoch.
#[derive(Serialize)]
struct ContainerRow {
    id: u64,
    action: String,
    node: String,
    memory_mb: u32,
    state: ContainerState,
    running: usize,
    created_ms: u64,
    idle_since_ms: Option<u64>,
    keep_until_ms: Option<u64>,
}

#[derive(Serialize)]
struct Waiting {
    activation_id: String,
    action: String,
    waited_ms: u64,
}

#[derive(Serialize)]
struct PoolRow {
    draining: bool,
    starting: usize,
    idle: usize,
    prewarm: usize,
    busy: usize,
    removing: usize,
    waiting: usize,
    nodes: Vec<NodeView>,
    /// The oldest waiting activations, at most [`WAITING_SHOWN`].
    queue: Vec<Waiting>,
}

#[derive(Serialize)]
struct Snapshot {
    pool: PoolRow,
    containers: Vec<ContainerRow>,
}

/// The containers an event or an effect names.
pub(super) fn touched(event: &Event) -> Option<ContainerId> {
    match event {
        Event::Started { container, .. } | Event::Finished { container, .. } | Event::Removed(container) => {
            Some(*container)
        }
        _ => None,
    }
}

pub(super) fn touched_by(effect: &Effect) -> Option<ContainerId> {
    match effect {
        Effect::Create { container, .. }
        | Effect::Dispatch { container, .. }
        | Effect::Remove { container }
        | Effect::Pause { container }
        | Effect::Resume { container } => Some(*container),
        Effect::Reject { .. } => None,
    }
}

impl ContainerPool {
    /// Core time `t` in milliseconds since the epoch.
    fn wall_ms(&self, t: Time) -> u64 {
        let (now, wall) = (self.epoch.now(), crate::model::epoch_ms());
        match t.checked_sub(now) {
            Some(ahead) => wall + ahead.as_millis() as u64,
            None => wall.saturating_sub((now - t).as_millis() as u64),
        }
    }

    fn row(&self, view: ContainerView) -> ContainerRow {
        ContainerRow {
            id: view.id.0,
            action: match view.owner {
                Owner::Key(key) => self.key_actions.get(&key).map(|k| k.action.path()).unwrap_or_default(),
                Owner::Stem(stem) => self.stem_label(stem),
            },
            node: view.node.0.to_string(),
            memory_mb: view.memory_mb,
            state: view.state,
            running: view.running,
            created_ms: self.wall_ms(view.created_at),
            idle_since_ms: view.idle.map(|(since, _)| self.wall_ms(since)),
            keep_until_ms: view.idle.and_then(|(_, until)| until).map(|t| self.wall_ms(t)),
        }
    }

    /// Each container in `ids` as it is now (its row, or that it is gone).
    pub(super) fn publish_touched(&self, ids: &SmallVec<[ContainerId; 4]>) {
        let live = &self.metrics.live;
        for (i, &id) in ids.iter().enumerate() {
            if ids[..i].contains(&id) {
                continue;
            }
            match self.core.container(id) {
                Some(view) => live.publish("container", &self.row(view)),
                None => live.publish("gone", &serde_json::json!({ "id": id.0 })),
            }
        }
    }

    fn pool_row(&self) -> PoolRow {
        let status = self.status();
        let mut queue: Vec<_> = self.jobs.values().collect();
        queue.sort_by_key(|run| run.accepted);
        let queue = queue
            .into_iter()
            .take(WAITING_SHOWN)
            .map(|run| Waiting {
                activation_id: run.meta.activation_id.clone(),
                action: format!("{}/{}", run.meta.namespace, run.meta.name),
                waited_ms: run.accepted.elapsed().as_millis() as u64,
            })
            .collect();
        PoolRow {
            draining: status.draining,
            starting: status.starting,
            idle: status.idle,
            prewarm: status.prewarm,
            busy: status.busy,
            removing: status.removing,
            waiting: status.waiting,
            nodes: status.nodes,
            queue,
        }
    }

    /// The nodes and the queue, every [`POOL_EVERY`] while somebody watches.
    pub(super) fn publish_pool(&self) {
        if self.metrics.live.watched() {
            self.metrics.live.publish("pool", &self.pool_row());
        }
    }
}

impl Handler<LiveSnapshot> for ContainerPool {
    type Result = MessageResult<LiveSnapshot>;

    fn handle(&mut self, _: LiveSnapshot, _: &mut Context<Self>) -> Self::Result {
        let containers = self.core.containers().into_iter().map(|view| self.row(view)).collect();
        MessageResult(crate::live::frame("snapshot", &Snapshot { pool: self.pool_row(), containers }))
    }
}

/// Keeps `Bytes` in the message's signature.
pub(super) type Frame = Bytes;
