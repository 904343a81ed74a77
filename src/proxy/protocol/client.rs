//! The client every runtime protocol speaks through: `POST`s over kept-alive HTTP/1.1
//! connections to one container.
//!
//! Straight on hyper's connection API rather than a general-purpose client: the address never
//! changes, so there is no URL to parse, no pool keyed by host and no connector stack per
//! request; idle connections wait in a small stack, one per run in flight at most.
//!
//! Two rules keep a kept-alive connection from failing a run. Runtimes close connections that
//! sit idle (node's HTTP server after 5 s, `server.keepAliveTimeout`, also across a pause), so
//! a connection idle longer than [`IDLE_BOUND`] is not reused. And since the close may still
//! cross the request on the wire, a request on a reused connection that fails before a single
//! byte of an answer came back provably never reached the runtime's handler: it is sent once
//! more, on a fresh connection. A request on a fresh connection is never sent twice.

use super::fn_relay::{FnRelay, StreamSummary};
use super::stream::{StreamBroken, StreamRelay};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use invoker_factory::contract::Transport;
use invoker_factory::peer::{Peer, StrangerError};
use invoker_http::body_parts::BodyParts;
use invoker_http::read_watched::ReadWatchedStream;
use invoker_http::{handshake, ConnectionError};
use invoker_wire::runtime::STREAM_TYPE;
use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("timed out")]
    Timeout,
    #[error("the runtime could not be reached or dropped the connection: {0}")]
    Connection(#[from] ConnectionError),
    /// The answer ran past what may be read of it; reading stopped there.
    #[error("the answer is longer than {0} bytes")]
    TooLarge(usize),
    /// What answered is not the container's own runtime (see `factory::peer`).
    #[error("{0}")]
    Stranger(#[from] StrangerError),
}

/// A runtime's answer as it came: its HTTP status, headers and body (for a response passed on
/// to its caller as it came, its last part, and what it was).
#[derive(Debug, Default)]
pub struct RuntimeResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub streamed: Option<StreamSummary>,
}

/// Where an answer that streams goes as it comes.
pub enum Relay<'a> {
    /// A generator's values (our runtime's `STREAM_TYPE`, asked for with `Accept`).
    Values(&'a mut StreamRelay),
    /// An Fn function's response in chunks.
    AsWritten(&'a mut FnRelay),
}

impl Relay<'_> {
    fn reborrow(&mut self) -> Relay<'_> {
        match self {
            Relay::Values(relay) => Relay::Values(relay),
            Relay::AsWritten(relay) => Relay::AsWritten(relay),
        }
    }
}

impl RuntimeResponse {
    /// The body's first 200 characters as text (what an answer that is not JSON is shown as).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).chars().take(200).collect()
    }
}

/// Idle connections kept per container at most (more only while more runs are in flight).
const MAX_IDLE: usize = 64;

/// A connection idle longer than this is closed rather than reused (Fn's agent keeps none past
/// 1 s, for the runtimes that close idle ones themselves).
pub const IDLE_BOUND: Duration = Duration::from_secs(1);

/// What an answer may hold beyond the result itself (the runtime's error envelope, spacing).
const ENVELOPE_BYTES: usize = 16 * 1024;

/// One open connection: its sender, when it was last given back, and the bytes the runtime
/// has sent on it so far.
struct Connection {
    sender: SendRequest<BodyParts>,
    idle_since: Instant,
    received: Arc<AtomicU64>,
}

pub struct RuntimeClient {
    transport: Transport,
    peer: Arc<Peer>,
    idle: Mutex<Vec<Connection>>,
    /// The most of an answer's body read before giving up on it.
    max_body: usize,
}

impl RuntimeClient {
    /// `max_result` is the largest result an answer may carry (the payload limit).
    /// Every new connection is checked against `peer`.
    pub fn new(transport: &Transport, peer: Arc<Peer>, max_result: usize) -> Self {
        RuntimeClient {
            transport: transport.clone(),
            peer,
            idle: Mutex::new(Vec::new()),
            max_body: max_result.saturating_add(ENVELOPE_BYTES),
        }
    }

    /// The largest result an answer may carry (the payload limit).
    pub fn max_result(&self) -> usize {
        self.max_body - ENVELOPE_BYTES
    }

