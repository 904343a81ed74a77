//! An OTLP/HTTP receiver for the tests: it decodes the real protobuf the binaries export
//! (`opentelemetry-proto`'s messages), and keeps every span with its service's name.

use hyper::body::Incoming;
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use parking_lot::Mutex;
use prost::Message;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One span as received.
#[derive(Clone, Debug)]
pub struct Received {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root.
    pub parent: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: BTreeMap<String, String>,
    /// The status's message when it is an error.
    pub error: Option<String>,
}

#[derive(Default)]
struct Seen {
    spans: Vec<Received>,
    exports: usize,
    bad: Vec<String>,
}

#[derive(Clone, Default)]
pub struct Receiver {
    seen: Arc<Mutex<Seen>>,
    pub endpoint: String,
}

fn text(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

impl Receiver {
    /// Listens on a loopback port; `endpoint` is its base address for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let receiver =
            Receiver { endpoint: format!("http://{}", listener.local_addr().unwrap()), ..Default::default() };
        let seen = receiver.seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let seen = seen.clone();
                        async move { Ok::<_, std::convert::Infallible>(take(&seen, request).await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        receiver
    }

    pub fn spans(&self) -> Vec<Received> {
        self.seen.lock().spans.clone()
    }

    /// How many export requests came (each a batch of spans).
    pub fn exports(&self) -> usize {
        self.seen.lock().exports
    }

    /// Requests that were not a valid OTLP export, said why.
    pub fn bad(&self) -> Vec<String> {
        self.seen.lock().bad.clone()
    }
}

async fn take(seen: &Mutex<Seen>, request: Request<Incoming>) -> Response<http_body_util::Full<bytes::Bytes>> {
    use http_body_util::BodyExt;
    let (head, body) = request.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let protobuf = head.headers.get("content-type").is_some_and(|v| v == "application/x-protobuf");
    let decoded = ExportTraceServiceRequest::decode(body.as_ref());
    let mut seen = seen.lock();
    match (head.uri.path(), protobuf, decoded) {
        ("/v1/traces", true, Ok(export)) => {
            seen.exports += 1;
            for resource in export.resource_spans {
                let resource_attributes = resource.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
                let service = resource_attributes.get("service.name").cloned().unwrap_or_default();
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        let error = span.status.as_ref().filter(|s| s.code == 2).map(|s| s.message.clone());
                        seen.spans.push(Received {
                            service: service.clone(),
                            name: span.name.clone(),
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent: hex(&span.parent_span_id),
                            start_ns: span.start_time_unix_nano,
                            end_ns: span.end_time_unix_nano,
                            attributes: attributes(&span.attributes),
                            error,
                        });
                    }
                }
            }
        }
        (path, protobuf, decoded) => {
            seen.bad.push(format!("{path}, protobuf: {protobuf}, decoded: {:?}", decoded.err()));
        }
    }
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(http_body_util::Full::new(bytes::Bytes::from(answer)))
        .unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
