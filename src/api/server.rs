//! The HTTP/1.1 server under the API: hyper's connection API on the invoker's one thread.
//!
//! Why not a framework: a warm activation's request is one route, and the framework's share of
//! the invoker's instructions (actix-web's decoder alone zeroed 3 KiB of header slots per parse)
//! was larger than the activation's own bookkeeping; see BENCHMARKS.md. Everything is bounded:
//! connections, the time to send a request's head, the size and time of its body.

use super::wire::ApiStream;
use super::AppState;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
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

/// Serves `state` on `listener` until `stop` is cancelled; then closes idle connections, lets
/// requests in flight finish (for at most `STOP_GRACE`) and returns.
pub async fn serve(listener: TcpListener, state: Arc<AppState>, stop: CancellationToken) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEAD_TIMEOUT);
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
        let service = service_fn(move |request| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(state.handle(request).await) }
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(ApiStream::new(stream)), service));
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
