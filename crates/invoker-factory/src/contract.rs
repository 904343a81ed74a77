//! What every container factory promises the pool and the proxies (the trait, what a container
//! is created for, the handle it gives back, its errors), apart from the factories, so that
//! each factory imports the promise and not the enum over its siblings.

use super::error::FactoryError;
use super::logs::LogBuffer;
use super::netns::NetNs;
use super::peer::{ContainerSocket, Peer};
use invoker_ids::{ContainerId, NodeId, NodeStatsUpdate, Time};
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

impl ContainerSpec {
    /// The namespace whose action this container runs.
    pub fn namespace(&self) -> &str {
        self.action_path.split('/').next().unwrap_or_default()
    }
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
    /// The function's own image (an Fn function made from an image, `fn:image`), run with its
    /// own entry point; `None`: the kind's image.
    pub image: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp(SocketAddr),
    /// A socket in a directory the container can write: reached only as [`peer`] allows.
    Unix(Arc<ContainerSocket>),
    /// A port on the loopback of the container's own network namespace (see `netns.rs`).
    Netns(Arc<NetNs>, u16),
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
    pub peer: Arc<Peer>,
    pub logs: Arc<LogBuffer>,
    /// When it became ready; stats the factory observes from then on include it.
    pub ready_at: Time,
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
