//! What a handler is given (the request's head and body) and the helpers it reads them and
//! answers with.

use super::error::ApiError;
use bytes::Bytes;
use hyper::StatusCode;
use invoker_http::{with_body, Response};
use invoker_telemetry::TraceParent;
use serde::Deserialize;

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

/// A request as the handlers see it: the head, and the body when the route takes one, with
/// who sent it when that was checked before its body was read (it is checked once).
pub(crate) struct Call {
    pub head: hyper::http::request::Parts,
    pub body: Bytes,
    pub principal: Option<Principal>,
}

impl Call {
    /// The caller's W3C `traceparent`: one valid header, else none (an invalid or repeated one
    /// is ignored and the activation starts a trace of its own, as the recommendation asks).
    pub(crate) fn traceparent(&self) -> Option<TraceParent> {
        let mut found = self.head.headers.get_all(invoker_telemetry::HEADER).iter();
        match (found.next(), found.next()) {
            (Some(value), None) => TraceParent::parse(value.to_str().ok()?),
            _ => None,
        }
    }

    /// The query string parsed into `T`; a malformed one is a 400 naming it.
    pub(crate) fn query<T: serde::de::DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_urlencoded::from_str(self.head.uri.query().unwrap_or(""))
            .map_err(|e| ApiError::BadRequest(format!("query: {e}")))
    }
}

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
