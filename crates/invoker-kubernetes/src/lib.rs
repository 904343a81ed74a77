//! The Kubernetes factory: action containers as pods, each bound (`spec.nodeName`) to the node
//! the pool chose within what that node offers. The offers come from watches of Nodes and Pods
//! (`watch.rs`, `offers.rs`), never from a call per activation; the pod is made and read
//! without I/O (`pod.rs`); this module carries out creations, deletions and log follows.
//!
//! There is no pause: an idle pod keeps running (as on Mesos). A start deletes the pods an
//! earlier run of the same `invoker_id` left in the namespace, and nothing else.

#![forbid(unsafe_code)]

/// The API's types and client, for what the invoker's own tests (the fake API server) say.
pub use k8s_openapi;
pub use kube;

mod doomed;
pub mod error;
pub mod offers;
pub mod plane;
pub mod pod;
mod pod_log;
pub mod policy;
pub mod standby;
pub mod watch;

use doomed::{DoomedPods, Why};
pub use error::KubeError;
use invoker_factory::contract::{ContainerFactory, ContainerHandle, ContainerSpec, Epoch, StatsReceiver, Transport};
use invoker_factory::error::{CreateError, FactoryError, SetupError};
use invoker_factory::logs::LogBuffer;
use invoker_factory::settings::KubernetesFactoryConfig;
use invoker_ids::{ContainerId, NodeId, NodeStatsUpdate};
use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use parking_lot::Mutex;
use pod::{build_pod, label_value, pod_name, pod_state, PodRequest, PodState, PodTemplate};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use watch::{watch_cluster, ClusterView};

/// Containers reported gone at most before the pool reads them.
const GONE_QUEUE: usize = 4096;

#[derive(Clone)]
pub struct KubernetesFactory {
    inner: Arc<Inner>,
}

struct Inner {
    config: KubernetesFactoryConfig,
    invoker_id: String,
    /// This run's id (its start time), in pod names and the `invoker-run` label.
    run: String,
    epoch: Epoch,
    pods: Api<Pod>,
    view: ClusterView,
    /// Kind → how its pods are made.
    templates: BTreeMap<String, PodTemplate>,
    stats: tokio::sync::watch::Sender<Vec<NodeStatsUpdate>>,
    /// Ready pods, with their logs and the task following them.
    live: Mutex<HashMap<ContainerId, LivePod>>,
    gone: mpsc::Sender<ContainerId>,
    gone_rx: Mutex<Option<mpsc::Receiver<ContainerId>>>,
    /// Where the client points, for `describe`.
    server: String,
    policies: Api<NetworkPolicy>,
    /// Pods to delete (again) when the watch shows them: unanswered creations, failed deletions.
    doomed: Mutex<DoomedPods>,
    /// True once the network policy is in place (or not wanted): no pod is created before.
    isolated: tokio::sync::watch::Sender<bool>,
}

struct LivePod {
    logs: Arc<LogBuffer>,
    follower: tokio::task::AbortHandle,
}

fn setup(source: KubeError) -> FactoryError {
    FactoryError::Setup {
        factory: "kubernetes",
        source: SetupError::Failed { what: "the API server", source: source.into() },
    }
}

/// The client `[factory.kubernetes]` names: an API server URL, a kubeconfig, or what kube
/// infers (`$KUBECONFIG`, `~/.kube/config`, the pod's service account).
async fn client(c: &KubernetesFactoryConfig) -> Result<(kube::Client, String), FactoryError> {
    kube_client(c.api_server.as_deref(), c.kubeconfig.as_deref()).await.map_err(setup)
}

/// A client for `api_server`, else the `kubeconfig` file's current context, else what kube
/// infers; and the server's URL. Shared with the capacity manager's control plane.
pub async fn kube_client(
    api_server: Option<&str>,
    kubeconfig: Option<&std::path::Path>,
) -> Result<(kube::Client, String), KubeError> {
    let in_file = |source| KubeError::Kubeconfig {
        path: kubeconfig.unwrap_or(std::path::Path::new("")).into(),
        source: Box::new(source),
    };
    let config = match (api_server, kubeconfig) {
        (Some(url), _) => {
            kube::Config::new(url.parse().map_err(|source| KubeError::ApiServer { url: url.into(), source })?)
        }
        (None, Some(path)) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(in_file)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(in_file)?
        }
        (None, None) => kube::Config::infer().await.map_err(|e| KubeError::NoCluster(Box::new(e)))?,
    };
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(KubeError::call("making the client"))?;
    Ok((client, server))
}

