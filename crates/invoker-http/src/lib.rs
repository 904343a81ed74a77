//! The HTTP pieces the invoker's servers and clients share: a response with a body
//! (`Response`, `with_body`, `json_value`) of parts ([`body_parts`]), one client connection (`connect`, `handshake`), an
//! answer that goes out in two parts (`Follows`), one that goes out as it is made
//! ([`streamed`]), the hop-by-hop headers, and a unix stream
//! the reactor watches for reading only ([`read_watched`]). Used by the API, the action runtime,
//! the proxies, the mock containers and the cluster's clients, below all of them.

#![forbid(unsafe_code)]

pub mod body_parts;
pub mod read_watched;
pub mod streamed;

use body_parts::BodyParts;
use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::StatusCode;

pub type Response = hyper::Response<BodyParts>;

pub fn with_body(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response {
    with_parts(status, content_type, BodyParts::from(body.into()))
}

/// A body of parts sent one after another (a record whose result is large: `BodyParts`).
pub fn with_parts(status: StatusCode, content_type: &'static str, body: BodyParts) -> Response {
    let mut response = hyper::Response::new(body);
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

/// The rest of an answer that goes out in two parts (the shim's result, then its whole
/// record): carried in the first part's extensions, and made its body's tail by the server.
/// `None` from the future ends the body after the first part.
#[derive(Clone)]
pub struct Follows {
    pub first: Bytes,
    pub rest: std::sync::Arc<parking_lot::Mutex<Option<FollowingPart>>>,
}

pub type FollowingPart = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Bytes>> + Send>>;

impl Follows {
    pub fn new(first: Bytes, rest: impl std::future::Future<Output = Option<Bytes>> + Send + 'static) -> Self {
        Follows { first, rest: std::sync::Arc::new(parking_lot::Mutex::new(Some(Box::pin(rest)))) }
    }

    /// The body: the first part at once, then the rest when it comes.
    pub fn into_body(self) -> FollowedBody {
        FollowedBody { first: Some(self.first), rest: self.rest.lock().take() }
    }
}

pub struct FollowedBody {
    first: Option<Bytes>,
    rest: Option<FollowingPart>,
}

impl hyper::body::Body for FollowedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(first))));
        }
        let Some(rest) = self.rest.as_mut() else { return Poll::Ready(None) };
        match rest.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(part) => {
                self.rest = None;
                Poll::Ready(part.map(|bytes| Ok(hyper::body::Frame::data(bytes))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_none()
    }
}

/// Headers that belong to one connection, never passed on (RFC 9110 §7.6.1, and what Go's
/// reverse proxy strips); `content-length` is the new message's own.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Whether `name` is a header of one connection only ([`HOP_BY_HOP`]): the API and the
/// proxies both strip them from what they pass on.
pub fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// An answer's headers as one JSON object, as an Fn function's record keeps them: those of one
/// connection left out, a repeated name's values joined with ", " (as HTTP allows a list).
pub fn headers_json<N: AsRef<str>>(
    headers: impl IntoIterator<Item = (N, String)>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut json = serde_json::Map::new();
    for (name, value) in headers {
        let name = name.as_ref();
        if is_hop_by_hop(name) {
            continue;
        }
        match json.get_mut(name) {
            Some(serde_json::Value::String(first)) => {
                first.push_str(", ");
                first.push_str(&value);
            }
            _ => {
                json.insert(name.to_string(), serde_json::Value::String(value));
            }
        }
    }
    json
}
