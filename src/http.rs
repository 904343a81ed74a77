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

/// How an HTTP/1.1 client connection failed: the connect (the address, socket or namespace
/// was not there), or HTTP on it (the handshake, a request, an answer's body: a reset, a close
/// before the answer ended). The cluster's clients and the runtime client share it.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("{0}")]
    Connect(#[from] std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// An HTTP/1.1 connection to `authority` (`host:port`), without Nagle's delay; a task drives it
/// until either side closes it. The cluster's clients (etcd, schedulers, invokers) share it.
pub async fn connect<B>(authority: &str) -> Result<hyper::client::conn::http1::SendRequest<B>, ConnectionError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(authority).await?;
    let _ = stream.set_nodelay(true);
    handshake(hyper_util::rt::TokioIo::new(stream)).await
}

/// HTTP/1.1 over `stream`, driven by a task of its own until either side closes it.
pub async fn handshake<S, B>(stream: S) -> Result<hyper::client::conn::http1::SendRequest<B>, ConnectionError>
where
    S: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(stream).await?;
    tokio::spawn(connection);
    Ok(sender)
}
