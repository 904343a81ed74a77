//! A fake Kubernetes API server with a fake kubelet, for the Kubernetes factory's tests: the real
//! REST and watch wire format for Nodes and Pods (JSON lists with a `resourceVersion`; `?watch=1`
//! as a chunked stream of `{"type", "object"}` lines; a watch from a version older than what the
//! server keeps gets an `ERROR` event with a 410 `Expired` Status, as a real server's does; 409
//! on a name clash, 422 on an invalid pod; label selectors; a pod's `log?follow=true`), on
//! 127.0.0.1.
//!
//! Pods bound to a node (`spec.nodeName`) are run by the fake kubelet as local processes: it
//! admits a pod only within the node's allocatable memory (beyond, the pod fails with
//! `OutOfmemory`, as a real kubelet's admission does, and the refusal is counted), "pulls" only
//! the images a test registered (`ErrImagePull` otherwise; a container without a command runs
//! its image's registered entry point), expands `$(VAR)` in the command from
//! the container's environment (the downward API's `status.podIP` is 127.0.0.1), runs it, and
//! marks the pod Ready once its port accepts a TCP connection. The fake has no pod network: all
//! its pods share 127.0.0.1, so at admission it gives each one a port of its own, rewriting the
//! container's first port and its `PORT` variable (as a mutating admission webhook may); the
//! invoker reads the port from the pod object. Tests change the cluster through its methods (a
//! node cordoned, NotReady, another tenant's pod, an eviction) and can drop every open watch or
//! forget the history, as an API server restart or an etcd compaction would.

use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

mod http;
mod kubelet;
mod resize;
mod statefulset;
use kubelet::PodLog;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Node,
    Pod,
    StatefulSet,
}

struct Change {
    rv: u64,
    kind: Kind,
    kind_of_event: &'static str,
    object: Value,
}

#[derive(Default)]
struct Cluster {
    rv: u64,
    uid: u64,
    objects: BTreeMap<(Kind, String), Value>,
    history: Vec<Change>,
    /// Changes below this version are forgotten: a watch from before gets 410.
    compacted: u64,
    /// True while the server "restarts": every request gets 503.
    down: bool,
    /// Requests served: lists, watches, watches refused with 410.
    lists: usize,
    watches: usize,
    expired: usize,
    /// Images the fake kubelet can "pull", with their entry point (a program of this machine;
    /// empty for an image only ever run with a command).
    images: BTreeMap<String, Vec<String>>,
    /// Pods the kubelet admitted and that still hold their memory: key → (node, bytes).
    admitted: BTreeMap<String, (String, u64)>,
    /// The most memory admitted at once on each node.
    peak: BTreeMap<String, u64>,
    /// Pods created, and refused by the kubelet's admission.
    created: usize,
    refused: usize,
    /// Running pods' process groups, and their output.
    processes: BTreeMap<String, i32>,
    logs: BTreeMap<String, Arc<PodLog>>,
    /// Pods being evicted: their end is reported as an eviction.
    evicting: BTreeSet<String>,
    /// NetworkPolicies (`networking.k8s.io/v1`), by `namespace/name`.
    policies: BTreeMap<String, Value>,
    /// Pod creations answered 429 (too many requests) before any is served.
    throttled: usize,
    /// How long a pod creation takes before the server acts on it (a slow API server).
    slow_creates: Duration,
    /// Pod deletions still to answer 500 (an API server failing), and those answered so.
    failing_deletes: usize,
    failed_deletes: usize,
    /// Changes of a StatefulSet's replicas through its `scale` subresource.
    scale_changes: usize,
    /// Each running container's cgroup directory (`<key>#<container>`), and resizes served.
    cgroups: BTreeMap<String, std::path::PathBuf>,
    resizes: usize,
    /// A server before Kubernetes 1.33 (or with `InPlacePodVerticalScaling` off): no `resize`
    /// subresource, in its discovery or served.
    without_resize: bool,
}

/// What the server's tasks and the kubelet share.
struct Shared {
    cluster: Mutex<Cluster>,
    events: broadcast::Sender<Arc<Change>>,
    drops: broadcast::Sender<()>,
}

