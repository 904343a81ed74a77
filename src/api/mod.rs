//! The HTTP front door: OpenWhisk's REST subset with basic auth per namespace, and the admin
//! routes. Handlers validate, then call the intake or the store; they decide nothing else.

pub mod error;

use crate::activation::{ActivationService, InvokeRequest, Invoked};
use crate::config::Config;
use crate::model::{epoch_ms, new_activation_id, validate_entity_name, Action, Exec, KeyValue, Limits, Outcome};
use crate::pool::actor::REJECTED;
use actix_web::{web, HttpRequest, HttpResponse};
use base64::Engine as _;
use error::ApiError;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub struct AppState {
    pub service: ActivationService,
    pub config: Arc<Config>,
    /// API key → namespace.
    keys: HashMap<String, String>,
}

impl AppState {
    pub fn new(service: ActivationService, config: Arc<Config>) -> Self {
        let keys = config.namespaces.iter().map(|(ns, key)| (key.clone(), ns.clone())).collect();
        AppState { service, config, keys }
    }

    /// The namespace the request's basic-auth key belongs to.
    fn authenticate(&self, req: &HttpRequest) -> Result<(String, String), ApiError> {
        let header = req.headers().get("authorization").and_then(|h| h.to_str().ok()).ok_or(ApiError::Unauthorized)?;
        let encoded = header.strip_prefix("Basic ").ok_or(ApiError::Unauthorized)?;
        let decoded =
            base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| ApiError::Unauthorized)?;
        let key = String::from_utf8(decoded).map_err(|_| ApiError::Unauthorized)?;
        let ns = self.keys.get(&key).ok_or(ApiError::Unauthorized)?;
        Ok((ns.clone(), key))
    }

    /// `_` means the key's own namespace; any other must be it.
    fn namespace(&self, req: &HttpRequest, path_ns: &str) -> Result<(String, String), ApiError> {
        let (ns, key) = self.authenticate(req)?;
        if path_ns == "_" || path_ns == ns {
            Ok((ns, key))
        } else {
            Err(ApiError::Forbidden(path_ns.chars().take(256).collect()))
        }
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/ping", web::get().to(ping))
        .route("/health", web::get().to(health))
        .route("/metrics", web::get().to(metrics))
        .route("/v1/pool", web::get().to(pool))
        .route("/api/v1/namespaces/{ns}/actions", web::get().to(list_actions))
        .route("/api/v1/namespaces/{ns}/actions/{name}", web::put().to(put_action))
        .route("/api/v1/namespaces/{ns}/actions/{name}", web::get().to(get_action))
        .route("/api/v1/namespaces/{ns}/actions/{name}", web::delete().to(delete_action))
        .route("/api/v1/namespaces/{ns}/actions/{name}", web::post().to(invoke))
        .route("/api/v1/namespaces/{ns}/activations", web::get().to(list_activations))
        .route("/api/v1/namespaces/{ns}/activations/{id}", web::get().to(get_activation))
        .route("/api/v1/namespaces/{ns}/activations/{id}/{part}", web::get().to(get_activation_part));
}

async fn ping() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "ping": "pong" }))
}

async fn health(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
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

async fn metrics(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    state.authenticate(&req)?;
    let _ = state.service.pool().snapshot().await; // refreshes the pool gauges
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.service.metrics().render()))
}

async fn pool(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    state.authenticate(&req)?;
    let snapshot = state.service.pool().snapshot().await.ok_or(ApiError::Unavailable("the pool is gone".into()))?;
    Ok(HttpResponse::Ok().json(snapshot))
}

#[derive(Deserialize)]
struct PageQuery {
    limit: Option<String>,
    skip: Option<String>,
    name: Option<String>,
}

fn page(q: &PageQuery) -> Result<(usize, usize), ApiError> {
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

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    web::block(f).await.map_err(|e| ApiError::Internal(e.to_string()))
}

async fn list_actions(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    q: web::Query<PageQuery>,
) -> Result<HttpResponse, ApiError> {
    let (ns, _) = state.namespace(&req, &path)?;
    let (skip, limit) = page(&q)?;
    let store = state.service.store().clone();
    let actions = blocking(move || store.list_actions(&ns, skip, limit)).await??;
    Ok(HttpResponse::Ok().json(actions.iter().map(action_json).collect::<Vec<_>>()))
}

