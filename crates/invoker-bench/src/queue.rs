//! The durable queue's intake: non-blocking invokes of the no-op action fired by `c` closed-loop
//! callers for a while, each answered 202 once its call is journaled; meanwhile the pool drains
//! the queue into K warm containers. Reports the calls accepted a second, the latency of a
//! 202, refusals, and then how long the rest took to run and whether every accepted call ended
//! with a record (from the invoker's counters).

use super::load::measure;
use super::targets::{put_action, Invoker, GUEST};
use anyhow::bail;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The sum of the invoker's `invoker_activations_total`, over every status, and the successes.
async fn ended(http: &reqwest::Client, invoker: &Invoker) -> anyhow::Result<(u64, u64)> {
    let (user, pass) = invoker.admin.split_once(':').unwrap_or_default();
    let text = http.get(format!("{}/metrics", invoker.base)).basic_auth(user, Some(pass)).send().await?.text().await?;
    let (mut all, mut ok) = (0, 0);
    for line in text.lines().filter(|l| l.starts_with("invoker_activations_total{")) {
        let n: u64 = line.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0);
        all += n;
        if line.contains("status=\"success\"") {
            ok += n;
        }
    }
    Ok((all, ok))
}

pub async fn queue_intake(
    exe: &std::path::Path,
    http: &reqwest::Client,
    c: usize,
    k: usize,
    slice: Duration,
) -> anyhow::Result<Value> {
    let invoker = Invoker::start(exe, "queue", "[proxy]\npause_grace = \"0s\"\n")?;
    put_action(http, &invoker.base, "noop").await?;
    let warm_url = invoker.url("noop", "blocking=true");
    let warm: Vec<_> = (0..k).map(|_| super::targets::invoke(http, &warm_url, json!({"sleep": 1.0}))).collect();
    for r in futures_util::future::join_all(warm).await {
        r?;
    }
    let (before, before_ok) = ended(http, &invoker).await?;
    let url = invoker.url("noop", "blocking=false");
    let (h, u) = (http.clone(), url.clone());
    let began = Instant::now();
    let mut samples = measure(c, slice, move |_| {
        let (h, u) = (h.clone(), u.clone());
        async move {
            let (user, pass) = GUEST.split_once(':').unwrap_or_default();
            let r = h.post(&u).basic_auth(user, Some(pass)).json(&json!({})).send().await?;
            let status = r.status();
            let body = r.bytes().await?;
            if status != 202 {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| eprintln!("queue   the first refusal: {status} {}", String::from_utf8_lossy(&body)));
                bail!("non-blocking invoke: {status}");
            }
            Ok(())
        }
    })
    .await;
    let (rps, p50, _, p99) = samples.summary();
    let accepted = samples.count() as u64;
    // Everything accepted runs: wait for the counters to say so (bounded).
    let deadline = Instant::now() + Duration::from_secs(600);
    let (mut all, mut ok) = ended(http, &invoker).await?;
    while all - before < accepted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        (all, ok) = ended(http, &invoker).await?;
    }
    let drained_s = began.elapsed().as_secs_f64() - slice.as_secs_f64();
    let (ended_count, failed) = (all - before, (all - before).saturating_sub(ok - before_ok));
    eprintln!(
        "queue   c={c}: {rps:.0} non-blocking calls accepted a second (202 p50 {p50} us, p99 {p99} us, {} refused); \
         {ended_count} of {accepted} ended ({failed} failed), the backlog drained {drained_s:.1} s after the load",
        samples.errors,
    );
    Ok(json!({
        "queue_accepted_per_s": rps.round(), "queue_accept_p50_us": p50, "queue_accept_p99_us": p99,
        "queue_refused": samples.errors, "queue_accepted": accepted, "queue_ended": ended_count,
        "queue_failed": failed,
        "queue_drained_after_s": (drained_s * 10.0).round() / 10.0,
    }))
}
