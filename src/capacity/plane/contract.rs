//! What a control plane promises (the trait, the invoker it starts, its errors), apart from the
//! planes, so that each plane imports the promise and not the enum over its siblings.

use std::future::Future;

#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    #[error("starting invoker {id}: {reason}")]
    Start { id: String, reason: String },
    #[error("stopping invoker {id}: {reason}")]
    Stop { id: String, reason: String },
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
