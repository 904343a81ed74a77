//! The HTTP front door: OpenWhisk's REST subset with basic auth per namespace, and the admin
//! routes. Handlers validate, then call the intake or the store; they decide nothing else.

mod actions;
mod activations;
mod admin;
pub(crate) mod archive;
mod cluster;
pub mod error;
mod fn_routes;
pub mod server;
pub(crate) mod shim;
mod wire;

use crate::activation::ActivationService;
use crate::cluster::fetch::RemoteActions;
use crate::config::Config;
use crate::model::{validate_entity_name, Action};
use base64::Engine as _;
use bytes::Bytes;
use error::ApiError;
use http_body_util::{BodyExt, Limited};
use hyper::{HeaderMap, Method, StatusCode};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub struct AppState {
    pub service: ActivationService,
    pub config: Arc<Config>,
    /// API key → who holds it.
    keys: HashMap<String, Principal>,
    /// The `Authorization` header each key's clients send (`Basic <base64 of the key>`) → who
    /// holds it: most requests are one lookup, without decoding.
    headers: HashMap<String, Principal>,
    /// In a cluster: the actions schedulers send, fetched from them by revision.
    remote_actions: Option<Arc<RemoteActions>>,
}

/// Who a request's key belongs to. Each key is one principal's (the config checks it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Principal {
    /// A namespace's key: its own actions, records and logs, nothing else.
    Namespace { ns: String, key: String },
    /// `[admin] key`: the admin routes.
    Admin,
    /// `[admin] controller_keys`: `ActivationMessage`s for any namespace through the shim.
    Controller,
}

impl AppState {
    /// `config.admin.key` must be set by then (main generates one when the file has none).
    pub fn new(service: ActivationService, config: Arc<Config>) -> Self {
        let namespaces = config
            .namespaces
            .iter()
            .map(|(ns, key)| (key.clone(), Principal::Namespace { ns: ns.clone(), key: key.clone() }));
        let admin = config.admin.key.iter().map(|key| (key.clone(), Principal::Admin));
        let controllers = config.admin.controller_keys.iter().map(|key| (key.clone(), Principal::Controller));
        let keys: HashMap<String, Principal> = namespaces.chain(admin).chain(controllers).collect();
        let headers = keys
            .iter()
            .map(|(key, who)| (format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(key)), who.clone()))
            .collect();
        AppState { service, config, keys, headers, remote_actions: None }
    }

    /// An invoker of a cluster: messages from its schedulers name actions it fetches.
    pub fn with_remote_actions(mut self, remote: Arc<RemoteActions>) -> Self {
        self.remote_actions = Some(remote);
        self
    }

    pub(crate) fn remote_actions(&self) -> Option<&RemoteActions> {
        self.remote_actions.as_deref()
    }

    /// Who holds the request's basic-auth key; no key, or an unknown one, is a 401.
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let header =
            headers.get(hyper::header::AUTHORIZATION).and_then(|h| h.to_str().ok()).ok_or(ApiError::Unauthorized)?;
        if let Some(known) = self.headers.get(header) {
            return Ok(known.clone());
        }
        let encoded = header.strip_prefix("Basic ").ok_or(ApiError::Unauthorized)?;
        let decoded =
            base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| ApiError::Unauthorized)?;
        let key = String::from_utf8(decoded).map_err(|_| ApiError::Unauthorized)?;
        self.keys.get(&key).cloned().ok_or(ApiError::Unauthorized)
    }

    /// The namespace a namespace route acts in: `_` means the key's own; any other must be it.
    /// Only a namespace's key has one.
    pub(crate) fn namespace(&self, call: &Call, path_ns: &str) -> Result<(String, String), ApiError> {
        match self.authenticate(&call.head.headers)? {
            Principal::Namespace { ns, key } if path_ns == "_" || path_ns == ns => Ok((ns, key)),
            _ => Err(ApiError::Forbidden(path_ns.chars().take(256).collect())),
        }
    }

    /// Admin routes: the admin key, and no other.
    pub(crate) fn admin(&self, call: &Call) -> Result<(), ApiError> {
        match self.authenticate(&call.head.headers)? {
            Principal::Admin => Ok(()),
            _ => Err(ApiError::Forbidden(call.head.uri.path().chars().take(256).collect())),
        }
    }
}

/// A request as the handlers see it: the head, and the body when the route takes one.
pub(crate) struct Call {
    pub head: hyper::http::request::Parts,
    pub body: Bytes,
}

