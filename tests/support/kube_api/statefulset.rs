//! The fake's StatefulSets (`apps/v1`): create, get, and the `scale` subresource (get, merge
//! patch, replace), in the API server's shapes; and a controller that acts as Kubernetes' own
//! with `podManagementPolicy: Parallel`: a pod `<name>-<ordinal>` from the template for every
//! ordinal below the replicas (bound to the first Ready, schedulable node: the fake has no
//! scheduler), a pod that failed deleted and made again, and the pods at and above the replicas
//! deleted gracefully (SIGTERM, `terminationGracePeriodSeconds` to exit, then SIGKILL, as a
//! kubelet does), all at once.

use super::http::{create_pod, json_response, status, valid_name, Body};
use super::kubelet::terminate;
use super::{Kind, Shared};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

fn not_found(name: &str) -> hyper::Response<Body> {
    json_response(404, status(404, "NotFound", &format!("statefulsets.apps \"{name}\" not found")))
}

pub(super) fn create(shared: &Arc<Shared>, ns: &str, mut set: Value) -> hyper::Response<Body> {
    let name = set["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let invalid = |field: &str, why: &str| {
        json_response(422, status(422, "Invalid", &format!("StatefulSet.apps \"{name}\" is invalid: {field}: {why}")))
    };
    if !valid_name(&name) {
        return invalid("metadata.name", "a lowercase RFC 1123 subdomain");
    }
    let selector = set["spec"]["selector"]["matchLabels"].as_object().cloned().unwrap_or_default();
    if selector.is_empty() {
        return invalid("spec.selector", "Required value");
    }
    let labels = &set["spec"]["template"]["metadata"]["labels"];
    if selector.iter().any(|(k, v)| labels[k] != *v) {
        return invalid("spec.template.metadata.labels", "`selector` does not match template `labels`");
    }
    if set["spec"]["template"]["spec"]["containers"].as_array().is_none_or(|c| c.is_empty()) {
        return invalid("spec.template.spec.containers", "Required value");
    }
    if set["spec"]["replicas"].as_i64().is_some_and(|r| r < 0) {
        return invalid("spec.replicas", "must be greater than or equal to 0");
    }
    let key = format!("{ns}/{name}");
    {
        let mut cluster = shared.cluster.lock();
        if cluster.objects.contains_key(&(Kind::StatefulSet, key.clone())) {
            let message = format!("statefulsets.apps \"{name}\" already exists");
            return json_response(409, status(409, "AlreadyExists", &message));
        }
        cluster.uid += 1;
        set["metadata"]["uid"] = json!(format!("sts-uid-{}", cluster.uid));
    }
    set["metadata"]["namespace"] = json!(ns);
    set["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    if set["spec"]["replicas"].is_null() {
        set["spec"]["replicas"] = json!(1);
    }
    set["status"] = json!({"replicas": 0, "readyReplicas": 0});
    json_response(201, shared.put(Kind::StatefulSet, &key, set, "ADDED"))
}

pub(super) fn get(shared: &Arc<Shared>, ns: &str, name: &str) -> hyper::Response<Body> {
    match shared.get(Kind::StatefulSet, &format!("{ns}/{name}")) {
        Some(set) => json_response(200, set),
        None => not_found(name),
    }
}

/// The `autoscaling/v1` Scale of a StatefulSet.
fn scale_of(set: &Value) -> Value {
    let selector = set["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>())
        .unwrap_or_default()
        .join(",");
    let meta = &set["metadata"];
    json!({
        "apiVersion": "autoscaling/v1", "kind": "Scale",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                     "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"]},
        "spec": {"replicas": set["spec"]["replicas"]},
        "status": {"replicas": set["status"]["replicas"], "selector": selector}
    })
}

pub(super) fn get_scale(shared: &Arc<Shared>, ns: &str, name: &str) -> hyper::Response<Body> {
    match shared.get(Kind::StatefulSet, &format!("{ns}/{name}")) {
        Some(set) => json_response(200, scale_of(&set)),
        None => not_found(name),
    }
}

