//! Activation records: list, one by id, and its logs or result.

use super::call::{blocking, json, page, Call, PageQuery};
use super::error::ApiError;
use super::state::AppState;
use hyper::StatusCode;
use invoker_http::Response;
use invoker_wire::model::validate_entity_name;

pub(super) async fn list(state: &AppState, call: &Call, ns: &str) -> Result<Response, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    let q: PageQuery = call.query()?;
    let (skip, limit) = page(&q)?;
    if let Some(name) = &q.name {
        validate_entity_name("name", name).map_err(ApiError::BadRequest)?;
    }
    let store = state.service.store().clone();
    let name = q.name.clone();
    let records = blocking(move || store.list_activations(&ns, name.as_deref(), skip, limit)).await??;
    Ok(json(StatusCode::OK, &records))
}

async fn find_activation(
    state: &AppState,
    call: &Call,
    ns: &str,
    id: &str,
) -> Result<invoker_wire::model::ActivationRecord, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    if !invoker_wire::model::is_activation_id(id) {
        return Err(ApiError::BadRequest("activation id: must be 32 hexadecimal digits".into()));
    }
    let store = state.service.store().clone();
    let id = id.to_string();
    let record = blocking(move || store.get_activation(&id)).await??.ok_or(ApiError::NotFound)?;
    if record.namespace != ns {
        return Err(ApiError::NotFound);
    }
    Ok(record)
}

pub(super) async fn get(state: &AppState, call: &Call, ns: &str, id: &str) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &find_activation(state, call, ns, id).await?))
}

pub(super) async fn get_part(
    state: &AppState,
    call: &Call,
    ns: &str,
    id: &str,
    part: &str,
) -> Result<Response, ApiError> {
    let record = find_activation(state, call, ns, id).await?;
    match part {
        "logs" => Ok(json(StatusCode::OK, &serde_json::json!({ "logs": record.logs }))),
        "result" => Ok(json(StatusCode::OK, &record.response)),
        _ => Err(ApiError::NotFound),
    }
}
