//! Many streams at once (`--many-streams N`): N blocking calls of a python generator that yields
//! one value a second for 30 seconds, all open together on one invoker (each in a container of
//! its own: our runtime runs one call per action process). Counts every value each caller
//! reads, and samples the invoker's resident memory meanwhile (its own, not its containers').
//! The node's memory offer is set to what N containers of 128 MB take, whatever the machine
//! holds: forked from the zygote, each holds a few MB of its own.

use super::stream::{call, PeakRss};
use super::targets::{put_action_of, Invoker};
use futures_util::StreamExt as _;
use serde_json::{json, Value};
use std::time::Instant;

/// One value a second, `n` of them.
const TICK: &str =
    "import time\ndef main(a):\n    for i in range(a['n']):\n        if i:\n            time.sleep(1)\n        yield i\n";

pub async fn many_streams(exe: &std::path::Path, streams: usize, values: usize) -> anyhow::Result<Value> {
    let config = format!(
        "[limits]\nnamespace_concurrent = {}\n[factory.process]\nuser_memory_mb = {}\n",
        streams + 100,
        (streams + 50) * 128
    );
    let invoker = Invoker::start(exe, "many-streams", &config)?;
    // A connection per call: the caller holds them all open at once.
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;
    put_action_of(&http, &invoker.base, "tick", "python:3", TICK).await?;
    let url = invoker.url("tick", "blocking=true");
    let rss = PeakRss::sample(&invoker);
    let began = Instant::now();
    let calls = (0..streams).map(|_| values_read(&http, &url, values));
    let read: Vec<anyhow::Result<usize>> = futures_util::future::join_all(calls).await;
    let took = began.elapsed();
    let (before, peak) = rss.stop();
    let delivered: usize = read.iter().filter_map(|r| r.as_ref().ok()).sum();
    let whole = read.iter().filter(|r| matches!(r, Ok(n) if *n == values)).count();
    let failed: Vec<String> = read.iter().filter_map(|r| r.as_ref().err()).take(3).map(ToString::to_string).collect();
    let report = json!({
        "streams": streams,
        "values_each": values,
        "streams_whole": whole,
        "values_delivered": delivered,
        "values_expected": streams * values,
        "took_s": (took.as_secs_f64() * 10.0).round() / 10.0,
        "rss_before_kb": before,
        "rss_peak_kb": peak,
        "rss_growth_mib": ((peak.saturating_sub(before)) as f64 / 1024.0).round(),
        "failures": failed,
    });
    eprintln!("many streams: {report}");
    Ok(report)
}

/// The values one caller read (NDJSON lines) to the stream's end.
async fn values_read(http: &reqwest::Client, url: &str, values: usize) -> anyhow::Result<usize> {
    let mut body = call(http, url, json!({ "n": values })).await?.bytes_stream();
    let mut lines = 0;
    while let Some(part) = body.next().await {
        lines += part?.iter().filter(|b| **b == b'\n').count();
    }
    Ok(lines)
}
