//! Activation records: list, one by id, and its logs or result.

use super::error::ApiError;
use super::{blocking, page, AppState, PageQuery};
use crate::model::validate_entity_name;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

pub(super) async fn list(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    q: web::Query<PageQuery>,
) -> Result<HttpResponse, ApiError> {
    let (ns, _) = state.namespace(&req, &path)?;
    let (skip, limit) = page(&q)?;
    if let Some(name) = &q.name {
        validate_entity_name("name", name).map_err(ApiError::BadRequest)?;
    }
    let store = state.service.store().clone();
    let name = q.name.clone();
    let records = blocking(move || store.list_activations(&ns, name.as_deref(), skip, limit)).await??;
    Ok(HttpResponse::Ok().json(records))
}

async fn find_activation(
    state: &AppState,
    req: &HttpRequest,
    ns: &str,
    id: &str,
) -> Result<crate::model::ActivationRecord, ApiError> {
    let (ns, _) = state.namespace(req, ns)?;
    if !crate::model::is_activation_id(id) {
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

pub(super) async fn get(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(find_activation(&state, &req, &path.0, &path.1).await?))
}

pub(super) async fn get_part(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let record = find_activation(&state, &req, &path.0, &path.1).await?;
    match path.2.as_str() {
        "logs" => Ok(HttpResponse::Ok().json(json!({ "logs": record.logs }))),
        "result" => Ok(HttpResponse::Ok().json(record.response)),
        _ => Err(ApiError::NotFound),
    }
}
