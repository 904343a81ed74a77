//! The client every runtime protocol speaks through: `POST`s over kept-alive HTTP/1.1
//! connections to one container.
//!
//! Straight on hyper's connection API rather than a general-purpose client: the address never
//! changes, so there is no URL to parse, no pool keyed by host and no connector stack per
//! request; idle connections wait in a small stack, one per run in flight at most.

use crate::factory::Transport;
use crate::read_watched::ReadWatchedStream;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::Value;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("timed out")]
    Timeout,
    #[error("the runtime could not be reached or dropped the connection: {0}")]
    Connection(String),
}

/// A runtime's answer: its HTTP status and body (JSON when it parses).
#[derive(Debug)]
pub struct RuntimeResponse {
    pub status: u16,
    pub body: Result<Value, String>,
}

/// Idle connections kept per container at most (more only while more runs are in flight).
const MAX_IDLE: usize = 64;

pub struct RuntimeClient {
    transport: Transport,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl RuntimeClient {
    pub fn new(transport: &Transport) -> Self {
        RuntimeClient { transport: transport.clone(), idle: Mutex::new(Vec::new()) }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        match &self.transport {
            Transport::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
                let _ = stream.set_nodelay(true);
                handshake(TokioIo::new(stream)).await
            }
            Transport::Unix(path) => {
                handshake(ReadWatchedStream::connect(path).await.map_err(|e| e.to_string())?).await
            }
            Transport::Netns(ns, port) => {
                handshake(TokioIo::new(ns.connect(*port).await.map_err(|e| e.to_string())?)).await
            }
        }
    }

    /// A kept-alive connection ready for a request, or a new one.
    async fn sender(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        loop {
            let idle = self.idle.lock().pop();
            match idle {
                Some(mut sender) => {
                    if sender.ready().await.is_ok() {
                        return Ok(sender);
                    }
                }
                None => return self.connect().await,
            }
        }
    }

    /// `body` (JSON) to `path`; the answer's status and body, within `timeout`.
    pub async fn post(&self, path: &str, body: Bytes, timeout: Duration) -> Result<RuntimeResponse, RuntimeError> {
        let exchange = async {
            let mut sender = self.sender().await?;
            let request = hyper::Request::post(path)
                .header(hyper::header::HOST, "localhost")
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(body))
                .map_err(|e| e.to_string())?;
            let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let bytes = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
            let mut idle = self.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push(sender);
            }
            Ok::<_, String>((status, bytes))
        };
        let (status, bytes) = match tokio::time::timeout(timeout, exchange).await {
            Err(_) => return Err(RuntimeError::Timeout),
            Ok(Err(e)) => return Err(RuntimeError::Connection(e)),
            Ok(Ok(answer)) => answer,
        };
        let body =
            serde_json::from_slice(&bytes).map_err(|_| String::from_utf8_lossy(&bytes).chars().take(200).collect());
        Ok(RuntimeResponse { status, body })
    }
}

/// HTTP/1.1 on a connected stream; a task drives the connection until either side closes it.
async fn handshake<S>(stream: S) -> Result<SendRequest<Full<Bytes>>, String>
where
    S: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(stream).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(sender)
}
