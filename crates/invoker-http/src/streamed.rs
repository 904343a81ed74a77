//! An answer whose body goes out as it is made (an action's streamed values): carried in the
//! response's extensions as the receiving end of a bounded channel, and made its body by the
//! server. The bound is the flow control: a reader that does not read leaves the channel full,
//! and the producer waits on its `send` (no part of the stream piles up in memory).
//!
//! A body ends well only with [`StreamPart::End`]: a producer gone without it (failed, timed
//! out, dropped) aborts the body, so the reader sees a transfer cut short (a chunked body
//! without its last chunk), never a stream that looks whole.

use bytes::Bytes;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// The parts of a streamed body in flight at most between whoever makes them and the
/// connection that writes them.
pub const STREAM_PARTS: usize = 4;

/// One part of a streamed body.
#[derive(Debug)]
pub enum StreamPart {
    Data(Bytes),
    /// The body is whole.
    End,
}

/// What a reader of a body cut short is told (its connection is closed).
#[derive(Debug, thiserror::Error)]
#[error("the stream ended before its end")]
pub struct CutShort;

/// The receiving end of a streamed body, in a response's extensions (which must be `Clone`).
#[derive(Clone)]
pub struct Streamed(Arc<parking_lot::Mutex<Option<mpsc::Receiver<StreamPart>>>>);

impl Streamed {
    /// A channel of [`STREAM_PARTS`]: its sender, and the extension that makes its parts a body.
    pub fn channel() -> (mpsc::Sender<StreamPart>, Streamed) {
        let (tx, rx) = mpsc::channel(STREAM_PARTS);
        (tx, Streamed::new(rx))
    }

    pub fn new(parts: mpsc::Receiver<StreamPart>) -> Self {
        Streamed(Arc::new(parking_lot::Mutex::new(Some(parts))))
    }

    /// The body: each part as it comes, whole at [`StreamPart::End`], cut short if every
    /// sender is gone before it.
    pub fn into_body(self) -> StreamedBody {
        StreamedBody(self.0.lock().take())
    }
}

/// Resolves once the reader of a stream has left (its body dropped: the connection closed),
/// never when there is no reader (`None`): what a producer selects on beside its own work, to
/// stop making what nobody reads.
pub async fn reader_left(parts: Option<&mpsc::Sender<StreamPart>>) {
    match parts {
        Some(parts) => parts.closed().await,
        None => std::future::pending().await,
    }
}

/// How passing a body on ([`pass_on`]) ended.
pub enum Passed<E> {
    /// The body came to its end (the reader still has to be sent [`StreamPart::End`]).
    Whole,
    /// The reader left first.
    ReaderLeft,
    /// The body failed (its connection broke).
    Broken(E),
}

/// Passes `body`'s data on to `parts` as it comes, each part shown to `seen` first, until the
/// body ends, fails or the reader leaves; with no reader (`None`: one answered otherwise) the
/// body is read to its end and dropped. The channel's bound is the flow control: a slow
/// reader slows the body's reading.
pub async fn pass_on<B>(
    mut body: B,
    parts: Option<&mpsc::Sender<StreamPart>>,
    mut seen: impl FnMut(&Bytes),
) -> Passed<B::Error>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    use http_body_util::BodyExt as _;
    loop {
        let next = tokio::select! {
            next = body.frame() => next,
            () = reader_left(parts) => return Passed::ReaderLeft,
        };
        let data = match next {
            None => return Passed::Whole,
            Some(Err(e)) => return Passed::Broken(e),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        seen(&data);
        if let Some(parts) = parts {
            if parts.send(StreamPart::Data(data)).await.is_err() {
                return Passed::ReaderLeft;
            }
        }
    }
}

pub struct StreamedBody(Option<mpsc::Receiver<StreamPart>>);

impl hyper::body::Body for StreamedBody {
    type Data = Bytes;
    type Error = CutShort;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let Some(parts) = self.0.as_mut() else { return Poll::Ready(None) };
        match parts.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(StreamPart::Data(part))) => Poll::Ready(Some(Ok(hyper::body::Frame::data(part)))),
            Poll::Ready(Some(StreamPart::End)) => {
                self.0 = None;
                Poll::Ready(None)
            }
            Poll::Ready(None) => {
                self.0 = None;
                Poll::Ready(Some(Err(CutShort)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}
