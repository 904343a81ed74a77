//! The Kubernetes control plane: each group is a StatefulSet named after it, so its pods, and
//! the invokers they run (`--invoker-id $(POD_NAME)`), are `<group>-0`, `<group>-1`, ... as the
//! decision core names them. The manager asks for an invoker by raising the StatefulSet's
//! replicas through its `scale` subresource, and removes one by lowering them.
//!
//! A StatefulSet only ever removes its highest ordinals, which is why the decision core drains
//! the most recently added (the highest ordinal) first. One it removes below the highest (an
//! invoker that took no work) cannot go before those above it: it stays drained, counted as
//! being removed, until they go. A hole the other way (ordinals 0 and 2 wanted, so 1 runs
//! too) fills itself: the pod between registers, and the manager adopts it.
//!
//! Pods are watched (a reflector on the groups' label), so that whether an invoker runs, why
//! its pod failed and which invokers run at a manager's start are answered from memory. The
//! StatefulSet restarts a pod that fails; its invoker registers again under the same name.

use crate::error::KubeError;
use futures_util::StreamExt as _;
use invoker_core::capacity::{ordinal_in, GroupConfig};
use invoker_factory::plane::{ControlPlane, InvokerSpec, PlaneError, PlaneFailure};
use invoker_factory::settings::KubernetesPlaneConfig;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{reflector, watcher, WatchStreamExt as _};
use kube::Api;
use parking_lot::Mutex;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The label every invoker pod and StatefulSet of the manager carries, and the group's.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "invoker-capacity");
const GROUP_LABEL: &str = "app.kubernetes.io/instance";

pub struct KubernetesPlane {
    statefulsets: Api<StatefulSet>,
    pods: Store<Pod>,
    namespace: String,
    config: KubernetesPlaneConfig,
    etcd: Vec<String>,
    groups: BTreeMap<String, GroupConfig>,
    /// Per group: the ordinals wanted, and the replicas its StatefulSet was last given (`None`:
    /// it does not exist yet).
    scale: Mutex<BTreeMap<String, GroupScale>>,
    /// One scale change at a time (read, decide, patch).
    changing: tokio::sync::Mutex<()>,
    watch: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Debug, Default)]
struct GroupScale {
    wanted: BTreeSet<u32>,
    replicas: Option<u32>,
}

impl GroupScale {
    fn replicas_wanted(&self) -> u32 {
        self.wanted.last().map_or(0, |o| o + 1)
    }
}

