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
//! the images a test registered (`ErrImagePull` otherwise), expands `$(VAR)` in the command from
//! the container's environment (the downward API's `status.podIP` is 127.0.0.1), runs it, and
//! marks the pod Ready once its port accepts a TCP connection. The fake has no pod network: all
//! its pods share 127.0.0.1, so at admission it gives each one a port of its own, rewriting the
//! container's first port and its `PORT` variable (as a mutating admission webhook may); the
//! invoker reads the port from the pod object. Tests change the cluster through its methods (a
//! node cordoned, NotReady, another tenant's pod, an eviction) and can drop every open watch or
//! forget the history, as an API server restart or an etcd compaction would.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use k8s_openapi::chrono::{self, DateTime, SecondsFormat, Utc};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, Notify};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Node,
    Pod,
}

struct Change {
    rv: u64,
    kind: Kind,
    kind_of_event: &'static str,
    object: Value,
}

/// A pod's output, line by line with the time each was written (stdout and stderr
/// interleaved, as the kubelet keeps them), and whether it ended.
/// One line of a pod's output and when it was written.
type LogLine = (DateTime<Utc>, Vec<u8>);

#[derive(Default)]
struct PodLog {
    data: Mutex<(Vec<LogLine>, bool)>,
    grew: Notify,
}

impl PodLog {
    fn append(&self, line: &[u8]) {
        let mut data = self.data.lock();
        // Strictly increasing, as a kubelet's nanosecond stamps are in practice.
        let now = Utc::now();
        let at = match data.0.last() {
            Some((last, _)) if *last >= now => *last + chrono::Duration::nanoseconds(1),
            _ => now,
        };
        data.0.push((at, line.to_vec()));
        drop(data);
        self.grew.notify_waiters();
    }

    fn end(&self) {
        self.data.lock().1 = true;
        self.grew.notify_waiters();
    }
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
    /// Images the fake kubelet can "pull".
    images: BTreeSet<String>,
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
}

/// What the server's tasks and the kubelet share.
struct Shared {
    cluster: Mutex<Cluster>,
    events: broadcast::Sender<Arc<Change>>,
    drops: broadcast::Sender<()>,
}

