//! What each node offers the invoker's pods, computed from the API server's Nodes and Pods
//! (never per activation: from what the watches keep): its allocatable memory minus the memory
//! requests of every pod bound to it that still holds them, ours and everyone else's. A node
//! that is not Ready, is cordoned, or has a `NoSchedule`/`NoExecute` taint our pods do not
//! tolerate offers nothing (its capacity stays known, so work waits for it rather than being
//! refused as never fitting). OpenWhisk's Kubernetes factory has no such view and over-commits.

use k8s_openapi::api::core::v1::{Container, Node, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

const MIB: f64 = 1024.0 * 1024.0;

/// One node's memory for the invoker's pods, in MB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeOffer {
    pub node: String,
    /// Allocatable memory: what the kubelet admits pods against.
    pub capacity_mb: u64,
    /// Allocatable minus the requests of the pods bound to it; 0 where our pods cannot go.
    pub free_mb: u64,
    /// Why nothing can be placed there now (not Ready, cordoned, an untolerated taint).
    pub closed: Option<String>,
}

/// The offer of every node, in the order given.
pub fn node_offers<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    pods: impl IntoIterator<Item = &'a Pod>,
    tolerations: &[Toleration],
) -> Vec<NodeOffer> {
    let mut requested: BTreeMap<&str, u64> = BTreeMap::new();
    for pod in pods.into_iter().filter(|p| holds_resources(p)) {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            *requested.entry(node).or_default() += pod_request_bytes(pod);
        }
    }
    nodes
        .into_iter()
        .filter_map(|node| {
            let name = node.metadata.name.as_deref()?;
            let allocatable = node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get("memory"))
                .and_then(quantity_bytes)
                .unwrap_or(0);
            let used = requested.get(name).copied().unwrap_or(0);
            let closed = closed_because(node, tolerations);
            let free = if closed.is_some() { 0 } else { allocatable.saturating_sub(used) };
            Some(NodeOffer { node: name.to_string(), capacity_mb: mb(allocatable), free_mb: mb(free), closed })
        })
        .collect()
}

fn mb(bytes: u64) -> u64 {
    bytes / (1024 * 1024)
}

/// Why our pods cannot be placed on `node` now, if they cannot.
fn closed_because(node: &Node, tolerations: &[Toleration]) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if !ready {
        return Some("not Ready".into());
    }
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return Some("cordoned".into());
    }
    let taints = spec.and_then(|s| s.taints.as_deref()).unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .map(|t| format!("taint {}={}:{}", t.key, t.value.as_deref().unwrap_or(""), t.effect))
}

/// Kubernetes' own rule (`ToleratesTaint`): the effect, then the key, then the value unless
/// the operator is `Exists`.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// Whether a pod still holds its requests on its node: bound and not finished.
fn holds_resources(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    !matches!(phase, "Succeeded" | "Failed")
}

/// The memory a pod's requests hold on its node, as the scheduler counts them: the sum over its
/// containers, or its largest init container if more, plus the pod's overhead. A container
/// without a request but with a limit requests its limit (the API server's defaulting).
pub fn pod_request_bytes(pod: &Pod) -> u64 {
    let Some(spec) = &pod.spec else { return 0 };
    let containers: u64 = spec.containers.iter().map(container_request).sum();
    let init = spec.init_containers.as_deref().unwrap_or_default().iter().map(container_request).max().unwrap_or(0);
    let overhead = spec.overhead.as_ref().and_then(|o| o.get("memory")).and_then(quantity_bytes).unwrap_or(0);
    containers.max(init) + overhead
}

fn container_request(container: &Container) -> u64 {
    let resources = container.resources.as_ref();
    let of = |map: Option<&BTreeMap<String, Quantity>>| map.and_then(|m| m.get("memory")).and_then(quantity_bytes);
    of(resources.and_then(|r| r.requests.as_ref()))
        .or_else(|| of(resources.and_then(|r| r.limits.as_ref())))
        .unwrap_or(0)
}