impl KubernetesFactory {
    /// `start_timeouts`: the kinds whose pods have their own bound to be Ready (`[kinds]`'s
    /// `start_timeout`); the others have `create_timeout`.
    pub async fn new(
        k: &KubernetesFactoryConfig,
        invoker_id: &str,
        start_timeouts: &BTreeMap<String, Duration>,
        epoch: Epoch,
    ) -> Result<Self, FactoryError> {
        let k = k.clone();
        let tolerations: Vec<Toleration> = k.tolerations.iter().map(toleration).collect();
        let (client, server) = client(&k).await?;
        let templates = k
            .kinds
            .iter()
            .map(|(kind, c)| {
                let start_timeout = start_timeouts.get(kind).copied().unwrap_or(k.create_timeout);
                let template = PodTemplate {
                    image: c.image.clone(),
                    command: c.command.clone(),
                    port: c.port(),
                    pull_policy: k.image_pull_policy.clone(),
                    tolerations: tolerations.clone(),
                    code_file: c.code_file.clone(),
                    start_timeout,
                };
                (kind.clone(), template)
            })
            .collect();
        if !k.network_policy {
            tracing::warn!(
                "factory.kubernetes.network_policy = false: action pods get the cluster's network, \
                 and reach other pods, services and the internet as the cluster allows"
            );
        }
        let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
        let (gone, gone_rx) = mpsc::channel(GONE_QUEUE);
        let inner = Arc::new(Inner {
            pods: Api::namespaced(client.clone(), &k.namespace),
            policies: Api::namespaced(client.clone(), &k.namespace),
            isolated: tokio::sync::watch::channel(!k.network_policy).0,
            doomed: Mutex::new(DoomedPods::default()),
            view: watch_cluster(client, tolerations),
            config: k,
            invoker_id: invoker_id.to_string(),
            run: run.to_string(),
            epoch,
            templates,
            stats: tokio::sync::watch::channel(Vec::new()).0,
            live: Mutex::new(HashMap::new()),
            gone,
            gone_rx: Mutex::new(Some(gone_rx)),
            server,
        });
        tokio::spawn(publish_stats(Arc::downgrade(&inner), inner.view.offers.clone()));
        tokio::spawn(watch_live(Arc::downgrade(&inner), inner.view.changes.clone()));
        tokio::spawn(start_up(inner.clone()));
        Ok(KubernetesFactory { inner })
    }
}

impl ContainerFactory for KubernetesFactory {
    fn describe(&self) -> String {
        let i = &self.inner;
        format!(
            "kubernetes factory: pods in namespace '{}' on {} (node offers from watches of Nodes and Pods; each pod \
             bound to its node, Guaranteed QoS, non-root, no capabilities, read-only root; idle pods keep running)",
            i.config.namespace, i.server
        )
    }

    fn stats(&self) -> StatsReceiver {
        self.inner.stats.subscribe()
    }

    fn take_gone(&self) -> Option<mpsc::Receiver<ContainerId>> {
        self.inner.gone_rx.lock().take()
    }

    /// The offers stand as observed now while the watches are up (they would have shown any
    /// change); while they are down, the stats age and the pool stops placing on stale nodes.
    fn observe(&self) {
        if *self.inner.view.connected.borrow() {
            self.inner.publish();
        }
    }

