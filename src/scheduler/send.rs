//! Handing an activation to an invoker: OpenWhisk's `ActivationMessage` to its shim
//! (`POST /v1/activations`, the controller key) over kept-alive connections, one idle stack per
//! invoker. What came back decides what happens next, and the line between "nothing ran" and
//! "it may have run" is drawn here: a connection refused, a request never written, or a 503
//! whose record says nothing ran may go to another invoker; anything after the request was
//! written never does.

use crate::model::{ActivationRecord, Rejection};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

/// Idle connections kept per invoker at most.
const MAX_IDLE: usize = 64;
/// Largest answer read: a record with its result and logs.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// What became of one hand-over.
#[derive(Debug)]
pub enum Sent {
    /// The invoker ran it (or started it and it ended there): its record.
    Finished(Box<ActivationRecord>),
    /// Nothing ran there: another invoker may take it.
    Refused(String),
    /// It may have started, and no record came back: it ends here, never run again.
    Lost(String),
}

pub struct InvokerClient {
    /// `Basic <base64 of the controller key>`.
    authorization: String,
    /// Invoker address (`host:port`) → idle connections.
    idle: Mutex<HashMap<String, Vec<SendRequest<Full<Bytes>>>>>,
}

impl InvokerClient {
    pub fn new(controller_key: &str) -> Self {
        use base64::Engine as _;
        let authorization = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(controller_key));
        InvokerClient { authorization, idle: Mutex::new(HashMap::new()) }
    }

    /// `message` to the invoker at `authority`, answered within `timeout`.
    pub async fn send(&self, authority: &str, message: Bytes, timeout: Duration) -> Sent {
        match tokio::time::timeout(timeout, self.exchange(authority, message)).await {
            Err(_) => Sent::Lost(format!("no answer within {timeout:?}")),
            Ok(Err(sent)) => sent,
            Ok(Ok((status, body))) => interpret(status, &body),
        }
    }

    async fn exchange(&self, authority: &str, message: Bytes) -> Result<(u16, Bytes), Sent> {
        let mut request = Some(self.request(authority, message)?);
        // A kept-alive connection the invoker closed meanwhile takes nothing: the request goes
        // on the next one, or a new one. A new one that takes nothing either ends the attempt:
        // nothing was sent, so another invoker may take it (looping would only wait for the
        // timeout and then call it lost).
        loop {
            let pooled = self.idle.lock().get_mut(authority).and_then(Vec::pop);
            let is_new = pooled.is_none();
            let mut sender = match pooled {
                Some(sender) => sender,
                None => {
                    crate::http::connect(authority).await.map_err(|e| Sent::Refused(format!("unreachable: {e}")))?
                }
            };
            let unsent = |reason: String| Sent::Refused(format!("a new connection took nothing: {reason}"));
            if let Err(e) = sender.ready().await {
                if is_new {
                    return Err(unsent(e.to_string()));
                }
                continue;
            }
            let fresh = request.take().expect("a request to send");
            let response = match sender.try_send_request(fresh).await {
                Ok(response) => response,
                Err(mut e) => match e.take_message() {
                    Some(_) if is_new => return Err(unsent(e.error().to_string())),
                    Some(unsent) => {
                        request = Some(unsent);
                        continue;
                    }
                    None => return Err(Sent::Lost(format!("the connection broke: {}", e.error()))),
                },
            };
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| Sent::Lost(format!("the answer broke off: {e}")))?
                .to_bytes();
            let mut idle = self.idle.lock();
            let stack = idle.entry(authority.to_string()).or_default();
            if stack.len() < MAX_IDLE {
                stack.push(sender);
            }
            return Ok((status, body));
        }
    }

    fn request(&self, authority: &str, message: Bytes) -> Result<hyper::Request<Full<Bytes>>, Sent> {
        hyper::Request::post("/v1/activations")
            .header(hyper::header::HOST, authority)
            .header(hyper::header::AUTHORIZATION, &self.authorization)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(message))
            .map_err(|e| Sent::Refused(format!("the request could not be made: {e}")))
    }

    /// Forgets the connections of an invoker that left.
    pub fn forget(&self, authority: &str) {
        self.idle.lock().remove(authority);
    }
}

/// The part of a `CombinedCompletionAndResultMessage` the scheduler keeps: the record, read in
/// one pass (no intermediate JSON tree).
#[derive(serde::Deserialize)]
struct CompletionMessage {
    response: ActivationRecord,
}

/// The invoker's answer: a `CombinedCompletionAndResultMessage` with the record, or an error.
fn interpret(status: u16, body: &[u8]) -> Sent {
    let record = serde_json::from_slice::<CompletionMessage>(body).ok().map(|m| m.response);
    let error = || {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        parsed.as_ref().and_then(|v| v["error"].as_str()).map_or_else(
            || String::from_utf8_lossy(body).chars().take(200).collect::<String>(),
            |e| e.chars().take(500).collect(),
        )
    };
    match (status, record) {
        (_, Some(record)) => {
            let rejected = record.annotation("rejected").and_then(Value::as_str).is_some_and(Rejection::ran_nothing);
            if rejected && matches!(status, 400 | 503) {
                Sent::Refused(record.response.result["error"].as_str().unwrap_or("refused").to_string())
            } else {
                Sent::Finished(Box::new(record))
            }
        }
        // Before anything ran: a draining invoker, a namespace at its limit there, a key it
        // does not take, an action it could not fetch.
        (401 | 403 | 404 | 429 | 503, None) => Sent::Refused(format!("answered {status}: {}", error())),
        (202, None) => Sent::Lost("it accepted the activation but did not answer with its end".into()),
        (_, None) => Sent::Lost(format!("answered {status}: {}", error())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(annotations: Value) -> Value {
        json!({ "response": {
            "namespace": "guest", "name": "a", "version": "0.0.1", "subject": "guest",
            "activationId": "0123456789abcdef0123456789abcdef", "start": 1, "end": 2, "duration": 1,
            "statusCode": 3, "response": { "status": "whisk internal error", "statusCode": 3, "success": false, "result": { "error": "why" } },
            "logs": [], "annotations": annotations, "publish": false
        }})
    }

    #[test]
    fn only_what_ran_nothing_goes_elsewhere() {
        let body = |v: Value| v.to_string().into_bytes();
        let refused = body(record(json!([{ "key": "rejected", "value": "create_failed" }])));
        assert!(matches!(interpret(503, &refused), Sent::Refused(m) if m == "why"));
        let lost_container = body(record(json!([{ "key": "rejected", "value": "container_lost" }])));
        assert!(matches!(interpret(503, &lost_container), Sent::Finished(_)), "it ran: its record stands");
        assert!(matches!(interpret(200, &body(record(json!([])))), Sent::Finished(_)));
        let draining = body(json!({ "error": "the invoker is shutting down", "code": "x" }));
        assert!(matches!(interpret(503, &draining), Sent::Refused(m) if m.contains("shutting down")));
        assert!(matches!(interpret(500, b"oops"), Sent::Lost(_)), "a 500 may have run");
        assert!(matches!(interpret(202, b"{}"), Sent::Lost(_)));
    }
}