impl Shared {
    /// Stores `object` at a new resourceVersion and tells the watches; returns it as stored.
    fn put(&self, kind: Kind, key: &str, object: Value, kind_of_event: &'static str) -> Value {
        self.put_locked(&mut self.cluster.lock(), kind, key, object, kind_of_event)
    }

    /// `put` for a caller that holds the lock: a read, its change and its store are one step, as
    /// the API server's are (a change read before a deletion must not bring the object back).
    fn put_locked(
        &self,
        cluster: &mut Cluster,
        kind: Kind,
        key: &str,
        mut object: Value,
        kind_of_event: &'static str,
    ) -> Value {
        cluster.rv += 1;
        let rv = cluster.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if kind_of_event == "DELETED" {
            cluster.objects.remove(&(kind, key.to_string()));
        } else {
            cluster.objects.insert((kind, key.to_string()), object.clone());
        }
        let change = Arc::new(Change { rv, kind, kind_of_event, object: object.clone() });
        cluster.history.push(Change { rv, kind, kind_of_event, object: object.clone() });
        // Sent under the lock: watches see changes in resourceVersion order.
        let _ = self.events.send(change);
        object
    }

    fn get(&self, kind: Kind, key: &str) -> Option<Value> {
        self.cluster.lock().objects.get(&(kind, key.to_string())).cloned()
    }

    /// Changes an object that exists, atomically; `change` may decline (false). Returns the
    /// object as stored.
    fn update(&self, kind: Kind, key: &str, change: impl FnOnce(&mut Value) -> bool) -> Option<Value> {
        let mut cluster = self.cluster.lock();
        let mut object = cluster.objects.get(&(kind, key.to_string()))?.clone();
        if !change(&mut object) {
            return None;
        }
        Some(self.put_locked(&mut cluster, kind, key, object, "MODIFIED"))
    }

    /// Changes a pod's status if it is still the pod `uid` (not deleted, not replaced).
    fn update_pod(&self, key: &str, uid: &str, change: impl FnOnce(&mut Value)) -> bool {
        self.update(Kind::Pod, key, |pod| {
            if pod["metadata"]["uid"] != uid {
                return false;
            }
            change(pod);
            true
        })
        .is_some()
    }

    /// Deletes a pod at once (grace 0): its processes are killed, its memory freed, and the
    /// object is gone before any of its processes' ends is reported.
    fn remove_pod(&self, ns: &str, name: &str) -> Option<Value> {
        let key = format!("{ns}/{name}");
        let mut cluster = self.cluster.lock();
        let pod = cluster.objects.get(&(Kind::Pod, key.clone()))?.clone();
        cluster.admitted.remove(&key);
        let process = cluster.processes.remove(&key);
        let deleted = self.put_locked(&mut cluster, Kind::Pod, &key, pod, "DELETED");
        drop(cluster);
        if let Some(pgid) = process {
            kill_group(pgid);
        }
        Some(deleted)
    }
}

fn kill_group(pgid: i32) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
}

pub struct FakeApiServer {
    pub url: String,
    shared: Arc<Shared>,
    _server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        for pgid in std::mem::take(&mut self.shared.cluster.lock().processes).into_values() {
            kill_group(pgid);
        }
    }
}

