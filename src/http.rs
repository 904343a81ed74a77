//! The responses of the crate's HTTP servers: the API, the action runtime, the mock containers.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::StatusCode;

pub type Response = hyper::Response<Full<Bytes>>;

pub fn with_body(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response {
    let mut response = hyper::Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A JSON value as the body (a `Value` always serialises).
pub fn json_value(status: StatusCode, value: &serde_json::Value) -> Response {
    with_body(status, "application/json", value.to_string())
}
