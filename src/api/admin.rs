//! Admin routes: liveness, health and capacity, Prometheus metrics, the pool's state.

use super::error::ApiError;
use super::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

pub(super) async fn ping() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "ping": "pong" }))
}

pub(super) async fn health(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    state.authenticate(&req)?;
    let snapshot = state.service.pool().snapshot().await.ok_or(ApiError::Unavailable("the pool is gone".into()))?;
    let launchable = snapshot.nodes.iter().map(|n| n.launchable_mb).max().unwrap_or(0);
    let status = if state.service.is_draining() {
        "draining"
    } else if snapshot.waiting > 0 && launchable < u64::from(state.config.limits.memory_min_mb) {
        "overloaded"
    } else {
        "healthy"
    };
    Ok(HttpResponse::Ok().json(json!({
        "status": status,
        "can_launch": launchable >= u64::from(state.config.limits.memory_min_mb) && !state.service.is_draining(),
        "launchable_mb": launchable,
        "nodes": snapshot.nodes,
        "containers": { "starting": snapshot.starting, "idle": snapshot.idle, "busy": snapshot.busy, "removing": snapshot.removing },
        "waiting": snapshot.waiting,
    })))
}

pub(super) async fn metrics(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    state.authenticate(&req)?;
    let _ = state.service.pool().snapshot().await; // refreshes the pool gauges
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.service.metrics().render()))
}

pub(super) async fn pool(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    state.authenticate(&req)?;
    let snapshot = state.service.pool().snapshot().await.ok_or(ApiError::Unavailable("the pool is gone".into()))?;
    Ok(HttpResponse::Ok().json(snapshot))
}
