//! The cluster as the invoker sees it, kept current from watches of Nodes and Pods (all
//! namespaces: other tenants' pods hold memory too). kube's watcher lists, then watches from
//! the list's `resourceVersion`; a dropped watch resumes from the last version seen, a 410
//! (history compacted) relists, errors back off. Each change recomputes `node_offers` over the
//! whole picture, which is cheap next to an activation and never on its path, and bumps a
//! counter that creations and the factory's watch on its own pods wait on.

use super::offers::{node_offers, NodeOffer};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, Toleration};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{reflector, watcher, WatchStreamExt as _};
use kube::Api;
use std::sync::Arc;
use tokio::sync::watch;

/// What the watches keep: every node's offer, every pod, and a counter of changes.
#[derive(Clone)]
pub struct ClusterView {
    pub offers: watch::Receiver<Vec<NodeOffer>>,
    pods: Store<Pod>,
    pub changes: watch::Receiver<u64>,
    /// Whether the last list or watch of both kinds succeeded: while not, the offers are only
    /// as fresh as when they last did.
    pub connected: watch::Receiver<bool>,
}

impl ClusterView {
    /// The pod `namespace/name` as last seen.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }
}

/// Starts the watches; they stop when every receiver is gone.
pub fn watch_cluster(client: kube::Client, tolerations: Vec<Toleration>) -> ClusterView {
    let (nodes, nodes_writer) = reflector::store::<Node>();
    let (pods, pods_writer) = reflector::store::<Pod>();
    let node_events = reflector(nodes_writer, watcher(Api::<Node>::all(client.clone()), watcher::Config::default()))
        .default_backoff();
    let pod_events =
        reflector(pods_writer, watcher(Api::<Pod>::all(client), watcher::Config::default())).default_backoff();
    let (offers_tx, offers) = watch::channel(Vec::new());
    let (changes_tx, changes) = watch::channel(0u64);
    let (connected_tx, connected) = watch::channel(false);
    let store = pods.clone();
    tokio::spawn(async move {
        let events =
            futures_util::stream::select(node_events.map(|e| (0, e.is_ok())), pod_events.map(|e| (1, e.is_ok())));
        let mut events = std::pin::pin!(events);
        let mut healthy = [false, false];
        while let Some((which, ok)) = events.next().await {
            healthy[which] = ok;
            connected_tx.send_if_modified(|c| std::mem::replace(c, healthy == [true, true]) != *c);
            if !ok {
                // A failed list or watch: the picture is unchanged; the watcher retries.
                continue;
            }
            let (nodes, pods) = (nodes.state(), store.state());
            let now = node_offers(nodes.iter().map(|n| n.as_ref()), pods.iter().map(|p| p.as_ref()), &tolerations);
            offers_tx.send_if_modified(|current| {
                let differs = *current != now;
                if differs {
                    *current = now;
                }
                differs
            });
            changes_tx.send_modify(|n| *n += 1);
            if offers_tx.is_closed() && changes_tx.is_closed() {
                return;
            }
        }
    });
    ClusterView { offers, pods, changes, connected }
}

/// Every node's latest offer (empty until the first lists arrive).
pub fn watch_offers(client: kube::Client, tolerations: Vec<Toleration>) -> watch::Receiver<Vec<NodeOffer>> {
    watch_cluster(client, tolerations).offers
}
