//! The Kubernetes plane's standby pods (see `plane`): what a pod asks for and was given, its
//! in-place resize, and the task that grows the pods of wanted invokers.

use crate::error::KubeError;
use invoker_factory::settings::KubernetesPlaneConfig;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Api;
use serde_json::json;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How soon an invoker asked for comes up: a new pod's, or with standby pods a resize's. A
/// resize was not measured here (no cluster): 300 ms is what the fleet scenarios' standby plane
/// counts, and the manager's `capacity_provisioning_seconds` shows the real figure.
pub fn lead(config: &KubernetesPlaneConfig) -> Duration {
    match config.standby {
        0 => Duration::from_secs(10),
        _ => Duration::from_millis(300),
    }
}

/// How often the pods of wanted invokers are checked for a resize still to ask.
const GROW_EVERY: Duration = Duration::from_millis(100);
/// A resize asked for and not yet in the pod's spec is asked again after this.
const RESIZE_AGAIN: Duration = Duration::from_secs(2);
/// How long a shrink back to standby may take before the pod is made again instead.
pub const SHRINK_WAIT: Duration = Duration::from_secs(5);

/// A memory quantity as the plane writes it.
pub(crate) fn quantity(mb: u64) -> String {
    format!("{mb}Mi")
}

/// The memory limit a pod's invoker container asks for (its spec).
pub(crate) fn asked_memory(pod: &Pod) -> Option<String> {
    let container = pod.spec.as_ref()?.containers.first()?;
    let limits = container.resources.as_ref()?.limits.as_ref()?;
    limits.get("memory").map(|q| q.0.clone())
}

/// The memory limit its kubelet last gave it (its status).
pub(crate) fn given_memory(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let limits = status.resources.as_ref()?.limits.as_ref()?;
    limits.get("memory").map(|q| q.0.clone())
}

/// Asks for the pod's invoker container to be resized to `mb`, requests and limits alike.
pub(crate) async fn resize(pods: &Api<Pod>, name: &str, mb: u64, bound: Duration) -> Result<(), KubeError> {
    let q = quantity(mb);
    let patch = Patch::Strategic(json!({ "spec": { "containers": [{
        "name": "invoker",
        "resources": { "requests": { "memory": q }, "limits": { "memory": q } },
    }] } }));
    tokio::time::timeout(bound, pods.patch_subresource("resize", name, &PatchParams::default(), &patch))
        .await
        .map_err(|_| KubeError::Timeout { doing: format!("resizing pod {name}"), bound })?
        .map_err(KubeError::call(format!("resizing pod {name} to {q}")))?;
    Ok(())
}

/// With standby pods, every [`GROW_EVERY`]: each wanted invoker's pod that does not yet ask for
/// its group's size (`sizes`, MB) is resized to it, asked again after [`RESIZE_AGAIN`].
pub(crate) async fn grow_wanted(
    api: Api<Pod>,
    pods: Store<Pod>,
    namespace: String,
    wanted: impl Fn() -> Vec<(String, u64)>,
    bound: Duration,
) {
    let mut asked: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(GROW_EVERY).await;
        let wanted = wanted();
        asked.retain(|name, _| wanted.iter().any(|(n, _)| n == name));
        for (name, mb) in wanted {
            let Some(pod) = pods.get(&ObjectRef::new(&name).within(&namespace)) else { continue };
            if pod.metadata.deletion_timestamp.is_some() || asked_memory(&pod).as_deref() == Some(&quantity(mb)) {
                asked.remove(&name);
                continue;
            }
            if asked.get(&name).is_some_and(|t| t.elapsed() < RESIZE_AGAIN) {
                continue;
            }
            asked.insert(name.clone(), Instant::now());
            if let Err(e) = resize(&api, &name, mb, bound).await {
                tracing::warn!(invoker = %name, "growing its pod: {e}");
            }
        }
    }
}