impl Call {
    /// The query string parsed into `T`; a malformed one is a 400 naming it.
    pub(crate) fn query<T: serde::de::DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_urlencoded::from_str(self.head.uri.query().unwrap_or(""))
            .map_err(|e| ApiError::BadRequest(format!("query: {e}")))
    }
}

/// The routes: a path's segments after the prefix, percent-decoded.
enum Route {
    Action {
        ns: String,
        name: String,
    },
    Actions {
        ns: String,
    },
    Activations {
        ns: String,
    },
    Activation {
        ns: String,
        id: String,
    },
    ActivationPart {
        ns: String,
        id: String,
        part: String,
    },
    ActivationMessage,
    Invokers,
    InvokerDrain {
        id: String,
        drain: bool,
    },
    InternalAction {
        ns: String,
        name: String,
    },
    InternalRecords,
    Ping,
    Health,
    Metrics,
    Pool,
    /// Fn's routes.
    FnApps,
    FnApp {
        id: String,
    },
    FnFunctions,
    FnFunction {
        id: String,
    },
    FnTriggers,
    FnTrigger {
        id: String,
    },
    FnInvoke {
        fn_id: String,
    },
    FnHttpTrigger {
        app: String,
        source: String,
    },
}

impl Route {
    fn find(path: &str) -> Result<Option<Route>, ApiError> {
        let fixed = match path {
            "/ping" => Some(Route::Ping),
            "/health" => Some(Route::Health),
            "/metrics" => Some(Route::Metrics),
            "/v1/pool" => Some(Route::Pool),
            "/v1/activations" => Some(Route::ActivationMessage),
            "/v1/invokers" => Some(Route::Invokers),
            "/v1/internal/records" => Some(Route::InternalRecords),
            "/v2/apps" => Some(Route::FnApps),
            "/v2/fns" => Some(Route::FnFunctions),
            "/v2/triggers" => Some(Route::FnTriggers),
            _ => None,
        };
        if fixed.is_some() {
            return Ok(fixed);
        }
        let decoded = |s: &str| -> Result<String, ApiError> {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|d| d.into_owned())
                .map_err(|_| ApiError::BadRequest("path: a segment is not UTF-8 once decoded".into()))
        };
        fn one(rest: &str) -> Option<&str> {
            (!rest.is_empty() && !rest.contains('/')).then_some(rest)
        }
        for (prefix, route) in [
            ("/v2/apps/", Route::fn_app as fn(String) -> Route),
            ("/v2/fns/", Route::fn_function),
            ("/v2/triggers/", Route::fn_trigger),
            ("/invoke/", Route::fn_invoke),
        ] {
            if let Some(rest) = path.strip_prefix(prefix) {
                return one(rest).map(|id| decoded(id).map(route)).transpose();
            }
        }
        if let Some(rest) = path.strip_prefix("/t/") {
            // The source is the rest of the path, `/` first, as the trigger names it.
            let Some((app, source)) = rest.split_once('/') else { return Ok(None) };
            if app.is_empty() {
                return Ok(None);
            }
            return Ok(Some(Route::FnHttpTrigger { app: decoded(app)?, source: format!("/{}", decoded(source)?) }));
        }
        if let Some(rest) = path.strip_prefix("/v1/invokers/") {
            return Ok(match rest.split('/').collect::<Vec<_>>().as_slice() {
                [id, "drain"] if !id.is_empty() => Some(Route::InvokerDrain { id: decoded(id)?, drain: true }),
                [id, "activate"] if !id.is_empty() => Some(Route::InvokerDrain { id: decoded(id)?, drain: false }),
                _ => None,
            });
        }
        if let Some(rest) = path.strip_prefix("/v1/internal/actions/") {
            return Ok(match rest.split('/').collect::<Vec<_>>().as_slice() {
                [ns, name] if !ns.is_empty() && !name.is_empty() => {
                    Some(Route::InternalAction { ns: decoded(ns)?, name: decoded(name)? })
                }
                _ => None,
            });
        }
        let Some(rest) = path.strip_prefix("/api/v1/namespaces/") else { return Ok(None) };
        let segments: Vec<&str> = rest.split('/').collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Ok(None);
        }
        Ok(Some(match segments.as_slice() {
            [ns, "actions", name] => Route::Action { ns: decoded(ns)?, name: decoded(name)? },
            [ns, "actions"] => Route::Actions { ns: decoded(ns)? },
            [ns, "activations"] => Route::Activations { ns: decoded(ns)? },
            [ns, "activations", id] => Route::Activation { ns: decoded(ns)?, id: decoded(id)? },
            [ns, "activations", id, part] => {
                Route::ActivationPart { ns: decoded(ns)?, id: decoded(id)?, part: decoded(part)? }
            }
            _ => return Ok(None),
        }))
    }

    fn fn_app(id: String) -> Route {
        Route::FnApp { id }
    }

    fn fn_function(id: String) -> Route {
        Route::FnFunction { id }
    }

    fn fn_trigger(id: String) -> Route {
        Route::FnTrigger { id }
    }

    fn fn_invoke(fn_id: String) -> Route {
        Route::FnInvoke { fn_id }
    }

    /// Fn's routes answer errors in Fn's words.
    fn is_fn(&self) -> bool {
        matches!(
            self,
            Route::FnApps
                | Route::FnApp { .. }
                | Route::FnFunctions
                | Route::FnFunction { .. }
                | Route::FnTriggers
                | Route::FnTrigger { .. }
                | Route::FnInvoke { .. }
                | Route::FnHttpTrigger { .. }
        )
    }

    /// The methods the route serves, for a 405's `Allow`.
    fn allowed(&self) -> &'static str {
        match self {
            Route::Action { .. } => "POST, GET, HEAD, PUT, DELETE",
            Route::FnApps | Route::FnFunctions | Route::FnTriggers => "GET, POST",
            Route::FnApp { .. } | Route::FnFunction { .. } => "GET, PUT, DELETE",
            Route::FnTrigger { .. } => "GET, DELETE",
            Route::FnInvoke { .. } => "POST",
            Route::FnHttpTrigger { .. } => "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS",
            Route::ActivationMessage | Route::InvokerDrain { .. } | Route::InternalRecords => "POST",
            Route::InternalAction { .. } => "GET, HEAD, DELETE",
            _ => "GET, HEAD",
        }
    }
}