    async fn create(&self, spec: &ContainerSpec, node: &NodeId) -> Result<ContainerHandle, FactoryError> {
        let inner = &self.inner;
        let template = inner.templates.get(&spec.kind).ok_or_else(|| FactoryError::UnknownKind(spec.kind.clone()))?;
        let name = inner.pod_name(spec.id);
        let request = PodRequest {
            name: &name,
            node: &node.0,
            memory_mb: spec.memory_mb,
            disk_mb: spec.disk_mb,
            cpus_per_gb: inner.config.cpus_per_gb,
            invoker_id: &inner.invoker_id,
            run: &inner.run,
            kind: &spec.kind,
            action: &spec.action_path,
        };
        let pod = match &spec.function {
            None => build_pod(template, &request),
            Some(function) => {
                let bridge = &inner.config.fn_bridge;
                if spec.memory_mb <= bridge.memory_mb {
                    return Err(CreateError::BridgeTooLarge { bridge_mb: bridge.memory_mb }.into());
                }
                if function.code.as_ref().is_some_and(|c| c.len() > pod::CODE_MAX_BYTES) {
                    return Err(CreateError::CodeTooLarge { max_bytes: pod::CODE_MAX_BYTES }.into());
                }
                if template.code_file.is_some() && function.code.is_none() {
                    return Err(CreateError::NoCode("its kind's code_file".into()).into());
                }
                pod::build_function_pod(template, &request, function, bridge)
            }
        };
        let bound = inner.config.create_timeout;
        let deadline = tokio::time::Instant::now() + bound;
        let mut isolated = inner.isolated.subscribe();
        if !matches!(tokio::time::timeout_at(deadline, isolated.wait_for(|done| *done)).await, Ok(Ok(_))) {
            return Err(CreateError::NoNetworkPolicy.into());
        }
        match tokio::time::timeout(inner.config.call_timeout, inner.pods.create(&PostParams::default(), &pod)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let source = KubeError::call("creating the pod")(e).into();
                return Err(CreateError::Engine { op: "kubernetes", source }.into());
            }
            Err(_) => {
                // It may exist all the same, now or later: it goes when it shows.
                inner.doom(&name, Why::Unanswered);
                self.delete(&name).await;
                return Err(CreateError::NoAnswer.into());
            }
        }
        let address = match inner.until_ready(&name, deadline).await {
            Ok(address) => address,
            Err(e) => {
                self.delete(&name).await;
                return Err(e);
            }
        };
        let transport = Transport::Tcp(address);
        if !transport.until_accepts(deadline).await {
            self.delete(&name).await;
            return Err(CreateError::Unanswered(address.to_string()).into());
        }
        let logs = Arc::new(LogBuffer::default());
        let (weak, id) = (Arc::downgrade(inner), spec.id);
        let live = move || weak.upgrade().is_some_and(|i| i.live.lock().contains_key(&id));
        let follower = tokio::spawn(pod_log::follow(inner.pods.clone(), name, logs.clone(), live)).abort_handle();
        inner.live.lock().insert(spec.id, LivePod { logs: logs.clone(), follower });
        // A pod's IP: nothing in the pod can move it elsewhere.
        let peer = Arc::default();
        Ok(ContainerHandle { id: spec.id, node: node.clone(), transport, peer, logs, ready_at: inner.epoch.now() })
    }

    async fn destroy(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.remove(c.id).await;
        Ok(())
    }

    async fn destroy_all(&self) {
        let ids: Vec<ContainerId> = self.inner.live.lock().keys().copied().collect();
        futures_util::future::join_all(ids.into_iter().map(|id| self.remove(id))).await;
    }
}

impl KubernetesFactory {
    /// Stops following the container's log and deletes its pod.
    async fn remove(&self, id: ContainerId) {
        if let Some(live) = self.inner.live.lock().remove(&id) {
            live.follower.abort();
            live.logs.close();
        }
        self.delete(&self.inner.pod_name(id)).await;
    }

