//! A caller that takes an action's answer as a stream, as the action makes it: the format it
//! asked for (its `Accept`), and where the stream's body goes once the first value is in.
//! Nothing is sent on `started` for an answer that is not a stream (the caller then gets the
//! record as always), nor for a stream that failed before its first value (its record says
//! why, as any failure's).

use bytes::Bytes;
use invoker_http::streamed::StreamPart;
use tokio::sync::{mpsc, oneshot};

/// How a streamed answer's values are written to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFormat {
    /// `application/x-ndjson`: each value's JSON, then a newline.
    Ndjson,
    /// `text/event-stream`: each value an event, `data: <JSON>`, then a blank line.
    EventStream,
    /// The bytes as the function wrote them, under its own status and headers (an Fn
    /// function's response in chunks: `StreamStart::head`).
    AsWritten,
}

impl StreamFormat {
    /// The format `accept` (an `Accept` header's value) asks for, if it asks for one.
    pub fn from_accept(accept: &str) -> Option<StreamFormat> {
        accept.split(',').find_map(|t| match t.split(';').next().unwrap_or_default().trim() {
            t if t.eq_ignore_ascii_case("application/x-ndjson") => Some(StreamFormat::Ndjson),
            t if t.eq_ignore_ascii_case("text/event-stream") => Some(StreamFormat::EventStream),
            _ => None,
        })
    }

    /// The content type of a stream of values (the function's own for [`StreamFormat::AsWritten`]).
    pub fn content_type(self) -> &'static str {
        match self {
            StreamFormat::Ndjson => "application/x-ndjson",
            StreamFormat::EventStream => "text/event-stream",
            StreamFormat::AsWritten => "application/octet-stream",
        }
    }

    /// What tells the caller the action failed after the values it read (`error`: JSON): an
    /// `error` event for an event stream (what its clients listen for), which then ends; none
    /// for NDJSON, whose body is cut short instead (its readers see the transfer fail).
    pub fn failure(self, error: &[u8]) -> Option<Bytes> {
        match self {
            StreamFormat::Ndjson | StreamFormat::AsWritten => None,
            StreamFormat::EventStream => {
                Some(Bytes::from([b"event: error\ndata: ".as_slice(), error, b"\n\n"].concat()))
            }
        }
    }

    /// One value as the caller reads it, from `line`: the value's JSON (no line break in it)
    /// and a newline. An NDJSON line is that line as it is (not copied).
    pub fn frame(self, line: Bytes) -> Bytes {
        match self {
            StreamFormat::Ndjson | StreamFormat::AsWritten => line,
            StreamFormat::EventStream => Bytes::from([b"data: ".as_slice(), &line, b"\n"].concat()),
        }
    }
}

/// The caller's side of a streamed answer: what the run needs to start it.
pub struct StreamRequest {
    pub format: StreamFormat,
    /// Told of the stream once its first part is in.
    pub started: oneshot::Sender<StreamStart>,
}

/// A stream as it starts: the head the function answered with, for a stream
/// [`StreamFormat::AsWritten`] (its status and headers, those of one connection left out;
/// empty for a stream of values), and the body's parts as they come.
#[derive(Debug)]
pub struct StreamStart {
    pub head: Option<(u16, Vec<(String, String)>)>,
    pub parts: mpsc::Receiver<StreamPart>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_names_the_format_and_values_are_framed_for_it() {
        assert_eq!(StreamFormat::from_accept("application/x-ndjson"), Some(StreamFormat::Ndjson));
        assert_eq!(StreamFormat::from_accept("text/html, Text/Event-Stream;q=0.9"), Some(StreamFormat::EventStream));
        assert_eq!(StreamFormat::from_accept("application/json"), None);
        assert_eq!(StreamFormat::from_accept("*/*"), None);
        assert_eq!(&StreamFormat::Ndjson.frame(Bytes::from_static(b"{\"a\":1}\n"))[..], b"{\"a\":1}\n");
        assert_eq!(&StreamFormat::EventStream.frame(Bytes::from_static(b"\"tok\"\n"))[..], b"data: \"tok\"\n\n");
    }
}