impl Drop for KubernetesPlane {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl KubernetesPlane {
    /// Connects, watches the groups' pods and reads their StatefulSets (a manager started again
    /// takes up the scale the one before left).
    pub async fn new(
        config: KubernetesPlaneConfig,
        etcd: Vec<String>,
        groups: BTreeMap<String, GroupConfig>,
    ) -> Result<Self, KubeError> {
        let (client, server) = crate::kube_client(config.api_server.as_deref(), config.kubeconfig.as_deref()).await?;
        let namespace = config.namespace.clone();
        let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), &namespace);
        let (pods, writer) = reflector::store::<Pod>();
        let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        let events = reflector(
            writer,
            watcher(Api::<Pod>::namespaced(client, &namespace), watcher::Config::default().labels(&selector)),
        )
        .default_backoff();
        let watch = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                if let Err(e) = event {
                    tracing::warn!("watching the invoker pods: {e}");
                }
            }
        });
        let bound = config.call_timeout;
        tokio::time::timeout(bound, pods.wait_until_ready())
            .await
            .map_err(|_| KubeError::Timeout { doing: format!("{server}: listing the invoker pods"), bound })?
            .map_err(|_| KubeError::WatchEnded(format!("{server}: the invoker pods")))?;
        let mut scale = BTreeMap::new();
        for name in groups.keys() {
            let found = tokio::time::timeout(bound, statefulsets.get_opt(name))
                .await
                .map_err(|_| KubeError::Timeout { doing: format!("{server}: reading StatefulSet {name}"), bound })?
                .map_err(KubeError::call(format!("{server}: reading StatefulSet {name}")))?;
            let replicas = found.map(|s| s.spec.and_then(|s| s.replicas).unwrap_or(0).max(0) as u32);
            let wanted = (0..replicas.unwrap_or(0)).collect();
            scale.insert(name.clone(), GroupScale { wanted, replicas });
        }
        Ok(KubernetesPlane {
            statefulsets,
            pods,
            namespace,
            config,
            etcd,
            groups,
            scale: Mutex::new(scale),
            changing: tokio::sync::Mutex::new(()),
            watch,
        })
    }

    fn pod(&self, id: &str) -> Option<std::sync::Arc<Pod>> {
        self.pods.get(&ObjectRef::new(id).within(&self.namespace))
    }

    fn group_of(&self, id: &str) -> Option<(String, u32)> {
        self.groups.keys().find_map(|g| ordinal_in(g, id).map(|o| (g.clone(), o)))
    }

    /// The StatefulSet of group `name` at 0 replicas: the pod template every invoker of the
    /// group runs.
    fn statefulset(&self, name: &str, group: &GroupConfig) -> Result<StatefulSet, KubeError> {
        let c = &self.config;
        let fill = |arg: &String| {
            arg.replace("{etcd}", &self.etcd.join(","))
                .replace("{tags}", &group.tags.join(","))
                .replace("{memory_mb}", &group.invoker_memory_mb.to_string())
        };
        let command: Vec<String> = c.command.iter().map(fill).collect();
        let labels = json!({ MANAGED_BY.0: MANAGED_BY.1, GROUP_LABEL: name });
        let memory = format!("{}Mi", group.invoker_memory_mb + c.overhead_mb);
        let mut mounts = vec![json!({ "name": "data", "mountPath": "/data" })];
        let mut volumes = vec![json!({ "name": "data", "emptyDir": {} })];
        if let Some(map) = &c.config_map {
            mounts.push(json!({ "name": "config", "mountPath": "/etc/invoker", "readOnly": true }));
            volumes.push(json!({ "name": "config", "configMap": { "name": map } }));
        }
        let object = json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": { "name": name, "namespace": self.namespace, "labels": labels },
            "spec": {
                "replicas": 0,
                "serviceName": name,
                // All at once, not one after another when ready: a burst wants them together.
                "podManagementPolicy": "Parallel",
                "selector": { "matchLabels": labels },
                "template": {
                    "metadata": { "labels": labels },
                    "spec": {
                        "terminationGracePeriodSeconds": c.termination_grace.as_secs(),
                        "containers": [{
                            "name": "invoker",
                            "image": c.image,
                            "imagePullPolicy": c.image_pull_policy,
                            "command": command,
                            "env": [
                                { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                                { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                            ],
                            "resources": { "requests": { "memory": memory }, "limits": { "memory": memory } },
                            "volumeMounts": mounts,
                        }],
                        "volumes": volumes,
                    }
                }
            }
        });
        serde_json::from_value(object).map_err(|source| KubeError::Template { group: name.into(), source })
    }

    /// Sets group `name`'s StatefulSet to the replicas its wanted ordinals need, creating it
    /// first if it does not exist.
    async fn apply_scale(&self, name: &str) -> Result<(), PlaneFailure> {
        let _one = self.changing.lock().await;
        let current = self.scale.lock().get(name).cloned().unwrap_or_default();
        let bound = self.config.call_timeout;
        let timed = |doing: String| KubeError::Timeout { doing, bound };
        if current.replicas.is_none() {
            let group = self.groups.get(name).ok_or_else(|| PlaneFailure::NoGroup(name.into()))?;
            let object = self.statefulset(name, group)?;
            match tokio::time::timeout(bound, self.statefulsets.create(&PostParams::default(), &object)).await {
                Err(_) => return Err(timed(format!("creating the StatefulSet {name}")).into()),
                Ok(Err(kube::Error::Api(status))) if status.code == 409 => {}
                Ok(Err(e)) => return Err(KubeError::call(format!("creating the StatefulSet {name}"))(e).into()),
                Ok(Ok(_)) => {}
            }
            if let Some(s) = self.scale.lock().get_mut(name) {
                s.replicas = Some(0);
            }
        }
        let replicas = self.scale.lock().get(name).map(GroupScale::replicas_wanted).unwrap_or(0);
        if current.replicas == Some(replicas) {
            return Ok(());
        }
        let patch = Patch::Merge(json!({ "spec": { "replicas": replicas } }));
        let patched = tokio::time::timeout(bound, self.statefulsets.patch_scale(name, &PatchParams::default(), &patch))
            .await
            .map_err(|_| timed(format!("scaling the StatefulSet {name}")))?
            .map_err(KubeError::call(format!("scaling the StatefulSet {name} to {replicas}")))?;
        let now = patched.spec.and_then(|s| s.replicas).unwrap_or(0).max(0) as u32;
        if let Some(s) = self.scale.lock().get_mut(name) {
            s.replicas = Some(now);
        }
        tracing::info!(group = %name, "StatefulSet scaled to {now}");
        Ok(())
    }
}

