//! The cluster as the invoker sees it, kept current from watches of Nodes and Pods (all
//! namespaces: other tenants' pods hold memory too). kube's watcher lists, then watches from
//! the list's `resourceVersion`; a dropped watch resumes from the last version seen, a 410
//! (history compacted) relists, errors back off. Each change recomputes `node_offers` over the
//! whole picture, which is cheap next to an activation and never on its path, and bumps a
//! counter that creations and the factory's watch on its own pods wait on.
//!
//! A change goes into the stores and into the offers as one step, under a lock that the node
//! stats' stamp takes too ([`ClusterView::offers_stamped`]). Without it a creation could see its
//! pod Ready in the store while the offers did not count the pod yet, and stats stamped after
//! that readiness (which the pool takes to count every pod started before) would show the pod's
//! memory free: the pool would place a pod the node cannot admit.

use super::offers::{node_offers, NodeOffer};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, Toleration};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::Api;
use parking_lot::RwLock;
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
    /// Held (written) while a change goes into the stores and the offers.
    applying: Arc<RwLock<()>>,
}

impl ClusterView {
    /// The pod `namespace/name` as last seen.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// The offers as they stand, with `stamp()` taken while no change is half applied: they
    /// count every pod a [`ClusterView::pod`] read before the stamp could see.
    pub fn offers_stamped<T>(&self, stamp: impl FnOnce() -> T) -> (Vec<NodeOffer>, T) {
        let _whole = self.applying.read();
        (self.offers.borrow().clone(), stamp())
    }
}

/// Starts the watches; they stop when every receiver is gone.
pub fn watch_cluster(client: kube::Client, tolerations: Vec<Toleration>) -> ClusterView {
    let (nodes, mut nodes_writer) = reflector::store::<Node>();
    let (pods, mut pods_writer) = reflector::store::<Pod>();
    let node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default()).default_backoff();
    let pod_events = watcher(Api::<Pod>::all(client), watcher::Config::default()).default_backoff();
    let (offers_tx, offers) = watch::channel(Vec::new());
    let (changes_tx, changes) = watch::channel(0u64);
    let (connected_tx, connected) = watch::channel(false);
    let applying = Arc::new(RwLock::new(()));
    let (store, lock) = (pods.clone(), applying.clone());
    tokio::spawn(async move {
        let events = futures_util::stream::select(
            node_events.map(|e| Change::Node(Box::new(e))),
            pod_events.map(|e| Change::Pod(Box::new(e))),
        );
        let mut events = std::pin::pin!(events);
        let mut healthy = [false, false];
        while let Some(change) = events.next().await {
            let (which, ok) = match &change {
                Change::Node(e) => (0, e.is_ok()),
                Change::Pod(e) => (1, e.is_ok()),
            };
            healthy[which] = ok;
            connected_tx.send_if_modified(|c| std::mem::replace(c, healthy == [true, true]) != *c);
            // A failed list or watch leaves the picture unchanged; the watcher retries.
            {
                let _applying = lock.write();
                match &change {
                    Change::Node(event) => match event.as_ref() {
                        Ok(event) => nodes_writer.apply_watcher_event(event),
                        Err(_) => continue,
                    },
                    Change::Pod(event) => match event.as_ref() {
                        Ok(event) => pods_writer.apply_watcher_event(event),
                        Err(_) => continue,
                    },
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
            }
            changes_tx.send_modify(|n| *n += 1);
            if offers_tx.is_closed() && changes_tx.is_closed() {
                return;
            }
        }
    });
    ClusterView { offers, pods, changes, connected, applying }
}

/// One event of either watch.
enum Change {
    Node(Box<Result<watcher::Event<Node>, watcher::Error>>),
    Pod(Box<Result<watcher::Event<Pod>, watcher::Error>>),
}

/// Every node's latest offer (empty until the first lists arrive).
pub fn watch_offers(client: kube::Client, tolerations: Vec<Toleration>) -> watch::Receiver<Vec<NodeOffer>> {
    watch_cluster(client, tolerations).offers
}
