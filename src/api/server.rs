//! The HTTP/1.1 server under the API: hyper's connection API on the invoker's one thread.
//!
//! Why not a framework: a warm activation's request is one route, and the framework's share of
//! the invoker's instructions (actix-web's decoder alone zeroed 3 KiB of header slots per parse)
//! was larger than the activation's own bookkeeping; see BENCHMARKS.md. Everything is bounded:
//! connections, the time to send a request's head, the size and time of its body, the requests
//! a connection may send ahead ([`READ_BUFFER`]), the time a client may leave an answer unread
//! (`[api] write_timeout`, see `wire.rs`), and the bytes of answers all clients together have
//! not taken yet (`[api] unread_answers_mb`, [`UnreadAnswers`]).

use super::state::AppState;
use super::wire::{ApiStream, HeldAnswer};
use http_body_util::Either;
use hyper::body::Body as _;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use invoker_http::streamed::Streamed;
use invoker_http::Follows;
use serde_json::json;
use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Connections open at once at most; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 25_000;

/// A client must send a request's head within this, and an idle kept-alive connection closes
/// after it.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// How long in-flight requests get to finish once the server stops.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What hyper reads ahead of a connection's requests at most (their heads, pipelined requests
/// behind an answer the client has not read): enough for a 100 KB URI to be refused as such.
pub const READ_BUFFER: usize = 128 * 1024;

/// The header an activation's answer names it in.
const ACTIVATION_ID: &str = "x-openwhisk-activation-id";

/// The bytes of answers sent and not yet taken by their clients, over every connection, in
/// KiB. A connection holds the permit of its answer until hyper has written it out (see
/// `wire.rs`), its next request comes, or it closes (a client that reads nothing is closed after
/// the write timeout).
struct UnreadAnswers {
    budget: Arc<Semaphore>,
    mb: u32,
}

impl UnreadAnswers {
    fn new(mb: u32) -> Self {
        UnreadAnswers { budget: Arc::new(Semaphore::new(mb as usize * 1024)), mb }
    }

    /// A read's refusal before it is answered, while less than 1 MB of the budget is left: an
    /// answer built only to be refused would cost the invoker's one thread as much as a sent one.
    fn refuse_early(&self, read: bool) -> Option<invoker_http::Response> {
        (read && self.budget.available_permits() < 1024).then(|| self.refusal())
    }

    fn refusal(&self) -> invoker_http::Response {
        super::error::ApiError::Unavailable(format!(
            "the server holds {} MB of answers its clients have not read yet ([api] unread_answers_mb); \
             read your answers, or try again",
            self.mb
        ))
        .into_response()
    }

    /// `response` with its bytes counted in `held` (the connection's slot). When the budget has
    /// no room for it, what it can say truthfully instead: an activation's answer becomes 202
    /// with its id (it ran; its record is stored, as for a blocking call that outlasted its
    /// wait), a read's a 503 that says why (nothing changed, safe to retry); a write's answer
    /// goes out uncounted (it says what was done, and refusing it would hide that).
    fn count(&self, read: bool, response: invoker_http::Response, held: &HeldAnswer) -> invoker_http::Response {
        let bytes = response.body().size_hint().exact().unwrap_or(0);
        let kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        if let Ok(permit) = self.budget.clone().try_acquire_many_owned(kib) {
            *held.borrow_mut() = Some(permit);
            return response;
        }
        let activation = response.headers().get(ACTIVATION_ID).cloned();
        match activation {
            Some(id) => {
                let mut accepted = super::call::json(
                    StatusCode::ACCEPTED,
                    &json!({ "activationId": id.to_str().unwrap_or_default() }),
                );
                accepted.headers_mut().insert(ACTIVATION_ID, id);
                accepted
            }
            None if read => {
                tracing::debug!(bytes, "an answer was refused: clients have not taken {} MB of answers", self.mb);
                self.refusal()
            }
            None => response,
        }
    }
}

/// Serves `state` on `listener` until `stop` is cancelled; then closes idle connections, lets
/// requests in flight finish (for at most `STOP_GRACE`) and returns.
pub async fn serve(listener: TcpListener, state: Arc<AppState>, stop: CancellationToken) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let write_timeout = state.config.api.write_timeout;
    let unread = Rc::new(UnreadAnswers::new(state.config.api.unread_answers_mb));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEAD_TIMEOUT).max_buf_size(READ_BUFFER);
    loop {
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely: back off instead of spinning.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let held = HeldAnswer::default();
        let stream = TokioIo::new(ApiStream::new(stream, write_timeout, held.clone()));
        let unread = unread.clone();
        let stop = stop.clone();
        let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let (state, unread, held, stop) = (state.clone(), unread.clone(), held.clone(), stop.clone());
            async move {
                // The answer before on this connection is written: its bytes are free.
                held.borrow_mut().take();
                if request.uri().path() == "/v1/live" {
                    // A stream, not an answer: it holds no budget of unread answers.
                    let (head, _) = request.into_parts();
                    return Ok(match super::live::events(&state, head, stop).await {
                        Ok(events) => events.map(|body| Either::Right(Either::Left(body))),
                        Err(e) => e.into_response().map(Either::Left),
                    });
                }
                let read = matches!(*request.method(), hyper::Method::GET | hyper::Method::HEAD);
                if let Some(refused) = unread.refuse_early(read) {
                    return Ok(refused.map(Either::Left));
                }
                let mut response = state.handle(request).await;
                // An answer in two parts: read as it is written, it holds no budget either.
                if let Some(follows) = response.extensions_mut().remove::<Follows>() {
                    return Ok(response.map(|_| Either::Right(Either::Right(Either::Left(follows.into_body())))));
                }
                // A streamed answer: its parts wait in a bounded channel, not in this budget.
                if let Some(streamed) = response.extensions_mut().remove::<Streamed>() {
                    return Ok(response.map(|_| Either::Right(Either::Right(Either::Right(streamed.into_body())))));
                }
                Ok::<_, Infallible>(unread.count(read, response, &held).map(Either::Left))
            }
        });
        let connection = graceful.watch(http.serve_connection(stream, service));
        tokio::task::spawn_local(async move {
            // A client that goes away mid-request is no error of ours.
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(STOP_GRACE, graceful.shutdown()).await.is_err() {
        tracing::warn!("requests still in flight after {STOP_GRACE:?} were cut");
    }
}
