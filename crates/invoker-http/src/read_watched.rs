//! A unix stream that the reactor watches for reading only, for both ends of a runtime
//! connection: the invoker's client and the runtime's server.
//!
//! Why: every time one end reads what the other wrote, the kernel frees buffer space and
//! reports it as `EPOLLOUT` to the writer. A stream registered for writing too (as tokio's
//! `UnixStream` always is) wakes the writer's thread once per activation for nothing: the
//! invoker when the runtime reads a `/run`, the runtime when the invoker reads the response.
//! Writes here go straight to the socket; only when it is full (a body larger than its buffer)
//! is a second descriptor registered for writability, and dropped once the write went through.

use hyper::rt::{Read, ReadBufCursor, Write};
use std::io::{self, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Bytes read per `read(2)`; a `/run` response is one read.
const READ_CHUNK: usize = 16 * 1024;

pub struct ReadWatchedStream {
    reading: AsyncFd<UnixStream>,
    /// A duplicate descriptor of the same socket, registered while a write waits for room.
    writing: Option<AsyncFd<UnixStream>>,
    /// Where reads land before hyper's buffer (which may be uninitialised memory).
    chunk: Box<[u8]>,
    /// Bytes read so far, where the owner counts them (a client telling whether a request on
    /// a kept-alive connection got any answer).
    received: Option<Arc<AtomicU64>>,
}

impl ReadWatchedStream {
    pub async fn connect(path: &std::path::Path) -> io::Result<ReadWatchedStream> {
        ReadWatchedStream::from_tokio(tokio::net::UnixStream::connect(path).await?)
    }

    /// Takes over a connected stream (one a listener accepted, say).
    pub fn from_tokio(stream: tokio::net::UnixStream) -> io::Result<ReadWatchedStream> {
        Ok(ReadWatchedStream {
            reading: register(stream.into_std()?, Interest::READABLE)?,
            writing: None,
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            received: None,
        })
    }

    /// The same stream, adding every byte read to `received`.
    pub fn counting_into(self, received: Arc<AtomicU64>) -> ReadWatchedStream {
        ReadWatchedStream { received: Some(received), ..self }
    }

    fn poll_writing(
        &mut self,
        cx: &mut Context<'_>,
        write: impl Fn(&UnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        if self.writing.is_none() {
            match write(self.reading.get_ref()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Registering a full socket reports it as soon as there is room, even if
                    // the room came before the registration.
                    let duplicate = self.reading.get_ref().try_clone()?;
                    self.writing = Some(register(duplicate, Interest::WRITABLE)?);
                }
                done => return Poll::Ready(done),
            }
        }
        let Some(waiting) = &self.writing else { unreachable!("registered above") };
        let done = loop {
            let mut ready = ready!(waiting.poll_write_ready(cx))?;
            if let Ok(done) = ready.try_io(|fd| write(fd.get_ref())) {
                break done;
            }
        };
        self.writing = None;
        Poll::Ready(done)
    }
}

impl Read for ReadWatchedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, mut buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let want = buf.remaining().min(this.chunk.len());
        loop {
            let mut ready = ready!(this.reading.poll_read_ready(cx))?;
            let chunk = &mut this.chunk[..want];
            if let Ok(read) = ready.try_io(|fd| {
                let mut socket = fd.get_ref();
                socket.read(chunk)
            }) {
                let n = read?;
                // A short read drained the socket: the next read waits for the next edge
                // instead of asking the kernel again to hear `EAGAIN` (as tokio's own streams).
                if n > 0 && n < want {
                    ready.clear_ready();
                }
                if let Some(received) = &this.received {
                    received.fetch_add(n as u64, Ordering::Relaxed);
                }
                buf.put_slice(&this.chunk[..n]);
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl Write for ReadWatchedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().poll_writing(cx, |mut s| s.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_writing(cx, |mut s| s.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.reading.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

/// Registers `socket` with the reactor for `interest` only.
// tokio deprecated the safe constructor in favour of an `unsafe` one whose contract is that the
// descriptor stays open and the same while registered; a `UnixStream` owns its descriptor and
// this module never swaps it, so the safe call is sound here and the crate stays unsafe-free.
#[allow(deprecated)]
fn register(socket: UnixStream, interest: Interest) -> io::Result<AsyncFd<UnixStream>> {
    AsyncFd::with_interest(socket, interest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A write larger than the socket's buffer waits for the peer to read, then completes;
    /// what the peer sends back is read whole.
    #[tokio::test]
    async fn writes_wait_for_room_and_reads_see_everything() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let big = vec![7u8; 4 * 1024 * 1024];
        let peer = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut got = vec![0u8; 4 * 1024 * 1024];
            conn.read_exact(&mut got).await.unwrap();
            assert!(got.iter().all(|b| *b == 7));
            conn.write_all(b"done").await.unwrap();
        });
        let mut stream = hyper_util::rt::TokioIo::new(ReadWatchedStream::connect(&path).await.unwrap());
        stream.write_all(&big).await.unwrap();
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"done");
        assert!(stream.inner().writing.is_none(), "the write registration is dropped once done");
        peer.await.unwrap();
    }
}
