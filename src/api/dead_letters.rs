//! A namespace's dead letters: the asynchronous calls that exhausted their attempts or their
//! age (`docs/async-calls.md`). Listed newest first, shown with their last record, driven again
//! (one, or all) as new calls, and deleted; only by the namespace's own key.

use super::call::{blocking, json, page, Call, PageQuery};
use super::error::ApiError;
use super::state::AppState;
use hyper::StatusCode;
use invoker_http::Response;
use invoker_store::{DeadLetter, DocKind};
use serde_json::json;

/// The namespace's letters, newest first.
async fn letters(state: &AppState, ns: &str) -> Result<Vec<DeadLetter>, ApiError> {
    let store = state.service.store().clone();
    let ns = ns.to_string();
    let docs = blocking(move || store.list_docs(&ns, DocKind::DeadLetter)).await??;
    let mut letters: Vec<DeadLetter> = docs.iter().filter_map(|doc| serde_json::from_str(doc).ok()).collect();
    letters.sort_by(|a, b| (b.at, &b.activation_id).cmp(&(a.at, &a.activation_id)));
    Ok(letters)
}

async fn letter(state: &AppState, ns: &str, id: &str) -> Result<DeadLetter, ApiError> {
    if !invoker_wire::model::is_activation_id(id) {
        return Err(ApiError::BadRequest("dead letter id: must be 32 hexadecimal digits".into()));
    }
    let store = state.service.store().clone();
    let (ns, id) = (ns.to_string(), id.to_string());
    let doc = blocking(move || store.get_doc(&ns, DocKind::DeadLetter, &id)).await??.ok_or(ApiError::NotFound)?;
    serde_json::from_str(&doc).map_err(|e| ApiError::Internal(format!("a dead letter does not read: {e}")))
}

pub(super) async fn list(state: &AppState, call: &Call, ns: &str) -> Result<Response, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    let (skip, limit) = page(&call.query::<PageQuery>()?)?;
    let letters: Vec<DeadLetter> = letters(state, &ns).await?.into_iter().skip(skip).take(limit).collect();
    Ok(json(StatusCode::OK, &letters))
}

/// One letter, with the record of its last attempt.
pub(super) async fn get(state: &AppState, call: &Call, ns: &str, id: &str) -> Result<Response, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    let letter = letter(state, &ns, id).await?;
    let store = state.service.store().clone();
    let last = letter.activation_id.clone();
    let record = blocking(move || store.get_activation(&last)).await??;
    let mut body = serde_json::to_value(&letter).map_err(|e| ApiError::Internal(e.to_string()))?;
    body["record"] = serde_json::to_value(record).unwrap_or_default();
    Ok(json(StatusCode::OK, &body))
}

pub(super) async fn delete(state: &AppState, call: &Call, ns: &str, id: &str) -> Result<Response, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    let letter = letter(state, &ns, id).await?;
    forget(state, &ns, &letter.activation_id).await?;
    Ok(json(StatusCode::OK, &letter))
}

async fn forget(state: &AppState, ns: &str, id: &str) -> Result<(), ApiError> {
    let store = state.service.store().clone();
    let (ns, id) = (ns.to_string(), id.to_string());
    blocking(move || store.put_doc(&ns, DocKind::DeadLetter, &id, None)).await??;
    Ok(())
}

/// `POST .../deadletters/{id}/redrive`: the letter's call again, as a new call (202 with its
/// activation id); the letter goes once the new call is queued.
pub(super) async fn redrive(state: &AppState, call: &Call, ns: &str, id: &str) -> Result<Response, ApiError> {
    let (ns, key) = state.namespace(call, ns)?;
    let letter = letter(state, &ns, id).await?;
    let new = state.service.redrive(&letter, Some(key)).await?;
    forget(state, &ns, &letter.activation_id).await?;
    Ok(json(StatusCode::ACCEPTED, &json!({ "activationId": new, "redriven": letter.activation_id })))
}

/// `POST .../deadletters/redrive`: every letter of the namespace, oldest first; stops at the
/// first refusal (a full queue: 429 naming it), after what was driven already.
pub(super) async fn redrive_all(state: &AppState, call: &Call, ns: &str) -> Result<Response, ApiError> {
    let (ns, key) = state.namespace(call, ns)?;
    let mut driven = Vec::new();
    for letter in letters(state, &ns).await?.into_iter().rev() {
        match state.service.redrive(&letter, Some(key.clone())).await {
            Ok(new) => {
                forget(state, &ns, &letter.activation_id).await?;
                driven.push(json!({ "activationId": new, "redriven": letter.activation_id }));
            }
            Err(e) if driven.is_empty() => return Err(e.into()),
            Err(e) => {
                let why = ApiError::from(e).to_string();
                return Ok(json(StatusCode::ACCEPTED, &json!({ "redriven": driven, "stopped": why })));
            }
        }
    }
    Ok(json(StatusCode::ACCEPTED, &json!({ "redriven": driven })))
}
