//! ContainerFactory: creates, pauses, resumes and destroys action containers, and reports what
//! each node of its cluster has free. Every backend implements [`ContainerFactory`] in a module
//! of its own; the [`Factory`] enum, selected by config, delegates to the one that runs, and
//! nothing outside this module knows which one it is.

mod cgroup;
#[cfg(feature = "docker")]
pub mod docker;
pub mod fn_bridge;
pub mod fn_socket;
mod id_lock;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod logs;
#[cfg(feature = "mesos")]
pub mod mesos;
#[cfg(feature = "test-util")]
pub mod mock;
pub mod netns;
mod one_host;
mod own_disk;
pub mod peer;
mod pipe_lines;
pub mod process;
pub mod sandbox;
mod snapshot;
mod uids;
pub mod watchdog;
mod zygote;

use crate::pool::core::{ContainerId, NodeId, NodeStatsUpdate, Time};
use logs::LogBuffer;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// What a container is created for: one action key, with its kind and memory.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub id: ContainerId,
    pub kind: String,
    pub memory_mb: u32,
    /// What the container may write, in MB (`limits.disk`): every factory gives it storage of
    /// this size and no more.
    pub disk_mb: u32,
    /// `namespace/name`, for labels and process names.
    pub action_path: String,
    /// For a kind whose protocol gives no code at start (Fn's): what the container starts
    /// with. `None` for every other kind.
    pub function: Option<Arc<FunctionStart>>,
}

/// What a container of a protocol without `/init` (Fn's) starts with, since its runtime takes
/// nothing from the invoker once it runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionStart {
    /// The action's code, written to the kind's `code_file`.
    pub code: Option<String>,
    /// The handler the kind's command names with `{main}`.
    pub main: String,
    /// The protocol's variables and the function's configuration; the factory adds where the
    /// function listens.
    pub env: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp(SocketAddr),
    /// A socket in a directory the container can write: reached only as [`peer`] allows.
    Unix(Arc<peer::ContainerSocket>),
    /// A port on the loopback of the container's own network namespace (see `netns.rs`).
    Netns(Arc<netns::NetNs>, u16),
}

impl Transport {
    /// True when a runtime accepts a connection here (how a factory knows it is ready).
    pub async fn accepts(&self) -> bool {
        match self {
            Transport::Tcp(addr) => tokio::net::TcpStream::connect(addr).await.is_ok(),
            Transport::Unix(socket) => socket.connect().await.is_ok(),
            Transport::Netns(ns, port) => ns.connect(*port).await.is_ok(),
        }
    }

    /// Polls until a runtime accepts a connection here; false once `deadline` passed (for
    /// backends that learn a container's address before its runtime listens).
    pub async fn until_accepts(&self, deadline: tokio::time::Instant) -> bool {
        while !self.accepts().await {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        true
    }
}

/// A created container: where its runtime listens and where its logs arrive.
#[derive(Clone, Debug)]
pub struct ContainerHandle {
    pub id: ContainerId,
    pub node: NodeId,
    pub transport: Transport,
    /// Who may answer a connection on `transport` (checked on each new one).
    pub peer: Arc<peer::Peer>,
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
    #[error("the container's image cannot be had: {0}")]
    Image(String),
    #[error("{op} failed: {reason}")]
    Operation { op: &'static str, reason: String },
}

impl FactoryError {
    /// What a failed create means to the pool and to the record.
    pub fn create_failure(&self) -> crate::pool::core::CreateFailure {
        use crate::pool::core::CreateFailure;
        match self {
            FactoryError::Refused(_) => CreateFailure::Refused,
            FactoryError::Image(_) => CreateFailure::Image,
            FactoryError::NotReady(_) => CreateFailure::NotReady,
            FactoryError::UnknownKind(_) | FactoryError::Create(_) | FactoryError::Operation { .. } => {
                CreateFailure::Failed
            }
        }
    }
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

/// What the pool and the proxies ask of a backend. Each call is bounded by the backend (a
/// create by its readiness deadline, a destroy by its kill timeout). The default methods are
/// for backends with nothing to do there.
pub trait ContainerFactory: Clone + Send + Sync + 'static {
    /// Creates a container of `spec` on `node` (the node the pool chose) and waits until its
    /// runtime accepts connections. A failed create leaves nothing behind.
    fn create(
        &self,
        spec: &ContainerSpec,
        node: &NodeId,
    ) -> impl Future<Output = Result<ContainerHandle, FactoryError>> + Send;

