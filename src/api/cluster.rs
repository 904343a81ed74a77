//! A scheduler's own routes: the invokers it sees, drain and activate (admin key), and the
//! internal route invokers fetch actions from (controller key). An invoker has none of them
//! (404).

use super::call::{json, Call};
use super::error::ApiError;
use super::state::AppState;
use hyper::StatusCode;
use invoker_http::Response;
use invoker_scheduler::Dispatcher;
use invoker_wire::cluster::{cluster_revision, MAX_RECORDS_ASKED};
use invoker_wire::model::validate_entity_name;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

fn dispatcher(state: &AppState) -> Result<&Arc<Dispatcher>, ApiError> {
    state.dispatcher().ok_or(ApiError::NotFound)
}

/// `GET /v1/invokers`: health, tags, headroom, containers held, activations in flight.
pub(super) async fn invokers(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    let dispatcher = dispatcher(state)?;
    state.admin(call)?;
    Ok(json(StatusCode::OK, &dispatcher.invokers()))
}

/// `POST /v1/invokers/{id}/drain` and `.../activate`.
pub(super) async fn drain(state: &AppState, call: &Call, id: &str, drain: bool) -> Result<Response, ApiError> {
    let dispatcher = dispatcher(state)?;
    state.admin(call)?;
    validate_entity_name("invoker id", id).map_err(ApiError::BadRequest)?;
    if !dispatcher.knows(id) {
        return Err(ApiError::NotFound);
    }
    dispatcher.set_drained(id, drain).await.map_err(|e| ApiError::Unavailable(format!("etcd: {e}")))?;
    let status = if drain { "draining" } else { "activated" };
    Ok(json(StatusCode::OK, &json!({ "invoker": id, "status": status })))
}

#[derive(Deserialize)]
struct RevisionQuery {
    revision: String,
}

/// `GET /v1/internal/actions/{ns}/{name}?revision=R`: the action whole, for an invoker this
/// scheduler sent it to; 404 when it is not at that revision any more. The controller key only.
pub(super) async fn internal_action(state: &AppState, call: &Call, ns: &str, name: &str) -> Result<Response, ApiError> {
    let dispatcher = dispatcher(state)?;
    state.controller(call)?;
    let query: RevisionQuery = call.query()?;
    let revision: u64 =
        query.revision.parse().map_err(|_| ApiError::BadRequest("revision: must be an unsigned integer".into()))?;
    validate_entity_name("namespace", ns).map_err(ApiError::BadRequest)?;
    let action = super::state::load_action(state, ns, name).await?;
    if cluster_revision(dispatcher.id(), action.revision, action.updated) != revision {
        return Err(ApiError::NotFound);
    }
    Ok(json(StatusCode::OK, action.as_ref()))
}

#[derive(Deserialize)]
struct KeepQuery {
    keep: Option<String>,
}

/// `DELETE /v1/internal/actions/{ns}/{name}[?keep=R]` on an invoker: a scheduler's action was
/// deleted (or saved at cluster revision `R`); its idle containers of other revisions go now.
/// The controller key only.
pub(super) async fn retire_action(state: &AppState, call: &Call, ns: &str, name: &str) -> Result<Response, ApiError> {
    state.controller(call)?;
    let pool = state.pool().ok_or(ApiError::NotFound)?;
    let query: KeepQuery = call.query()?;
    let keep = match query.keep {
        Some(keep) => Some(keep.parse().map_err(|_| ApiError::BadRequest("keep: must be an unsigned integer".into()))?),
        None => None,
    };
    validate_entity_name("namespace", ns).map_err(ApiError::BadRequest)?;
    pool.retire_action(ns, name, keep).await;
    Ok(json(StatusCode::OK, &json!({ "retired": format!("{ns}/{name}") })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordsAsked {
    activation_ids: Vec<String>,
}

/// `POST /v1/internal/records` on an invoker, `{"activation_ids": [...]}`: the records it holds
/// of those activations, for a scheduler that wrote guesses for them (it restarted, or lost the
/// invoker's answer) and replaces them with what ran. A record that is itself a guess (this
/// invoker restarted under it) is no answer. The controller key only.
pub(super) async fn internal_records(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    state.controller(call)?;
    state.pool().ok_or(ApiError::NotFound)?;
    let asked: RecordsAsked = serde_json::from_slice(&call.body)
        .map_err(|e| ApiError::BadRequest(format!("body: {{\"activation_ids\": [...]}} expected: {e}")))?;
    if asked.activation_ids.len() > MAX_RECORDS_ASKED {
        return Err(ApiError::BadRequest(format!("activation_ids: at most {MAX_RECORDS_ASKED} at once")));
    }
    if let Some(bad) = asked.activation_ids.iter().find(|id| !invoker_wire::model::is_activation_id(id)) {
        let bad: String = bad.chars().take(64).collect();
        return Err(ApiError::BadRequest(format!("activation_ids: '{bad}' is not 32 hexadecimal digits")));
    }
    let store = state.service.store().clone();
    let records = super::call::blocking(move || {
        let mut found = Vec::new();
        for id in &asked.activation_ids {
            if let Some(record) = store.get_activation(id)?.filter(|r| !r.is_guess()) {
                found.push(record);
            }
        }
        Ok::<_, invoker_store::StoreError>(found)
    })
    .await??;
    Ok(json(StatusCode::OK, &json!({ "records": records })))
}

/// A scheduler's health: healthy while some invoker would take work.
pub(super) fn health(state: &AppState, details: bool) -> Response {
    let Some(dispatcher) = state.dispatcher() else {
        return json(StatusCode::OK, &json!({ "status": "unhealthy" }));
    };
    let status = if state.service.is_draining() {
        "draining"
    } else if dispatcher.any_healthy() {
        "healthy"
    } else {
        "unhealthy"
    };
    if !details {
        return json(StatusCode::OK, &json!({ "status": status }));
    }
    json(StatusCode::OK, &json!({ "status": status, "invokers": dispatcher.invokers() }))
}
