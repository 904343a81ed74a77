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
//!
//! **Standby pods** (`standby`): a new pod takes seconds (scheduled, its image pulled, its
//! invoker started); a running one can grow within a fraction of one. With standby pods the
//! StatefulSet runs `standby` more pods than the highest invoker wanted, its template at
//! `standby_mb`: their invokers follow their pod's memory limit and offer nothing, so they stay
//! out of the cluster. The group asking for an invoker grows that invoker's pod to the group's
//! size by an in-place resize (the pod's `resize` subresource; Kubernetes 1.33 or later), its
//! invoker registers with what it was given, and the StatefulSet's next pod is the new standby.
//! A pod made for an invoker (a scale-up beyond the standby ones, a pod the StatefulSet made
//! again) comes at standby size and is grown as soon as it is there. An invoker removed below the
//! highest is shrunk back to standby in place, or, where its kubelet does not shrink it within
//! [`SHRINK_WAIT`] (a kubelet keeps a shrink below what the container uses pending: a drained
//! invoker sheds its idle containers, but its provisioned ones stay), its pod is deleted and
//! made again. A
//! resize its node has no room for stays pending (`PodResizePending`), said by `last_error`
//! until the group's provision timeout gives that invoker up.

use crate::error::KubeError;
use crate::standby::{asked_memory, given_memory, grow_wanted, quantity, resize, standby_pods, SHRINK_WAIT};
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
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The label every invoker pod and StatefulSet of the manager carries, and the group's.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "invoker-capacity");
const GROUP_LABEL: &str = "app.kubernetes.io/instance";

pub struct KubernetesPlane {
    statefulsets: Api<StatefulSet>,
    pod_api: Api<Pod>,
    pods: Store<Pod>,
    namespace: String,
    config: KubernetesPlaneConfig,
    /// Standby pods per group: the config's, or where it leaves it unset the cluster's
    /// ([`standby_pods`]).
    standby: u32,
    etcd: Vec<String>,
    groups: BTreeMap<String, GroupConfig>,
    /// Per group: the ordinals wanted, and the replicas its StatefulSet was last given (`None`:
    /// it does not exist yet).
    scale: Arc<Mutex<BTreeMap<String, GroupScale>>>,
    /// One scale change at a time (read, decide, patch).
    changing: tokio::sync::Mutex<()>,
    watch: tokio::task::JoinHandle<()>,
    /// With standby pods: grows the pods of wanted invokers not yet at their group's size.
    grower: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Clone, Debug, Default)]
struct GroupScale {
    wanted: BTreeSet<u32>,
    replicas: Option<u32>,
}

impl GroupScale {
    /// The highest wanted ordinal's pod and `standby` more.
    fn replicas_wanted(&self, standby: u32) -> u32 {
        self.wanted.last().map_or(0, |o| o + 1) + standby
    }
}

impl Drop for KubernetesPlane {
    fn drop(&mut self) {
        self.watch.abort();
        if let Some(grower) = &self.grower {
            grower.abort();
        }
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
        let standby = standby_pods(&client, &config, &server).await?;
        let namespace = config.namespace.clone();
        let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), &namespace);
        let pod_api = Api::<Pod>::namespaced(client, &namespace);
        let (pods, writer) = reflector::store::<Pod>();
        let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        let events =
            reflector(writer, watcher(pod_api.clone(), watcher::Config::default().labels(&selector))).default_backoff();
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
        let sizes: BTreeMap<String, u64> =
            groups.iter().map(|(name, g)| (name.clone(), g.invoker_memory_mb + config.overhead_mb)).collect();
        for name in groups.keys() {
            let found = tokio::time::timeout(bound, statefulsets.get_opt(name))
                .await
                .map_err(|_| KubeError::Timeout { doing: format!("{server}: reading StatefulSet {name}"), bound })?
                .map_err(KubeError::call(format!("{server}: reading StatefulSet {name}")))?;
            let replicas = found.map(|s| s.spec.and_then(|s| s.replicas).unwrap_or(0).max(0) as u32);
            // Without standby pods every pod is an invoker wanted; with them, those grown.
            let wanted = match standby {
                0 => (0..replicas.unwrap_or(0)).collect(),
                _ => {
                    let full = quantity(sizes[name]);
                    pods.state()
                        .iter()
                        .filter(|pod| asked_memory(pod).as_deref() == Some(full.as_str()))
                        .filter_map(|pod| ordinal_in(name, pod.metadata.name.as_deref()?))
                        .collect()
                }
            };
            scale.insert(name.clone(), GroupScale { wanted, replicas });
        }
        let scale = Arc::new(Mutex::new(scale));
        let grower = (standby > 0).then(|| {
            let scale = scale.clone();
            // Each wanted invoker's pod, and its group's size.
            let wanted = move || -> Vec<(String, u64)> {
                let scale = scale.lock();
                let sized = |(group, s): (&String, &GroupScale)| {
                    let mb = sizes.get(group).copied().unwrap_or(0);
                    s.wanted.iter().map(move |o| (format!("{group}-{o}"), mb)).collect::<Vec<_>>()
                };
                scale.iter().flat_map(sized).collect()
            };
            let task = grow_wanted(pod_api.clone(), pods.clone(), namespace.clone(), wanted, bound);
            tokio::spawn(task)
        });
        Ok(KubernetesPlane {
            statefulsets,
            pod_api,
            pods,
            namespace,
            config,
            standby,
            etcd,
            groups,
            scale,
            changing: tokio::sync::Mutex::new(()),
            watch,
            grower,
        })
    }

    /// Standby pods per group: the config's, or the cluster's where it leaves it unset
    /// ([`standby_pods`]).
    pub fn standby(&self) -> u32 {
        self.standby
    }

    /// How soon an invoker asked for comes up: a new pod's, or with standby pods a resize's.
    pub fn lead(&self) -> Duration {
        crate::standby::lead(self.standby)
    }

    /// A group's invoker pod at its full size: its invoker's memory and the invoker's own.
    fn full_mb(&self, group: &str) -> u64 {
        self.groups.get(group).map_or(0, |g| g.invoker_memory_mb) + self.config.overhead_mb
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
                .replace("{overhead_mb}", &c.overhead_mb.to_string())
        };
        let command: Vec<String> = c.command.iter().map(fill).collect();
        let labels = json!({ MANAGED_BY.0: MANAGED_BY.1, GROUP_LABEL: name });
        // With standby pods every pod starts as one; those wanted are grown.
        let memory = match self.standby {
            0 => quantity(group.invoker_memory_mb + c.overhead_mb),
            _ => quantity(c.standby_mb),
        };
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
                            "resizePolicy": [{ "resourceName": "memory", "restartPolicy": "NotRequired" }],
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
        let standby = self.standby;
        let replicas = self.scale.lock().get(name).map_or(0, |s| s.replicas_wanted(standby));
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

