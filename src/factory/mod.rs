//! ContainerFactory: creates, pauses, resumes and destroys action containers, and reports what
//! each node of its cluster has free. One module per backend, selected by config through the
//! [`Factory`] enum; nothing outside this module knows which backend runs.

mod cgroup;
pub mod docker;
pub mod logs;
pub mod mesos;
pub mod mock;
pub mod process;
pub mod sandbox;
mod uids;

use crate::pool::core::{ContainerId, NodeId, NodeStatsUpdate, Time};
use logs::LogBuffer;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// What a container is created for: one action key, with its kind and memory.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub id: ContainerId,
    pub kind: String,
    pub memory_mb: u32,
    /// `namespace/name`, for labels and process names.
    pub action_path: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Transport {
    /// True when a runtime accepts a connection here (how a factory knows it is ready).
    pub async fn accepts(&self) -> bool {
        match self {
            Transport::Tcp(addr) => tokio::net::TcpStream::connect(addr).await.is_ok(),
            Transport::Unix(path) => tokio::net::UnixStream::connect(path).await.is_ok(),
        }
    }
}

/// A created container: where its runtime listens and where its logs arrive.
#[derive(Clone, Debug)]
pub struct ContainerHandle {
    pub id: ContainerId,
    pub node: NodeId,
    pub transport: Transport,
    pub logs: Arc<LogBuffer>,
    /// When it became ready; stats the factory observes from then on include it.
    pub ready_at: Time,
}

#[derive(Debug, thiserror::Error)]
pub enum FactoryError {
    #[error("no runtime is configured for kind '{0}'")]
    UnknownKind(String),
    #[error("the container could not be created: {0}")]
    Create(String),
    #[error("the container did not become ready within {0:?}")]
    NotReady(std::time::Duration),
    #[error("the cluster refused the container: {0}")]
    Refused(String),
    #[error("{op} failed: {reason}")]
    Operation { op: &'static str, reason: String },
}

/// The time base shared by the pool and the factories: node stats are stamped in it.
#[derive(Clone, Copy, Debug)]
pub struct Epoch(pub Instant);

impl Epoch {
    pub fn now(&self) -> Time {
        self.0.elapsed()
    }
}

/// The latest snapshot of every node, pushed by the factory; the pool caches it.
pub type StatsReceiver = watch::Receiver<Vec<NodeStatsUpdate>>;

/// The snapshot of a factory that runs on one host and sees no other use of its memory (process,
/// Docker): free is the capacity minus the declared limits of the live containers.
fn one_host_stats(
    node: &NodeId,
    capacity_mb: u64,
    limits_mb: impl Iterator<Item = u32>,
    at: Time,
) -> Vec<NodeStatsUpdate> {
    let used: u64 = limits_mb.map(u64::from).sum();
    vec![NodeStatsUpdate {
        node: node.clone(),
        capacity_mb,
        free_mb: capacity_mb.saturating_sub(used),
        observed_at: at,
    }]
}

#[derive(Clone)]
pub enum Factory {
    Process(process::ProcessFactory),
    Docker(docker::DockerFactory),
    Mesos(mesos::MesosFactory),
    Mock(mock::MockFactory),
}

impl Factory {
    /// The backend `factory.kind` names, set up from its section of the config.
    /// `store` keeps what a backend must remember across restarts (a Mesos framework id).
    pub async fn from_config(
        config: &crate::config::Config,
        epoch: Epoch,
        store: Arc<dyn crate::store::Store>,
    ) -> Result<Self, FactoryError> {
        use crate::config::FactoryKind;
        Ok(match config.factory.kind {
            FactoryKind::Process => Factory::Process(process::ProcessFactory::new(config, epoch)?),
            FactoryKind::Docker => Factory::Docker(docker::DockerFactory::new(config, epoch).await?),
            FactoryKind::Mesos => Factory::Mesos(mesos::MesosFactory::new(config, epoch, store).await?),
            FactoryKind::Mock => {
                let m = &config.factory.mock;
                let nodes = (0..m.nodes).map(|i| (format!("mock{i}"), m.node_memory_mb)).collect();
                Factory::Mock(mock::MockFactory::new(mock::MockConfig { nodes, ..mock::MockConfig::default() }, epoch))
            }
        })
    }

