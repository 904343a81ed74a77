//! A body as the parts it is made of, sent one after another and never joined: a call's
//! parameters go into the `/run` body as the slice of the caller's request they are, between the
//! few bytes before and after them, and a record whose result is large goes to its caller as
//! its parts (`invoker_wire::json_parts`), so a 64 MiB call is not copied once more on either
//! way. Every answer of the API's is one (most of one part): the parts sit in the body itself,
//! no allocation of their own.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The most parts a body has.
pub const MAX_PARTS: usize = 5;

/// Cheap to clone (each part is shared), which a resend on a fresh connection needs.
#[derive(Clone, Debug, Default)]
pub struct BodyParts {
    parts: [Bytes; MAX_PARTS],
    /// The next part to send.
    next: usize,
}

impl BodyParts {
    /// `given` in order; empty parts are skipped.
    pub fn new<const N: usize>(given: [Bytes; N]) -> Self {
        const { assert!(N <= MAX_PARTS, "a body has at most MAX_PARTS parts") };
        let mut parts: [Bytes; MAX_PARTS] = Default::default();
        for (slot, part) in parts.iter_mut().zip(given) {
            *slot = part;
        }
        BodyParts { parts, next: 0 }
    }

    fn left(&self) -> &[Bytes] {
        &self.parts[self.next.min(MAX_PARTS)..]
    }
}

impl From<Bytes> for BodyParts {
    fn from(bytes: Bytes) -> Self {
        BodyParts::new([bytes])
    }
}

impl Body for BodyParts {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        while self.next < MAX_PARTS {
            let n = self.next;
            self.next += 1;
            let part = std::mem::take(&mut self.parts[n]);
            if !part.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(part))));
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.left().iter().all(Bytes::is_empty)
    }

    /// Exact: the body goes with its `Content-Length`, as a joined one would.
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left().iter().map(|part| part.len() as u64).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    #[tokio::test]
    async fn the_parts_go_in_order_with_their_length_and_nothing_between() {
        let params = Bytes::from_static(b"{\"s\":\"x\"}");
        let body = BodyParts::new([
            Bytes::from_static(b"{\"value\":"),
            params.clone(),
            Bytes::new(),
            Bytes::from_static(b"}"),
        ]);
        assert_eq!(body.size_hint().exact(), Some(19));
        let whole = body.clone().collect().await.unwrap().to_bytes();
        assert_eq!(&whole[..], b"{\"value\":{\"s\":\"x\"}}");
        assert_eq!(body.collect().await.unwrap().to_bytes(), whole, "a clone sends the same again");
    }
}
