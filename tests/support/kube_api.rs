//! A fake Kubernetes API server for the Kubernetes factory's tests: the real REST and watch
//! wire format for Nodes and Pods (JSON lists with a `resourceVersion`; `?watch=1` as a chunked
//! stream of `{"type", "object"}` lines; a watch from a version older than what the server keeps
//! gets an `ERROR` event with a 410 `Expired` Status, as a real server's does), on 127.0.0.1.
//! Tests change the cluster through its methods (a node cordoned, NotReady, another tenant's
//! pod) and can drop every open watch or forget the history, as an API server restart or an
//! etcd compaction would.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::broadcast;

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

#[derive(Default)]
struct Cluster {
    rv: u64,
    objects: BTreeMap<(Kind, String), Value>,
    history: Vec<Change>,
    /// Changes below this version are forgotten: a watch from before gets 410.
    compacted: u64,
    /// False while the server "restarts": every request gets 503.
    down: bool,
    /// Requests served: lists, watches, watches refused with 410.
    lists: usize,
    watches: usize,
    expired: usize,
}

pub struct FakeApiServer {
    pub url: String,
    cluster: Arc<Mutex<Cluster>>,
    events: broadcast::Sender<Arc<Change>>,
    drops: broadcast::Sender<()>,
    _server: tokio::task::JoinHandle<()>,
}

impl FakeApiServer {
    pub async fn start() -> FakeApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let cluster = Arc::new(Mutex::new(Cluster::default()));
        let (events, _) = broadcast::channel(1024);
        let (drops, _) = broadcast::channel(16);
        let (c, e, d) = (cluster.clone(), events.clone(), drops.clone());
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (c, e, d) = (c.clone(), e.clone(), d.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (c, e, d) = (c.clone(), e.clone(), d.clone());
                        async move { Ok::<_, Infallible>(serve(request, c, e, d)) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        FakeApiServer { url, cluster, events, drops, _server: server }
    }

    fn put(&self, kind: Kind, name: &str, mut object: Value, kind_of_event: &'static str) {
        let mut cluster = self.cluster.lock();
        cluster.rv += 1;
        let rv = cluster.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if kind_of_event == "DELETED" {
            cluster.objects.remove(&(kind, name.to_string()));
        } else {
            cluster.objects.insert((kind, name.to_string()), object.clone());
        }
        let change = Arc::new(Change { rv, kind, kind_of_event, object });
        cluster.history.push(Change { rv, kind, kind_of_event, object: change.object.clone() });
        drop(cluster);
        let _ = self.events.send(change);
    }

    fn get(&self, kind: Kind, name: &str) -> Value {
        self.cluster.lock().objects.get(&(kind, name.to_string())).cloned().expect("no such object")
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

    /// A running pod of another tenant, bound to `node`, requesting `memory_mi` MiB.
    pub fn add_pod(&self, namespace: &str, name: &str, node: &str, memory_mi: u64) {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox",
                "resources": {"requests": {"memory": format!("{memory_mi}Mi")}}}]},
            "status": {"phase": "Running"}
        });
        self.put(Kind::Pod, &format!("{namespace}/{name}"), pod, "ADDED");
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        let pod = self.get(Kind::Pod, &key);
        self.put(Kind::Pod, &key, pod, "DELETED");
    }

    /// Ends every open watch (an API server restarting, a proxy timing out).
    pub fn drop_watches(&self) {
        let _ = self.drops.send(());
    }

    /// Forgets the history (an etcd compaction): a watch resumed from before gets 410.
    pub fn compact(&self) {
        let mut cluster = self.cluster.lock();
        cluster.compacted = cluster.rv;
        cluster.history.clear();
    }

    /// While down, every request gets 503 (an API server restarting), and open watches end.
    pub fn set_down(&self, down: bool) {
        self.cluster.lock().down = down;
        if down {
            self.drop_watches();
        }
    }

    /// Lists, watches (each resumed or restarted watch is one) and watches refused with 410.
    pub fn served(&self) -> (usize, usize, usize) {
        let cluster = self.cluster.lock();
        (cluster.lists, cluster.watches, cluster.expired)
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

fn serve(
    request: hyper::Request<hyper::body::Incoming>,
    cluster: Arc<Mutex<Cluster>>,
    events: broadcast::Sender<Arc<Change>>,
    drops: broadcast::Sender<()>,
) -> hyper::Response<Body> {
    let kind = match (request.method(), request.uri().path()) {
        (&hyper::Method::GET, "/api/v1/nodes") => Kind::Node,
        (&hyper::Method::GET, "/api/v1/pods") => Kind::Pod,
        (_, path) => return json_response(404, status(404, "NotFound", &format!("the fake serves no {path}"))),
    };
    if cluster.lock().down {
        return json_response(503, status(503, "ServiceUnavailable", "the fake API server is down"));
    }
    let query: BTreeMap<String, String> =
        serde_urlencoded::from_str(request.uri().query().unwrap_or("")).unwrap_or_default();
    let watching = query.get("watch").is_some_and(|w| w == "1" || w == "true");
    if !watching {
        let mut cluster = cluster.lock();
        cluster.lists += 1;
        let items: Vec<Value> =
            cluster.objects.iter().filter(|((k, _), _)| *k == kind).map(|(_, o)| o.clone()).collect();
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
    // Subscribed before the history is read: nothing falls between the two.
    let mut live = events.subscribe();
    let mut dropped = drops.subscribe();
    let (backlog, expired, mut seen) = {
        let mut cluster = cluster.lock();
        let expired = from != 0 && from < cluster.compacted;
        cluster.watches += 1;
        cluster.expired += usize::from(expired);
        let backlog: Vec<Value> = cluster
            .history
            .iter()
            .filter(|c| c.kind == kind && c.rv > from)
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
            tokio::select! {
                change = live.recv() => match change {
                    Ok(c) if c.kind == kind && c.rv > seen => {
                        seen = c.rv;
                        if tx.send(line(json!({"type": c.kind_of_event, "object": c.object}))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
                _ = dropped.recv() => return,
            }
        }
    });
    let stream = tokio_stream_from(rx);
    hyper::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap()
}

/// An mpsc receiver as a stream of body frames.
fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