fn action_json(a: &Action) -> Value {
    json!({
        "namespace": a.namespace, "name": a.name, "version": a.version, "exec": a.exec,
        "limits": a.limits, "parameters": a.parameters, "annotations": a.annotations,
        "publish": a.publish, "updated": a.updated,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionPut {
    exec: Option<Exec>,
    limits: Option<LimitsPut>,
    #[serde(default)]
    parameters: Vec<KeyValue>,
    #[serde(default)]
    annotations: Vec<KeyValue>,
    #[serde(default)]
    publish: bool,
    #[serde(default)]
    #[allow(dead_code)]
    namespace: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    name: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    version: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsPut {
    timeout: Option<u64>,
    memory: Option<u32>,
    logs: Option<u32>,
    concurrency: Option<u32>,
}

fn validate_action(config: &Config, put: ActionPut, ns: &str, name: &str) -> Result<Action, ApiError> {
    let bad = |m: String| ApiError::BadRequest(m);
    let exec = put.exec.ok_or_else(|| bad("exec: is required".into()))?;
    if !config.kinds.contains_key(&exec.kind) {
        let known: Vec<_> = config.kinds.keys().cloned().collect();
        return Err(bad(format!("exec.kind: '{}' is not a supported kind ({})", exec.kind, known.join(", "))));
    }
    if exec.code.as_deref().is_none_or(str::is_empty) {
        return Err(bad("exec.code: is required and must not be empty".into()));
    }
    let l = &config.limits;
    let given = put.limits.unwrap_or(LimitsPut { timeout: None, memory: None, logs: None, concurrency: None });
    let limits = Limits {
        timeout: given.timeout.unwrap_or(l.timeout_default_ms),
        memory: given.memory.unwrap_or(l.memory_default_mb),
        logs: given.logs.unwrap_or(l.logs_default_mb),
        concurrency: given.concurrency.unwrap_or(l.concurrency_default),
    };
    let range = |field: &str, v: u64, lo: u64, hi: u64, unit: &str| {
        if v < lo || v > hi {
            Err(bad(format!("limits.{field}: {v} {unit} is outside the allowed range {lo}..={hi} {unit}")))
        } else {
            Ok(())
        }
    };
    range("timeout", limits.timeout, l.timeout_min_ms, l.timeout_max_ms, "ms")?;
    range("memory", limits.memory.into(), l.memory_min_mb.into(), l.memory_max_mb.into(), "MB")?;
    range("logs", limits.logs.into(), 0, l.logs_max_mb.into(), "MB")?;
    range("concurrency", limits.concurrency.into(), 1, l.concurrency_max.into(), "")?;
    for (i, p) in put.parameters.iter().enumerate() {
        if p.key.is_empty() {
            return Err(bad(format!("parameters[{i}].key: must not be empty")));
        }
    }
    Ok(Action {
        namespace: ns.into(),
        name: name.into(),
        version: String::new(),
        exec,
        limits,
        parameters: put.parameters,
        annotations: put.annotations,
        publish: put.publish,
        updated: epoch_ms(),
        revision: 0,
    })
}

#[derive(Deserialize)]
struct PutQuery {
    overwrite: Option<String>,
}

async fn put_action(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    q: web::Query<PutQuery>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let (ns, _) = state.namespace(&req, &path.0)?;
    validate_entity_name("name", &path.1).map_err(ApiError::BadRequest)?;
    let overwrite = match q.overwrite.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(ApiError::BadRequest(format!("overwrite: '{other}' is not true or false"))),
    };
    let put: ActionPut =
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("request body: {e}")))?;
    let action = validate_action(&state.config, put, &ns, &path.1)?;
    let store = state.service.store().clone();
    let saved = blocking(move || store.put_action(action, overwrite)).await??;
    Ok(HttpResponse::Ok().json(action_json(&saved)))
}

async fn load_action(state: &AppState, ns: &str, name: &str) -> Result<Action, ApiError> {
    validate_entity_name("name", name).map_err(ApiError::BadRequest)?;
    let store = state.service.store().clone();
    let (ns, name) = (ns.to_string(), name.to_string());
    blocking(move || store.get_action(&ns, &name)).await??.ok_or(ApiError::NotFound)
}

async fn get_action(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (ns, _) = state.namespace(&req, &path.0)?;
    Ok(HttpResponse::Ok().json(action_json(&load_action(&state, &ns, &path.1).await?)))
}

async fn delete_action(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (ns, _) = state.namespace(&req, &path.0)?;
    validate_entity_name("name", &path.1).map_err(ApiError::BadRequest)?;
    let store = state.service.store().clone();
    let name = path.1.clone();
    let deleted = blocking(move || store.delete_action(&ns, &name)).await??.ok_or(ApiError::NotFound)?;
    Ok(HttpResponse::Ok().json(action_json(&deleted)))
}

#[derive(Deserialize)]
struct InvokeQuery {
    blocking: Option<String>,
    result: Option<String>,
    timeout: Option<String>,
}

fn flag(field: &str, v: &Option<String>) -> Result<bool, ApiError> {
    match v.as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::BadRequest(format!("{field}: '{other}' is not true or false"))),
    }
}

