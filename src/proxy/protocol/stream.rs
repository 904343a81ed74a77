//! A run whose action streams its answer (our runtime's `STREAM_TYPE`): each value passed on to
//! the caller as it comes, in the format the caller asked for, through a bounded channel, so
//! that a caller that reads slowly slows the action and one that leaves stops it. What the
//! record keeps of a stream is its count of values, its size and its last value (bounded), not
//! every byte.

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use invoker_http::streamed::{StreamPart, STREAM_PARTS};
use invoker_http::ConnectionError;
use invoker_job::stream::{StreamFormat, StreamRequest, StreamStart};
use invoker_wire::runtime::{STREAM_END, STREAM_VALUE};
use serde::de::IgnoredAny;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

/// The largest last value a stream's record keeps whole (a larger one is said by its size).
const LAST_KEPT: usize = 64 * 1024;

/// Where the caller is.
enum Caller {
    /// Waiting for the first value: the stream's body goes to it then.
    Waiting {
        format: StreamFormat,
        started: oneshot::Sender<StreamStart>,
    },
    Reading {
        format: StreamFormat,
        parts: mpsc::Sender<StreamPart>,
    },
    /// Answered otherwise before the first value (its blocking wait passed): the stream is
    /// read to its end, its values counted, for the record.
    Answered,
}

pub struct StreamRelay {
    caller: Caller,
    /// The longest line read (a value): the payload limit.
    max_line: usize,
    values: u64,
    bytes: u64,
    last: Option<Bytes>,
    pending: BytesMut,
}

/// Why a stream could not be read to its end.
#[derive(Debug)]
pub enum StreamBroken {
    /// A line ran past the payload limit.
    TooLarge(usize),
    Connection(ConnectionError),
}

/// How a stream ended, as the record says it.
enum End {
    Complete,
    Failed(Value),
    CallerLeft,
}

impl StreamRelay {
    pub fn new(request: StreamRequest, max_line: usize) -> Self {
        StreamRelay {
            caller: Caller::Waiting { format: request.format, started: request.started },
            max_line,
            values: 0,
            bytes: 0,
            last: None,
            pending: BytesMut::new(),
        }
    }

    /// Reads `body` (a `STREAM_TYPE` answer) to its end, or until the caller leaves; the
    /// result the record keeps, and whether the body was read to its end (the connection may
    /// serve again).
    pub async fn pump(&mut self, mut body: hyper::body::Incoming) -> Result<(Bytes, bool), StreamBroken> {
        // How much of `pending` is known to hold no newline: a long line comes in many frames,
        // and each is searched once.
        let mut searched = 0;
        loop {
            while let Some(at) = memchr::memchr(b'\n', &self.pending[searched..]) {
                let end = searched + at;
                searched = 0;
                let line = self.pending.split_to(end + 1).freeze();
                if let Some(end) = self.line(line).await {
                    let read_to_end = matches!(end, End::Complete | End::Failed(_)) && self.pending.is_empty();
                    return Ok((self.result(end), read_to_end));
                }
            }
            searched = self.pending.len();
            if self.pending.len() > self.max_line {
                return Err(StreamBroken::TooLarge(self.max_line));
            }
            // A caller that leaves while the action thinks stops it now, not at its next value.
            let next = tokio::select! {
                next = body.frame() => next,
                () = self.caller_left() => return Ok((self.result(End::CallerLeft), false)),
            };
            let frame = match next {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Err(StreamBroken::Connection(ConnectionError::Http(e))),
                None => {
                    let why = "the runtime's stream ended without its last line";
                    return Err(StreamBroken::Connection(ConnectionError::Connect(std::io::Error::other(why))));
                }
            };
            if let Ok(mut data) = frame.into_data() {
                while data.has_remaining() {
                    let chunk = data.chunk();
                    self.pending.extend_from_slice(chunk);
                    let n = chunk.len();
                    data.advance(n);
                }
            }
        }
    }

