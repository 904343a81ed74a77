//! Admin routes: liveness, health and capacity, Prometheus metrics, the pool's state.

use super::call::{json, Call};
use super::error::ApiError;
use super::state::AppState;
use hyper::StatusCode;
use invoker_http::{with_body, Response};
use serde_json::json;

pub(super) fn ping() -> Response {
    json(StatusCode::OK, &json!({ "ping": "pong" }))
}

/// The state word for anyone (a load balancer's probe); the details, which name nodes and
/// counts, for the admin key only.
pub(super) async fn health(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    let details = state.admin(call).is_ok();
    let Some(pool) = state.pool() else { return Ok(super::cluster::health(state, details)) };
    let status = pool.status().await.ok_or(ApiError::Unavailable("the pool is gone".into()))?;
    let launchable = status.launchable_mb();
    let min_mb = u64::from(state.config.limits.memory_min_mb);
    let word = state.service.health(status.health(state.service.is_draining(), min_mb)).as_str();
    if !details {
        return Ok(json(StatusCode::OK, &json!({ "status": word })));
    }
    let nodes: Vec<_> = status
        .nodes
        .iter()
        .map(|n| {
            json!({
                "node": n.node, "stale": n.stale, "capacity_mb": n.capacity_mb,
                "free_mb": n.free_mb, "reserved_mb": n.reserved_mb,
                "used_mb": n.committed_mb, "removing_mb": n.removing_mb,
                "launchable_mb": n.launchable_mb, "idle_mb": n.idle_mb, "starts_in_flight": n.starts_in_flight,
            })
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({
        "status": word,
        "can_launch": launchable >= min_mb && !state.service.is_draining(),
        "launchable_mb": launchable,
        "nodes": nodes,
        "containers": { "starting": status.starting, "idle": status.idle, "prewarm": status.prewarm, "prewarm_mb": status.prewarm_mb, "busy": status.busy, "removing": status.removing },
        "waiting": status.waiting,
        "create_failures_in_a_row": status.create_failures_in_a_row,
        "create_refusals_in_a_row": status.create_refusals_in_a_row,
        "store": state.service.store().trouble(),
        }),
    ))
}

pub(super) async fn metrics(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    state.admin(call)?;
    if let Some(pool) = state.pool() {
        pool.refresh_gauges().await;
    }
    let metrics = state.service.metrics();
    if let Some(queue) = state.service.queue_counts() {
        // Only the namespaces with calls waiting now.
        metrics.queued.clear();
        metrics.queued_oldest_seconds.clear();
        let now = invoker_wire::model::epoch_ms();
        for depth in queue.by_namespace() {
            let label = invoker_metrics::NamespaceLabel { namespace: depth.namespace };
            metrics.queued.get_or_create(&label).set(depth.calls as i64);
            let age = now.saturating_sub(depth.oldest) / 1000;
            metrics.queued_oldest_seconds.get_or_create(&label).set(age as i64);
        }
    }
    let mut text = metrics.render();
    if let Some(dispatcher) = state.dispatcher() {
        text.push_str(&dispatcher.metrics.render());
    }
    Ok(with_body(StatusCode::OK, "text/plain; version=0.0.4", text.into_bytes()))
}

/// Every namespace's action names are in it: the admin key only.
pub(super) async fn pool(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    state.admin(call)?;
    let pool = state.pool().ok_or(ApiError::NotFound)?;
    let snapshot = pool.snapshot().await.ok_or(ApiError::Unavailable("the pool is gone".into()))?;
    Ok(json(StatusCode::OK, &snapshot))
}
