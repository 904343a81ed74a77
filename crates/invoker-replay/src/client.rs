//! One HTTP/1.1 request on a connection of its own, with an API key: what the replay asks of
//! the scheduler and the capacity manager.

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use std::time::Duration;

/// The largest answer read (a record).
const MAX_ANSWER: usize = 1024 * 1024;

fn authority(url: &str) -> &str {
    url.trim_start_matches("http://").split('/').next().unwrap_or_default()
}

/// One request on a connection of its own: (status, body).
pub async fn request(method: &str, url: &str, key: Option<&str>, body: Option<String>) -> Result<(u16, Bytes), String> {
    let mut sender = invoker_http::connect::<Full<Bytes>>(authority(url)).await.map_err(|e| e.to_string())?;
    let path = url.trim_start_matches("http://").find('/').map_or("/", |i| &url.trim_start_matches("http://")[i..]);
    let mut builder = hyper::Request::builder().method(method).uri(path).header("host", authority(url));
    if let Some(key) = key {
        let basic = base64::engine::general_purpose::STANDARD.encode(key);
        builder = builder.header("authorization", format!("Basic {basic}"));
    }
    let request = match body {
        Some(body) => builder.header("content-type", "application/json").body(Full::new(Bytes::from(body))),
        None => builder.body(Full::new(Bytes::new())),
    }
    .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_ANSWER).collect().await.map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes()))
}

pub async fn get(url: &str, key: Option<&str>) -> Result<(u16, Bytes), String> {
    tokio::time::timeout(Duration::from_secs(5), request("GET", url, key, None))
        .await
        .unwrap_or_else(|_| Err("no answer within 5 s".into()))
}