/// A memory quantity in bytes (`128Mi`, `1G`, `1.5Gi`, `129e6`, `12345`), rounded up; `None`
/// for what is not one.
pub fn quantity_bytes(quantity: &Quantity) -> Option<u64> {
    let text = quantity.0.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (number, suffix) = match suffix.strip_prefix(['e', 'E']) {
        Some(exponent) if !exponent.is_empty() => {
            let exponent: i32 = exponent.parse().ok()?;
            (number.parse::<f64>().ok()? * 10f64.powi(exponent), "")
        }
        _ => (number.parse::<f64>().ok()?, suffix),
    };
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => MIB,
        "Gi" => MIB * 1024.0,
        "Ti" => MIB * MIB,
        "Pi" => MIB * MIB * 1024.0,
        "Ei" => MIB * MIB * MIB,
        _ => return None,
    };
    let bytes = (number * scale).ceil();
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, memory: &str, extra: serde_json::Value) -> Node {
        let mut node = json!({
            "metadata": {"name": name},
            "spec": {},
            "status": {"allocatable": {"memory": memory}, "conditions": [{"type": "Ready", "status": "True"}]}
        });
        merge(&mut node, extra);
        serde_json::from_value(node).unwrap()
    }

    fn pod(node: &str, phase: &str, spec: serde_json::Value) -> Pod {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": node, "containers": []}, "status": {"phase": phase}});
        merge(&mut pod["spec"], spec);
        serde_json::from_value(pod).unwrap()
    }

    fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
        if let (Some(into), serde_json::Value::Object(from)) = (into.as_object_mut(), from) {
            for (k, v) in from {
                match into.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        into.insert(k, v);
                    }
                }
            }
        }
    }

    fn memory(request: Option<&str>, limit: Option<&str>) -> serde_json::Value {
        let mut resources = json!({});
        if let Some(r) = request {
            resources["requests"] = json!({"memory": r});
        }
        if let Some(l) = limit {
            resources["limits"] = json!({"memory": l});
        }
        json!({"name": "c", "resources": resources})
    }

    #[test]
    fn quantities_in_every_notation() {
        let q = |s: &str| quantity_bytes(&Quantity(s.into()));
        assert_eq!(q("128Mi"), Some(128 * 1024 * 1024));
        assert_eq!(q("1Gi"), Some(1 << 30));
        assert_eq!(q("1.5Gi"), Some(3 << 29));
        assert_eq!(q("1G"), Some(1_000_000_000));
        assert_eq!(q("129e6"), Some(129_000_000));
        assert_eq!(q("12345"), Some(12345));
        assert_eq!(q("500m"), Some(1), "a fraction of a byte rounds up");
        assert_eq!(q("16Xi"), None);
        assert_eq!(q("-1Mi"), None);
        assert_eq!(q(""), None);
    }

    #[test]
    fn a_node_offers_its_allocatable_minus_every_bound_pods_requests() {
        let nodes = [node("a", "4Gi", json!({})), node("b", "2Gi", json!({}))];
        let pods = [
            pod("a", "Running", json!({"containers": [memory(Some("1Gi"), None), memory(None, Some("512Mi"))]})),
            pod(
                "a",
                "Pending",
                json!({"containers": [memory(Some("256Mi"), Some("1Gi"))], "overhead": {"memory": "64Mi"}}),
            ),
            pod("a", "Succeeded", json!({"containers": [memory(Some("1Gi"), None)]})),
            pod(
                "b",
                "Running",
                json!({"containers": [memory(Some("100Mi"), None)], "initContainers": [memory(Some("1Gi"), None)]}),
            ),
        ];
        let offers = node_offers(&nodes, &pods, &[]);
        assert_eq!(
            offers[0],
            NodeOffer { node: "a".into(), capacity_mb: 4096, free_mb: 4096 - 1024 - 512 - 256 - 64, closed: None }
        );
        assert_eq!(offers[1].free_mb, 1024, "the largest init container counts when it exceeds the containers");
    }

    #[test]
    fn a_node_not_ready_cordoned_or_tainted_offers_nothing_but_keeps_its_capacity() {
        let not_ready = node("n", "4Gi", json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}));
        let cordoned = node("c", "4Gi", json!({"spec": {"unschedulable": true}}));
        let tainted =
            node("t", "4Gi", json!({"spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}}));
        let preferred = node("p", "4Gi", json!({"spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}}));
        let offers = node_offers(&[not_ready, cordoned, tainted.clone(), preferred], &[], &[]);
        let closed: Vec<_> =
            offers.iter().map(|o| (o.node.as_str(), o.free_mb, o.capacity_mb, o.closed.clone())).collect();
        assert_eq!(closed[0], ("n", 0, 4096, Some("not Ready".into())));
        assert_eq!(closed[1], ("c", 0, 4096, Some("cordoned".into())));
        assert_eq!(closed[2], ("t", 0, 4096, Some("taint gpu=yes:NoSchedule".into())));
        assert_eq!(closed[3], ("p", 4096, 4096, None), "a preference is not a refusal");

        let toleration = |v: serde_json::Value| -> Toleration { serde_json::from_value(v).unwrap() };
        let equal = toleration(json!({"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}));
        let exists = toleration(json!({"key": "gpu", "operator": "Exists"}));
        let wrong_value = toleration(json!({"key": "gpu", "value": "no"}));
        let wrong_effect = toleration(json!({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}));
        for (tol, open) in [(equal, true), (exists, true), (wrong_value, false), (wrong_effect, false)] {
            let offer = &node_offers(std::slice::from_ref(&tainted), &[], std::slice::from_ref(&tol))[0];
            assert_eq!(offer.closed.is_none(), open, "{tol:?}");
        }
    }

    proptest::proptest! {
        /// Whatever the pods, a node never offers more than its allocatable, and one more pod
        /// bound to it never makes it offer more.
        #[test]
        fn an_offer_is_within_the_allocatable_and_shrinks_with_each_pod(
            allocatable_mi in 0u64..65_536,
            requests_mi in proptest::collection::vec(0u64..4_096, 0..12),
        ) {
            let nodes = [node("a", &format!("{allocatable_mi}Mi"), json!({}))];
            let mut pods = Vec::new();
            let mut last = allocatable_mi;
            for r in requests_mi {
                pods.push(pod("a", "Running", json!({"containers": [memory(Some(&format!("{r}Mi")), None)]})));
                let offer = &node_offers(&nodes, &pods, &[])[0];
                proptest::prop_assert!(offer.free_mb <= offer.capacity_mb);
                proptest::prop_assert!(offer.free_mb <= last);
                last = offer.free_mb;
            }
        }
    }
}
