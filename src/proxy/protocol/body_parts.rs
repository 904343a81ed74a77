//! A request's body to a runtime as the parts it is made of, sent one after another and never
//! joined: a call's parameters go into the `/run` body as the slice of the caller's request they
//! are, between the few bytes before and after them, so a 64 MiB call is not copied once more
//! (and held, for the one resend a stale connection may need, as long as the run).

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Cheap to clone (each part is shared), which a resend on a fresh connection needs.
#[derive(Clone, Debug, Default)]
pub struct BodyParts(VecDeque<Bytes>);

impl BodyParts {
    pub fn new(parts: impl IntoIterator<Item = Bytes>) -> Self {
        BodyParts(parts.into_iter().filter(|p| !p.is_empty()).collect())
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
        Poll::Ready(self.0.pop_front().map(|part| Ok(Frame::data(part))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    /// Exact: the request goes with its `Content-Length`, as a joined body would.
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|part| part.len() as u64).sum())
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