impl FakeApiServer {
    pub async fn start() -> FakeApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            cluster: Mutex::new(Cluster::default()),
            events: broadcast::channel(4096).0,
            drops: broadcast::channel(16).0,
        });
        let serving = shared.clone();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(http::serve(request, shared).await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        tokio::spawn(statefulset::controller(shared.clone()));
        FakeApiServer { url, shared, _server: server }
    }

    /// Changes an object the test made (it must exist).
    fn update(&self, kind: Kind, key: &str, change: impl FnOnce(&mut Value)) {
        let updated = self.shared.update(kind, key, |object| {
            change(object);
            true
        });
        assert!(updated.is_some(), "no such object: {key}");
    }

    fn put(&self, kind: Kind, key: &str, object: Value, kind_of_event: &'static str) {
        self.shared.put(kind, key, object, kind_of_event);
    }

    /// A Ready node with `memory_mi` MiB allocatable.
    pub fn add_node(&self, name: &str, memory_mi: u64) {
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {},
            "status": {
                "allocatable": {"memory": format!("{memory_mi}Mi"), "cpu": "4", "pods": "110"},
                "capacity": {"memory": format!("{memory_mi}Mi"), "cpu": "4", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        });
        self.put(Kind::Node, name, node, "ADDED");
    }

    pub fn set_ready(&self, name: &str, ready: bool) {
        let conditions = json!([{"type": "Ready", "status": if ready { "True" } else { "Unknown" }}]);
        self.update(Kind::Node, name, |node| node["status"]["conditions"] = conditions);
    }

    pub fn cordon(&self, name: &str, cordoned: bool) {
        self.update(Kind::Node, name, |node| node["spec"]["unschedulable"] = json!(cordoned));
    }

    /// A running pod of another tenant, bound to `node`, requesting `memory_mi` MiB (admitted:
    /// it holds its memory on the node).
    pub fn add_pod(&self, namespace: &str, name: &str, node: &str, memory_mi: u64) {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox",
                "resources": {"requests": {"memory": format!("{memory_mi}Mi")}}}]},
            "status": {"phase": "Running"}
        });
        let key = format!("{namespace}/{name}");
        self.shared.cluster.lock().admitted.insert(key.clone(), (node.to_string(), memory_mi << 20));
        self.put(Kind::Pod, &key, pod, "ADDED");
    }

    /// A running pod with `labels` (as another invoker's action pod would carry).
    pub fn add_labeled_pod(&self, namespace: &str, name: &str, node: &str, labels: Value) {
        self.add_pod(namespace, name, node, 1);
        self.update(Kind::Pod, &format!("{namespace}/{name}"), |pod| pod["metadata"]["labels"] = labels);
    }

    /// Memory of `node` the kubelet holds but the API does not show (a static pod, a system
    /// reserve the node's allocatable does not count): the kubelet refuses what then exceeds it.
    pub fn hide_memory(&self, node: &str, memory_mi: u64) {
        let mut cluster = self.shared.cluster.lock();
        cluster.admitted.insert(format!("hidden/{node}"), (node.to_string(), memory_mi << 20));
    }

    pub fn unhide_memory(&self, node: &str) {
        self.shared.cluster.lock().admitted.remove(&format!("hidden/{node}"));
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        self.shared.remove_pod(namespace, name).expect("no such pod");
    }

    /// An image the kubelet can pull.
    pub fn add_image(&self, image: &str) {
        self.add_image_with_entrypoint(image, &[]);
    }

    /// An image the kubelet can pull, whose entry point runs a container without a command.
    pub fn add_image_with_entrypoint(&self, image: &str, entrypoint: &[&str]) {
        let entrypoint = entrypoint.iter().map(|a| a.to_string()).collect();
        self.shared.cluster.lock().images.insert(image.to_string(), entrypoint);
    }

    /// Evicts a running pod (node pressure): its process is killed and it ends `Failed`
    /// with reason `Evicted`; the object stays until someone deletes it.
    pub fn evict(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        let mut cluster = self.shared.cluster.lock();
        cluster.evicting.insert(key.clone());
        let pgid = cluster.processes.remove(&key).expect("no such running pod");
        kill_group(pgid);
    }

    /// The pods in `namespace` (names), with their phase.
    pub fn pods(&self, namespace: &str) -> Vec<(String, String)> {
        let cluster = self.shared.cluster.lock();
        cluster
            .objects
            .iter()
            .filter(|((k, _), o)| *k == Kind::Pod && o["metadata"]["namespace"] == namespace)
            .map(|(_, o)| {
                let name = o["metadata"]["name"].as_str().unwrap_or_default().to_string();
                (name, o["status"]["phase"].as_str().unwrap_or_default().to_string())
            })
            .collect()
    }

    /// The pod in `namespace` whose `label` ends with `suffix`.
    pub fn pod_labeled(&self, namespace: &str, label: &str, suffix: &str) -> Option<Value> {
        let cluster = self.shared.cluster.lock();
        let mut pods = cluster.objects.iter().filter(|((k, _), _)| *k == Kind::Pod).map(|(_, o)| o);
        pods.find(|o| {
            o["metadata"]["namespace"] == namespace
                && o["metadata"]["labels"][label].as_str().is_some_and(|v| v.ends_with(suffix))
        })
        .cloned()
    }

    /// The NetworkPolicy `namespace/name`, if one was made.
    pub fn network_policy(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared.cluster.lock().policies.get(&format!("{namespace}/{name}")).cloned()
    }

    /// Pods created through the API, and pods the kubelet refused for want of memory.
    pub fn created_and_refused(&self) -> (usize, usize) {
        let cluster = self.shared.cluster.lock();
        (cluster.created, cluster.refused)
    }

    /// The most memory (MiB) the kubelet ever admitted at once on `node`.
    pub fn peak_mi(&self, node: &str) -> u64 {
        self.shared.cluster.lock().peak.get(node).copied().unwrap_or(0) >> 20
    }

    /// The next `n` pod creations are answered 429.
    pub fn throttle_creates(&self, n: usize) {
        self.shared.cluster.lock().throttled = n;
    }

    /// Each pod creation takes `delay` before the server acts on it (and answers).
    /// Serves no pod `resize` subresource, as a server before Kubernetes 1.33 does.
    pub fn without_resize(&self) {
        self.shared.cluster.lock().without_resize = true;
    }

    pub fn slow_creates(&self, delay: Duration) {
        self.shared.cluster.lock().slow_creates = delay;
    }

    /// The next `n` pod deletions are answered 500, the pod left as it is.
    pub fn fail_deletes(&self, n: usize) {
        self.shared.cluster.lock().failing_deletes = n;
    }

    /// Pod deletions answered 500 so far.
    pub fn failed_deletes(&self) -> usize {
        self.shared.cluster.lock().failed_deletes
    }

    /// Ends every open watch and log stream (an API server restarting, a proxy timing out).
    pub fn drop_watches(&self) {
        let _ = self.shared.drops.send(());
    }

    /// Forgets the history (an etcd compaction): a watch resumed from before gets 410.
    pub fn compact(&self) {
        let mut cluster = self.shared.cluster.lock();
        cluster.compacted = cluster.rv;
        cluster.history.clear();
    }

    /// While down, every request gets 503 (an API server restarting), and open watches end.
    pub fn set_down(&self, down: bool) {
        self.shared.cluster.lock().down = down;
        if down {
            self.drop_watches();
        }
    }

    /// The StatefulSet `namespace/name` as stored (its spec's and status's replicas).
    pub fn statefulset(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared.get(Kind::StatefulSet, &format!("{namespace}/{name}"))
    }

    /// Changes of replicas made through the `scale` subresource.
    pub fn scale_changes(&self) -> usize {
        self.shared.cluster.lock().scale_changes
    }

    /// Patches served by pods' `resize` subresource.
    pub fn resizes(&self) -> usize {
        self.shared.cluster.lock().resizes
    }

    /// The memory limit the pod `namespace/name`'s first container was last given (its status),
    /// and a resize of it left pending (its reason).
    pub fn pod_memory(&self, namespace: &str, name: &str) -> Option<(String, Option<String>)> {
        let pod = self.shared.get(Kind::Pod, &format!("{namespace}/{name}"))?;
        let given = pod["status"]["containerStatuses"][0]["resources"]["limits"]["memory"].as_str()?.to_string();
        let conditions = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let pending = conditions.iter().find(|c| c["type"] == "PodResizePending");
        Some((given, pending.and_then(|c| c["reason"].as_str().map(str::to_string))))
    }

    /// Lists, watches (each resumed or restarted watch is one) and watches refused with 410.
    pub fn served(&self) -> (usize, usize, usize) {
        let cluster = self.shared.cluster.lock();
        (cluster.lists, cluster.watches, cluster.expired)
    }
}