    /// A new connection, once its peer proved to be the container's own.
    async fn connect(&self) -> Result<Connection, RuntimeError> {
        let received = Arc::new(AtomicU64::new(0));
        let connect_err = |e: std::io::Error| RuntimeError::Connection(e.into());
        let sender = match &self.transport {
            Transport::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr).await.map_err(connect_err)?;
                let _ = stream.set_nodelay(true);
                self.peer.check(None)?;
                handshake(TokioIo::new(Counted { inner: stream, received: received.clone() })).await
            }
            Transport::Unix(socket) => {
                let stream = socket.connect().await?;
                self.peer.check(Some(stream.peer_cred().map_err(connect_err)?))?;
                let stream = ReadWatchedStream::from_tokio(stream).map_err(connect_err)?;
                handshake(stream.counting_into(received.clone())).await
            }
            Transport::Netns(ns, port) => {
                let stream = ns.connect(*port).await.map_err(connect_err)?;
                self.peer.check(None)?;
                handshake(TokioIo::new(Counted { inner: stream, received: received.clone() })).await
            }
        }?;
        Ok(Connection { sender, idle_since: Instant::now(), received })
    }

    /// A kept-alive connection ready for a request (and `true`), or a new one.
    async fn connection(&self) -> Result<(Connection, bool), RuntimeError> {
        loop {
            let idle = {
                let mut idle = self.idle.lock();
                match idle.pop() {
                    // The stack is newest on top: when its top is too old, so is the rest.
                    Some(c) if c.idle_since.elapsed() > IDLE_BOUND => {
                        idle.clear();
                        None
                    }
                    popped => popped,
                }
            };
            match idle {
                Some(mut c) => {
                    if c.sender.ready().await.is_ok() {
                        return Ok((c, true));
                    }
                }
                None => return self.connect().await.map(|c| (c, false)),
            }
        }
    }

    /// One request and its answer on one connection. `Err(Retry)` says nothing of the answer
    /// came back on a connection that had served before: the request never reached the runtime.
    /// `headers`: the request's own; `None`, a JSON body's (OpenWhisk's, without a map built).
    /// `relay`: a caller that takes a stream, which an answer of our runtime's `STREAM_TYPE` is
    /// passed on to as it comes (asked for with `Accept`).
    async fn exchange(
        &self,
        path: &str,
        headers: Option<&HeaderMap>,
        body: BodyParts,
        relay: Option<Relay<'_>>,
    ) -> Result<RuntimeResponse, Failed> {
        let (mut c, reused) = self.connection().await.map_err(Failed::Other)?;
        let before = c.received.load(Ordering::Relaxed);
        let unanswered = |e: hyper::Error| {
            if reused && c.received.load(Ordering::Relaxed) == before {
                Failed::Retry(e)
            } else {
                Failed::Other(ConnectionError::Http(e).into())
            }
        };
        let mut request = hyper::Request::new(body);
        *request.method_mut() = hyper::Method::POST;
        *request.uri_mut() = hyper::Uri::try_from(path).unwrap_or_default();
        match headers {
            Some(headers) => *request.headers_mut() = headers.clone(),
            None => {
                request.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
        }
        request.headers_mut().insert(HOST, HeaderValue::from_static("localhost"));
        if let Some(Relay::Values(_)) = relay {
            request.headers_mut().insert(ACCEPT, HeaderValue::from_static(STREAM_TYPE));
        }
        let response = match c.sender.send_request(request).await {
            Ok(response) => response,
            Err(e) => return Err(unanswered(e)),
        };
        let (parts, body) = response.into_parts();
        let broken = |broken| {
            Failed::Other(match broken {
                StreamBroken::TooLarge(limit) => RuntimeError::TooLarge(limit),
                StreamBroken::Connection(e) => RuntimeError::Connection(e),
            })
        };
        let values = parts.headers.get(CONTENT_TYPE).is_some_and(|t| t.as_bytes() == STREAM_TYPE.as_bytes());
        // A stream left unread (its caller gone) ends with its connection.
        match relay {
            Some(Relay::Values(relay)) if values => {
                let (result, read_to_end) = relay.pump(body).await.map_err(broken)?;
                if read_to_end {
                    self.keep(c);
                }
                let (status, headers) = (parts.status.as_u16(), parts.headers);
                return Ok(RuntimeResponse { status, headers, body: result, streamed: None });
            }
            Some(Relay::AsWritten(relay)) if FnRelay::takes(&parts) => {
                let (last, read_to_end, summary) = relay.pump(&parts, body).await.map_err(broken)?;
                if read_to_end {
                    self.keep(c);
                }
                let (status, headers) = (parts.status.as_u16(), parts.headers);
                return Ok(RuntimeResponse { status, headers, body: last, streamed: Some(summary) });
            }
            _ => {}
        }
        // The connection is dropped with the rest of a too long answer unread.
        let bytes = match read_whole(body, self.max_body).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Err(Failed::Other(RuntimeError::TooLarge(self.max_body - ENVELOPE_BYTES))),
            Err(e) => return Err(Failed::Other(ConnectionError::Http(e).into())),
        };
        self.keep(c);
        Ok(RuntimeResponse { status: parts.status.as_u16(), headers: parts.headers, body: bytes, streamed: None })
    }

    /// Keeps `c` for the next request, if there is room.
    fn keep(&self, mut c: Connection) {
        c.idle_since = Instant::now();
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(c);
        }
    }

    /// `body` (JSON) to `path`; the answer, within `timeout`.
    pub async fn post(&self, path: &str, body: BodyParts, timeout: Duration) -> Result<RuntimeResponse, RuntimeError> {
        self.exchange_within(path, None, body, timeout, None).await
    }

    /// As [`Self::post`], a stream passed on to `relay` as it comes; the answer's body is then
    /// what the record keeps of the stream ([`StreamRelay::pump`]).
    pub async fn post_streaming(
        &self,
        path: &str,
        body: BodyParts,
        timeout: Duration,
        relay: &mut StreamRelay,
    ) -> Result<RuntimeResponse, RuntimeError> {
        self.exchange_within(path, None, body, timeout, Some(Relay::Values(relay))).await
    }

    /// As [`Self::send`], a response in chunks passed on to `relay` as it comes.
    pub async fn send_streaming(
        &self,
        path: &str,
        headers: &HeaderMap,
        body: BodyParts,
        timeout: Duration,
        relay: &mut FnRelay,
    ) -> Result<RuntimeResponse, RuntimeError> {
        self.exchange_within(path, Some(headers), body, timeout, Some(Relay::AsWritten(relay))).await
    }

    /// `body` with `headers` to `path` (a `POST`); the answer, within `timeout`.
    pub async fn send(
        &self,
        path: &str,
        headers: &HeaderMap,
        body: BodyParts,
        timeout: Duration,
    ) -> Result<RuntimeResponse, RuntimeError> {
        self.exchange_within(path, Some(headers), body, timeout, None).await
    }

    async fn exchange_within(
        &self,
        path: &str,
        headers: Option<&HeaderMap>,
        body: BodyParts,
        timeout: Duration,
        mut relay: Option<Relay<'_>>,
    ) -> Result<RuntimeResponse, RuntimeError> {
        let exchange = async {
            match self.exchange(path, headers, body.clone(), relay.as_mut().map(Relay::reborrow)).await {
                Err(Failed::Retry(e)) => {
                    tracing::debug!("a kept-alive runtime connection was closed under a request ({e}); sent again");
                    self.exchange(path, headers, body, relay).await.map_err(Failed::into_error)
                }
                other => other.map_err(Failed::into_error),
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(RuntimeError::Timeout),
            Ok(answer) => Ok(answer?),
        }
    }
}

/// An answer's body in one buffer of its declared size, each part copied in as it comes and let
/// go (a large result is held once, not as its parts and then their join); `None` past `max`.
async fn read_whole(mut body: hyper::body::Incoming, max: usize) -> Result<Option<Bytes>, hyper::Error> {
    let declared = hyper::body::Body::size_hint(&body).lower() as usize;
    if declared > max {
        return Ok(None);
    }
    let mut whole = Vec::with_capacity(declared);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if whole.len() + data.len() > max {
                return Ok(None);
            }
            whole.extend_from_slice(&data);
        }
    }
    Ok(Some(Bytes::from(whole)))
}

/// How one exchange failed: on a reused connection before any answer (safe to send again), or
/// otherwise.
enum Failed {
    Retry(hyper::Error),
    Other(RuntimeError),
}

impl Failed {
    fn into_error(self) -> RuntimeError {
        match self {
            Failed::Retry(e) => ConnectionError::Http(e).into(),
            Failed::Other(e) => e,
        }
    }
}

/// A stream that counts the bytes read from it (what the runtime has sent on the connection).
struct Counted<S> {
    inner: S,
    received: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            this.received.fetch_add(read as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
