//! The HTTP front door: OpenWhisk's REST subset with basic auth per namespace, and the admin
//! routes. Handlers validate, then call the intake or the store; they decide nothing else.

mod actions;
mod activations;
mod admin;
pub mod error;
mod shim;

use crate::activation::ActivationService;
use crate::config::Config;
use crate::model::{validate_entity_name, Action};
use actix_web::{web, HttpRequest, HttpResponse};
use base64::Engine as _;
use error::ApiError;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;

pub use actions::invoke_response;

pub struct AppState {
    pub service: ActivationService,
    pub config: Arc<Config>,
    /// API key → namespace.
    keys: HashMap<String, String>,
    /// The `Authorization` header each key's clients send (`Basic <base64 of the key>`) →
    /// namespace and key: most requests are one lookup, without decoding.
    headers: HashMap<String, (String, String)>,
}

impl AppState {
    pub fn new(service: ActivationService, config: Arc<Config>) -> Self {
        let keys = config.namespaces.iter().map(|(ns, key)| (key.clone(), ns.clone())).collect();
        let headers = config
            .namespaces
            .iter()
            .map(|(ns, key)| {
                let header = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(key));
                (header, (ns.clone(), key.clone()))
            })
            .collect();
        AppState { service, config, keys, headers }
    }

    /// The namespace the request's basic-auth key belongs to.
    pub(crate) fn authenticate(&self, req: &HttpRequest) -> Result<(String, String), ApiError> {
        let header = req.headers().get("authorization").and_then(|h| h.to_str().ok()).ok_or(ApiError::Unauthorized)?;
        if let Some(known) = self.headers.get(header) {
            return Ok(known.clone());
        }
        let encoded = header.strip_prefix("Basic ").ok_or(ApiError::Unauthorized)?;
        let decoded =
            base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| ApiError::Unauthorized)?;
        let key = String::from_utf8(decoded).map_err(|_| ApiError::Unauthorized)?;
        let ns = self.keys.get(&key).ok_or(ApiError::Unauthorized)?;
        Ok((ns.clone(), key))
    }

    /// `_` means the key's own namespace; any other must be it.
    pub(crate) fn namespace(&self, req: &HttpRequest, path_ns: &str) -> Result<(String, String), ApiError> {
        let (ns, key) = self.authenticate(req)?;
        if path_ns == "_" || path_ns == ns {
            Ok((ns, key))
        } else {
            Err(ApiError::Forbidden(path_ns.chars().take(256).collect()))
        }
    }
}

/// The whole HTTP surface with its state and body limit, for `App::configure`.
pub fn configure(state: web::Data<AppState>) -> impl Fn(&mut web::ServiceConfig) + Clone {
    move |cfg| {
        let limits = &state.config.limits;
        cfg.app_data(state.clone())
            .app_data(web::PayloadConfig::new(limits.code_max_bytes.max(limits.payload_max_bytes)));
        routes(cfg);
    }
}

/// One resource per path, with its methods as routes: the router tries each resource's pattern
/// (a regex where the path has parameters) in turn, so the invoke path comes first and is tried
/// once, not once per method. A known path with another method gets 405.
fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/api/v1/namespaces/{ns}/actions/{name}")
            .route(web::post().to(actions::invoke))
            .route(web::get().to(actions::get))
            .route(web::put().to(actions::put))
            .route(web::delete().to(actions::delete))
            .default_service(web::to(|req: HttpRequest| async move {
                Err::<HttpResponse, _>(ApiError::MethodNotAllowed {
                    method: req.method().to_string(),
                    allowed: "POST, GET, PUT, DELETE",
                })
            })),
    )
    .route("/ping", web::get().to(admin::ping))
    .route("/health", web::get().to(admin::health))
    .route("/metrics", web::get().to(admin::metrics))
    .route("/v1/pool", web::get().to(admin::pool))
    .route("/v1/activations", web::post().to(shim::activation_message))
    .route("/api/v1/namespaces/{ns}/actions", web::get().to(actions::list))
    .route("/api/v1/namespaces/{ns}/activations", web::get().to(activations::list))
    .route("/api/v1/namespaces/{ns}/activations/{id}", web::get().to(activations::get))
    .route("/api/v1/namespaces/{ns}/activations/{id}/{part}", web::get().to(activations::get_part));
}

#[derive(Deserialize)]
pub(crate) struct PageQuery {
    limit: Option<String>,
    skip: Option<String>,
    pub name: Option<String>,
}

pub(crate) fn page(q: &PageQuery) -> Result<(usize, usize), ApiError> {
    let num = |field: &str, v: &Option<String>, default: usize| -> Result<usize, ApiError> {
        v.as_deref().map_or(Ok(default), |s| {
            s.parse().map_err(|_| ApiError::BadRequest(format!("{field}: '{s}' is not a non-negative integer")))
        })
    };
    let limit = num("limit", &q.limit, 30)?;
    if limit > 200 {
        return Err(ApiError::BadRequest("limit: at most 200".into()));
    }
    Ok((num("skip", &q.skip, 0)?, if limit == 0 { 200 } else { limit }))
}

/// Parses a JSON body; the error names the field (`limits.memory: invalid type ...`).
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "request body".to_string() } else { format!("request body: {path}") };
        ApiError::BadRequest(format!("{field}: {}", e.into_inner()))
    })
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    web::block(f).await.map_err(|e| ApiError::Internal(e.to_string()))
}

pub(crate) fn flag(field: &str, v: &Option<String>) -> Result<bool, ApiError> {
    match v.as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::BadRequest(format!("{field}: '{other}' is not true or false"))),
    }
}

pub(crate) async fn load_action(state: &AppState, ns: &str, name: &str) -> Result<Arc<Action>, ApiError> {
    validate_entity_name("name", name).map_err(ApiError::BadRequest)?;
    // A read transaction on a page the cache holds: quick enough to run inline.
    state.service.store().get_action(ns, name)?.ok_or(ApiError::NotFound)
}
