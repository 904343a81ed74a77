//! Streamed answers (`--stream-only`): how long a generator's value takes from its `yield` to
//! the caller, and how fast a large stream goes through with how much of the invoker's memory.
//!
//! - **Delay**: a python generator yields `time.time_ns()` taken just before each `yield`; the
//!   caller reads each NDJSON line and takes the wall clock as it arrives (one machine, one
//!   clock). Reported for the first value of each call (c=1, one call after another) and for
//!   the values after it (spaced 20 ms, so that each is a value the action made while the
//!   caller waited, not one queued behind another).
//! - **A large call**: a 64 MiB string parameter in and out of a python action of 512 MB, the
//!   invoker's resident memory sampled meanwhile.
//! - **Throughput**: a generator yields the same 1 MiB string 1,024 times (1 GiB); the caller
//!   reads the NDJSON body and counts its bytes. The invoker's resident memory is sampled every
//!   10 ms meanwhile; its growth is the peak over what it held before the call. Its floor is
//!   python alone: the launcher's loop writing the same values into a pipe read here.

use super::targets::{Invoker, GUEST};
use futures_util::StreamExt as _;
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const GEN: &str = "import time\ndef main(a):\n    size = a.get('size', 0)\n    if size:\n        chunk = 'x' * size\n        for i in range(a['n']):\n            yield chunk\n        return\n    for i in range(a['n']):\n        if i:\n            time.sleep(a.get('gap', 0))\n        yield time.time_ns()\n";

/// The configuration that lets a 64 MiB call in and out.
pub const LARGE_CALLS: &str = "[limits]\npayload_max_bytes = 134217728\n";

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

pub async fn call(http: &reqwest::Client, url: &str, params: Value) -> anyhow::Result<reqwest::Response> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let response = http
        .post(url)
        .basic_auth(user, Some(pass))
        .header("accept", "application/x-ndjson")
        .json(&params)
        .send()
        .await?;
    anyhow::ensure!(response.status() == 200, "a streamed call answered {}", response.status());
    Ok(response)
}

/// Each value's delay from its yield to the caller, in microseconds: the first value's, then
/// the later ones'.
async fn delays(http: &reqwest::Client, url: &str, calls: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for _ in 0..calls {
        let mut body = call(http, url, json!({ "n": 5, "gap": 0.02 })).await?.bytes_stream();
        let mut pending = Vec::new();
        let mut seen = 0;
        while let Some(part) = body.next().await {
            let arrived = now_ns();
            pending.extend_from_slice(&part?);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let yielded: u128 = std::str::from_utf8(&line)?.trim().parse()?;
                let us = arrived.saturating_sub(yielded) as f64 / 1000.0;
                if seen == 0 {
                    first.push(us)
                } else {
                    later.push(us)
                }
                seen += 1;
            }
        }
        anyhow::ensure!(seen == 5, "a stream of 5 values brought {seen}");
    }
    Ok((first, later))
}

/// One stream of `n` values of `size` bytes: its bytes a second, and the invoker's resident
/// memory before and at its peak meanwhile (kB).
async fn throughput(
    http: &reqwest::Client,
    invoker: &Invoker,
    url: &str,
    n: usize,
    size: usize,
) -> anyhow::Result<(f64, u64, u64)> {
    let rss = PeakRss::sample(invoker);
    let began = Instant::now();
    let mut body = call(http, url, json!({ "n": n, "size": size })).await?.bytes_stream();
    let mut bytes = 0u64;
    while let Some(part) = body.next().await {
        bytes += part?.len() as u64;
    }
    let elapsed = began.elapsed();
    let (before, peak) = rss.stop();
    let expected = (n * (size + 3)) as u64;
    anyhow::ensure!(bytes == expected, "the stream brought {bytes} bytes of {expected}");
    Ok((bytes as f64 / elapsed.as_secs_f64() / 1e6, before, peak))
}

/// A 64 MiB string parameter into a python action of 512 MB that answers it back: the status,
/// and the invoker's resident memory before and at its peak meanwhile (kB).
async fn large_call(http: &reqwest::Client, invoker: &Invoker) -> anyhow::Result<(u16, u64, u64)> {
    let code = "def main(a):\n    return {'s': a['s']}\n";
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let action = json!({ "exec": { "kind": "python:3", "code": code }, "limits": { "memory": 512 } });
    let put = http.put(format!("{}/api/v1/namespaces/_/actions/echo?overwrite=true", invoker.base));
    put.basic_auth(user, Some(pass)).json(&action).send().await?.error_for_status()?;
    let body = serde_json::to_vec(&json!({ "s": "x".repeat(64 * 1024 * 1024) }))?;
    let rss = PeakRss::sample(invoker);
    let response = http
        .post(invoker.url("echo", "blocking=true&result=true"))
        .basic_auth(user, Some(pass))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    let answer = response.bytes().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (before, peak) = rss.stop();
    anyhow::ensure!(status != 200 || answer.len() > 64 * 1024 * 1024, "the result came back short");
    Ok((status, before, peak))
}