async fn invoke(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    q: web::Query<InvokeQuery>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let (ns, key) = state.namespace(&req, &path.0)?;
    let limits = &state.config.limits;
    if body.len() > limits.payload_max_bytes {
        return Err(ApiError::TooLarge(limits.payload_max_bytes));
    }
    let (blocking, result_only) = (flag("blocking", &q.blocking)?, flag("result", &q.result)?);
    let max_wait = limits.blocking_wait;
    let wait = match q.timeout.as_deref() {
        None => max_wait,
        Some(t) => match t.parse::<u64>() {
            Ok(ms) if ms > 0 && Duration::from_millis(ms) <= max_wait => Duration::from_millis(ms),
            _ => {
                let max = max_wait.as_millis();
                return Err(ApiError::BadRequest(format!("timeout: '{t}' must be an integer from 1 to {max} (ms)")));
            }
        },
    };
    let params: Map<String, Value> = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match serde_json::from_slice(&body) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(ApiError::BadRequest("request body: the parameters must be a JSON object".into())),
            Err(e) => return Err(ApiError::BadRequest(format!("request body: {e}"))),
        }
    };
    let action = Arc::new(load_action(&state, &ns, &path.1).await?);
    let api_key = action.provides_api_key().then_some(key);
    let invoked = state
        .service
        .invoke(InvokeRequest {
            action,
            params,
            subject: ns.clone(),
            api_key,
            activation_id: new_activation_id(),
            transaction_id: new_activation_id(),
            wait: blocking.then_some(wait),
        })
        .await?;
    Ok(invoke_response(invoked, result_only))
}

/// 200 done, 202 accepted, 502 the action failed, 503 nothing ran, 400 can never fit.
pub fn invoke_response(invoked: Invoked, result_only: bool) -> HttpResponse {
    let record = match invoked {
        Invoked::Accepted(id) => {
            return HttpResponse::Accepted()
                .insert_header(("x-openwhisk-activation-id", id.clone()))
                .json(json!({ "activationId": id }));
        }
        Invoked::Done(record) => record,
    };
    let mut response = match record.outcome() {
        Outcome::Success => HttpResponse::Ok(),
        Outcome::ApplicationError | Outcome::DeveloperError => HttpResponse::BadGateway(),
        Outcome::WhiskError if record.annotation(REJECTED) == Some(&json!("never_fits")) => HttpResponse::BadRequest(),
        Outcome::WhiskError => {
            let mut r = HttpResponse::ServiceUnavailable();
            r.insert_header(("Retry-After", "1"));
            r
        }
    };
    response.insert_header(("x-openwhisk-activation-id", record.activation_id.clone()));
    if result_only {
        response.json(&record.response.result)
    } else {
        response.json(&*record)
    }
}

async fn list_activations(
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

async fn get_activation(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(find_activation(&state, &req, &path.0, &path.1).await?))
}

async fn get_activation_part(
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
