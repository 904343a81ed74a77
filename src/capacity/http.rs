//! The manager's own small API: `GET /v1/capacity` (each group's invokers by state, demand,
//! target, predictor, the last decisions with their reasons) and `GET /metrics`, both with the
//! admin key; `GET /ping` for anyone. Nothing else: the manager serves no actions.

use super::manager::CapacityStatus;
use super::metrics::CapacityMetrics;
use crate::http::{json_value, with_body, Response};
use hyper::{Method, StatusCode};
use parking_lot::Mutex;
use serde_json::json;
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
        let error = |status: StatusCode, message: &str| json_value(status, &json!({ "error": message }));
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
            _ => error(StatusCode::NOT_FOUND, "no such route: /v1/capacity, /metrics and /ping"),
        }
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
            let api = self.clone();
            let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let authorization = request.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
                let response = api.answer(request.method(), request.uri().path(), authorization);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
    }
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