/// The invoker's resident memory as it was when sampling began, and its peak while it ran
/// (sampled every 10 ms).
pub struct PeakRss {
    before: u64,
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    sampling: tokio::task::JoinHandle<()>,
}

impl PeakRss {
    pub fn sample(invoker: &Invoker) -> Self {
        let before = invoker.rss_kb();
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
        let (seen, pid) = (peak.clone(), invoker.pid());
        let sampling = tokio::spawn(async move {
            loop {
                seen.fetch_max(super::targets::rss_kb(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        PeakRss { before, peak, sampling }
    }

    /// (before, peak), in kB.
    pub fn stop(self) -> (u64, u64) {
        self.sampling.abort();
        (self.before, self.peak.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// The floor of the throughput: the launcher's own loop (the same writes of the same 1 MiB
/// string, 1,024 times) into a pipe this process reads and counts, with no runtime, invoker or
/// HTTP between. MB a second.
fn python_floor() -> anyhow::Result<f64> {
    use std::io::Read as _;
    const LOOP: &str = r#"import os
out = os.fdopen(1, 'w')
chunk = 'x' * (1024 * 1024)
for i in range(1024):
    data = chunk.encode('utf-8')
    out.write('$%d\n' % len(data))
    out.flush()
    out.buffer.write(data)
    out.buffer.flush()
"#;
    let began = Instant::now();
    let mut child =
        std::process::Command::new("python3").args(["-c", LOOP]).stdout(std::process::Stdio::piped()).spawn()?;
    let mut out = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let (mut bytes, mut buf) = (0u64, vec![0u8; 64 * 1024]);
    loop {
        match out.read(&mut buf)? {
            0 => break,
            n => bytes += n as u64,
        }
    }
    child.wait()?;
    anyhow::ensure!(bytes == 1024 * (1024 * 1024 + 9), "the floor wrote {bytes} bytes");
    Ok(bytes as f64 / began.elapsed().as_secs_f64() / 1e6)
}

/// Both measures on an invoker of `config` (`name`: the side's name in the report).
pub async fn stream_side(
    exe: &std::path::Path,
    http: &reqwest::Client,
    name: &str,
    config: &str,
    calls: usize,
) -> anyhow::Result<Value> {
    let invoker = Invoker::start(exe, &format!("stream-{name}"), config)?;
    measure(http, name, &invoker, calls, true).await
}

/// Both measures through `front` (an invoker, or a scheduler in front of one: its memory is
/// the one sampled), and with `large` a 64 MiB call (`front` configured with [`LARGE_CALLS`]).
pub async fn measure(
    http: &reqwest::Client,
    name: &str,
    front: &Invoker,
    calls: usize,
    large: bool,
) -> anyhow::Result<Value> {
    let invoker = front;
    super::targets::put_action_of(http, &invoker.base, "gen", "python:3", GEN).await?;
    let url = invoker.url("gen", "blocking=true");
    // Warm: the container and its process, and the caller's connection.
    delays(http, &url, 2).await?;
    let (first, later) = delays(http, &url, calls).await?;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (mb_s, before, peak) = throughput(http, invoker, &url, 1024, 1024 * 1024).await?;
        runs.push(json!({ "mb_per_s": mb_s.round(), "rss_before_kb": before, "rss_peak_kb": peak,
            "rss_growth_mib": ((peak.saturating_sub(before)) as f64 / 1024.0).round() }));
    }
    let floors: Vec<f64> = (0..2).map(|_| python_floor().map(f64::round)).collect::<anyhow::Result<_>>()?;
    let large = match large {
        false => Value::Null,
        true => {
            let (status, before, peak) = large_call(http, invoker).await?;
            json!({ "status": status, "rss_before_kb": before, "rss_peak_kb": peak,
                "rss_growth_mib": ((peak.saturating_sub(before)) as f64 / 1024.0).round() })
        }
    };
    let report = json!({
        "a_64_mib_call_in_and_out": large,
        "python_alone_mb_per_s": floors,
        "first_value_delay_us_p50": percentile(first.clone(), 0.5).round(),
        "first_value_delay_us_p90": percentile(first, 0.9).round(),
        "later_value_delay_us_p50": percentile(later.clone(), 0.5).round(),
        "later_value_delay_us_p90": percentile(later, 0.9).round(),
        "one_gib_in_1_mib_values": runs,
    });
    eprintln!("stream  {name}: {report}");
    Ok(report)
}
