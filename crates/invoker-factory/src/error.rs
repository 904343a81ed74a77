//! What a factory's calls fail with, typed: the pool tells a refusal from a missing image from
//! a broken create by the variant (`create_failure`), and an operator reads the cause.
//!
//! Two kinds of text remain, and only where the other side gives nothing else: the words of a
//! cluster or an engine (why Kubernetes or Mesos refused or failed a container, why an image
//! cannot be had), and the line a runtime last wrote on stderr before it died.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum FactoryError {
    #[error("no runtime is configured for kind '{0}'")]
    UnknownKind(String),
    #[error("the container could not be created: {0}")]
    Create(#[from] CreateError),
    #[error("the container did not become ready within {0:?}")]
    NotReady(Duration),
    /// The cluster's words: there is no room for it after all.
    #[error("the cluster refused the container: {0}")]
    Refused(String),
    /// The engine's or the cluster's words.
    #[error("the container's image cannot be had: {0}")]
    Image(String),
    /// A local image (no registry gave it) that the namespace may not run (`local_images`).
    #[error(
        "image '{image}' was built on this engine, not pulled from a registry, and namespace '{namespace}' runs \
         only its own such images, named '{namespace}/...' (fn update context registry {namespace})"
    )]
    ImageNotOwned { image: String, namespace: String },
    #[error("{op}: no such container")]
    NoSuchContainer { op: &'static str },
    #[error("{op}: the container is not {state}")]
    NotInState { op: &'static str, state: &'static str },
    #[error("{op} failed: {source}")]
    Operation { op: &'static str, source: Cause },
    #[error("the {factory} factory cannot start: {source}")]
    Setup { factory: &'static str, source: SetupError },
}

impl FactoryError {
    /// A create's failure with the line the runtime (or sandbox) last wrote on stderr, which
    /// names the step that failed inside it; any other error as it is.
    pub fn with_said(self, said: Option<String>) -> FactoryError {
        match (self, said) {
            (FactoryError::Create(cause), Some(said)) => CreateError::Said { cause: Box::new(cause), said }.into(),
            (e, _) => e,
        }
    }

    /// What a failed create means to the pool and to the record.
    pub fn create_failure(&self) -> invoker_ids::CreateFailure {
        use invoker_ids::CreateFailure;
        match self {
            FactoryError::Refused(_) => CreateFailure::Refused,
            FactoryError::Image(_) => CreateFailure::Image,
            FactoryError::ImageNotOwned { .. } => CreateFailure::ImageNotOwned,
            FactoryError::NotReady(_) => CreateFailure::NotReady,
            FactoryError::UnknownKind(_)
            | FactoryError::Create(_)
            | FactoryError::NoSuchContainer { .. }
            | FactoryError::NotInState { .. }
            | FactoryError::Operation { .. }
            | FactoryError::Setup { .. } => CreateFailure::Failed,
        }
    }
}

/// The system error under a failed call.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Sys(#[from] nix::errno::Errno),
    /// What a backend's engine or cluster said (Docker's, Kubernetes', Mesos' error, each typed
    /// in its own crate).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

impl Cause {
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Cause::Backend(Box::new(e))
    }
}

/// Why one container could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("kind '{0}' has no command: it runs only where an image holds its function (Docker, Kubernetes)")]
    NoCommand(String),
    #[error("the {0} factory runs no Fn function (the process, Docker and Kubernetes factories do)")]
    NoFunctions(&'static str),
    #[error("the action has no code for {0}")]
    NoCode(String),
    #[error(transparent)]
    NoUid(#[from] super::uids::UidsError),
    /// A step of the container's set-up on this host (its directory, disk, socket, cgroups).
    #[error("{step}: {source}")]
    Step { step: &'static str, source: Cause },
    #[error("{}: {source}", .path.display())]
    Path { path: PathBuf, source: std::io::Error },
    #[error("the function's socket: {0}")]
    Socket(#[from] super::fn_socket::ListenerError),
    /// The runtime (or the function) ended before it was ready, with its exit status.
    #[error("the {what} exited before it was ready ({status})")]
    Exited { what: &'static str, status: String },
    #[error("the runtime exited as it became ready")]
    ExitedAsReady,
    /// What went wrong, and the line the sandbox or runtime last wrote on stderr, which names
    /// the step that failed inside it.
    #[error("{cause}: {said}")]
    Said { cause: Box<CreateError>, said: String },
    #[error("the container is not running (no pid)")]
    NoPid,
    #[error("the container's network namespace (pid {pid}): {source}")]
    Netns { pid: i64, source: std::io::Error },
    #[error(
        "pid {0} of the container shares the invoker's network; the engine must run on this host, in the \
         invoker's pid namespace, for network = \"isolated\""
    )]
    SharedNetwork(i64),
    /// The engine or cluster refused or failed it (`op`: what was asked).
    #[error("{op}: {source}")]
    Engine { op: &'static str, source: Cause },
    /// The cluster's words for a container that failed (a Mesos task, a pod).
    #[error("{0}")]
    Failed(String),
    #[error("an Fn function on Kubernetes needs more than its bridge's {bridge_mb} MB")]
    BridgeTooLarge { bridge_mb: u32 },
    #[error("an Fn function's code on Kubernetes is at most {max_bytes} bytes")]
    CodeTooLarge { max_bytes: usize },
    #[error("the action pods' network policy is not in place yet")]
    NoNetworkPolicy,
    #[error("the API server did not answer the pod's creation in time")]
    NoAnswer,
    #[error("the pod is Ready but {0} does not answer the invoker")]
    Unanswered(String),
    #[error("the pod was deleted")]
    Deleted,
    #[error("agent host {0} does not resolve")]
    Unresolved(String),
    /// The factory is shutting down (its create slots closed) or a set-up task died.
    #[error("the factory stopped: {0}")]
    Stopped(&'static str),
    #[error("the mock factory is set to fail every create")]
    MockFails,
}

impl CreateError {
    pub fn step(step: &'static str, source: impl Into<Cause>) -> Self {
        CreateError::Step { step, source: source.into() }
    }
}

/// Why a factory cannot start on this host with this config.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{}: {source}", .path.display())]
    Path { path: PathBuf, source: std::io::Error },
    #[error("{what}: {source}")]
    Failed { what: &'static str, source: Cause },
    /// A setting this host cannot honour, or one it needs: the setting, and why.
    #[error("{setting}: {why}")]
    Unfit { setting: String, why: String },
    #[error(transparent)]
    Id(#[from] super::id_lock::IdLockError),
    #[error(transparent)]
    Uids(#[from] super::uids::UidsError),
    /// The factory `factory.kind` names is not in this build.
    #[error("factory.kind: {0}")]
    NotBuilt(String),
}
