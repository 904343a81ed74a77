//! What a control plane promises the capacity manager (the trait, the invoker it starts, its
//! errors): the other contract a backend implements. Here, apart from the planes, so that each
//! plane (the local one in the invoker, Kubernetes' in its crate) imports the promise and not
//! the enum over its siblings.

use std::future::Future;

#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    #[error("starting invoker {id}: {cause}")]
    Start {
        id: String,
        #[source]
        cause: PlaneFailure,
    },
    #[error("stopping invoker {id}: {cause}")]
    Stop {
        id: String,
        #[source]
        cause: PlaneFailure,
    },
}

/// What a plane could not do for one invoker.
#[derive(Debug, thiserror::Error)]
pub enum PlaneFailure {
    #[error("{}: {source}", .path.display())]
    Path { path: std::path::PathBuf, source: std::io::Error },
    #[error("not an invoker of a group")]
    NotInAGroup,
    #[error("no group {0}")]
    NoGroup(String),
    #[error("its pod still exists {0:?} after the scale-down")]
    StillThere(std::time::Duration),
    /// What the cluster said (Kubernetes' error, typed in its crate).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

/// One invoker to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvokerSpec {
    pub id: String,
    pub group: String,
    pub tags: Vec<String>,
    pub memory_mb: u64,
}

pub trait ControlPlane: Send + Sync + 'static {
    /// Starts an invoker; it registers in etcd when it is up.
    fn provision(&self, spec: &InvokerSpec) -> impl Future<Output = Result<(), PlaneError>> + Send;
    /// Stops it: it drains (what it holds finishes within its shutdown grace) and exits; after
    /// a bound, it is killed.
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), PlaneError>> + Send;
    /// Whether it runs: `Some(false)` once it exited, `None` when the plane does not know it.
    fn running(&self, id: &str) -> Option<bool>;
    /// Why an invoker that exited did (its last error), when the plane can tell.
    fn last_error(&self, id: &str) -> Option<String>;
    /// Every invoker it runs now, whoever started it (this manager in an earlier leadership,
    /// a manager before it, a standby that led meanwhile), read afresh from where the plane
    /// keeps them: called each time leadership is taken, so that no handle from before a loss
    /// of leadership is trusted, and nothing running is started twice.
    fn found(&self) -> Vec<String>;
    /// The manager forgot `id` (it is gone, not running): what is left of it (a dead process's
    /// pid file and data) goes.
    fn forget(&self, id: &str);
}
