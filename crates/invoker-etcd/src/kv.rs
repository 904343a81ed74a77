//! What the cluster layer asks of etcd, as a trait: the registry, the schedulers and the
//! capacity manager are written against it, and [`crate::client::Etcd`] is the real one.

use crate::mirror::Snapshot;
use std::future::Future;
use std::time::Duration;

/// A lease, as etcd numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseId(pub i64);

/// The few etcd operations the cluster layer needs; [`crate::client::Etcd`] is the real one, and the
/// tests run against a real etcd (there is no fake).
pub trait ClusterKv: Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;

    fn grant(&self, ttl: Duration) -> impl Future<Output = Result<LeaseId, Self::Error>> + Send;
    /// Renews the lease; `None` when it has expired (its keys are gone).
    fn keep_alive(&self, lease: LeaseId) -> impl Future<Output = Result<Option<Duration>, Self::Error>> + Send;
    fn revoke(&self, lease: LeaseId) -> impl Future<Output = Result<(), Self::Error>> + Send;
    fn put(
        &self,
        key: &str,
        value: &str,
        lease: Option<LeaseId>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// Puts `key` only if it does not exist; false when it does.
    fn create(&self, key: &str, value: &str, lease: LeaseId) -> impl Future<Output = Result<bool, Self::Error>> + Send;
    /// The value and the lease of `key` (lease 0: none).
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<(String, LeaseId)>, Self::Error>> + Send;
    fn get_prefix(&self, prefix: &str) -> impl Future<Output = Result<Vec<(String, String)>, Self::Error>> + Send;
    fn delete(&self, key: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `prefix` kept in memory until `stop` ([`crate::mirror::mirror`]).
    fn mirror(&self, prefix: &str, stop: tokio_util::sync::CancellationToken)
        -> tokio::sync::watch::Receiver<Snapshot>;
}
