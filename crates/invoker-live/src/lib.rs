//! The live feed behind `/ui`: what changes in the pool (a container's state, the nodes, the
//! queue) and the activations as they end, as server-sent events, to whoever watches. Free
//! while nobody does: every publisher asks [`LiveFeed::watched`] first, and builds nothing
//! when it is false.
//!
//! A viewer gets a snapshot first (the pool's whole view, once), then the changes. The events
//! are framed once and shared by every viewer (`Bytes`); a viewer that falls behind the
//! bounded channel gets a new snapshot instead of the changes it missed.
//!
//! The page itself (`ui/`) and the stream's framing are shared by the invoker, the scheduler
//! and the capacity manager: each serves the same page, fed its own events.

#![forbid(unsafe_code)]

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::{broadcast, mpsc};

const PAGE: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// One of the page's files (`/ui`, `/ui/app.js`, `/ui/app.css`), answered with the page's own
/// files only allowed (no script from elsewhere, no frame, no plugin). Every process serves
/// the same page; what it shows follows the events it is sent.
pub fn asset(path: &str) -> Option<invoker_http::Response> {
    let (content_type, body) = match path {
        "/ui" | "/ui/" => ("text/html; charset=utf-8", PAGE),
        "/ui/app.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/ui/app.css" => ("text/css; charset=utf-8", STYLE),
        _ => return None,
    };
    let mut page = invoker_http::with_body(hyper::StatusCode::OK, content_type, Bytes::from_static(body.as_bytes()));
    let policy = "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'";
    page.headers_mut().insert("content-security-policy", hyper::header::HeaderValue::from_static(policy));
    Some(page)
}

/// An event stream's answer: `first`, then what `rest` is given.
pub fn event_stream(first: VecDeque<Bytes>, rest: mpsc::Receiver<Bytes>) -> hyper::Response<LiveBody> {
    let mut response = hyper::Response::new(LiveBody { first, rest });
    let headers = response.headers_mut();
    headers.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/event-stream"));
    headers.insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-store"));
    response
}

/// An event stream's body: the first frames, then what a forwarding task passes on, until it
/// stops (the process stops, or the viewer went away).
pub struct LiveBody {
    first: VecDeque<Bytes>,
    rest: mpsc::Receiver<Bytes>,
}

impl Body for LiveBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(first) = self.first.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        self.rest.poll_recv(cx).map(|next| next.map(|bytes| Ok(Frame::data(bytes))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Events a viewer may be behind before it gets a new snapshot.
const BACKLOG: usize = 4096;
/// The last activations a new viewer is shown.
const RECENT: usize = 50;

pub struct LiveFeed {
    events: broadcast::Sender<Bytes>,
    recent: Mutex<VecDeque<Bytes>>,
}

impl Default for LiveFeed {
    fn default() -> Self {
        LiveFeed { events: broadcast::channel(BACKLOG).0, recent: Mutex::new(VecDeque::new()) }
    }
}

/// One server-sent event: `event: <kind>` and its JSON on one `data:` line (JSON has no raw
/// newline).
pub fn frame(kind: &str, data: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(data).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    Bytes::from(format!("event: {kind}\ndata: {json}\n\n"))
}

impl LiveFeed {
    /// Whether anybody watches: publishers build nothing otherwise.
    pub fn watched(&self) -> bool {
        self.events.receiver_count() > 0
    }

    /// How many watch now.
    pub fn viewers(&self) -> usize {
        self.events.receiver_count()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Bytes> {
        self.events.subscribe()
    }

    pub fn publish(&self, kind: &str, data: &impl Serialize) {
        let _ = self.events.send(frame(kind, data));
    }

    /// An activation ended: kept among the last ones, and sent.
    pub fn activation(&self, row: &ActivationRow) {
        let event = frame("activation", row);
        let mut recent = self.recent.lock();
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(event.clone());
        drop(recent);
        let _ = self.events.send(event);
    }

    /// The last activations, oldest first, as sent.
    pub fn recent(&self) -> Vec<Bytes> {
        self.recent.lock().iter().cloned().collect()
    }
}

/// An activation as the view lists it.
#[derive(Serialize)]
pub struct ActivationRow<'a> {
    pub id: &'a str,
    pub action: String,
    pub status: &'a str,
    pub start: Option<&'a str>,
    pub wait_ms: Option<u64>,
    pub init_ms: Option<u64>,
    pub duration_ms: u64,
    pub end_ms: u64,
}

impl<'a> ActivationRow<'a> {
    pub fn of(record: &'a invoker_wire::model::ActivationRecord) -> Self {
        let number = |key: &str| record.annotation(key).and_then(|v| v.as_u64());
        ActivationRow {
            id: &record.activation_id,
            action: format!("{}/{}", record.namespace, record.name),
            status: &record.response.status,
            start: record.annotation("startKind").and_then(|v| v.as_str()),
            wait_ms: number("waitTime"),
            init_ms: number("initTime"),
            duration_ms: record.duration,
            end_ms: record.end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_sent_while_nobody_watches_and_late_viewers_see_the_last_activations() {
        let feed = LiveFeed::default();
        assert!(!feed.watched());
        let mut viewer = feed.subscribe();
        assert!(feed.watched());
        feed.publish("gone", &serde_json::json!({"id": 3}));
        assert_eq!(viewer.try_recv().unwrap(), Bytes::from("event: gone\ndata: {\"id\":3}\n\n"));
        drop(viewer);
        assert!(!feed.watched());
        let row = ActivationRow {
            id: "a",
            action: "guest/x".into(),
            status: "success",
            start: Some("warm"),
            wait_ms: Some(1),
            init_ms: None,
            duration_ms: 2,
            end_ms: 3,
        };
        for _ in 0..RECENT + 5 {
            feed.activation(&row);
        }
        assert_eq!(feed.recent().len(), RECENT);
    }
}
