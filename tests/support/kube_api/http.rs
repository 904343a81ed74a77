//! The fake's HTTP side: routes, lists and watches, pod creation and deletion, network
//! policies, a pod's log; every answer in the API server's JSON and Status shapes.

use super::kubelet::kubelet;
use super::statefulset;
use super::{Change, Kind, Shared};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use invoker_kubernetes::k8s_openapi::chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

pub(super) type Body = BoxBody<Bytes, Infallible>;

pub(super) fn json_response(status: u16, body: Value) -> hyper::Response<Body> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

pub(super) fn status(code: u16, reason: &str, message: &str) -> Value {
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

pub(super) async fn serve(
    request: hyper::Request<hyper::body::Incoming>,
    shared: Arc<Shared>,
) -> hyper::Response<Body> {
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
        (&Method::GET, ["api", "v1"]) => json_response(200, core_resources(shared.cluster.lock().without_resize)),
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
        (&Method::DELETE, ["api", "v1", "namespaces", ns, "pods", name]) => {
            let failing = {
                let mut cluster = shared.cluster.lock();
                let failing = cluster.failing_deletes > 0;
                if failing {
                    cluster.failing_deletes -= 1;
                    cluster.failed_deletes += 1;
                }
                failing
            };
            if failing {
                return json_response(500, status(500, "InternalError", "etcdserver: request timed out"));
            }
            match shared.remove_pod(ns, name) {
                Some(pod) => json_response(200, pod),
                None => json_response(404, status(404, "NotFound", &format!("pods \"{name}\" not found"))),
            }
        }
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
        (&Method::POST, ["apis", "apps", "v1", "namespaces", ns, "statefulsets"]) => {
            let ns = ns.to_string();
            match read_json(request).await {
                Ok(set) => statefulset::create(&shared, &ns, set),
                Err(response) => response,
            }
        }
        (&Method::PATCH, ["api", "v1", "namespaces", _, "pods", _, "resize"])
            if shared.cluster.lock().without_resize =>
        {
            json_response(404, status(404, "NotFound", "the server could not find the requested resource"))
        }
        (&Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name, "resize"]) => {
            let strategic =
                request.headers().get("content-type").is_some_and(|t| t == "application/strategic-merge-patch+json");
            if !strategic {
                let message = "the fake takes strategic merge patches of a pod's resize only";
                return json_response(415, status(415, "UnsupportedMediaType", message));
            }
            let (ns, name) = (ns.to_string(), name.to_string());
            match read_json(request).await {
                Ok(patch) => {
                    shared.cluster.lock().resizes += 1;
                    super::resize::resize(&shared, &ns, &name, &patch)
                }
                Err(response) => response,
            }
        }
        (&Method::GET, ["apis", "apps", "v1", "namespaces", ns, "statefulsets", name]) => {
            statefulset::get(&shared, ns, name)
        }
        (&Method::GET, ["apis", "apps", "v1", "namespaces", ns, "statefulsets", name, "scale"]) => {
            statefulset::get_scale(&shared, ns, name)
        }
        (&Method::PATCH | &Method::PUT, ["apis", "apps", "v1", "namespaces", ns, "statefulsets", name, "scale"]) => {
            let merge = request.headers().get("content-type").is_some_and(|t| t == "application/merge-patch+json");
            if method == Method::PATCH && !merge {
                let message = "the fake takes merge patches (application/merge-patch+json) of a scale only";
                return json_response(415, status(415, "UnsupportedMediaType", message));
            }
            let (ns, name) = (ns.to_string(), name.to_string());
            match read_json(request).await {
                Ok(body) => statefulset::set_scale(&shared, &ns, &name, &body),
                Err(response) => response,
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

/// The request's body as JSON, or the 400 that says why not.
/// The core group's discovery (`GET /api/v1`): the resources the fake serves, as an
/// `APIResourceList`; `pods/resize` only on a server that has it.
fn core_resources(without_resize: bool) -> Value {
    let resource = |name: &str, kind: &str, verbs: &[&str]| json!({ "name": name, "singularName": "", "namespaced": name != "nodes", "kind": kind, "verbs": verbs });
    let mut resources = vec![
        resource("nodes", "Node", &["get", "list", "watch"]),
        resource("pods", "Pod", &["create", "delete", "get", "list", "watch"]),
        resource("pods/log", "Pod", &["get"]),
    ];
    if !without_resize {
        resources.push(resource("pods/resize", "Pod", &["get", "patch", "update"]));
    }
    json!({ "kind": "APIResourceList", "groupVersion": "v1", "resources": resources })
}

async fn read_json(request: hyper::Request<hyper::body::Incoming>) -> Result<Value, hyper::Response<Body>> {
    let body = request
        .into_body()
        .collect()
        .await
        .map_err(|_| json_response(400, status(400, "BadRequest", "unreadable body")))?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| json_response(400, status(400, "BadRequest", &format!("the body is not JSON: {e}"))))
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
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

pub(super) fn create_pod(shared: &Arc<Shared>, ns: &str, mut pod: Value) -> hyper::Response<Body> {
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
    let log = {
        let logs = &shared.cluster.lock().logs;
        match query.get("container") {
            Some(c) => logs.get(&format!("{key}#{c}")).or(logs.get(key)).cloned(),
            None => logs.get(key).cloned(),
        }
    };
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