impl AppState {
    /// Answers one request; every failure is a status with OpenWhisk's error body.
    pub async fn handle<B>(&self, request: hyper::Request<B>) -> Response
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (head, body) = request.into_parts();
        let route = Route::find(head.uri.path());
        // Fn's routes answer errors as Fn does.
        let fn_route = matches!(&route, Ok(Some(r)) if r.is_fn());
        match self.dispatch(route, head, body).await {
            Ok(response) => response,
            Err(e) if fn_route => e.into_fn_response(),
            Err(e) => e.into_response(),
        }
    }

    async fn dispatch<B>(
        &self,
        route: Result<Option<Route>, ApiError>,
        head: hyper::http::request::Parts,
        body: B,
    ) -> Result<Response, ApiError>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let route = route?.ok_or(ApiError::NotFound)?;
        let takes_body = matches!(
            (&route, &head.method),
            (Route::Action { .. }, &Method::POST | &Method::PUT)
                | (Route::ActivationMessage | Route::InternalRecords, &Method::POST)
                | (Route::FnApps | Route::FnFunctions | Route::FnTriggers | Route::FnInvoke { .. }, &Method::POST)
                | (Route::FnApp { .. } | Route::FnFunction { .. }, &Method::PUT)
                | (Route::FnHttpTrigger { .. }, _)
        );
        let body = if takes_body {
            // Only a caller with a key gets its body read: a stranger cannot make the invoker
            // buffer the largest body a route takes (48 MB of code by default).
            self.authenticate(&head.headers)?;
            self.read_body(&head, body).await?
        } else {
            Bytes::new()
        };
        let call = Call { head, body };
        // HEAD is GET without the body (hyper leaves the body out of the answer).
        let method = if call.head.method == Method::HEAD { &Method::GET } else { &call.head.method };
        match (route, method) {
            (Route::Action { ns, name }, &Method::POST) => actions::invoke(self, &call, &ns, &name).await,
            (Route::Action { ns, name }, &Method::GET) => actions::get(self, &call, &ns, &name).await,
            (Route::Action { ns, name }, &Method::PUT) => actions::put(self, &call, &ns, &name).await,
            (Route::Action { ns, name }, &Method::DELETE) => actions::delete(self, &call, &ns, &name).await,
            (Route::Actions { ns }, &Method::GET) => actions::list(self, &call, &ns).await,
            (Route::Activations { ns }, &Method::GET) => activations::list(self, &call, &ns).await,
            (Route::Activation { ns, id }, &Method::GET) => activations::get(self, &call, &ns, &id).await,
            (Route::ActivationPart { ns, id, part }, &Method::GET) => {
                activations::get_part(self, &call, &ns, &id, &part).await
            }
            (Route::ActivationMessage, &Method::POST) => shim::activation_message(self, &call).await,
            (Route::Invokers, &Method::GET) => cluster::invokers(self, &call).await,
            (Route::InvokerDrain { id, drain }, &Method::POST) => cluster::drain(self, &call, &id, drain).await,
            (Route::InternalAction { ns, name }, &Method::GET) => {
                cluster::internal_action(self, &call, &ns, &name).await
            }
            (Route::InternalAction { ns, name }, &Method::DELETE) => {
                cluster::retire_action(self, &call, &ns, &name).await
            }
            (Route::InternalRecords, &Method::POST) => cluster::internal_records(self, &call).await,
            (Route::Ping, &Method::GET) => Ok(admin::ping()),
            (Route::Health, &Method::GET) => admin::health(self, &call).await,
            (Route::Metrics, &Method::GET) => admin::metrics(self, &call).await,
            (Route::Pool, &Method::GET) => admin::pool(self, &call).await,
            (route @ (Route::FnApps | Route::FnFunctions | Route::FnTriggers), &Method::GET | &Method::POST)
            | (
                route @ (Route::FnApp { .. } | Route::FnFunction { .. }),
                &Method::GET | &Method::PUT | &Method::DELETE,
            )
            | (route @ Route::FnTrigger { .. }, &Method::GET | &Method::DELETE) => self.fn_entity(route, &call).await,
            (Route::FnInvoke { fn_id }, &Method::POST) => fn_routes::invoke(self, &call, &fn_id).await,
            (Route::FnHttpTrigger { app, source }, _) => fn_routes::trigger(self, &call, &app, &source).await,
            (route, _) => {
                Err(ApiError::MethodNotAllowed { method: call.head.method.to_string(), allowed: route.allowed() })
            }
        }
    }

    async fn fn_entity(&self, route: Route, call: &Call) -> Result<Response, ApiError> {
        match route {
            Route::FnApps => fn_routes::apps(self, call).await,
            Route::FnApp { id } => fn_routes::app(self, call, &id).await,
            Route::FnFunctions => fn_routes::functions(self, call).await,
            Route::FnFunction { id } => fn_routes::function(self, call, &id).await,
            Route::FnTriggers => fn_routes::triggers(self, call).await,
            Route::FnTrigger { id } => fn_routes::trigger_doc(self, call, &id).await,
            _ => Err(ApiError::NotFound),
        }
    }

    /// The whole body, refused past the largest any route takes (code, or parameters with the
    /// shim's envelope) and cut off after `BODY_TIMEOUT`.
    async fn read_body<B>(&self, head: &hyper::http::request::Parts, body: B) -> Result<Bytes, ApiError>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let limits = &self.config.limits;
        let limit = limits.code_max_bytes.max(shim::message_limit(limits.payload_max_bytes));
        let declared = head.headers.get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        if declared.is_some_and(|n: usize| n > limit) {
            return Err(ApiError::TooLarge(limit));
        }
        let collected = tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, limit).collect()).await;
        match collected {
            Err(_) => Err(ApiError::BadRequest(format!("request body: not received within {BODY_TIMEOUT:?}"))),
            Ok(Ok(body)) => Ok(body.to_bytes()),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::TooLarge(limit)),
            Ok(Err(e)) => Err(ApiError::BadRequest(format!("request body: {e}"))),
        }
    }
}

/// How long a request's body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);

pub use crate::http::{with_body, Response};

/// A JSON response.
pub(crate) fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => with_body(status, "application/json", body),
        Err(e) => ApiError::Internal(format!("the response is not JSON: {e}")).into_response(),
    }
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

/// Parses a JSON body; the error names the field (`limits.memory: invalid type ...`), and
/// anything after the value (`{...}xyz`) is refused, as `serde_json::from_slice` does.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "request body".to_string() } else { format!("request body: {path}") };
        ApiError::BadRequest(format!("{field}: {}", e.into_inner()))
    })?;
    deserializer.end().map_err(|e| ApiError::BadRequest(format!("request body: {e}")))?;
    Ok(value)
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::Internal(e.to_string()))
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
