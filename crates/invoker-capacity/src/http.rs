//! The manager's own small API: `GET /v1/capacity` (each group's invokers by state, demand,
//! target, predictor, the last decisions with their reasons) and `GET /metrics`, both with the
//! admin key; `GET /ping` for anyone. Nothing else: the manager serves no actions.

use super::manager::CapacityStatus;
use super::metrics::CapacityMetrics;
use bytes::Bytes;
use http_body_util::Either;
use hyper::{Method, StatusCode};
use invoker_http::body_parts::BodyParts;
use invoker_http::{json_value, with_body, Response};
use invoker_live::LiveBody;
use parking_lot::Mutex;
use serde_json::json;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct CapacityApi {
    /// `Basic <base64 of the admin key>`.
    admin: Arc<str>,
    pub status: Arc<Mutex<CapacityStatus>>,
    pub metrics: Arc<CapacityMetrics>,
}

impl CapacityApi {
    pub fn new(admin_key: &str, status: Arc<Mutex<CapacityStatus>>, metrics: Arc<CapacityMetrics>) -> Self {
        use base64::Engine as _;
        let admin = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(admin_key)).into();
        CapacityApi { admin, status, metrics }
    }

    pub fn answer(&self, method: &Method, path: &str, authorization: Option<&str>) -> Response {
        let admin = authorization == Some(&*self.admin);
        match (method, path) {
            (&Method::GET, "/ping") => json_value(StatusCode::OK, &json!({})),
            (&Method::GET, "/v1/capacity" | "/metrics") if authorization.is_none() => {
                error(StatusCode::UNAUTHORIZED, "the admin key is required")
            }
            (&Method::GET, "/v1/capacity" | "/metrics") if !admin => {
                error(StatusCode::FORBIDDEN, "only the admin key may read this")
            }
            (&Method::GET, "/v1/capacity") => {
                let status = serde_json::to_value(&*self.status.lock()).unwrap_or_default();
                json_value(StatusCode::OK, &status)
            }
            (&Method::GET, "/metrics") => {
                with_body(StatusCode::OK, "application/openmetrics-text; version=1.0.0", self.metrics.render())
            }
            (_, "/ping" | "/v1/capacity" | "/metrics") => error(StatusCode::METHOD_NOT_ALLOWED, "GET only"),
            _ => error(StatusCode::NOT_FOUND, "no such route: /v1/capacity, /v1/live, /metrics, /ui and /ping"),
        }
    }

    /// The live view's first event: each group with its last hour and its last decisions.
    fn live_snapshot(&self) -> Bytes {
        let status = self.status.lock();
        let groups: Vec<_> = status.groups.iter().map(|g| live_group(g, g.history.iter().collect())).collect();
        invoker_live::frame("capacity", &json!({ "snapshot": true, "leader": status.leader, "groups": groups }))
    }

    /// What a round changed: each group's newest sample and its last decisions.
    fn live_round(&self) -> Bytes {
        let status = self.status.lock();
        let groups: Vec<_> =
            status.groups.iter().map(|g| live_group(g, g.history.back().into_iter().collect())).collect();
        invoker_live::frame("capacity", &json!({ "snapshot": false, "leader": status.leader, "groups": groups }))
    }

    /// `GET /v1/live` (the admin key): the capacity view's events, a snapshot and then each
    /// round as the manager decides it.
    fn live(
        &self,
        authorization: Option<&str>,
        stop: CancellationToken,
    ) -> hyper::Response<Either<BodyParts, LiveBody>> {
        match authorization {
            None => return error(StatusCode::UNAUTHORIZED, "the admin key is required").map(Either::Left),
            Some(given) if given != &*self.admin => {
                return error(StatusCode::FORBIDDEN, "only the admin key may read this").map(Either::Left)
            }
            Some(_) => {}
        }
        let mut rounds = self.status.lock().rounds.0.subscribe();
        let first = VecDeque::from([Bytes::from_static(b"retry: 2000\n\n"), self.live_snapshot()]);
        let (tx, rest) = tokio::sync::mpsc::channel(64);
        let api = self.clone();
        tokio::spawn(async move {
            loop {
                let frame = tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tx.closed() => return,
                    changed = rounds.changed() => match changed {
                        Ok(()) => api.live_round(),
                        Err(_) => return,
                    },
                    _ = tokio::time::sleep(std::time::Duration::from_secs(15)) => Bytes::from_static(b": still here\n\n"),
                };
                // A viewer that does not read is sent nothing more: it reconnects for a snapshot.
                if tx.try_send(frame).is_err() {
                    return;
                }
            }
        });
        invoker_live::event_stream(first, rest).map(Either::Right)
    }

    /// Serves until `stop` (every request is answered from memory: no body is read).
    pub async fn serve(self, listener: TcpListener, stop: CancellationToken) {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(std::time::Duration::from_secs(30));
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let (api, stop) = (self.clone(), stop.clone());
            let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let authorization = request.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
                let response = match (request.method(), request.uri().path()) {
                    (&Method::GET, "/v1/live") => api.live(authorization, stop.clone()),
                    (method, path) => match invoker_live::asset(path).filter(|_| method == Method::GET) {
                        Some(page) => page.map(Either::Left),
                        None => api.answer(method, path, authorization).map(Either::Left),
                    },
                };
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    json_value(status, &json!({ "error": message }))
}

/// A group as the live view draws it, with `history` (its last hour, or its newest round).
fn live_group(g: &super::manager::GroupStatus, history: Vec<&super::manager::Sample>) -> serde_json::Value {
    json!({
        "name": g.name, "predictor": g.predictor, "demand_mb": g.demand_mb, "target_mb": g.target_mb,
        "target_invokers": g.target_invokers, "counts": g.counts, "history": history,
        "decisions": g.decisions.iter().rev().take(10).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_key_reads_the_status_and_nobody_else() {
        use base64::Engine as _;
        let api = CapacityApi::new("admin:secret", Arc::default(), Arc::default());
        let basic = |key: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(key));
        assert_eq!(api.answer(&Method::GET, "/ping", None).status(), 200);
        assert_eq!(api.answer(&Method::GET, "/v1/capacity", None).status(), 401);
        assert_eq!(api.answer(&Method::GET, "/v1/capacity", Some(&basic("guest:x"))).status(), 403);
        assert_eq!(api.answer(&Method::GET, "/v1/capacity", Some(&basic("admin:secret"))).status(), 200);
        assert_eq!(api.answer(&Method::GET, "/metrics", Some(&basic("admin:secret"))).status(), 200);
        assert_eq!(api.answer(&Method::POST, "/v1/capacity", Some(&basic("admin:secret"))).status(), 405);
        assert_eq!(api.answer(&Method::GET, "/v1/actions", None).status(), 404);
    }
}
