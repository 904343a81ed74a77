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

/// Why no connection was made: the TCP connect, or HTTP/1.1's handshake on it.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
    Tcp(#[from] std::io::Error),
    #[error("{0}")]
    Handshake(#[from] hyper::Error),
}

/// An HTTP/1.1 connection to `authority` (`host:port`), without Nagle's delay; a task drives it
/// until either side closes it. The cluster's clients (etcd, schedulers, invokers) share it.
pub async fn connect<B>(authority: &str) -> Result<hyper::client::conn::http1::SendRequest<B>, ConnectError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(authority).await?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}
