//! The runtime's HTTP/1.1 server: hyper's connection API on the runtime's one thread.
//!
//! Why not actix-web (as before): its streams are registered with the reactor for writing too,
//! so every time the invoker read a `/run` response the runtime woke for nothing (2.85 sleeps
//! per activation where 2 are needed; see BENCHMARKS.md). Unix connections here are
//! `ReadWatchedStream`s. The only client is the invoker that started the runtime, so there
//! are no idle timeouts: its kept-alive connections stay open between activations.

use super::handlers::{error, init, run_action, Runtime};
use super::options::MAX_BODY;
use http_body_util::BodyExt;
use http_body_util::Either;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, ALLOW};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use invoker_http::read_watched::ReadWatchedStream;
use invoker_http::streamed::Streamed;
use invoker_http::Response;
use invoker_wire::runtime::STREAM_TYPE;
use std::convert::Infallible;
use std::rc::Rc;
use std::time::Duration;

/// Connections open at once at most (the invoker opens one per run in flight).
const MAX_CONNECTIONS: usize = 1024;

pub(super) enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Serves `/init` and `/run` until the process ends.
pub(super) async fn serve(listener: Listener, runtime: Rc<Runtime>) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().await.map(|(stream, _)| {
                let _ = stream.set_nodelay(true);
                spawn_connection(TokioIo::new(stream), runtime.clone(), slot)
            }),
            Listener::Unix(l) => l
                .accept()
                .await
                .and_then(|(stream, _)| ReadWatchedStream::from_tokio(stream))
                .map(|stream| spawn_connection(stream, runtime.clone(), slot)),
        };
        if accepted.is_err() {
            // Out of descriptors, most likely: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn spawn_connection<I>(io: I, runtime: Rc<Runtime>, slot: tokio::sync::OwnedSemaphorePermit)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
{
    let service = service_fn(move |request| {
        let runtime = runtime.clone();
        async move {
            let mut response = route(&runtime, request).await;
            // A streamed run's body goes out as the action makes it.
            Ok::<_, Infallible>(match response.extensions_mut().remove::<Streamed>() {
                Some(streamed) => response.map(|_| Either::Right(streamed.into_body())),
                None => response.map(Either::Left),
            })
        }
    });
    tokio::task::spawn_local(async move {
        let _ = http1::Builder::new().serve_connection(io, service).await;
        drop(slot);
    });
}

async fn route(runtime: &Rc<Runtime>, request: Request<Incoming>) -> Response {
    let is_init = match request.uri().path() {
        "/init" => true,
        "/run" => false,
        other => {
            return error(StatusCode::NOT_FOUND, format!("no route {}", other.chars().take(200).collect::<String>()))
        }
    };
    if request.method() != Method::POST {
        let mut response = error(StatusCode::METHOD_NOT_ALLOWED, format!("{} takes POST only", request.uri().path()));
        response.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    let streams = request
        .headers()
        .get_all(ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim() == STREAM_TYPE)));
    let too_large = || error(StatusCode::PAYLOAD_TOO_LARGE, format!("the body is larger than {MAX_BODY} bytes"));
    if hyper::body::Body::size_hint(request.body()).lower() > MAX_BODY as u64 {
        return too_large();
    }
    let body = match read_body(request.into_body()).await {
        Ok(Some(body)) => body,
        Ok(None) => return too_large(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("the body could not be read: {e}")),
    };
    if is_init {
        init(runtime, &body).await
    } else {
        run_action(runtime, body, streams).await
    }
}

/// The body in one buffer of its declared size, each part copied in as it comes and let go
/// (no list of parts joined after: the runtime's memory counts against the action's, and a
/// large call would need it twice); `None` past [`MAX_BODY`].
async fn read_body(mut body: Incoming) -> Result<Option<Vec<u8>>, hyper::Error> {
    let declared = hyper::body::Body::size_hint(&body).lower() as usize;
    // One byte more: a `/run` body becomes a line, and its newline must not move it.
    let mut whole = Vec::with_capacity(declared.min(MAX_BODY) + 1);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if whole.len() + data.len() > MAX_BODY {
                return Ok(None);
            }
            whole.extend_from_slice(&data);
        }
    }
    Ok(Some(whole))
}
