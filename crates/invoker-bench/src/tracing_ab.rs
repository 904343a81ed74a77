//! The warm path with tracing off, and exporting every trace or 1 % of them, in one run: three
//! invokers alike but for `[tracing]`, their slices rotating so that drift hits all alike. The
//! traces go to a sink in this process that reads each export and answers it, as a collector
//! would, without decoding it.

use super::{Samples, Side};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Counts the export requests and their bytes.
struct Sink {
    endpoint: String,
    exports: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

impl Sink {
    async fn start() -> anyhow::Result<Sink> {
        use http_body_util::BodyExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let (exports, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (e, b) = (exports.clone(), bytes.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (e, b) = (e.clone(), b.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                        let (e, b) = (e.clone(), b.clone());
                        async move {
                            let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                            e.fetch_add(1, Ordering::Relaxed);
                            b.fetch_add(body.len() as u64, Ordering::Relaxed);
                            hyper::Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(http_body_util::Full::new(bytes::Bytes::new()))
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Ok(Sink { endpoint, exports, bytes })
    }
}

pub async fn tracing_ab(
    exe: &Path,
    http: &reqwest::Client,
    k: usize,
    slice: Duration,
    rounds: usize,
) -> anyhow::Result<Value> {
    let mut sides = Vec::new();
    let mut sinks = Vec::new();
    for (name, ratio) in [("off", None), ("sampled_100", Some(1.0)), ("sampled_1", Some(0.01))] {
        let sink = Sink::start().await?;
        let tracing = match ratio {
            None => String::new(),
            Some(r) => format!("[tracing]\notlp_endpoint = \"{}\"\nsample_ratio = {r}\n", sink.endpoint),
        };
        let config = format!("[proxy]\npause_grace = \"0s\"\n{tracing}");
        sides.push(Side::start(name, exe, &config, http, k).await?);
        sinks.push(sink);
    }
    let mut levels = vec![1, k];
    levels.dedup();
    let mut runs = Vec::new();
    for &c in &levels {
        for side in &mut sides {
            side.slice_invoker(c, Duration::from_millis(300), http).await;
        }
        let mut samples: Vec<Samples> = sides.iter().map(|_| Samples::default()).collect();
        for _ in 0..rounds {
            for (side, all) in sides.iter_mut().zip(&mut samples) {
                all.add(side.slice_invoker(c, slice, http).await);
            }
        }
        let mut row = serde_json::Map::new();
        row.insert("concurrency".into(), json!(c));
        let mut off = None;
        for (side, all) in sides.iter().zip(&mut samples) {
            let (rps, p50, _, p99) = all.summary();
            let (_, busy, _) = all.cpu_per_request();
            let base = *off.get_or_insert(rps);
            eprintln!(
                "c={c:<3} {:<12} {rps:>8.0} req/s  p50 {p50:>6} us  p99 {p99:>6} us  CPU {busy} us/request  errors {}",
                side.name, all.errors
            );
            row.insert(
                side.name.into(),
                json!({ "rps": rps.round(), "p50_us": p50, "p99_us": p99, "cpu_us": busy, "errors": all.errors,
                        "rps_vs_off": (rps / base.max(1e-9) * 1000.0).round() / 1000.0 }),
            );
        }
        runs.push(Value::Object(row));
    }
    // The last batches leave within the processor's delay (5 s by default).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let exported: Vec<Value> = sides
        .iter()
        .zip(&sinks)
        .map(|(side, sink)| {
            json!({ "mode": side.name, "exports": sink.exports.load(Ordering::Relaxed),
                    "bytes": sink.bytes.load(Ordering::Relaxed) })
        })
        .collect();
    eprintln!("exported: {}", Value::Array(exported.clone()));
    Ok(json!({ "tracing": runs, "exported": exported }))
}
