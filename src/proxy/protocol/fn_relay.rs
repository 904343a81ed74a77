//! An Fn function's response in chunks (a 200 of no declared length: what the node FDK's
//! `streamResult` writes, server-sent events, NDJSON, a large file) passed on to the caller as
//! it comes: the function's status and headers first, then each part as the function wrote
//! it, through the same bounded channel as a generator's values, so that a slow caller slows
//! the function and one that leaves ends its call. A response of declared length is read whole
//! and answered as always. The record keeps the stream's count of parts, its size and its last
//! part (up to 64 KiB), not every byte.

use super::stream::StreamBroken;
use bytes::Bytes;
use hyper::header::CONTENT_LENGTH;
use invoker_http::streamed::{Passed, StreamPart, STREAM_PARTS};
use invoker_http::{is_hop_by_hop, ConnectionError};
use invoker_job::stream::{StreamRequest, StreamStart};
use tokio::sync::{mpsc, oneshot};

/// The most of the last part the record keeps.
const LAST_KEPT: usize = 64 * 1024;

/// What the record says of a response streamed to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSummary {
    pub parts: u64,
    pub bytes: u64,
    /// "complete", or "the caller left".
    pub end: &'static str,
}

pub struct FnRelay {
    started: Option<oneshot::Sender<StreamStart>>,
}

impl FnRelay {
    pub fn new(request: StreamRequest) -> Self {
        FnRelay { started: Some(request.started) }
    }

    /// Whether an answer with this head is passed on as it comes: a 200 whose length is not
    /// declared (any other answer is read whole, and its status read as Fn's agent reads it).
    pub fn takes(head: &hyper::http::response::Parts) -> bool {
        head.status == hyper::StatusCode::OK && !head.headers.contains_key(CONTENT_LENGTH)
    }

    /// Passes `body` on to the caller until it ends or the caller leaves; the last part (up to
    /// [`LAST_KEPT`] of it), whether the body was read to its end (the connection may serve
    /// again), and what the record says of the stream.
    pub async fn pump(
        &mut self,
        head: &hyper::http::response::Parts,
        body: hyper::body::Incoming,
    ) -> Result<(Bytes, bool, StreamSummary), StreamBroken> {
        let headers = head.headers.iter().filter(|(name, _)| !is_hop_by_hop(name.as_str()));
        let headers =
            headers.map(|(n, v)| (n.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()));
        let (parts, receiver) = mpsc::channel(STREAM_PARTS);
        let start = StreamStart { head: Some((head.status.as_u16(), headers.collect())), parts: receiver };
        // A caller already answered otherwise (its wait passed) has the stream read to its end.
        let parts = match self.started.take().map(|started| started.send(start)) {
            Some(Ok(())) => Some(parts),
            _ => None,
        };
        let mut summary = StreamSummary { parts: 0, bytes: 0, end: "complete" };
        let mut last = Bytes::new();
        let passed = invoker_http::streamed::pass_on(body, parts.as_ref(), |data| {
            summary.parts += 1;
            summary.bytes += data.len() as u64;
            last = data.slice(data.len().saturating_sub(LAST_KEPT)..);
        })
        .await;
        match passed {
            Passed::Whole => {}
            Passed::ReaderLeft => {
                summary.end = "the caller left";
                return Ok((last, false, summary));
            }
            Passed::Broken(e) => return Err(StreamBroken::Connection(ConnectionError::Http(e))),
        }
        if let Some(parts) = &parts {
            let _ = parts.send(StreamPart::End).await;
        }
        Ok((last, true, summary))
    }
}
