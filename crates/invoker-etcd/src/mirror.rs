//! A prefix of etcd kept in memory: one range, then the gateway's watch from the revision the
//! range was read at, each change applied as it comes. A scheduler used to range its whole
//! prefix (every invoker and every container) five times a second; now it ranges once, and
//! again only when the watch breaks or etcd compacted past it, and it sees a change within a
//! round trip instead of within a refresh. The capacity manager follows the registrations, the
//! demand reports and its leader key the same way, and each invoker its drain key.
//!
//! While etcd cannot be read the entries stay as last seen and the snapshot says so
//! (`current` false): a reader freezes its picture as it did on a failed range. A watch that
//! says nothing for `QUIET_CHECK` is checked with a linearizable read on the member that serves
//! it, so a member that hangs with its connection open (a stall), or that lost its cluster (a
//! partition), is noticed and the watch replaced on another member, while the others answer.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A watch quiet this long is checked with a read on its own member.
const QUIET_CHECK: Duration = Duration::from_secs(5);
/// The longest pause between two ranges while etcd does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The prefix as last seen.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub entries: Arc<BTreeMap<String, String>>,
    /// False while etcd cannot be read (the entries are as last seen) and before the first range.
    pub current: bool,
    /// Ranges made: one at the start, one more for each broken or compacted watch.
    pub ranges: u64,
    /// Counts every change of the snapshot: a later one has a higher number.
    pub seq: u64,
}

/// One change under the prefix.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    Put { key: String, value: String },
    Delete { key: String },
}

/// What one object of the watch stream says.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchNews {
    /// The watch is in place (or, with no events, a progress report).
    Nothing,
    Changes(Vec<Change>),
    /// The watch is over (etcd compacted past its revision, or cancelled it): range again.
    Ended(WatchEnd),
}

/// Why etcd ended a watch.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchEnd {
    #[error("etcd compacted its history past the watch (to revision {0})")]
    Compacted(i64),
    /// With etcd's reason.
    #[error("etcd cancelled the watch: {0}")]
    Cancelled(String),
    /// With etcd's words (`etcdserver: no leader`).
    #[error("etcd: {0}")]
    Failed(String),
}

/// Why a mirror's watch stopped, and it ranges again.
#[derive(Debug, thiserror::Error)]
enum Stopped<O: std::error::Error, W: std::error::Error> {
    #[error("the watch could not be opened: {0}")]
    Open(O),
    #[error("the watch broke: {0}")]
    Broken(W),
    #[error("quiet for {0:?} and its member does not serve a read")]
    Silent(Duration),
    #[error(transparent)]
    Ended(WatchEnd),
}

/// The keys and values of a range, and the revision it was read at.
pub type Ranged = (Vec<(String, String)>, i64);

/// What a mirror needs of etcd (the cluster layer's `Etcd` client is the real one).
pub trait Source: Clone + Send + Sync + 'static {
    type Error: std::error::Error + Send;
    type Watch: Watch;
    /// Every key under `prefix` with its value, and the revision they were read at.
    fn get_prefix_at(&self, prefix: &str) -> impl Future<Output = Result<Ranged, Self::Error>> + Send;
    /// The changes under `prefix` from `revision` on.
    fn watch_prefix(
        &self,
        prefix: &str,
        revision: i64,
    ) -> impl Future<Output = Result<Self::Watch, Self::Error>> + Send;
}

/// A watch's news, one after another, until it ends (`Err`: why).
pub trait Watch: Send {
    type Error: std::error::Error + Send;
    fn next(&mut self) -> impl Future<Output = Result<WatchNews, Self::Error>> + Send;
    /// Whether the member serving this watch still serves reads: asked of that member itself,
    /// since a frozen member's watch is silent while the others answer for the cluster.
    fn still_served(&self) -> impl Future<Output = bool> + Send;
}

/// Keeps `prefix` of `etcd` in the returned receiver until `stop`.
pub fn mirror<S: Source>(etcd: S, prefix: String, stop: CancellationToken) -> watch::Receiver<Snapshot> {
    let (sender, receiver) = watch::channel(Snapshot::default());
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = follow(&etcd, &prefix, &sender) => {}
        }
    });
    receiver
}

async fn follow<S: Source>(etcd: &S, prefix: &str, sender: &watch::Sender<Snapshot>) {
    let mut backoff = Duration::from_millis(100);
    let mut complained: Option<Instant> = None;
    loop {
        let revision = match etcd.get_prefix_at(prefix).await {
            Ok((pairs, revision)) => {
                sender.send_modify(|s| {
                    s.entries = Arc::new(pairs.into_iter().collect());
                    s.current = true;
                    s.ranges += 1;
                    s.seq += 1;
                });
                complained = None;
                revision
            }
            Err(e) => {
                sender.send_if_modified(|s| std::mem::replace(&mut s.current, false));
                if complained.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(%prefix, "reading etcd: {e}; again in {backoff:?} (the picture as last seen meanwhile)");
                    complained = Some(Instant::now());
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let watched = Instant::now();
        let why = watch_from(etcd, prefix, revision + 1, sender).await;
        tracing::debug!(%prefix, "the etcd watch ended: {why}; ranging again");
        invoker_telemetry::moment("etcd.watch.ended", prefix, Some(&why.to_string()));
        // A watch that cannot stay up must not turn into a range after range.
        if watched.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}

/// Applies the watch's changes until it ends; returns why it did.
async fn watch_from<S: Source>(
    etcd: &S,
    prefix: &str,
    revision: i64,
    sender: &watch::Sender<Snapshot>,
) -> Stopped<S::Error, <S::Watch as Watch>::Error> {
    let mut stream = match etcd.watch_prefix(prefix, revision).await {
        Ok(stream) => stream,
        Err(e) => return Stopped::Open(e),
    };
    loop {
        let news = match tokio::time::timeout(QUIET_CHECK, stream.next()).await {
            Ok(Ok(news)) => news,
            Ok(Err(e)) => return Stopped::Broken(e),
            Err(_) if stream.still_served().await => continue,
            Err(_) => return Stopped::Silent(QUIET_CHECK),
        };
        match news {
            WatchNews::Nothing => {}
            WatchNews::Ended(why) => return Stopped::Ended(why),
            WatchNews::Changes(changes) => sender.send_modify(|s| {
                let entries = Arc::make_mut(&mut s.entries);
                for change in changes {
                    match change {
                        Change::Put { key, value } => entries.insert(key, value),
                        Change::Delete { key } => entries.remove(&key),
                    };
                }
                s.seq += 1;
            }),
        }
    }
}
