//! etcd through its v3 JSON gateway (`/v3/kv/*`, `/v3/lease/*`, served by every etcd since 3.4),
//! over the hyper client the invoker already has: no gRPC stack and no `protoc` for a few calls
//! every half second. Keys and values travel base64-encoded, as the gateway wants.

use crate::kv::{ClusterKv, LeaseId};
use crate::mirror::{Change, Ranged, Source, Watch, WatchEnd, WatchNews};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bound on one call, connecting included.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest answer read (a range over every container of a large cluster fits).
const MAX_ANSWER: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No member answered; the last one tried, and why.
    #[error("etcd {endpoint}: {source}")]
    Unreachable { endpoint: String, source: StreamError },
    /// A member answered with an error: its gRPC code (`code`, 0 when the gateway gave none)
    /// and its words.
    #[error("etcd answered {status}: {message}")]
    Refused { status: u16, code: i64, message: String },
    #[error("etcd endpoint '{0}' is not http://host:port")]
    BadEndpoint(String),
}

/// gRPC's `NOT_FOUND`, as the gateway gives it (`"code": 5`): a lease already gone.
const GRPC_NOT_FOUND: i64 = 5;

impl EtcdError {
    /// Whether etcd said that what the call names does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, EtcdError::Refused { code: GRPC_NOT_FOUND, .. })
    }
}

/// Why a call to one member, or a stream from it, gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Connection(#[from] invoker_http::ConnectionError),
    #[error("the request could not be built: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("an object past {MAX_ANSWER} bytes")]
    TooLarge,
    #[error("etcd closed the stream")]
    Closed,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

use invoker_wire::cluster::authority;

/// One etcd cluster, reached through the member that answered last, or the next one that
/// answers: a member that hangs costs one call's bound once, not on every call after it.
#[derive(Clone, Debug)]
pub struct Etcd {
    endpoints: Arc<[(String, String)]>,
    /// The index of the member that answered last.
    preferred: Arc<AtomicUsize>,
}

