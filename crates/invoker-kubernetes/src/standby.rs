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

/// How soon an invoker asked for comes up: a new pod's, or with `standby` pods a resize's. A
/// resize was not measured here (no cluster): 300 ms is what the fleet scenarios' standby plane
/// counts, and the manager's `capacity_provisioning_seconds` (and the lead it measures) shows
/// the real figure.
pub(crate) fn lead(standby: u32) -> Duration {
    match standby {
        0 => Duration::from_secs(10),
        _ => Duration::from_millis(300),
    }
}

/// Standby pods per group where `[capacity.kubernetes] standby` is unset: the fleet scenarios'
/// standby plane keeps two (one delayed more calls, three cost more and delayed no fewer).
pub const AUTO: u32 = 2;

/// The standby pods the plane keeps: the config's, or where it is unset [`AUTO`] when the API
/// server serves pods' `resize` subresource (Kubernetes 1.33 and later, where in-place resize
/// is on by default; its discovery lists `pods/resize` only then) and the invokers follow their
/// pod's memory limit, none otherwise: a pod that cannot be resized would never be grown.
pub(crate) async fn standby_pods(
    client: &kube::Client,
    config: &KubernetesPlaneConfig,
    server: &str,
) -> Result<u32, KubeError> {
    if let Some(n) = config.standby {
        return Ok(n);
    }
    if !config.follows_its_limit() {
        tracing::info!("no standby pods: the invokers' command does not follow their pod's memory limit");
        return Ok(0);
    }
    let bound = config.call_timeout;
    let doing = format!("{server}: listing the core API's resources");
    let resources = tokio::time::timeout(bound, client.list_core_api_resources("v1"))
        .await
        .map_err(|_| KubeError::Timeout { doing: doing.clone(), bound })?
        .map_err(KubeError::call(doing))?;
    match resources.resources.iter().any(|r| r.name == "pods/resize") {
        true => {
            tracing::info!("{AUTO} standby pods per group, grown by an in-place resize");
            Ok(AUTO)
        }
        false => {
            tracing::warn!(
                "no standby pods: {server} serves no pod resize (Kubernetes 1.33 or later has it); \
                 every invoker is a new pod, which takes seconds"
            );
            Ok(0)
        }
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
