//! An invoker's side of provisioned containers across a cluster: it follows the asks the
//! schedulers publish for it under `{prefix}/provisioned/{id}/` (one per scheduler and action:
//! its revision and how many; see `scheduler::provisioned`), fetches each action from its
//! scheduler as it does for an activation, and has its pool keep that many. An ask that goes
//! (its scheduler dropped it, or died and its lease took it) or names a new revision lets the
//! old one's containers go. A fetch that fails is tried again at the next reading.

use super::fetch::RemoteActions;
use crate::pool::actor::PoolHandle;
use invoker_etcd::mirror::Snapshot;
use invoker_wire::cluster::{parse_provisioned_key, provisioned_prefix, ProvisionedEntry};
use invoker_wire::model::Action;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the asks are looked at again without a change (a fetch that failed).
const RETRY: Duration = Duration::from_secs(5);

/// One ask as kept: the action it was for, and how many the pool keeps of it.
struct Held {
    revision: u64,
    count: u32,
    action: Arc<Action>,
}

/// Keeps the pool's provisioned containers as this invoker's asks say, until `stop`.
pub async fn follow(
    mut asks: watch::Receiver<Snapshot>,
    prefix: String,
    id: String,
    remote: Arc<RemoteActions>,
    pool: PoolHandle,
    stop: CancellationToken,
) {
    let mine = provisioned_prefix(&prefix, &id);
    let mut held: BTreeMap<String, Held> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = asks.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY) => {}
        }
        let snapshot = asks.borrow_and_update().clone();
        if !snapshot.current {
            continue; // etcd cannot be read: what the pool keeps stays as it is
        }
        let wanted: BTreeMap<&str, ProvisionedEntry> = snapshot
            .entries
            .iter()
            .filter_map(|(key, value)| {
                let rest = key.strip_prefix(&mine)?;
                let entry = serde_json::from_str::<ProvisionedEntry>(value)
                    .map_err(|e| tracing::warn!(%key, "a provisioned ask does not decode: {e}"))
                    .ok()?;
                Some((rest, entry))
            })
            .collect();
        // What went, or names another revision now: its containers go.
        let gone: Vec<String> = held
            .iter()
            .filter(|(rest, h)| wanted.get(rest.as_str()).is_none_or(|w| w.revision != h.revision))
            .map(|(rest, _)| rest.clone())
            .collect();
        for rest in gone {
            if let Some(h) = held.remove(&rest) {
                pool.provision(h.action, 0).await;
            }
        }
        for (rest, entry) in wanted {
            match held.get_mut(rest) {
                Some(h) if h.count == entry.count => {}
                Some(h) => {
                    h.count = entry.count;
                    pool.provision(h.action.clone(), entry.count).await;
                }
                None => {
                    let Some((scheduler, ns, name)) = parse_provisioned_key(rest) else {
                        tracing::warn!(key = rest, "a provisioned ask out of the layout");
                        continue;
                    };
                    match remote.action(&scheduler, &ns, &name, entry.revision).await {
                        Ok(action) => {
                            pool.provision(action.clone(), entry.count).await;
                            held.insert(
                                rest.to_string(),
                                Held { revision: entry.revision, count: entry.count, action },
                            );
                        }
                        Err(e) => tracing::warn!("a provisioned action could not be fetched: {e} (trying again)"),
                    }
                }
            }
        }
    }
}
