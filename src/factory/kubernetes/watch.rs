//! The nodes' offers, kept current from watches of Nodes and Pods (all namespaces: other
//! tenants' pods hold memory too). kube's watcher lists, then watches from the list's
//! `resourceVersion`; a dropped watch resumes from the last version seen, a 410 (history
//! compacted) relists, errors back off. Each change recomputes `node_offers` over the whole
//! picture, which is cheap next to an activation and never on its path.

use super::offers::{node_offers, NodeOffer};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, Toleration};
use kube::runtime::{reflector, watcher, WatchStreamExt as _};
use kube::Api;
use tokio::sync::watch;

/// Starts the watches; the receiver holds every node's latest offer (empty until the first
/// lists arrive). The watches stop when every receiver is gone.
pub fn watch_offers(client: kube::Client, tolerations: Vec<Toleration>) -> watch::Receiver<Vec<NodeOffer>> {
    let (nodes, nodes_writer) = reflector::store::<Node>();
    let (pods, pods_writer) = reflector::store::<Pod>();
    let node_events = reflector(nodes_writer, watcher(Api::<Node>::all(client.clone()), watcher::Config::default()))
        .default_backoff();
    let pod_events =
        reflector(pods_writer, watcher(Api::<Pod>::all(client), watcher::Config::default())).default_backoff();
    let (sender, receiver) = watch::channel(Vec::new());
    tokio::spawn(async move {
        let changes = futures_util::stream::select(node_events.map(|e| e.is_ok()), pod_events.map(|e| e.is_ok()));
        let mut changes = std::pin::pin!(changes);
        while let Some(ok) = changes.next().await {
            if !ok {
                // A failed list or watch: the picture is unchanged; the watcher retries.
                continue;
            }
            let (nodes, pods) = (nodes.state(), pods.state());
            let offers = node_offers(nodes.iter().map(|n| n.as_ref()), pods.iter().map(|p| p.as_ref()), &tolerations);
            let changed = sender.send_if_modified(|current| {
                let differs = *current != offers;
                if differs {
                    *current = offers;
                }
                differs
            });
            if !changed && sender.is_closed() {
                return;
            }
        }
    });
    receiver
}
