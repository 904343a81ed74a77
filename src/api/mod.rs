//! The HTTP front door: OpenWhisk's REST subset with basic auth per namespace, and the admin
//! routes. Handlers validate, then call the intake or the store; they decide nothing else.

mod actions;
mod activations;
mod admin;
pub(crate) mod archive;
mod call;
mod cluster;
mod dead_letters;
pub mod error;
mod fn_routes;
pub(crate) mod live;
pub mod server;
pub(crate) mod shim;
mod state;
mod wire;

pub(crate) use call::Call;
pub use state::AppState;

use bytes::Bytes;
use error::ApiError;
use fn_routes::Entities;
use http_body_util::BodyExt;
use hyper::Method;
use std::time::Duration;

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
    DeadLetters {
        ns: String,
    },
    DeadLetter {
        ns: String,
        id: String,
    },
    DeadLetterRedrive {
        ns: String,
        /// `None`: every letter of the namespace.
        id: Option<String>,
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
    /// The live view's page and its files (no key: they carry no secret).
    Ui,
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
    /// `/invoke/{fn_id}` with a key, or `/invoke/{fn_id}/{invoke_key}`, the URL Fn's client
    /// calls with no credential.
    FnInvoke {
        fn_id: String,
        invoke_key: Option<String>,
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
            "/ui" | "/ui/" | "/ui/app.js" | "/ui/app.css" => Some(Route::Ui),
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
        ] {
            if let Some(rest) = path.strip_prefix(prefix) {
                return one(rest).map(|id| decoded(id).map(route)).transpose();
            }
        }
        if let Some(rest) = path.strip_prefix("/invoke/") {
            return Ok(match rest.split('/').collect::<Vec<_>>().as_slice() {
                [fn_id] if !fn_id.is_empty() => Some(Route::FnInvoke { fn_id: decoded(fn_id)?, invoke_key: None }),
                [fn_id, key] if !fn_id.is_empty() && !key.is_empty() => {
                    Some(Route::FnInvoke { fn_id: decoded(fn_id)?, invoke_key: Some(decoded(key)?) })
                }
                _ => None,
            });
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
            [ns, "deadletters"] => Route::DeadLetters { ns: decoded(ns)? },
            [ns, "deadletters", "redrive"] => Route::DeadLetterRedrive { ns: decoded(ns)?, id: None },
            [ns, "deadletters", id] => Route::DeadLetter { ns: decoded(ns)?, id: decoded(id)? },
            [ns, "deadletters", id, "redrive"] => Route::DeadLetterRedrive { ns: decoded(ns)?, id: Some(decoded(id)?) },
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
            Route::FnApp { .. } | Route::FnFunction { .. } | Route::FnTrigger { .. } => "GET, PUT, DELETE",
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
                | (Route::FnApp { .. } | Route::FnFunction { .. } | Route::FnTrigger { .. }, &Method::PUT)
                | (Route::FnHttpTrigger { .. }, _)
        );
        let (body, principal) = if takes_body {
            // Only a caller with a key gets its body read: a stranger cannot make the invoker
            // buffer the largest body a route takes (48 MB of code by default). A function's
            // invoke key is one, for that function only.
            let principal = match &route {
                Route::FnInvoke { fn_id, invoke_key: Some(key) } => fn_routes::invoke_key_holder(self, fn_id, key)?,
                _ => self.authenticate(&head.headers)?,
            };
            (self.read_body(&head, body, self.body_limit(&route, &head.method)).await?, Some(principal))
        } else {
            (Bytes::new(), None)
        };
        let mut call = Call { head, body, principal };
        // HEAD is GET without the body (hyper leaves the body out of the answer).
        let method = if call.head.method == Method::HEAD { &Method::GET } else { &call.head.method };
        match (route, method) {
            (Route::Action { ns, name }, &Method::POST) => actions::invoke(self, &mut call, &ns, &name).await,
            (Route::Action { ns, name }, &Method::GET) => actions::get(self, &call, &ns, &name).await,
            (Route::Action { ns, name }, &Method::PUT) => actions::put(self, &call, &ns, &name).await,
            (Route::Action { ns, name }, &Method::DELETE) => actions::delete(self, &call, &ns, &name).await,
            (Route::Actions { ns }, &Method::GET) => actions::list(self, &call, &ns).await,
            (Route::Activations { ns }, &Method::GET) => activations::list(self, &call, &ns).await,
            (Route::Activation { ns, id }, &Method::GET) => activations::get(self, &call, &ns, &id).await,
            (Route::ActivationPart { ns, id, part }, &Method::GET) => {
                activations::get_part(self, &call, &ns, &id, &part).await
            }
            (Route::DeadLetters { ns }, &Method::GET) => dead_letters::list(self, &call, &ns).await,
            (Route::DeadLetter { ns, id }, &Method::GET) => dead_letters::get(self, &call, &ns, &id).await,
            (Route::DeadLetter { ns, id }, &Method::DELETE) => dead_letters::delete(self, &call, &ns, &id).await,
            (Route::DeadLetterRedrive { ns, id: Some(id) }, &Method::POST) => {
                dead_letters::redrive(self, &call, &ns, &id).await
            }
            (Route::DeadLetterRedrive { ns, id: None }, &Method::POST) => {
                dead_letters::redrive_all(self, &call, &ns).await
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
            (Route::Ui, &Method::GET) => invoker_live::asset(call.head.uri.path()).ok_or(ApiError::NotFound),
            (route @ (Route::FnApps | Route::FnFunctions | Route::FnTriggers), &Method::GET | &Method::POST)
            | (
                route @ (Route::FnApp { .. } | Route::FnFunction { .. } | Route::FnTrigger { .. }),
                &Method::GET | &Method::PUT | &Method::DELETE,
            ) => self.fn_entity(route, &call).await,
            (Route::FnInvoke { fn_id, .. }, &Method::POST) => fn_routes::invoke(self, &call, &fn_id).await,
            (Route::FnHttpTrigger { app, source }, _) => fn_routes::trigger(self, &call, &app, &source).await,
            (route, _) => {
                Err(ApiError::MethodNotAllowed { method: call.head.method.to_string(), allowed: route.allowed() })
            }
        }
    }

    async fn fn_entity(&self, route: Route, call: &Call) -> Result<Response, ApiError> {
        match route {
            Route::FnApps => fn_routes::entities(self, call, Entities::Apps, None).await,
            Route::FnApp { id } => fn_routes::entities(self, call, Entities::Apps, Some(&id)).await,
            Route::FnFunctions => fn_routes::entities(self, call, Entities::Functions, None).await,
            Route::FnFunction { id } => fn_routes::entities(self, call, Entities::Functions, Some(&id)).await,
            Route::FnTriggers => fn_routes::entities(self, call, Entities::Triggers, None).await,
            Route::FnTrigger { id } => fn_routes::entities(self, call, Entities::Triggers, Some(&id)).await,
            _ => Err(ApiError::NotFound),
        }
    }

    /// The largest body `route` takes with `method`: a call's parameters (an invoke, an Fn
    /// call) the payload limit, the shim's message that with its envelope, an entity its code.
    fn body_limit(&self, route: &Route, method: &Method) -> usize {
        let limits = &self.config.limits;
        match (route, method) {
            (Route::Action { .. }, &Method::POST) | (Route::FnInvoke { .. } | Route::FnHttpTrigger { .. }, _) => {
                limits.payload_max_bytes
            }
            (Route::ActivationMessage, _) => shim::message_limit(limits.payload_max_bytes),
            _ => limits.code_max_bytes,
        }
    }

    /// The whole body, refused past `limit` (at once when its `Content-Length` says so, before
    /// any of it is read; otherwise as soon as it passes it) and cut off after `BODY_TIMEOUT`.
    /// Read into one buffer of its declared size, each part let go as it is copied in: a large
    /// call is held once, not as its parts and then their join.
    async fn read_body<B>(&self, head: &hyper::http::request::Parts, body: B, limit: usize) -> Result<Bytes, ApiError>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let declared = head.headers.get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        if declared.is_some_and(|n: usize| n > limit) {
            return Err(ApiError::TooLarge(limit));
        }
        // A body that came in one frame (most: the whole request in one read) is kept as
        // those bytes; only a second frame makes a buffer, sized as the request declared.
        let read = async {
            tokio::pin!(body);
            let (mut first, mut whole, mut read) = (None::<Bytes>, Vec::new(), 0);
            while let Some(frame) = body.as_mut().frame().await {
                let frame = frame.map_err(|e| ApiError::BadRequest(format!("request body: {}", e.into())))?;
                let Ok(data) = frame.into_data() else { continue };
                read += data.len();
                if read > limit {
                    return Err(ApiError::TooLarge(limit));
                }
                if data.is_empty() {
                    continue;
                }
                match first.take() {
                    None if whole.is_empty() => first = Some(data),
                    held => {
                        if whole.is_empty() {
                            whole.reserve(declared.unwrap_or(0).max(read));
                        }
                        whole.extend_from_slice(held.as_deref().unwrap_or_default());
                        whole.extend_from_slice(&data);
                    }
                }
            }
            Ok(first.unwrap_or_else(|| Bytes::from(whole)))
        };
        match tokio::time::timeout(BODY_TIMEOUT, read).await {
            Err(_) => Err(ApiError::BadRequest(format!("request body: not received within {BODY_TIMEOUT:?}"))),
            Ok(read) => read,
        }
    }
}

/// How long a request's body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);

pub use invoker_http::{with_body, Response};
