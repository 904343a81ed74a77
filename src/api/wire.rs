//! The API's connections under hyper, with the answers hyper gives without asking us made
//! like every other error of the API: a JSON body with a reason.
//!
//! hyper refuses a request it cannot parse (a garbage request line, too many headers, a
//! negative `Content-Length`, a 100 KB URI) with a status and an empty body, and meets an
//! HTTP/2 preface on an HTTP/1.1 connection with silence. It has no hook for either, so the
//! stream does it: its one write of such a head (`connection: close` and `content-length: 0`,
//! which none of our own answers has) is replaced with the same status and a body, and a
//! connection that opens with the HTTP/2 preface gets a 505 and is closed. Every other byte
//! passes through untouched, so the warm path pays one prefix check per write.
//!
//! It also bounds how long a client may leave an answer unread: a write that makes no progress
//! for the write timeout fails, and hyper closes the connection (and frees the answer). And it
//! gives back the connection's share of the unread-answers budget once hyper flushed (hyper
//! flushes the stream only when its own buffer is written out).

use std::cell::RefCell;
use std::future::Future as _;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;

/// What the connection's answer in writing holds of the unread-answers budget.
pub type HeldAnswer = Rc<RefCell<Option<OwnedSemaphorePermit>>>;

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// What only hyper's own refusals have in their head.
const REFUSAL_MARK: &[u8] = b"\r\nconnection: close\r\ncontent-length: 0\r\n";

pub struct ApiStream<S> {
    inner: S,
    /// Nothing read yet: the next read is the connection's first bytes.
    first_read: bool,
    /// A replacement answer still to be written (the socket took part of it).
    pending: Vec<u8>,
    /// Reads end: the connection was answered here and is closing.
    closed: bool,
    /// How long a write may wait for the client to take anything.
    write_timeout: Duration,
    /// Since when writes wait (armed by the first write that could not go through).
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    held: HeldAnswer,
}

impl<S> ApiStream<S> {
    pub fn new(inner: S, write_timeout: Duration, held: HeldAnswer) -> Self {
        ApiStream { inner, first_read: true, pending: Vec::new(), closed: false, write_timeout, stalled: None, held }
    }

    /// What a write that could not go through answers: wait, until the client took nothing for
    /// the write timeout; then an error, which closes the connection. `done` is the write's
    /// own answer when it went through.
    fn deadline<T>(&mut self, cx: &mut Context<'_>, done: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if done.is_ready() {
            self.stalled = None;
            return done;
        }
        let timeout = self.write_timeout;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took nothing of its answer for {timeout:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> ApiStream<S> {
    /// Writes what is pending; ready once none is.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let written = Pin::new(&mut self.inner).poll_write(cx, &self.pending);
            let n = ready!(self.deadline(cx, written))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for ApiStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.closed {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if std::mem::take(&mut this.first_read) && buf.filled()[before..].starts_with(H2_PREFACE) {
            // hyper would close without a word: answer, and read nothing more.
            buf.set_filled(before);
            this.closed = true;
            this.pending = refusal(505, "request: HTTP/2 is not served here; speak HTTP/1.1");
            let _ = this.poll_pending(cx);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ApiStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_pending(cx))?;
        if let Some(status) = hyper_refusal(data) {
            this.pending = refusal(status, reason(status));
            let _ = this.poll_pending(cx);
            return Poll::Ready(Ok(data.len()));
        }
        let written = Pin::new(&mut this.inner).poll_write(cx, data);
        this.deadline(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_pending(cx))?;
        let only = bufs.iter().filter(|b| !b.is_empty()).count() == 1;
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()).filter(|_| only) {
            if let Some(status) = hyper_refusal(first) {
                this.pending = refusal(status, reason(status));
                let _ = this.poll_pending(cx);
                return Poll::Ready(Ok(first.len()));
            }
        }
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.deadline(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        let flushed = self.deadline(cx, flushed);
        if let Poll::Ready(Ok(())) = flushed {
            // Everything hyper had to write is the kernel's now.
            self.held.borrow_mut().take();
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The status of a refusal hyper wrote on its own, if `data` is one.
fn hyper_refusal(data: &[u8]) -> Option<u16> {
    let status = data.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
    if !matches!(status[0], b'4' | b'5') || !data.ends_with(b"\r\n\r\n") {
        return None;
    }
    if !data.windows(REFUSAL_MARK.len()).any(|w| w == REFUSAL_MARK) {
        return None;
    }
    std::str::from_utf8(status).ok()?.parse().ok()
}

fn reason(status: u16) -> &'static str {
    match status {
        431 => "request headers: too many, or too large",
        414 => "request line: the URI is too long",
        413 => "request body: too large",
        408 => "request: the head did not arrive in time",
        505 => "request: HTTP/2 is not served here; speak HTTP/1.1",
        _ => "request: not valid HTTP/1.1 (the request line, a header name or value, or Content-Length)",
    }
}

/// A complete answer with the API's error body; the connection closes after it.
fn refusal(status: u16, reason: &str) -> Vec<u8> {
    let phrase = hyper::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error");
    let body = serde_json::json!({ "error": reason, "code": invoker_wire::model::new_activation_id() }).to_string();
    format!(
        "HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_own_refusals_are_replaced() {
        let refusal = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(hyper_refusal(refusal), Some(431));
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 60\r\n\r\n";
        assert_eq!(hyper_refusal(ours), None);
        let ok = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hyper_refusal(ok), None);
    }

    #[test]
    fn a_refusal_is_json_with_its_reason() {
        let text = String::from_utf8(refusal(400, reason(400))).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(body["error"].as_str().unwrap().contains("not valid HTTP/1.1"));
    }
}
