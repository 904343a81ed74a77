//! ContainerFactory: creates, pauses, resumes and destroys action containers, and reports what
//! each node of its cluster has free. Every backend implements [`ContainerFactory`] in a module
//! of its own; the [`Factory`] enum, selected by config, delegates to the one that runs, and
//! nothing outside this module knows which one it is.

pub mod fn_bridge;
#[cfg(feature = "test-util")]
pub mod mock;

#[cfg(feature = "docker")]
use invoker_docker as docker;
use invoker_factory::contract::{ContainerFactory, ContainerHandle, ContainerSpec, Epoch, StatsReceiver};
use invoker_factory::error::{FactoryError, SetupError};
use invoker_ids::{ContainerId, NodeId};
#[cfg(feature = "kubernetes")]
use invoker_kubernetes as kubernetes;
#[cfg(feature = "mesos")]
use invoker_mesos as mesos;
use std::sync::Arc;

#[derive(Clone)]
pub enum Factory {
    Process(invoker_process::ProcessFactory),
    #[cfg(feature = "docker")]
    Docker(docker::DockerFactory),
    #[cfg(feature = "mesos")]
    Mesos(mesos::MesosFactory),
    #[cfg(feature = "kubernetes")]
    Kubernetes(kubernetes::KubernetesFactory),
    #[cfg(feature = "test-util")]
    Mock(mock::MockFactory),
}

/// `$body` with `$f` bound to the backend that runs: the one list of backends to delegate to.
macro_rules! each_backend {
    ($factory:expr, $f:ident => $body:expr) => {
        match $factory {
            Factory::Process($f) => $body,
            #[cfg(feature = "docker")]
            Factory::Docker($f) => $body,
            #[cfg(feature = "mesos")]
            Factory::Mesos($f) => $body,
            #[cfg(feature = "kubernetes")]
            Factory::Kubernetes($f) => $body,
            #[cfg(feature = "test-util")]
            Factory::Mock($f) => $body,
        }
    };
}

impl Factory {
    /// The backend's name, as `factory.kind` spells it: on the spans of what it creates.
    pub fn name(&self) -> &'static str {
        match self {
            Factory::Process(_) => "process",
            #[cfg(feature = "docker")]
            Factory::Docker(_) => "docker",
            #[cfg(feature = "mesos")]
            Factory::Mesos(_) => "mesos",
            #[cfg(feature = "kubernetes")]
            Factory::Kubernetes(_) => "kubernetes",
            #[cfg(feature = "test-util")]
            Factory::Mock(_) => "mock",
        }
    }

    /// The backend `factory.kind` names, set up from its section of the config.
    /// `store` keeps what a backend must remember across restarts (a Mesos framework id).
    pub async fn from_config(
        config: &crate::config::Config,
        epoch: Epoch,
        store: Arc<dyn invoker_store::Store>,
    ) -> Result<Self, FactoryError> {
        use crate::config::FactoryKind;
        let _ = &store; // only the Mesos backend keeps anything
        Ok(match config.factory.kind {
            FactoryKind::Process => Factory::Process(invoker_process::ProcessFactory::new(
                &config.factory.process,
                &config.kinds,
                &config.invoker_id,
                &config.data_dir,
                config.source.as_deref(),
                epoch,
            )?),
            #[cfg(feature = "docker")]
            FactoryKind::Docker => {
                let docker = &config.factory.docker;
                Factory::Docker(docker::DockerFactory::new(docker, &config.invoker_id, &config.data_dir, epoch).await?)
            }
            #[cfg(feature = "mesos")]
            FactoryKind::Mesos => Factory::Mesos(mesos_factory(config, epoch, store).await?),
            #[cfg(feature = "kubernetes")]
            FactoryKind::Kubernetes => {
                let k8s = &config.factory.kubernetes;
                let start_timeouts = config
                    .kinds
                    .iter()
                    .filter(|(kind, _)| k8s.kinds.contains_key(*kind))
                    .map(|(kind, kc)| (kind.clone(), kc.start_timeout_or(k8s.create_timeout)))
                    .collect();
                let factory = kubernetes::KubernetesFactory::new(k8s, &config.invoker_id, &start_timeouts, epoch);
                Factory::Kubernetes(factory.await?)
            }
            #[cfg(feature = "test-util")]
            FactoryKind::Mock => {
                let m = &config.factory.mock;
                let nodes = (0..m.nodes).map(|i| (format!("mock{i}"), m.node_memory_mb)).collect();
                let config = mock::MockConfig { nodes, start_latency: m.start_latency, ..mock::MockConfig::default() };
                let factory = mock::MockFactory::new(config, epoch);
                if let Some(file) = &m.memory_limit_file {
                    factory.follow_memory_limit(file, m.own_memory_mb, m.node_memory_mb);
                }
                Factory::Mock(factory)
            }
            // Refused by the config's validation already; said again for a caller that skipped it.
            #[allow(unreachable_patterns)]
            kind => {
                let missing = kind.missing_feature().map_or_else(String::new, |f| f.to_string());
                return Err(FactoryError::Setup { factory: "configured", source: SetupError::NotBuilt(missing) });
            }
        })
    }
}