    /// Removes the container and everything it started; its memory is free once this returns.
    fn destroy(&self, c: &ContainerHandle) -> impl Future<Output = Result<(), FactoryError>> + Send;

    /// Freezes an idle container: it keeps its memory and uses no CPU.
    fn pause(&self, _c: &ContainerHandle) -> impl Future<Output = Result<(), FactoryError>> + Send {
        async { Ok(()) }
    }

    fn resume(&self, _c: &ContainerHandle) -> impl Future<Output = Result<(), FactoryError>> + Send {
        async { Ok(()) }
    }

    /// The latest snapshot of every node; the backend publishes a new one when it changes.
    fn stats(&self) -> StatsReceiver;

    /// Re-observes the cluster and publishes fresh stats (called periodically, never per
    /// activation).
    fn observe(&self) {}

    /// True when the container's last process was killed for exceeding its memory limit.
    fn was_oom_killed(&self, _c: &ContainerHandle) -> bool {
        false
    }

    /// Containers that end on their own (a lost node, a failed task), for the pool to replace;
    /// `Some` once, for the backends that learn of such ends.
    fn take_gone(&self) -> Option<tokio::sync::mpsc::Receiver<ContainerId>> {
        None
    }

    /// Whether jobs wait for room (a cluster that hands out resources on demand asks for more).
    fn demand(&self, _waiting: bool) {}

    /// Destroys everything still alive (shutdown), bounded by the caller.
    fn destroy_all(&self) -> impl Future<Output = ()> + Send;

    /// What the factory enforces, for the start-up log and `/health`.
    fn describe(&self) -> String;
}

#[derive(Clone)]
pub enum Factory {
    Process(process::ProcessFactory),
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
    /// The backend `factory.kind` names, set up from its section of the config.
    /// `store` keeps what a backend must remember across restarts (a Mesos framework id).
    pub async fn from_config(
        config: &crate::config::Config,
        epoch: Epoch,
        store: Arc<dyn crate::store::Store>,
    ) -> Result<Self, FactoryError> {
        use crate::config::FactoryKind;
        let _ = &store; // only the Mesos backend keeps anything
        Ok(match config.factory.kind {
            FactoryKind::Process => Factory::Process(process::ProcessFactory::new(config, epoch)?),
            #[cfg(feature = "docker")]
            FactoryKind::Docker => Factory::Docker(docker::DockerFactory::new(config, epoch).await?),
            #[cfg(feature = "mesos")]
            FactoryKind::Mesos => Factory::Mesos(mesos::MesosFactory::new(config, epoch, store).await?),
            #[cfg(feature = "kubernetes")]
            FactoryKind::Kubernetes => Factory::Kubernetes(kubernetes::KubernetesFactory::new(config, epoch).await?),
            #[cfg(feature = "test-util")]
            FactoryKind::Mock => {
                let m = &config.factory.mock;
                let nodes = (0..m.nodes).map(|i| (format!("mock{i}"), m.node_memory_mb)).collect();
                Factory::Mock(mock::MockFactory::new(mock::MockConfig { nodes, ..mock::MockConfig::default() }, epoch))
            }
            // Refused by the config's validation already; said again for a caller that skipped it.
            #[allow(unreachable_patterns)]
            kind => {
                let reason = kind.missing_feature().map_or_else(String::new, |f| f.to_string());
                return Err(FactoryError::Operation { op: "factory setup", reason });
            }
        })
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