/// A merge patch of the Scale (PATCH) or a whole Scale (PUT): only `spec.replicas` counts.
pub(super) fn set_scale(shared: &Arc<Shared>, ns: &str, name: &str, body: &Value) -> hyper::Response<Body> {
    let key = format!("{ns}/{name}");
    let Some(set) = shared.get(Kind::StatefulSet, &key) else { return not_found(name) };
    let replicas = match &body["spec"]["replicas"] {
        Value::Null => return json_response(200, scale_of(&set)),
        r => r.as_i64(),
    };
    let Some(replicas) = replicas.filter(|r| *r >= 0) else {
        let message =
            format!("Scale.autoscaling \"{name}\" is invalid: spec.replicas: must be greater than or equal to 0");
        return json_response(422, status(422, "Invalid", &message));
    };
    let stored = shared.update(Kind::StatefulSet, &key, |set| {
        set["spec"]["replicas"] = json!(replicas);
        true
    });
    let Some(stored) = stored else { return not_found(name) };
    shared.cluster.lock().scale_changes += 1;
    json_response(200, scale_of(&stored))
}

/// The controller: every 50 ms, each StatefulSet's pods brought to what its spec says.
pub(super) async fn controller(shared: Arc<Shared>) {
    loop {
        let sets: Vec<Value> = {
            let cluster = shared.cluster.lock();
            cluster.objects.iter().filter(|((k, _), _)| *k == Kind::StatefulSet).map(|(_, o)| o.clone()).collect()
        };
        for set in sets {
            reconcile(&shared, &set);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn reconcile(shared: &Arc<Shared>, set: &Value) {
    let ns = set["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
    let name = set["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let replicas = set["spec"]["replicas"].as_u64().unwrap_or(0);
    let grace = set["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    let ordinal = |pod_name: &str| pod_name.strip_prefix(&format!("{name}-"))?.parse::<u64>().ok();
    let pods: Vec<Value> = {
        let cluster = shared.cluster.lock();
        cluster
            .objects
            .iter()
            .filter(|((k, _), o)| {
                *k == Kind::Pod
                    && o["metadata"]["namespace"] == ns
                    && o["metadata"]["ownerReferences"][0]["uid"] == set["metadata"]["uid"]
            })
            .map(|(_, o)| o.clone())
            .collect()
    };
    for pod in &pods {
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let Some(i) = ordinal(pod_name) else { continue };
        let terminating = !pod["metadata"]["deletionTimestamp"].is_null();
        let ended = matches!(pod["status"]["phase"].as_str(), Some("Failed" | "Succeeded"));
        if terminating {
            continue;
        }
        if i >= replicas {
            let key = format!("{ns}/{pod_name}");
            let marked = shared.update_pod(&key, pod["metadata"]["uid"].as_str().unwrap_or_default(), |p| {
                p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                p["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            });
            if marked {
                tokio::spawn(terminate(shared.clone(), key, Duration::from_secs(grace)));
            }
        } else if ended {
            // Made again at the next pass, under the same name.
            shared.remove_pod(&ns, pod_name);
        }
    }
    let node = {
        let cluster = shared.cluster.lock();
        cluster
            .objects
            .iter()
            .filter(|((k, _), n)| {
                *k == Kind::Node
                    && n["spec"]["unschedulable"] != true
                    && n["status"]["conditions"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
            })
            .map(|((_, name), _)| name.clone())
            .next()
    };
    let existing: Vec<u64> =
        pods.iter().filter_map(|p| ordinal(p["metadata"]["name"].as_str().unwrap_or_default())).collect();
    for i in (0..replicas).filter(|i| !existing.contains(i)) {
        let Some(node) = &node else { break };
        let pod_name = format!("{name}-{i}");
        let mut labels = set["spec"]["template"]["metadata"]["labels"].clone();
        labels[POD_NAME_LABEL] = json!(pod_name);
        let mut spec = set["spec"]["template"]["spec"].clone();
        spec["nodeName"] = json!(node);
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                    "uid": set["metadata"]["uid"], "controller": true}]},
            "spec": spec,
        });
        let created = create_pod(shared, &ns, pod);
        assert!(created.status().is_success(), "the controller's pod {pod_name} was refused");
    }
    // Pods it runs (terminating ones included, as Kubernetes counts them until they are gone).
    let counted = pods.len() as u64;
    if set["status"]["replicas"].as_u64() != Some(counted) {
        let key = format!("{ns}/{name}");
        shared.update(Kind::StatefulSet, &key, |current| {
            current["status"]["replicas"] = json!(counted);
            true
        });
    }
}