    /// Resolves once a caller reading the stream has left (never for one that is not).
    async fn caller_left(&self) {
        let parts = match &self.caller {
            Caller::Reading { parts, .. } => Some(parts),
            Caller::Waiting { .. } | Caller::Answered => None,
        };
        invoker_http::streamed::reader_left(parts).await
    }

    /// One line of the stream, its newline last; `Some` when it was the last.
    async fn line(&mut self, line: Bytes) -> Option<End> {
        match line.first() {
            Some(&STREAM_VALUE) => {
                let value = line.slice(1..line.len() - 1);
                // What goes to the caller is JSON with no line break in it (a raw CR would end
                // an event-stream's line): a runtime that sends other is not passed on.
                if value.contains(&b'\r') || serde_json::from_slice::<IgnoredAny>(&value).is_err() {
                    return Some(self.failed(json!("the runtime streamed a value that is not one line of JSON")).await);
                }
                let (len, kept) = (value.len() as u64, (value.len() <= LAST_KEPT).then(|| value.clone()));
                if self.deliver(Some(line.slice(1..))).await {
                    return Some(End::CallerLeft);
                }
                // Counted once gone to the caller (or read for a caller answered otherwise).
                self.values += 1;
                self.bytes += len;
                self.last = kept;
                None
            }
            Some(&STREAM_END) => {
                let end: Value = serde_json::from_slice(&line[1..line.len() - 1])
                    .unwrap_or_else(|_| json!({ "error": "the runtime's last line is not JSON" }));
                match end.get("error") {
                    Some(error) => Some(self.failed(error.clone()).await),
                    None => {
                        // An empty stream is a stream too: the caller gets its (empty) body.
                        self.deliver(None).await;
                        if let Caller::Reading { parts, .. } = &self.caller {
                            let _ = parts.send(StreamPart::End).await;
                        }
                        Some(End::Complete)
                    }
                }
            }
            _ => Some(self.failed(json!("the runtime streamed a line that is neither a value nor the end")).await),
        }
    }

    /// The action failed after the values the caller read: told so as its format tells it (an
    /// event stream's `error` event, after which it ends), or its body cut short (NDJSON, which
    /// has no word for it: no [`StreamPart::End`] is sent).
    async fn failed(&mut self, error: Value) -> End {
        if let Caller::Reading { format, parts } = &self.caller {
            if let Some(event) = format.failure(json!({ "error": error }).to_string().as_bytes()) {
                if parts.send(StreamPart::Data(event)).await.is_ok() {
                    let _ = parts.send(StreamPart::End).await;
                }
            }
        }
        End::Failed(error)
    }

    /// A value's line (its JSON and a newline) to the caller (`None`: only the stream's
    /// start); whether the caller left.
    async fn deliver(&mut self, value: Option<Bytes>) -> bool {
        self.caller = match std::mem::replace(&mut self.caller, Caller::Answered) {
            Caller::Waiting { format, started } => {
                let (parts, body) = mpsc::channel(STREAM_PARTS);
                match started.send(StreamStart { head: None, parts: body }) {
                    Ok(()) => Caller::Reading { format, parts },
                    Err(_) => Caller::Answered,
                }
            }
            other => other,
        };
        match (&self.caller, value) {
            (Caller::Reading { format, parts }, Some(value)) => {
                parts.send(StreamPart::Data(format.frame(value))).await.is_err()
            }
            _ => false,
        }
    }

    /// The record's result: the stream's count of values, its size, its last value, and how it
    /// ended (`error` when the action failed along the way, so that the record says so).
    fn result(&self, end: End) -> Bytes {
        let last = match &self.last {
            Some(last) => serde_json::from_slice(last).unwrap_or(Value::Null),
            None if self.values > 0 => json!({ "omitted": "larger than 64 KiB" }),
            None => Value::Null,
        };
        let mut result = json!({ "values": self.values, "bytes": self.bytes, "last": last });
        match end {
            End::Complete => result["end"] = json!("complete"),
            End::CallerLeft => result["end"] = json!("the caller left"),
            End::Failed(error) => {
                result["end"] = json!("failed");
                result["error"] = error;
            }
        }
        Bytes::from(result.to_string())
    }
}