impl KubernetesPlane {
    /// Shrinks invoker `id`'s pod back to standby (its invoker then offers nothing and leaves
    /// the cluster); a pod its kubelet has not shrunk within [`SHRINK_WAIT`] (a kubelet keeps a
    /// shrink below what the container uses pending) is deleted, and the StatefulSet makes it
    /// again at standby size.
    async fn back_to_standby(&self, id: &str) -> Result<(), PlaneFailure> {
        let Some(uid) = self.pod(id).and_then(|pod| pod.metadata.uid.clone()) else { return Ok(()) };
        let small = quantity(self.config.standby_mb);
        let same_pod = |plane: &Self| plane.pod(id).filter(|pod| pod.metadata.uid.as_deref() == Some(uid.as_str()));
        match resize(&self.pod_api, id, self.config.standby_mb, self.config.call_timeout).await {
            Ok(()) => {
                let deadline = Instant::now() + SHRINK_WAIT;
                while Instant::now() < deadline {
                    match same_pod(self) {
                        None => return Ok(()),
                        Some(pod) if given_memory(&pod).as_deref() == Some(small.as_str()) => {
                            tracing::info!(invoker = %id, "its pod is back to standby");
                            return Ok(());
                        }
                        Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                tracing::warn!(invoker = %id, "its pod was not shrunk within {SHRINK_WAIT:?}: made again instead");
            }
            Err(e) => tracing::warn!(invoker = %id, "shrinking its pod: {e}; made again instead"),
        }
        let bound = self.config.call_timeout;
        let params = kube::api::DeleteParams::default();
        tokio::time::timeout(bound, self.pod_api.delete(id, &params))
            .await
            .map_err(|_| KubeError::Timeout { doing: format!("deleting pod {id}"), bound })?
            .map_err(KubeError::call(format!("deleting pod {id}")))?;
        let deadline = Instant::now() + self.config.termination_grace + Duration::from_secs(10);
        while same_pod(self).is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match same_pod(self) {
            Some(_) => Err(PlaneFailure::StillThere(self.config.termination_grace)),
            None => Ok(()),
        }
    }
}

impl ControlPlane for KubernetesPlane {
    async fn provision(&self, spec: &InvokerSpec) -> Result<(), PlaneError> {
        let fail = |cause: PlaneFailure| PlaneError::Start { id: spec.id.clone(), cause };
        let (group, ordinal) = self.group_of(&spec.id).ok_or_else(|| fail(PlaneFailure::NotInAGroup))?;
        self.scale.lock().entry(group.clone()).or_default().wanted.insert(ordinal);
        self.apply_scale(&group).await.map_err(fail)?;
        // A standby pod there: grown now (one still to come, once it is).
        let full = self.full_mb(&group);
        let standby = self.pod(&spec.id).filter(|pod| asked_memory(pod) != Some(quantity(full)));
        if self.standby > 0 && standby.is_some() {
            resize(&self.pod_api, &spec.id, full, self.config.call_timeout).await.map_err(|e| fail(e.into()))?;
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), PlaneError> {
        let fail = |cause: PlaneFailure| PlaneError::Stop { id: id.to_string(), cause };
        let (group, ordinal) = self.group_of(id).ok_or_else(|| fail(PlaneFailure::NotInAGroup))?;
        let standby = self.standby;
        let below_the_highest = {
            let mut scale = self.scale.lock();
            let s = scale.entry(group.clone()).or_default();
            s.wanted.remove(&ordinal);
            ordinal < s.replicas_wanted(standby)
        };
        if below_the_highest && standby == 0 {
            tracing::info!(invoker = %id, "stays (drained) until the invokers above it in its StatefulSet go");
            return Ok(());
        }
        self.apply_scale(&group).await.map_err(fail)?;
        if below_the_highest {
            return self.back_to_standby(id).await.map_err(fail);
        }
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

    /// The invokers running (with standby pods, those grown: a standby pod is no invoker).
    fn found(&self) -> Vec<String> {
        let invoker = |pod: &Pod| {
            let name = pod.metadata.name.clone()?;
            let (group, _) = self.group_of(&name)?;
            let grown = self.standby == 0 || asked_memory(pod) == Some(quantity(self.full_mb(&group)));
            (grown && self.running(&name) == Some(true)).then_some(name)
        };
        self.pods.state().iter().filter_map(|pod| invoker(pod)).collect()
    }
}
