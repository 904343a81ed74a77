//! `/ui`, the live view: the page (plain HTML, CSS and JavaScript served from the binary, no
//! key: it carries no secret) and `/v1/live`, its events (the admin key): a snapshot of the
//! pool, the last activations, then every change as the pool and the activations' ends
//! publish it (`crate::live`).

use super::call::Call;
use super::error::ApiError;
use super::state::AppState;
use bytes::Bytes;
use invoker_live::LiveBody;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// Viewers at once, at most: each holds a connection and a forwarding task.
const MAX_VIEWERS: usize = 16;
/// Frames buffered per viewer before it counts as behind (and gets a new snapshot).
const VIEWER_BUFFER: usize = 256;
/// A comment sent to an idle stream, so that proxies and the browser keep it.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// What a process shows: an invoker its pool (whose changes come through the feed), a
/// scheduler the invokers it sees (sent when they changed, looked at every second).
enum View {
    Pool(crate::pool::actor::PoolHandle),
    Scheduler(std::sync::Arc<invoker_scheduler::Dispatcher>),
}

impl View {
    async fn snapshot(&self) -> Option<Bytes> {
        match self {
            View::Pool(pool) => pool.live_snapshot().await,
            View::Scheduler(dispatcher) => Some(invoker_live::frame("invokers", &invokers(dispatcher))),
        }
    }

    fn every(&self) -> Duration {
        match self {
            View::Pool(_) => KEEP_ALIVE,
            View::Scheduler(_) => Duration::from_secs(1),
        }
    }

    /// What changed since `last` was sent (the pool's changes come through the feed).
    async fn changed(&self, last: &mut Bytes) -> Option<Bytes> {
        let View::Scheduler(_) = self else { return None };
        let now = self.snapshot().await?;
        (now != *last).then(|| {
            *last = now.clone();
            now
        })
    }
}

/// The invokers a scheduler sees, by id.
fn invokers(dispatcher: &invoker_scheduler::Dispatcher) -> serde_json::Value {
    let mut invokers = dispatcher.invokers();
    invokers.sort_by(|a, b| a.record.id.cmp(&b.record.id));
    serde_json::json!({ "scheduler": dispatcher.id(), "invokers": invokers })
}

/// `GET /v1/live`: the admin's event stream.
pub(super) async fn events(
    state: &AppState,
    head: hyper::http::request::Parts,
    stop: CancellationToken,
) -> Result<hyper::Response<LiveBody>, ApiError> {
    let call = Call { head, body: Bytes::new(), principal: None };
    state.admin(&call)?;
    if call.head.method != hyper::Method::GET {
        return Err(ApiError::MethodNotAllowed { method: call.head.method.to_string(), allowed: "GET" });
    }
    let feed = &state.service.metrics().live;
    if feed.viewers() >= MAX_VIEWERS {
        return Err(ApiError::Unavailable(format!("{MAX_VIEWERS} viewers already watch; try again later")));
    }
    let view = match (state.pool(), state.dispatcher()) {
        (Some(pool), _) => View::Pool(pool.clone()),
        (None, Some(dispatcher)) => View::Scheduler(dispatcher.clone()),
        (None, None) => return Err(ApiError::NotFound),
    };
    // Subscribed before the snapshot: a change after it is sent after it too.
    let mut changes = feed.subscribe();
    let snapshot = view.snapshot().await.ok_or_else(|| ApiError::Unavailable("the pool is gone".into()))?;
    let mut first = VecDeque::from([Bytes::from_static(b"retry: 2000\n\n"), snapshot.clone()]);
    first.extend(feed.recent());
    let (tx, rest) = mpsc::channel(VIEWER_BUFFER);
    tokio::task::spawn_local(async move {
        let mut last = snapshot;
        let mut every = tokio::time::interval(view.every());
        let mut quiet = tokio::time::Instant::now();
        loop {
            let frame = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tx.closed() => return,
                changed = changes.recv() => match changed {
                    Ok(frame) => frame,
                    // Behind: what it missed is in a new snapshot.
                    Err(broadcast::error::RecvError::Lagged(_)) => match view.snapshot().await {
                        Some(snapshot) => snapshot,
                        None => return,
                    },
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = every.tick() => match view.changed(&mut last).await {
                    Some(frame) => frame,
                    None if quiet.elapsed() >= KEEP_ALIVE => Bytes::from_static(b": still here\n\n"),
                    None => continue,
                },
            };
            quiet = tokio::time::Instant::now();
            // A viewer that does not read its buffer is one behind, too.
            if tx.try_send(frame).is_err() {
                changes = changes.resubscribe();
                let Some(snapshot) = view.snapshot().await else { return };
                if tx.send(snapshot).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(invoker_live::event_stream(first, rest))
}