/// The Mesos factory of `[factory.mesos]`: each kind's command as the agents run it (the
/// invoker binary there, the port the offer gives), its framework id kept in `store`.
#[cfg(feature = "mesos")]
async fn mesos_factory(
    config: &crate::config::Config,
    epoch: Epoch,
    store: Arc<dyn invoker_store::Store>,
) -> Result<mesos::MesosFactory, FactoryError> {
    let m = &config.factory.mesos;
    let agent_invoker = match &m.agent_invoker {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(|e| FactoryError::Setup {
            factory: "mesos",
            source: SetupError::Failed { what: "the invoker's own executable", source: e.into() },
        })?,
    };
    let listen = format!("{}:{{port}}", m.listen_host);
    let commands = config.kinds.iter().map(|(kind, k)| (kind.clone(), k.command_for(&agent_invoker, &listen, "")));
    let ready_timeout = config.proxy.init_timeout.max(std::time::Duration::from_secs(10));
    let kept = Arc::new(KeptInStore(store));
    mesos::MesosFactory::new(m, &config.invoker_id, commands.collect(), ready_timeout, epoch, kept).await
}

/// The invoker's store, as the Mesos factory keeps its framework id in it.
#[cfg(feature = "mesos")]
struct KeptInStore(Arc<dyn invoker_store::Store>);

#[cfg(feature = "mesos")]
impl mesos::KeptSettings for KeptInStore {
    fn get(&self, key: &str) -> Result<Option<String>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(self.0.get_setting(key)?)
    }

    fn put(&self, key: &str, value: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(self.0.put_setting(key, value)?)
    }
}

impl ContainerFactory for Factory {
    async fn create(&self, spec: &ContainerSpec, node: &NodeId) -> Result<ContainerHandle, FactoryError> {
        each_backend!(self, f => f.create(spec, node).await)
    }

    async fn destroy(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        each_backend!(self, f => f.destroy(c).await)
    }

    async fn pause(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        each_backend!(self, f => f.pause(c).await)
    }

    async fn resume(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        each_backend!(self, f => f.resume(c).await)
    }

    fn stats(&self) -> StatsReceiver {
        each_backend!(self, f => f.stats())
    }

    fn observe(&self) {
        each_backend!(self, f => f.observe())
    }

    fn was_oom_killed(&self, c: &ContainerHandle) -> bool {
        each_backend!(self, f => f.was_oom_killed(c))
    }

    fn take_gone(&self) -> Option<tokio::sync::mpsc::Receiver<ContainerId>> {
        each_backend!(self, f => f.take_gone())
    }

    fn demand(&self, waiting: bool) {
        each_backend!(self, f => f.demand(waiting))
    }

    async fn destroy_all(&self) {
        each_backend!(self, f => f.destroy_all().await)
    }

    fn describe(&self) -> String {
        each_backend!(self, f => f.describe())
    }
}
