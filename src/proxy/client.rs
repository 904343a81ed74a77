//! The OpenWhisk action runtime protocol, client side: `POST /init` once, `POST /run` per
//! activation, over one kept-alive connection pool per container.

use crate::factory::Transport;
use serde_json::Value;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("timed out")]
    Timeout,
    #[error("the runtime could not be reached or dropped the connection: {0}")]
    Connection(String),
}

/// A runtime's answer: its HTTP status and body (JSON when it parses).
#[derive(Debug)]
pub struct RuntimeResponse {
    pub status: u16,
    pub body: Result<Value, String>,
}

pub struct RuntimeClient {
    http: reqwest::Client,
    base: String,
}

impl RuntimeClient {
    pub fn new(transport: &Transport) -> Result<Self, String> {
        let builder = reqwest::Client::builder().pool_max_idle_per_host(64);
        let (builder, base) = match transport {
            Transport::Tcp(addr) => (builder.tcp_nodelay(true), format!("http://{addr}")),
            Transport::Unix(path) => (builder.unix_socket(path.as_path()), "http://localhost".to_string()),
        };
        let http = builder.build().map_err(|e| e.to_string())?;
        Ok(RuntimeClient { http, base })
    }

    pub async fn init(&self, body: &Value, timeout: Duration) -> Result<RuntimeResponse, RuntimeError> {
        self.post("/init", body, timeout).await
    }

    pub async fn run(&self, body: &Value, timeout: Duration) -> Result<RuntimeResponse, RuntimeError> {
        self.post("/run", body, timeout).await
    }

    async fn post(&self, path: &str, body: &Value, timeout: Duration) -> Result<RuntimeResponse, RuntimeError> {
        let request = self.http.post(format!("{}{path}", self.base)).json(body).send();
        let response = match tokio::time::timeout(timeout, request).await {
            Err(_) => return Err(RuntimeError::Timeout),
            Ok(Err(e)) => return Err(RuntimeError::Connection(e.to_string())),
            Ok(Ok(r)) => r,
        };
        let status = response.status().as_u16();
        let bytes = match tokio::time::timeout(timeout, response.bytes()).await {
            Err(_) => return Err(RuntimeError::Timeout),
            Ok(Err(e)) => return Err(RuntimeError::Connection(e.to_string())),
            Ok(Ok(b)) => b,
        };
        let body =
            serde_json::from_slice(&bytes).map_err(|_| String::from_utf8_lossy(&bytes).chars().take(200).collect());
        Ok(RuntimeResponse { status, body })
    }
}