impl ControlPlane for KubernetesPlane {
    async fn provision(&self, spec: &InvokerSpec) -> Result<(), PlaneError> {
        let fail = |cause: PlaneFailure| PlaneError::Start { id: spec.id.clone(), cause };
        let (group, ordinal) = self.group_of(&spec.id).ok_or_else(|| fail(PlaneFailure::NotInAGroup))?;
        self.scale.lock().entry(group.clone()).or_default().wanted.insert(ordinal);
        self.apply_scale(&group).await.map_err(fail)
    }

    async fn remove(&self, id: &str) -> Result<(), PlaneError> {
        let fail = |cause: PlaneFailure| PlaneError::Stop { id: id.to_string(), cause };
        let (group, ordinal) = self.group_of(id).ok_or_else(|| fail(PlaneFailure::NotInAGroup))?;
        let below_the_highest = {
            let mut scale = self.scale.lock();
            let s = scale.entry(group.clone()).or_default();
            s.wanted.remove(&ordinal);
            ordinal < s.replicas_wanted()
        };
        if below_the_highest {
            tracing::info!(invoker = %id, "stays (drained) until the invokers above it in its StatefulSet go");
            return Ok(());
        }
        self.apply_scale(&group).await.map_err(fail)?;
        // The StatefulSet deletes the pod; it has its grace to drain and exit.
        let deadline = Instant::now() + self.config.termination_grace + Duration::from_secs(10);
        while self.pod(id).is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match self.pod(id) {
            Some(_) => Err(fail(PlaneFailure::StillThere(self.config.termination_grace))),
            None => Ok(()),
        }
    }

    fn running(&self, id: &str) -> Option<bool> {
        match self.pod(id) {
            Some(pod) => {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                Some(!matches!(phase, Some("Failed" | "Succeeded")))
            }
            // Not there: being made (below the replicas), or gone.
            None => {
                let (group, ordinal) = self.group_of(id)?;
                let replicas = self.scale.lock().get(&group).and_then(|s| s.replicas).unwrap_or(0);
                (ordinal >= replicas).then_some(false)
            }
        }
    }

    fn last_error(&self, id: &str) -> Option<String> {
        let status = self.pod(id)?.status.clone()?;
        let container = status.container_statuses.unwrap_or_default().into_iter().next();
        let state = container.and_then(|c| c.state);
        let from_state = state.and_then(|s| {
            let terminated =
                s.terminated.map(|t| format!("exited {}: {}", t.exit_code, t.message.or(t.reason).unwrap_or_default()));
            let waiting =
                s.waiting.map(|w| format!("{}: {}", w.reason.unwrap_or_default(), w.message.unwrap_or_default()));
            terminated.or(waiting)
        });
        let from_pod = status.reason.map(|r| format!("{r}: {}", status.message.unwrap_or_default()));
        from_pod.or(from_state).map(|e| e.chars().take(500).collect())
    }

    /// A pod is the StatefulSet's to keep or delete, with its volume.
    fn forget(&self, _id: &str) {}

    fn found(&self) -> Vec<String> {
        self.pods
            .state()
            .iter()
            .filter_map(|pod| pod.metadata.name.clone())
            .filter(|name| self.group_of(name).is_some() && self.running(name) == Some(true))
            .collect()
    }
}
