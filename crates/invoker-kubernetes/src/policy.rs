//! The network policy that keeps action pods off the network, as the process and Docker
//! factories do: no egress at all (no other pod, no service, no DNS, nothing outside the
//! cluster), and ingress only on the runtime's port, where the invoker speaks `/init` and
//! `/run`. A cluster enforces it only with a network plugin that implements NetworkPolicy (most
//! do; kubenet and flannel alone do not): the README says so.

use super::pod::{label_value, LABEL_INVOKER};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// The policy's name for an invoker.
pub fn policy_name(invoker_id: &str) -> String {
    format!("invoker-{}-actions", label_value(invoker_id).to_ascii_lowercase().replace(['_', '.'], "-"))
}

/// Every pod of `invoker_id`: no egress, ingress on the runtime's named port only.
pub fn action_policy(invoker_id: &str) -> NetworkPolicy {
    let selector = BTreeMap::from([(LABEL_INVOKER.to_string(), label_value(invoker_id))]);
    NetworkPolicy {
        metadata: ObjectMeta { name: Some(policy_name(invoker_id)), ..Default::default() },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some(selector), ..Default::default() }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::String("http".into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                from: None,
            }]),
            // Present and empty: no egress is allowed.
            egress: Some(Vec::new()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_selects_the_invokers_pods_denies_egress_and_opens_only_the_runtimes_port() {
        let policy = action_policy("Invoker_0");
        assert_eq!(policy.metadata.name.as_deref(), Some("invoker-invoker-0-actions"));
        let spec = policy.spec.unwrap();
        let labels = spec.pod_selector.unwrap().match_labels.unwrap();
        assert_eq!(labels["invoker-id"], "Invoker_0");
        assert_eq!(spec.policy_types.unwrap(), ["Ingress", "Egress"]);
        assert_eq!(spec.egress, Some(Vec::new()));
        let ports = spec.ingress.unwrap()[0].ports.clone().unwrap();
        assert_eq!(ports[0].port, Some(IntOrString::String("http".into())));
    }
}