    /// Deletes the pod at once (grace 0) and waits, bounded, for the watch to show it gone:
    /// only then is its memory free on the node. A deletion that fails is tried again (see
    /// `doomed`).
    async fn delete(&self, name: &str) {
        let inner = &self.inner;
        let params = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        let failed = match tokio::time::timeout(inner.config.call_timeout, inner.pods.delete(name, &params)).await {
            Ok(Ok(_)) => None,
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => return,
            Ok(Err(e)) => Some(api_error("deleting the pod", e)),
            Err(_) => Some(KubeError::Timeout { doing: "deleting the pod".into(), bound: inner.config.call_timeout }),
        };
        if let Some(why) = failed {
            tracing::warn!(pod = name, "kubernetes: {why}; tried again while the pod shows");
            inner.doom(name, Why::DeleteFailed);
            return;
        }
        let mut changes = inner.view.changes.clone();
        let deadline = tokio::time::Instant::now() + inner.config.delete_timeout;
        while inner.view.pod(&inner.config.namespace, name).is_some() {
            if !matches!(tokio::time::timeout_at(deadline, changes.changed()).await, Ok(Ok(()))) {
                tracing::warn!(pod = name, "kubernetes: the pod's deletion was not seen in time; tried again");
                inner.doom(name, Why::DeleteFailed);
                return;
            }
        }
    }
}

impl Inner {
    fn doom(&self, name: &str, why: Why) {
        if let Some(dropped) = self.doomed.lock().remember(name, why) {
            tracing::warn!(pod = %dropped, "kubernetes: too many pods to delete again; this one is no longer followed");
        }
    }

    fn pod_name(&self, id: ContainerId) -> String {
        pod_name(&self.invoker_id, &self.run, id.0)
    }