impl Shared {
    /// Stores `object` at a new resourceVersion and tells the watches; returns it as stored.
    fn put(&self, kind: Kind, key: &str, mut object: Value, kind_of_event: &'static str) -> Value {
        let mut cluster = self.cluster.lock();
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

    /// Changes a pod's status if it is still the pod `uid` (not deleted, not replaced).
    fn update_pod(&self, key: &str, uid: &str, change: impl FnOnce(&mut Value)) -> bool {
        let Some(mut pod) = self.get(Kind::Pod, key) else { return false };
        if pod["metadata"]["uid"] != uid {
            return false;
        }
        change(&mut pod);
        self.put(Kind::Pod, key, pod, "MODIFIED");
        true
    }

    /// Deletes a pod at once (grace 0): its processes are killed, its memory freed.
    fn remove_pod(&self, ns: &str, name: &str) -> Option<Value> {
        let key = format!("{ns}/{name}");
        let pod = self.get(Kind::Pod, &key)?;
        {
            let mut cluster = self.cluster.lock();
            cluster.admitted.remove(&key);
            if let Some(pgid) = cluster.processes.remove(&key) {
                kill_group(pgid);
            }
        }
        Some(self.put(Kind::Pod, &key, pod, "DELETED"))
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
                        async move { Ok::<_, Infallible>(serve(request, shared).await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        FakeApiServer { url, shared, _server: server }
    }

    fn get(&self, kind: Kind, key: &str) -> Value {
        self.shared.get(kind, key).expect("no such object")
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
        let mut node = self.get(Kind::Node, name);
        node["status"]["conditions"] = json!([{"type": "Ready", "status": if ready { "True" } else { "Unknown" }}]);
        self.put(Kind::Node, name, node, "MODIFIED");
    }

    pub fn cordon(&self, name: &str, cordoned: bool) {
        let mut node = self.get(Kind::Node, name);
        node["spec"]["unschedulable"] = json!(cordoned);
        self.put(Kind::Node, name, node, "MODIFIED");
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
        let key = format!("{namespace}/{name}");
        let mut pod = self.get(Kind::Pod, &key);
        pod["metadata"]["labels"] = labels;
        self.put(Kind::Pod, &key, pod, "MODIFIED");
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
        self.shared.cluster.lock().images.insert(image.to_string());
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
    pub fn slow_creates(&self, delay: Duration) {
        self.shared.cluster.lock().slow_creates = delay;
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

    /// Lists, watches (each resumed or restarted watch is one) and watches refused with 410.
    pub fn served(&self) -> (usize, usize, usize) {
        let cluster = self.shared.cluster.lock();
        (cluster.lists, cluster.watches, cluster.expired)
    }
}

/// Bytes of a memory quantity as the invoker writes them (`256Mi`, `1Gi`, plain bytes).
fn quantity_bytes(q: &str) -> Option<u64> {
    let (number, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = number.parse().ok()?;
    let factor = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return None,
    };
    Some(n * factor)
}

/// The memory a pod asks for: its containers' requests (their limits where no request is set).
fn pod_request(pod: &Value) -> u64 {
    let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
    containers
        .iter()
        .map(|c| {
            let r = &c["resources"];
            r["requests"]["memory"].as_str().or(r["limits"]["memory"].as_str()).and_then(quantity_bytes).unwrap_or(0)
        })
        .sum()
}

/// `$(NAME)` replaced by the variable's value, as the kubelet expands a container's command.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = arg.to_string();
    for (name, value) in env {
        out = out.replace(&format!("$({name})"), value);
    }
    out
}

/// The fake kubelet for one pod: admission, "pull", start, readiness, end.
async fn kubelet(shared: Arc<Shared>, key: String) {
    let Some(pod) = shared.get(Kind::Pod, &key) else { return };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let node = pod["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
    let request = pod_request(&pod);
    // Admission: within the node's allocatable, counting every pod it admitted before.
    let refused = {
        let mut cluster = shared.cluster.lock();
        let allocatable = cluster
            .objects
            .get(&(Kind::Node, node.clone()))
            .and_then(|n| n["status"]["allocatable"]["memory"].as_str().and_then(quantity_bytes));
        let used: u64 = cluster.admitted.values().filter(|(n, _)| *n == node).map(|(_, b)| b).sum();
        match allocatable {
            Some(total) if used + request <= total => {
                cluster.admitted.insert(key.clone(), (node.clone(), request));
                let peak = cluster.peak.entry(node.clone()).or_default();
                *peak = (*peak).max(used + request);
                None
            }
            Some(total) => {
                cluster.refused += 1;
                Some(format!(
                    "Pod Node didn't have enough resource: memory, requested: {request}, used: {used}, capacity: {total}"
                ))
            }
            None => Some(format!("node \"{node}\" not found")),
        }
    };
    if let Some(message) = refused {
        shared.update_pod(&key, &uid, |p| {
            p["status"] = json!({"phase": "Failed", "reason": "OutOfmemory", "message": message});
        });
        return;
    }
    let container = pod["spec"]["containers"][0].clone();
    let image = container["image"].as_str().unwrap_or_default().to_string();
    if !shared.cluster.lock().images.contains(&image) {
        shared.update_pod(&key, &uid, |p| {
            p["status"]["containerStatuses"] = json!([{"name": container["name"], "ready": false, "restartCount": 0,
                "image": image, "imageID": "",
                "state": {"waiting": {"reason": "ErrImagePull", "message": format!("pull access denied for {image}")}}}]);
        });
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut env = BTreeMap::new();
    for var in container["env"].as_array().cloned().unwrap_or_default() {
        let name = var["name"].as_str().unwrap_or_default().to_string();
        let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("status.podIP") | Some("status.hostIP") => "127.0.0.1".to_string(),
            Some("metadata.name") => pod["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            Some("metadata.namespace") => pod["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
            _ if name == "PORT" => port.to_string(),
            _ => var["value"].as_str().unwrap_or_default().to_string(),
        };
        env.insert(name, value);
    }
    let argv: Vec<String> = container["command"]
        .as_array()
        .into_iter()
        .chain(container["args"].as_array())
        .flatten()
        .filter_map(|a| a.as_str())
        .map(|a| expand(a, &env))
        .collect();
    // The pod's own /tmp (its emptyDir), gone with the pod: the fake has no mount namespace, so
    // the process gets it as TMPDIR.
    let tmp = tempfile::Builder::new().prefix("fake-pod-tmp-").tempdir().unwrap();
    let started = match argv.split_first() {
        Some((program, args)) => tokio::process::Command::new(program)
            .args(args)
            .env_clear()
            .envs(&env)
            .env("TMPDIR", tmp.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string()),
        None => Err("the fake kubelet runs only pods with a command".to_string()),
    };
    let mut child = match started {
        Ok(child) => child,
        Err(e) => {
            shared.cluster.lock().admitted.remove(&key);
            shared.update_pod(&key, &uid, |p| {
                p["status"] = json!({"phase": "Failed", "containerStatuses": [{"name": container["name"], "ready": false,
                    "state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": e}}}]});
            });
            return;
        }
    };
    let log = Arc::new(PodLog::default());
    {
        let mut cluster = shared.cluster.lock();
        if !cluster.objects.contains_key(&(Kind::Pod, key.clone())) {
            return; // deleted meanwhile: the child is killed on drop
        }
        cluster.processes.insert(key.clone(), child.id().unwrap_or_default() as i32);
        cluster.logs.insert(key.clone(), log.clone());
    }
    let readers = [
        tokio::spawn(copy_into(child.stdout.take(), log.clone())),
        tokio::spawn(copy_into(child.stderr.take(), log.clone())),
    ];
    let running = |ready: bool| {
        move |p: &mut Value| {
            if let Some(ports) = p["spec"]["containers"][0]["ports"].as_array_mut() {
                if let Some(first) = ports.first_mut() {
                    first["containerPort"] = json!(port);
                }
            }
            if let Some(vars) = p["spec"]["containers"][0]["env"].as_array_mut() {
                for var in vars.iter_mut().filter(|v| v["name"] == "PORT") {
                    var["value"] = json!(port.to_string());
                }
            }
            let name = p["spec"]["containers"][0]["name"].clone();
            p["status"] = json!({"phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{"name": name, "ready": ready, "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]});
        }
    };
    if !shared.update_pod(&key, &uid, running(false)) {
        return;
    }
    // Readiness: a TCP probe on the port until it answers or the process ends.
    let mut ready = false;
    let status = loop {
        if !ready && tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            ready = true;
            if !shared.update_pod(&key, &uid, running(true)) {
                return;
            }
        }
        let wait = if ready { Duration::from_secs(3600) } else { Duration::from_millis(20) };
        if let Ok(status) = tokio::time::timeout(wait, child.wait()).await {
            break status;
        }
    };
    for reader in readers {
        let _ = reader.await;
    }
    log.end();
    let evicted = {
        let mut cluster = shared.cluster.lock();
        cluster.admitted.remove(&key);
        cluster.processes.remove(&key);
        cluster.evicting.remove(&key)
    };
    let code = status.ok().and_then(|s| s.code()).unwrap_or(137);
    shared.update_pod(&key, &uid, |p| {
        let name = p["spec"]["containers"][0]["name"].clone();
        let terminated =
            json!({"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }}});
        p["status"] = if evicted {
            json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."})
        } else {
            json!({"phase": if code == 0 { "Succeeded" } else { "Failed" }, "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": name, "ready": false, "restartCount": 0, "state": terminated}]})
        };
    });
}

/// Whole lines, as a kubelet's log keeps them (each stream line by line, interleaved by arrival,
/// each with the time it came).
async fn copy_into(pipe: Option<impl tokio::io::AsyncRead + Unpin>, log: Arc<PodLog>) {
    use tokio::io::AsyncBufReadExt as _;
    let Some(pipe) = pipe else { return };
    let mut pipe = tokio::io::BufReader::new(pipe);
    let mut line = Vec::new();
    while pipe.read_until(b'\n', &mut line).await.is_ok_and(|n| n > 0) {
        log.append(&line);
        line.clear();
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn json_response(status: u16, body: Value) -> hyper::Response<Body> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// Splits `k=v,k2=v2` (equality only, as the invoker sends).
fn label_selector(query: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let Some(selector) = query.get("labelSelector") else { return Vec::new() };
    selector
        .split(',')
        .filter_map(|term| term.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim_start_matches('=').trim().to_string()))
        .collect()
}

/// Whether `object` is in `namespace` (all when `None`) and carries every label of `selector`.
fn selected(object: &Value, namespace: Option<&str>, selector: &[(String, String)]) -> bool {
    let meta = &object["metadata"];
    namespace.is_none_or(|ns| meta["namespace"] == ns)
        && selector.iter().all(|(k, v)| meta["labels"][k.as_str()].as_str() == Some(v.as_str()))
}

async fn serve(request: hyper::Request<hyper::body::Incoming>, shared: Arc<Shared>) -> hyper::Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let query: BTreeMap<String, String> =
        serde_urlencoded::from_str(request.uri().query().unwrap_or("")).unwrap_or_default();
    if shared.cluster.lock().down {
        return json_response(503, status(503, "ServiceUnavailable", "the fake API server is down"));
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    use hyper::Method;
    match (&method, segments.as_slice()) {
        (&Method::GET, ["api", "v1", "nodes"]) => list_or_watch(&shared, Kind::Node, None, &query),
        (&Method::GET, ["api", "v1", "pods"]) => list_or_watch(&shared, Kind::Pod, None, &query),
        (&Method::GET, ["api", "v1", "namespaces", ns, "pods"]) => list_or_watch(&shared, Kind::Pod, Some(ns), &query),
        (&Method::POST, ["api", "v1", "namespaces", ns, "pods"]) => {
            let ns = ns.to_string();
            let (throttled, slow) = {
                let mut cluster = shared.cluster.lock();
                let throttled = cluster.throttled > 0;
                cluster.throttled = cluster.throttled.saturating_sub(1);
                (throttled, cluster.slow_creates)
            };
            if throttled {
                return json_response(429, status(429, "TooManyRequests", "the server has received too many requests"));
            }
            let body = match request.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(_) => return json_response(400, status(400, "BadRequest", "unreadable body")),
            };
            // A slow server still creates the pod, whether or not the client waited for it.
            let creating = tokio::spawn(async move {
                tokio::time::sleep(slow).await;
                match serde_json::from_slice::<Value>(&body) {
                    Ok(pod) => create_pod(&shared, &ns, pod),
                    Err(e) => json_response(400, status(400, "BadRequest", &format!("the body is not JSON: {e}"))),
                }
            });
            creating.await.unwrap_or_else(|_| json_response(500, status(500, "InternalError", "the creation panicked")))
        }
        (&Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => {
            match shared.get(Kind::Pod, &format!("{ns}/{name}")) {
                Some(pod) => json_response(200, pod),
                None => json_response(404, status(404, "NotFound", &format!("pods \"{name}\" not found"))),
            }
        }
        (&Method::DELETE, ["api", "v1", "namespaces", ns, "pods", name]) => match shared.remove_pod(ns, name) {
            Some(pod) => json_response(200, pod),
            None => json_response(404, status(404, "NotFound", &format!("pods \"{name}\" not found"))),
        },
        (&Method::GET, ["api", "v1", "namespaces", ns, "pods", name, "log"]) => {
            pod_log(&shared, &format!("{ns}/{name}"), &query)
        }
        (
            &Method::POST | &Method::PUT,
            ["apis", "networking.k8s.io", "v1", "namespaces", ns, "networkpolicies", rest @ ..],
        ) => {
            let key = match rest {
                [] => None,
                [name] => Some(format!("{ns}/{name}")),
                _ => return json_response(404, status(404, "NotFound", "no such resource")),
            };
            let ns = ns.to_string();
            let body = match request.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(_) => return json_response(400, status(400, "BadRequest", "unreadable body")),
            };
            match serde_json::from_slice::<Value>(&body) {
                Ok(policy) => put_policy(&shared, &ns, key, policy),
                Err(e) => json_response(400, status(400, "BadRequest", &format!("the body is not JSON: {e}"))),
            }
        }
        (&Method::GET, ["apis", "networking.k8s.io", "v1", "namespaces", ns, "networkpolicies", name]) => {
            match shared.cluster.lock().policies.get(&format!("{ns}/{name}")) {
                Some(policy) => json_response(200, policy.clone()),
                None => json_response(404, status(404, "NotFound", &format!("networkpolicies \"{name}\" not found"))),
            }
        }
        (_, _) => json_response(404, status(404, "NotFound", &format!("the fake serves no {method} {path}"))),
    }
}

fn list_or_watch(
    shared: &Arc<Shared>,
    kind: Kind,
    namespace: Option<&str>,
    query: &BTreeMap<String, String>,
) -> hyper::Response<Body> {
    let selector = label_selector(query);
    let namespace = namespace.map(str::to_string);
    let watching = query.get("watch").is_some_and(|w| w == "1" || w == "true");
    if !watching {
        let mut cluster = shared.cluster.lock();
        cluster.lists += 1;
        let items: Vec<Value> = cluster
            .objects
            .iter()
            .filter(|((k, _), o)| *k == kind && selected(o, namespace.as_deref(), &selector))
            .map(|(_, o)| o.clone())
            .collect();
        let list_kind = if kind == Kind::Node { "NodeList" } else { "PodList" };
        return json_response(
            200,
            json!({"kind": list_kind, "apiVersion": "v1",
                   "metadata": {"resourceVersion": cluster.rv.to_string()}, "items": items}),
        );
    }
    let from: u64 = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let line = |event: Value| Ok(Frame::data(Bytes::from(format!("{event}\n"))));
    let wanted = move |c: &Change| c.kind == kind && selected(&c.object, namespace.as_deref(), &selector);
    // Subscribed before the history is read: nothing falls between the two.
    let mut live = shared.events.subscribe();
    let mut dropped = shared.drops.subscribe();
    let (backlog, expired, mut seen) = {
        let mut cluster = shared.cluster.lock();
        let expired = from != 0 && from < cluster.compacted;
        cluster.watches += 1;
        cluster.expired += usize::from(expired);
        let backlog: Vec<Value> = cluster
            .history
            .iter()
            .filter(|c| c.rv > from && wanted(c))
            .map(|c| json!({"type": c.kind_of_event, "object": c.object}))
            .collect();
        (backlog, expired, from.max(cluster.history.last().map_or(0, |c| c.rv)))
    };
    tokio::spawn(async move {
        if expired {
            let _ = tx
                .send(line(json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")})))
                .await;
            return;
        }
        for event in backlog {
            if tx.send(line(event)).await.is_err() {
                return;
            }
        }
        loop {
            // A drop sent before a change wins over it: a server going down delivers nothing after.
            tokio::select! {
                biased;
                _ = dropped.recv() => return,
                change = live.recv() => match change {
                    Ok(c) if c.rv > seen && wanted(&c) => {
                        seen = c.rv;
                        if tx.send(line(json!({"type": c.kind_of_event, "object": c.object}))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
            }
        }
    });
    streaming(rx, "application/json")
}

fn streaming(
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
    content_type: &str,
) -> hyper::Response<Body> {
    hyper::Response::builder()
        .status(200)
        .header("content-type", content_type)
        .body(BodyExt::boxed(StreamBody::new(tokio_stream_from(rx))))
        .unwrap()
}

/// A DNS-1123 subdomain, as the API server requires of a pod's name.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn create_pod(shared: &Arc<Shared>, ns: &str, mut pod: Value) -> hyper::Response<Body> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
    let invalid = |field: &str, why: &str| {
        let message = format!("Pod \"{name}\" is invalid: {field}: {why}");
        json_response(422, status(422, "Invalid", &message))
    };
    if !valid_name(&name) {
        return invalid(
            "metadata.name",
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
        );
    }
    let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
    if containers.is_empty() {
        return invalid("spec.containers", "Required value");
    }
    if let Some(i) = containers.iter().position(|c| c["name"].as_str().is_none_or(str::is_empty)) {
        return invalid(&format!("spec.containers[{i}].name"), "Required value");
    }
    if let Some(i) = containers.iter().position(|c| c["image"].as_str().is_none_or(str::is_empty)) {
        return invalid(&format!("spec.containers[{i}].image"), "Required value");
    }
    if pod["metadata"]["namespace"].as_str().is_some_and(|n| n != ns) {
        let message = "the namespace of the object does not match the namespace on the request";
        return json_response(400, status(400, "BadRequest", message));
    }
    let key = format!("{ns}/{name}");
    {
        let mut cluster = shared.cluster.lock();
        if cluster.objects.contains_key(&(Kind::Pod, key.clone())) {
            let message = format!("pods \"{name}\" already exists");
            return json_response(409, status(409, "AlreadyExists", &message));
        }
        cluster.created += 1;
        cluster.uid += 1;
        pod["metadata"]["uid"] = json!(format!("pod-uid-{}", cluster.uid));
    }
    pod["metadata"]["namespace"] = json!(ns);
    pod["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    pod["status"] = json!({"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]});
    let stored = shared.put(Kind::Pod, &key, pod, "ADDED");
    if stored["spec"]["nodeName"].as_str().is_some() {
        tokio::spawn(kubelet(shared.clone(), key));
    }
    json_response(201, stored)
}

/// Creates a policy (`key` none: POST, 409 on a clash) or replaces one (PUT at `key`, 409 when
/// its `resourceVersion` is not the stored one), as the API server does.
fn put_policy(shared: &Arc<Shared>, ns: &str, key: Option<String>, mut policy: Value) -> hyper::Response<Body> {
    let name = policy["metadata"]["name"].as_str().unwrap_or_default().to_string();
    if !valid_name(&name) || policy["spec"]["podSelector"].is_null() {
        let message = format!("NetworkPolicy \"{name}\" is invalid: metadata.name or spec.podSelector");
        return json_response(422, status(422, "Invalid", &message));
    }
    let mut cluster = shared.cluster.lock();
    let at = format!("{ns}/{name}");
    let stored = cluster.policies.get(&at).map(|p| p["metadata"]["resourceVersion"].clone());
    match (&key, stored) {
        (None, Some(_)) => {
            let message = format!("networkpolicies.networking.k8s.io \"{name}\" already exists");
            return json_response(409, status(409, "AlreadyExists", &message));
        }
        (Some(k), _) if *k != at => return json_response(400, status(400, "BadRequest", "the name does not match")),
        (Some(_), None) => return json_response(404, status(404, "NotFound", "no such networkpolicy")),
        (Some(_), Some(rv)) if policy["metadata"]["resourceVersion"] != rv => {
            return json_response(409, status(409, "Conflict", "the object has been modified"));
        }
        _ => {}
    }
    cluster.rv += 1;
    policy["metadata"]["namespace"] = json!(ns);
    policy["metadata"]["resourceVersion"] = json!(cluster.rv.to_string());
    cluster.policies.insert(at, policy.clone());
    json_response(if key.is_none() { 201 } else { 200 }, policy)
}

/// A pod's log: every line (from `since`, inclusive, as the API server's `sinceTime`), each
/// behind its RFC 3339 time when `timestamps`; with `follow`, new lines as they come, until the
/// container ends or the server drops its streams.
fn pod_log(shared: &Arc<Shared>, key: &str, query: &BTreeMap<String, String>) -> hyper::Response<Body> {
    let log = shared.cluster.lock().logs.get(key).cloned();
    let Some(log) = log else {
        let name = key.split('/').nth(1).unwrap_or_default();
        let message = format!("container \"main\" in pod \"{name}\" is waiting to start");
        return json_response(400, status(400, "BadRequest", &message));
    };
    let flag = |k: &str| query.get(k).is_some_and(|f| f == "true" || f == "1");
    let (follow, timestamps) = (flag("follow"), flag("timestamps"));
    let since = match query.get("sinceTime").map(|t| DateTime::parse_from_rfc3339(t)) {
        None => None,
        Some(Ok(t)) => Some(t.with_timezone(&Utc)),
        Some(Err(e)) => return json_response(400, status(400, "BadRequest", &format!("sinceTime: {e}"))),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let mut dropped = shared.drops.subscribe();
    tokio::spawn(async move {
        let mut sent = 0;
        loop {
            let notified = log.grew.notified();
            let (lines, done) = {
                let data = log.data.lock();
                (data.0[sent..].to_vec(), data.1)
            };
            sent += lines.len();
            for (at, line) in lines.into_iter().filter(|(at, _)| since.is_none_or(|s| *at >= s)) {
                let mut out = Vec::new();
                if timestamps {
                    out.extend_from_slice(at.to_rfc3339_opts(SecondsFormat::Nanos, true).as_bytes());
                    out.push(b' ');
                }
                out.extend_from_slice(&line);
                if tx.send(Ok(Frame::data(Bytes::from(out)))).await.is_err() {
                    return;
                }
            }
            if done || !follow {
                return;
            }
            tokio::select! {
                biased;
                _ = dropped.recv() => return,
                _ = notified => {}
            }
        }
    });
    streaming(rx, "text/plain")
}

/// An mpsc receiver as a stream of body frames.
fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