impl Etcd {
    /// `endpoints` are `http://host:port` URLs of the cluster's members.
    pub fn new(endpoints: &[String]) -> Result<Self, EtcdError> {
        let parsed = endpoints
            .iter()
            .map(|e| {
                let authority = authority(e).ok_or_else(|| EtcdError::BadEndpoint(e.clone()))?;
                Ok((e.clone(), authority.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if parsed.is_empty() {
            return Err(EtcdError::BadEndpoint(String::new()));
        }
        Ok(Etcd { endpoints: parsed.into(), preferred: Arc::new(AtomicUsize::new(0)) })
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        match self.on_first_answering(|authority| post(authority, path, &body)).await? {
            (_, (200, answer)) => Ok(answer),
            (_, (status, answer)) => Err(refused(status, &answer)),
        }
    }

    /// `request` to each member in turn (each within `CALL_TIMEOUT`), from the one that
    /// answered last, until one answers; with the index of the member that did.
    async fn on_first_answering<'a, T, F>(
        &'a self,
        request: impl Fn(&'a str) -> F,
    ) -> Result<(usize, (u16, T)), EtcdError>
    where
        F: std::future::Future<Output = Result<(u16, T), StreamError>>,
    {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = None;
        for member in (0..self.endpoints.len()).map(|i| (first + i) % self.endpoints.len()) {
            let (endpoint, authority) = &self.endpoints[member];
            let source = match tokio::time::timeout(CALL_TIMEOUT, request(authority)).await {
                Ok(Ok(answer)) => {
                    self.preferred.store(member, Ordering::Relaxed);
                    return Ok((member, answer));
                }
                Ok(Err(e)) => e,
                Err(_) => StreamError::Timeout(CALL_TIMEOUT),
            };
            last = Some(EtcdError::Unreachable { endpoint: endpoint.clone(), source });
        }
        Err(last.expect("at least one endpoint"))
    }

    /// Whether `member` itself serves a linearizable read now: a member frozen, or cut off
    /// from its cluster's leader, does not, though the others do.
    async fn member_serves(&self, member: usize, prefix: &str) -> bool {
        let (endpoint, authority) = &self.endpoints[member];
        let body = json!({ "key": b64(prefix), "count_only": true, "limit": 1 });
        match tokio::time::timeout(CALL_TIMEOUT, post(authority, "/v3/kv/range", &body)).await {
            Ok(Ok((200, _))) => true,
            outcome => {
                tracing::debug!(%endpoint, "etcd member does not serve a read: {outcome:?}");
                if self.preferred.load(Ordering::Relaxed) == member {
                    self.preferred.store((member + 1) % self.endpoints.len(), Ordering::Relaxed);
                }
                false
            }
        }
    }
}

/// A status other than 200, with the gateway's message.
fn refused(status: u16, answer: &Value) -> EtcdError {
    let code = answer["code"].as_i64().unwrap_or(0);
    EtcdError::Refused { status, code, message: answer["message"].as_str().unwrap_or("").to_string() }
}

/// One POST of JSON on a new connection (calls are rare: a few per publish interval); the
/// answer is the first JSON object (a keep-alive answer is a stream that stays open).
async fn post(authority: &str, path: &str, body: &Value) -> Result<(u16, Value), StreamError> {
    let (status, mut stream) = post_for_stream(authority, path, body).await?;
    Ok((status, stream.next().await?))
}

/// A POST of JSON whose answer is read as a stream of JSON objects.
async fn post_for_stream(authority: &str, path: &str, body: &Value) -> Result<(u16, JsonStream), StreamError> {
    let mut sender = invoker_http::connect(authority).await?;
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let response = sender.send_request(request).await.map_err(invoker_http::ConnectionError::from)?;
    let status = response.status().as_u16();
    Ok((status, JsonStream { body: response.into_body(), buffer: Vec::new() }))
}

/// The gateway's answer: JSON objects, one after another, for as long as the call lasts (one
/// for a plain call, a watch's news for a watch).
pub struct JsonStream {
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
}

impl JsonStream {
    /// The next object, or why there is none (closed, broken, or an object past the bound).
    pub async fn next(&mut self) -> Result<Value, StreamError> {
        loop {
            let mut objects = serde_json::Deserializer::from_slice(&self.buffer).into_iter::<Value>();
            match objects.next() {
                Some(Ok(value)) => {
                    let used = objects.byte_offset();
                    self.buffer.drain(..used);
                    return Ok(value);
                }
                Some(Err(e)) if !e.is_eof() => return Err(StreamError::NotJson(e)),
                _ => {}
            }
            if self.buffer.len() > MAX_ANSWER {
                return Err(StreamError::TooLarge);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.buffer.extend_from_slice(data);
                    }
                }
                Some(Err(e)) => return Err(invoker_http::ConnectionError::from(e).into()),
                None => return Err(StreamError::Closed),
            }
        }
    }
}

/// The gateway's watch stream, read as a watch's news, and the member that serves it.
pub struct WatchStream {
    json: JsonStream,
    etcd: Etcd,
    member: usize,
    prefix: String,
}

impl Watch for WatchStream {
    type Error = StreamError;

    async fn next(&mut self) -> Result<WatchNews, StreamError> {
        self.json.next().await.map(|object| watch_news(&object))
    }

    /// Asks the watch's own member: another member's answer says nothing of this stream.
    async fn still_served(&self) -> bool {
        self.etcd.member_serves(self.member, &self.prefix).await
    }
}

/// Reads one object of the gateway's watch stream.
pub fn watch_news(object: &Value) -> WatchNews {
    if !object["error"].is_null() {
        return WatchNews::Ended(WatchEnd::Failed(object["error"]["message"].as_str().unwrap_or("an error").into()));
    }
    let result = &object["result"];
    if result["canceled"].as_bool() == Some(true) {
        let compacted = int(&result["compact_revision"]);
        return WatchNews::Ended(if compacted > 0 {
            WatchEnd::Compacted(compacted)
        } else {
            WatchEnd::Cancelled(result["cancel_reason"].as_str().unwrap_or("no reason given").into())
        });
    }
    let Some(events) = result["events"].as_array() else { return WatchNews::Nothing };
    let changes = events
        .iter()
        .map(|event| {
            let key = unb64(&event["kv"]["key"]);
            // A put is the protocol's default, so the gateway leaves its type out.
            match event["type"].as_str() {
                Some("DELETE") => Change::Delete { key },
                _ => Change::Put { key, value: unb64(&event["kv"]["value"]) },
            }
        })
        .collect();
    WatchNews::Changes(changes)
}

impl Source for Etcd {
    type Error = EtcdError;
    type Watch = WatchStream;

    /// Every key under `prefix` with its value, and the store's revision they were read at
    /// (a watch from the next revision misses nothing and repeats nothing).
    async fn get_prefix_at(&self, prefix: &str) -> Result<Ranged, EtcdError> {
        let range_end = B64.encode(prefix_end(prefix));
        let answer = self.call("/v3/kv/range", json!({ "key": b64(prefix), "range_end": range_end })).await?;
        let kvs = answer["kvs"].as_array().map(Vec::as_slice).unwrap_or_default();
        let pairs = kvs.iter().map(|kv| (unb64(&kv["key"]), unb64(&kv["value"]))).collect();
        Ok((pairs, int(&answer["header"]["revision"])))
    }

    /// Opens the gateway's watch stream of every change under `prefix` from `revision`, on the
    /// first member that answers.
    async fn watch_prefix(&self, prefix: &str, revision: i64) -> Result<WatchStream, EtcdError> {
        let create = json!({ "create_request": {
            "key": b64(prefix), "range_end": B64.encode(prefix_end(prefix)), "start_revision": revision.to_string(),
        }});
        match self.on_first_answering(|authority| post_for_stream(authority, "/v3/watch", &create)).await? {
            (member, (200, json)) => Ok(WatchStream { json, etcd: self.clone(), member, prefix: prefix.to_string() }),
            (_, (status, mut stream)) => Err(refused(status, &stream.next().await.unwrap_or_default())),
        }
    }
}

fn b64(s: &str) -> String {
    B64.encode(s)
}

fn unb64(v: &Value) -> String {
    v.as_str().and_then(|s| B64.decode(s).ok()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// The gateway writes 64-bit numbers as strings.
fn int(v: &Value) -> i64 {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_i64()).unwrap_or(0)
}

/// The first key after every key that starts with `prefix`, for a range over the prefix.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl ClusterKv for Etcd {
    type Error = EtcdError;

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, EtcdError> {
        let answer = self.call("/v3/lease/grant", json!({ "TTL": ttl.as_secs().max(1) })).await?;
        Ok(LeaseId(int(&answer["ID"])))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, EtcdError> {
        let answer = self.call("/v3/lease/keepalive", json!({ "ID": lease.0.to_string() })).await?;
        let ttl = int(&answer["result"]["TTL"]);
        Ok((ttl > 0).then(|| Duration::from_secs(ttl as u64)))
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), EtcdError> {
        match self.call("/v3/lease/revoke", json!({ "ID": lease.0.to_string() })).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn put(&self, key: &str, value: &str, lease: Option<LeaseId>) -> Result<(), EtcdError> {
        let mut body = json!({ "key": b64(key), "value": b64(value) });
        if let Some(lease) = lease {
            body["lease"] = json!(lease.0.to_string());
        }
        self.call("/v3/kv/put", body).await.map(|_| ())
    }

    async fn create(&self, key: &str, value: &str, lease: LeaseId) -> Result<bool, EtcdError> {
        let body = json!({
            "compare": [{ "key": b64(key), "target": "CREATE", "create_revision": "0", "result": "EQUAL" }],
            "success": [{ "request_put": { "key": b64(key), "value": b64(value), "lease": lease.0.to_string() } }],
        });
        let answer = self.call("/v3/kv/txn", body).await?;
        Ok(answer["succeeded"].as_bool().unwrap_or(false))
    }

    async fn get(&self, key: &str) -> Result<Option<(String, LeaseId)>, EtcdError> {
        let answer = self.call("/v3/kv/range", json!({ "key": b64(key) })).await?;
        Ok(answer["kvs"]
            .as_array()
            .and_then(|kvs| kvs.first())
            .map(|kv| (unb64(&kv["value"]), LeaseId(int(&kv["lease"])))))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>, EtcdError> {
        self.get_prefix_at(prefix).await.map(|(pairs, _)| pairs)
    }

    async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        self.call("/v3/kv/deleterange", json!({ "key": b64(key) })).await.map(|_| ())
    }

    fn mirror(
        &self,
        prefix: &str,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::sync::watch::Receiver<super::mirror::Snapshot> {
        crate::mirror::mirror(self.clone(), prefix.to_string(), stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateways_watch_objects_read_as_changes_or_as_the_end_of_the_watch() {
        let created = json!({"result": {"header": {"revision": "7"}, "created": true}});
        assert_eq!(watch_news(&created), WatchNews::Nothing);
        // "L2Ev" is "/a/", "djE=" is "v1".
        let events = json!({"result": {"header": {"revision": "9"}, "events": [
            {"kv": {"key": "L2Ev", "mod_revision": "8", "value": "djE="}},
            {"type": "DELETE", "kv": {"key": "L2Ev", "mod_revision": "9"}}
        ]}});
        assert_eq!(
            watch_news(&events),
            WatchNews::Changes(vec![
                Change::Put { key: "/a/".into(), value: "v1".into() },
                Change::Delete { key: "/a/".into() }
            ])
        );
        let compacted = json!({"result": {"header": {}, "canceled": true, "compact_revision": "40"}});
        assert_eq!(watch_news(&compacted), WatchNews::Ended(WatchEnd::Compacted(40)));
        let error = json!({"error": {"grpc_code": 14, "message": "etcdserver: no leader"}});
        assert_eq!(watch_news(&error), WatchNews::Ended(WatchEnd::Failed("etcdserver: no leader".into())));
    }

    #[test]
    fn a_prefix_range_ends_after_every_key_that_starts_with_it() {
        assert_eq!(prefix_end("a/b/"), b"a/b0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert!(Etcd::new(&["http://127.0.0.1:2379".into()]).is_ok());
        assert!(Etcd::new(&["127.0.0.1:2379".into()]).is_err());
        assert!(Etcd::new(&[]).is_err());
    }
}