    /// Waits for the pod to be Ready (its runtime's address) or to fail, by the deadline.
    async fn until_ready(
        &self,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> Result<std::net::SocketAddr, FactoryError> {
        let mut changes = self.view.changes.clone();
        let mut seen = false;
        loop {
            match pod_state(self.view.pod(&self.config.namespace, name).as_deref()) {
                PodState::Ready(address) => return Ok(address),
                PodState::Refused(why) => return Err(FactoryError::Refused(why)),
                PodState::Failed(why) => return Err(CreateError::Failed(why).into()),
                PodState::NoImage(why) => return Err(FactoryError::Image(why)),
                PodState::Gone if seen => return Err(CreateError::Deleted.into()),
                PodState::Gone => {}
                PodState::Pending => seen = true,
            }
            if !matches!(tokio::time::timeout_at(deadline, changes.changed()).await, Ok(Ok(()))) {
                return Err(FactoryError::NotReady(self.config.create_timeout));
            }
        }
    }
}

fn api_error(doing: &str, e: kube::Error) -> KubeError {
    KubeError::call(doing)(e)
}

/// The pool's node stats at every change of the offers.
async fn publish_stats(
    inner: std::sync::Weak<Inner>,
    mut offers: tokio::sync::watch::Receiver<Vec<offers::NodeOffer>>,
) {
    loop {
        let Some(strong) = inner.upgrade() else { return };
        offers.mark_unchanged();
        strong.publish();
        drop(strong);
        if offers.changed().await.is_err() {
            return;
        }
    }
}

impl Inner {
    /// Every node's offer as the pool's node stats, stamped now: with no change half applied,
    /// so that they count every pod a creation saw Ready before.
    fn publish(&self) {
        let (offers, now) = self.view.offers_stamped(|| self.epoch.now());
        let stats = offers
            .iter()
            .map(|o| NodeStatsUpdate {
                node: NodeId::new(&o.node),
                capacity_mb: o.capacity_mb,
                free_mb: o.free_mb,
                observed_at: now,
            })
            .collect();
        self.stats.send_replace(stats);
    }
}

/// Tells the pool of ready pods that ended on their own (evicted, crashed, deleted by someone),
/// and deletes the doomed pods the watch shows (at every change, and every `doomed::RETRY`).
async fn watch_live(inner: std::sync::Weak<Inner>, mut changes: tokio::sync::watch::Receiver<u64>) {
    loop {
        if let Ok(Err(_)) = tokio::time::timeout(doomed::RETRY, changes.changed()).await {
            return;
        }
        let Some(inner) = inner.upgrade() else { return };
        let due = inner.doomed.lock().due(|name| inner.view.pod(&inner.config.namespace, name).is_some());
        for name in due {
            tracing::info!(pod = %name, "kubernetes: deleting a pod whose creation or deletion went wrong");
            let factory = KubernetesFactory { inner: inner.clone() };
            tokio::spawn(async move { factory.delete(&name).await });
        }
        let ids: Vec<ContainerId> = inner.live.lock().keys().copied().collect();
        for id in ids {
            let state = pod_state(inner.view.pod(&inner.config.namespace, &inner.pod_name(id)).as_deref());
            if let PodState::Failed(why) | PodState::Refused(why) | PodState::NoImage(why) = &state {
                tracing::warn!(container = id.0, %why, "kubernetes: a pod ended on its own");
            }
            if matches!(state, PodState::Ready(_) | PodState::Pending) || inner.live.lock().remove(&id).is_none() {
                continue;
            }
            if inner.gone.try_send(id).is_err() {
                tracing::warn!(container = id.0, "kubernetes: the pool was not told of a gone pod");
            }
            // A failed pod's object stays until someone deletes it.
            let (factory, name) = (KubernetesFactory { inner: inner.clone() }, inner.pod_name(id));
            tokio::spawn(async move { factory.delete(&name).await });
        }
    }
}

/// Puts the network policy in place, then deletes the pods an earlier run of this invoker
/// left; each retried until the API server answers.
async fn start_up(inner: Arc<Inner>) {
    if inner.config.network_policy {
        let mut backoff = Duration::from_millis(100);
        loop {
            match tokio::time::timeout(inner.config.call_timeout, ensure_policy(&inner)).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => {
                    tracing::warn!("kubernetes: {}; again in {backoff:?}", api_error("the network policy", e))
                }
                Err(_) => tracing::warn!("kubernetes: the network policy: no answer in time; again in {backoff:?}"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(15));
        }
        inner.isolated.send_replace(true);
    }
    remove_left(&inner).await;
}

/// Creates the policy, or replaces the one an earlier run made with this run's.
async fn ensure_policy(inner: &Inner) -> Result<(), kube::Error> {
    let mut wanted = policy::action_policy(&inner.invoker_id);
    match inner.policies.create(&PostParams::default(), &wanted).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let name = policy::policy_name(&inner.invoker_id);
            let current = inner.policies.get(&name).await?;
            wanted.metadata.resource_version = current.metadata.resource_version;
            inner.policies.replace(&name, &PostParams::default(), &wanted).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Deletes the pods an earlier run of this invoker left (its `invoker-id`, another run),
/// retrying until the API server answers.
async fn remove_left(inner: &Arc<Inner>) {
    let selector = format!("{}={}", pod::LABEL_INVOKER, label_value(&inner.invoker_id));
    let mut backoff = Duration::from_millis(100);
    let params = ListParams::default().labels(&selector);
    let left = loop {
        match tokio::time::timeout(inner.config.call_timeout, inner.pods.list(&params)).await {
            Ok(Ok(list)) => break list.items,
            Ok(Err(e)) => tracing::warn!("kubernetes: {}; again in {backoff:?}", api_error("listing pods left", e)),
            Err(_) => tracing::warn!("kubernetes: listing pods left: no answer in time; again in {backoff:?}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(15));
    };
    let run = label_value(&inner.run);
    let factory = KubernetesFactory { inner: inner.clone() };
    let names: Vec<String> = left
        .into_iter()
        .filter(|p| p.metadata.labels.as_ref().and_then(|l| l.get(pod::LABEL_RUN)) != Some(&run))
        .filter_map(|p| p.metadata.name)
        .collect();
    if !names.is_empty() {
        tracing::info!(pods = names.len(), "kubernetes: deleting the pods an earlier run of this invoker left");
    }
    futures_util::future::join_all(names.iter().map(|name| factory.delete(name))).await;
}

/// The config's toleration as the API's type.
fn toleration(t: &invoker_factory::settings::Toleration) -> Toleration {
    Toleration {
        key: t.key.clone(),
        operator: t.operator.clone(),
        value: t.value.clone(),
        effect: t.effect.clone(),
        toleration_seconds: t.toleration_seconds,
    }
}