    pub async fn create(&self, spec: &ContainerSpec, node: &NodeId) -> Result<ContainerHandle, FactoryError> {
        match self {
            Factory::Process(f) => f.create(spec, node).await,
            Factory::Docker(f) => f.create(spec, node).await,
            Factory::Mesos(f) => f.create(spec, node).await,
            Factory::Mock(f) => f.create(spec, node).await,
        }
    }

    pub async fn pause(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        match self {
            Factory::Process(f) => f.pause(c).await,
            Factory::Docker(f) => f.pause(c).await,
            Factory::Mesos(f) => f.pause(c).await,
            Factory::Mock(f) => f.pause(c).await,
        }
    }

    pub async fn resume(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        match self {
            Factory::Process(f) => f.resume(c).await,
            Factory::Docker(f) => f.resume(c).await,
            Factory::Mesos(f) => f.resume(c).await,
            Factory::Mock(f) => f.resume(c).await,
        }
    }

    pub async fn destroy(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        match self {
            Factory::Process(f) => f.destroy(c).await,
            Factory::Docker(f) => f.destroy(c).await,
            Factory::Mesos(f) => f.destroy(c).await,
            Factory::Mock(f) => f.destroy(c).await,
        }
    }

    pub fn stats(&self) -> StatsReceiver {
        match self {
            Factory::Process(f) => f.stats(),
            Factory::Docker(f) => f.stats(),
            Factory::Mesos(f) => f.stats(),
            Factory::Mock(f) => f.stats(),
        }
    }

    /// Re-observes the cluster and publishes fresh stats (called periodically, never per activation).
    pub fn observe(&self) {
        match self {
            Factory::Process(f) => f.observe(),
            Factory::Docker(f) => f.observe(),
            Factory::Mesos(f) => f.observe(),
            Factory::Mock(f) => f.observe(),
        }
    }

    /// True when the container's last process was killed for exceeding its memory limit.
    pub fn was_oom_killed(&self, c: &ContainerHandle) -> bool {
        match self {
            Factory::Process(f) => f.was_oom_killed(c.id),
            Factory::Docker(f) => f.was_oom_killed(c.id),
            Factory::Mesos(_) => false,
            Factory::Mock(_) => false,
        }
    }

    /// Containers that end on their own (a lost node, a failed task), for the pool to replace;
    /// `Some` once, for the backends that learn of such ends (Mesos).
    pub fn take_gone(&self) -> Option<tokio::sync::mpsc::Receiver<ContainerId>> {
        match self {
            Factory::Mesos(f) => f.take_gone(),
            Factory::Process(_) | Factory::Docker(_) | Factory::Mock(_) => None,
        }
    }

    /// Tells the factory whether jobs wait for room (a Mesos framework then asks for offers).
    pub fn demand(&self, waiting: bool) {
        match self {
            Factory::Mesos(f) => f.demand(waiting),
            Factory::Process(_) | Factory::Docker(_) | Factory::Mock(_) => {}
        }
    }

    /// Destroys everything still alive (shutdown), bounded by the caller.
    pub async fn destroy_all(&self) {
        match self {
            Factory::Process(f) => f.destroy_all().await,
            Factory::Docker(f) => f.destroy_all().await,
            Factory::Mesos(f) => f.destroy_all().await,
            Factory::Mock(f) => f.destroy_all().await,
        }
    }

    /// What the factory enforces, for the start-up log and `/health`.
    pub fn describe(&self) -> String {
        match self {
            Factory::Process(f) => f.describe(),
            Factory::Docker(f) => f.describe(),
            Factory::Mesos(f) => f.describe(),
            Factory::Mock(_) => "mock factory (in-process runtimes, nothing enforced)".into(),
        }
    }
}
