//! A pod's `resize` subresource (in-place pod resize, Kubernetes 1.33 on): a strategic merge
//! patch of its containers' `resources`, matched by container name (anything else in it is
//! refused with 422, as the API server refuses it), and the fake kubelet acting on it: within
//! its node's allocatable memory, counting every other pod it admitted, it writes each
//! container's new limit into that container's `memory.max` (the fake has no cgroups: a file per
//! container, which the container's command sees as `/sys/fs/cgroup`) and sets the status's
//! `resources` and `allocatedResources`; beyond the node's free memory the resize stays pending
//! (`PodResizePending`, `Deferred`; `Infeasible` beyond all the node has), as a kubelet leaves
//! it. Unlike a kubelet, the fake shrinks a container at once whatever it uses, and does not try
//! a deferred resize again by itself.

use super::http::{json_response, status, Body};
use super::kubelet::{limit_bytes, pod_request, quantity_bytes};
use super::{Kind, Shared};
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) fn resize(shared: &Arc<Shared>, ns: &str, name: &str, patch: &Value) -> hyper::Response<Body> {
    let key = format!("{ns}/{name}");
    let invalid = |why: &str| {
        let message = format!("Pod \"{name}\" is invalid: spec: Forbidden: {why}");
        json_response(422, status(422, "Invalid", &message))
    };
    let Some(pod) = shared.get(Kind::Pod, &key) else {
        return json_response(404, status(404, "NotFound", &format!("pods \"{name}\" not found")));
    };
    let only_containers = patch.as_object().is_some_and(|o| o.keys().all(|k| k == "spec"))
        && patch["spec"].as_object().is_some_and(|o| o.keys().all(|k| k == "containers"));
    let Some(changes) = patch["spec"]["containers"].as_array().filter(|_| only_containers) else {
        return invalid("only a pod's containers' resources may be resized");
    };
    let mut resized = pod.clone();
    for change in changes {
        let fields_ok = change.as_object().is_some_and(|o| o.keys().all(|k| k == "name" || k == "resources"));
        let containers = resized["spec"]["containers"].as_array_mut();
        let target = containers.and_then(|cs| cs.iter_mut().find(|c| c["name"] == change["name"]));
        let Some(container) = target.filter(|_| fields_ok) else {
            return invalid("only the resources of the pod's own containers may be resized");
        };
        for part in ["requests", "limits"] {
            if let Some(values) = change["resources"][part].as_object() {
                for (resource, value) in values {
                    if value.as_str().and_then(quantity_bytes).is_none() && resource == "memory" {
                        return invalid(&format!("{part}.memory: not a quantity"));
                    }
                    container["resources"][part][resource] = value.clone();
                }
            }
        }
    }
    let stored = match shared.update(Kind::Pod, &key, |p| {
        if p["metadata"]["uid"] != pod["metadata"]["uid"] {
            return false;
        }
        p["spec"]["containers"] = resized["spec"]["containers"].clone();
        true
    }) {
        Some(stored) => stored,
        None => return json_response(409, status(409, "Conflict", "the pod changed meanwhile")),
    };
    let shared = shared.clone();
    tokio::spawn(async move { actuate(&shared, &key) });
    json_response(200, stored)
}

/// The kubelet's side: admits the pod's new request on its node and applies it, or leaves it
/// pending. A pod not yet admitted (not started) takes its new size when it starts.
fn actuate(shared: &Shared, key: &str) {
    let Some(pod) = shared.get(Kind::Pod, key) else { return };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let request = pod_request(&pod);
    let pending = {
        let mut cluster = shared.cluster.lock();
        let Some((node, _)) = cluster.admitted.get(key).cloned() else { return };
        let allocatable = cluster
            .objects
            .get(&(Kind::Node, node.clone()))
            .and_then(|n| n["status"]["allocatable"]["memory"].as_str().and_then(quantity_bytes))
            .unwrap_or(0);
        let others: u64 =
            cluster.admitted.iter().filter(|(k, (n, _))| *n == node && *k != key).map(|(_, (_, b))| b).sum();
        if request > allocatable {
            Some((
                "Infeasible",
                format!("Node didn't have enough capacity: memory, requested: {request}, capacity: {allocatable}"),
            ))
        } else if others + request > allocatable {
            Some(("Deferred", format!("Node didn't have enough resource: memory, requested: {request}, used: {others}, capacity: {allocatable}")))
        } else {
            cluster.admitted.insert(key.to_string(), (node.clone(), request));
            let peak = cluster.peak.entry(node).or_default();
            *peak = (*peak).max(others + request);
            for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
                let cgroup = format!("{key}#{}", container["name"].as_str().unwrap_or_default());
                if let Some(dir) = cluster.cgroups.get(&cgroup) {
                    let _ = std::fs::write(dir.join("memory.max"), limit_bytes(container));
                }
            }
            None
        }
    };
    shared.update_pod(key, &uid, |p| {
        let mut conditions: Vec<Value> = p["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c["type"] != "PodResizePending")
            .collect();
        match &pending {
            Some((reason, message)) => conditions
                .push(json!({"type": "PodResizePending", "status": "True", "reason": reason, "message": message})),
            None => {
                let containers = p["spec"]["containers"].as_array().cloned().unwrap_or_default();
                for status in p["status"]["containerStatuses"].as_array_mut().into_iter().flatten() {
                    if let Some(c) = containers.iter().find(|c| c["name"] == status["name"]) {
                        status["resources"] = c["resources"].clone();
                        status["allocatedResources"] = c["resources"]["requests"].clone();
                    }
                }
            }
        }
        p["status"]["conditions"] = json!(conditions);
    });
}
