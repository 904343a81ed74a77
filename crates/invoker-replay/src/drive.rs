//! The calls: each function an action of its memory, each call a blocking invoke at its
//! (compressed) time, sent whether or not the ones before it were answered, as a trace's callers
//! would. What each call met is kept ([`Outcome`]): its status, how long after it was sent the
//! answer came, and what its record says (a cold start: `initTime`).

use crate::cluster::{Cluster, GUEST_KEY, NAMESPACE};
use crate::ReplayError;
use invoker_core::sim::workload::Call;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What one call met.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The answer's status; 0 when none came.
    pub status: u16,
    /// From when it was due to when its answer came.
    pub latency: Duration,
    /// Its record says its container was started for it (`initTime`).
    pub cold: bool,
    /// The record's `waitTime` (from the invoker's acceptance to the run's start).
    pub wait: Option<Duration>,
    /// Why it was refused, as the answer says (429 and 503).
    pub refusal: Option<String>,
    /// Answered 202 (kept in the scheduler's queue past its wait for room): what it met is its
    /// record's, read after.
    pub kept: bool,
}

/// How often the record of a call answered 202 is asked for.
const RECORD_POLL: Duration = Duration::from_millis(20);

/// How much of a refusal's reason the verdict keeps.
const REFUSAL_CHARS: usize = 200;

/// Answers still out this long after their call's run should have ended count as none.
const ANSWER_BOUND: Duration = Duration::from_secs(90);

/// The code every action runs: it sleeps for what its call says (the trace's duration,
/// compressed).
const CODE: &str = "import time\n\ndef main(args):\n    time.sleep(float(args.get('s', 0)))\n    return {}\n";

/// Each function of the calls an action (`f<n>`) of its memory; its name by function.
pub async fn create_actions(cluster: &Cluster, calls: &[Call]) -> Result<BTreeMap<u32, String>, ReplayError> {
    let mut memory: BTreeMap<u32, u32> = BTreeMap::new();
    for call in calls {
        memory.entry(call.action).or_insert(call.memory_mb);
    }
    let mut names = BTreeMap::new();
    for (function, mb) in memory {
        let name = format!("f{function}");
        let url = format!("{}/api/v1/namespaces/{NAMESPACE}/actions/{name}?overwrite=true", cluster.scheduler);
        let body = serde_json::json!({
            "exec": { "kind": "python:3", "code": CODE },
            "limits": { "memory": mb, "timeout": 300_000 },
        });
        match crate::client::request("PUT", &url, Some(GUEST_KEY), Some(body.to_string())).await {
            Ok((200, _)) => {}
            Ok((status, body)) => {
                return Err(ReplayError::Cluster(format!(
                    "PUT action {name}: {status} {}",
                    String::from_utf8_lossy(&body)
                )))
            }
            Err(e) => return Err(ReplayError::Cluster(format!("PUT action {name}: {e}"))),
        }
        names.insert(function, name);
    }
    Ok(names)
}

/// Counts for the progress line.
#[derive(Default)]
struct Progress {
    sent: AtomicU64,
    answered: AtomicU64,
}

/// Sends every call at its time (from now), and waits for the answers still out up to
/// [`crate::DRAIN`] after the last was sent; prints a progress line every 5 s.
pub async fn send(cluster: &Cluster, calls: &[Call], actions: &BTreeMap<u32, String>, factor: f64) -> Vec<Outcome> {
    let start = Instant::now();
    let progress = Arc::new(Progress::default());
    let total = calls.len();
    let printing = {
        let progress = progress.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let (sent, answered) =
                    (progress.sent.load(Ordering::Relaxed), progress.answered.load(Ordering::Relaxed));
                let trace_minutes = start.elapsed().as_secs_f64() * factor / 60.0;
                eprintln!(
                    "replay: {sent}/{total} calls sent, {answered} answered, {} out; trace minute {trace_minutes:.0}",
                    sent - answered
                );
            }
        })
    };
    let mut running = Vec::with_capacity(calls.len());
    for call in calls {
        tokio::time::sleep_until(start + call.at).await;
        let url = format!(
            "{}/api/v1/namespaces/{NAMESPACE}/actions/{}?blocking=true",
            cluster.scheduler, actions[&call.action]
        );
        let body = serde_json::json!({ "s": call.run.as_secs_f64() }).to_string();
        let due = start + call.at;
        let bound = call.run + ANSWER_BOUND;
        let progress = progress.clone();
        progress.sent.fetch_add(1, Ordering::Relaxed);
        let scheduler = cluster.scheduler.clone();
        running.push(tokio::spawn(async move {
            let answer = tokio::time::timeout(bound, async {
                let (status, body) = crate::client::request("POST", &url, Some(GUEST_KEY), Some(body)).await?;
                match status {
                    202 => followed(&scheduler, &body, due).await,
                    _ => Ok(outcome(status, &body, due.elapsed())),
                }
            })
            .await;
            progress.answered.fetch_add(1, Ordering::Relaxed);
            match answer {
                Ok(Ok(outcome)) => outcome,
                _ => Outcome { status: 0, latency: due.elapsed(), ..Outcome::default() },
            }
        }));
    }
    let deadline = Instant::now() + crate::DRAIN;
    let mut outcomes = Vec::with_capacity(running.len());
    for task in running {
        let waited = tokio::time::timeout_at(deadline, task).await;
        outcomes.push(match waited {
            Ok(Ok(outcome)) => outcome,
            _ => Outcome::default(),
        });
    }
    printing.abort();
    outcomes
}

/// A blocking call answered 202 (kept in the scheduler's queue past its wait for room, or
/// longer than the blocking wait): its record, polled for until it is there, is its answer, as
/// a caller holding the activation id reads it; 200 or 502 as its blocking answer would have
/// been, its latency to the record's end.
async fn followed(scheduler: &str, accepted: &[u8], due: Instant) -> Result<Outcome, String> {
    let accepted: serde_json::Value = serde_json::from_slice(accepted).unwrap_or_default();
    let id = accepted["activationId"].as_str().ok_or("a 202 without an activation id")?;
    let url = format!("{scheduler}/api/v1/namespaces/{NAMESPACE}/activations/{id}");
    loop {
        tokio::time::sleep(RECORD_POLL).await;
        let Ok((200, body)) = crate::client::get(&url, Some(GUEST_KEY)).await else { continue };
        let record: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let status = if record["response"]["success"] == true { 200 } else { 502 };
        let since_end = record["end"].as_u64().map_or(0, |end| invoker_wire::model::epoch_ms().saturating_sub(end));
        let latency = due.elapsed().saturating_sub(Duration::from_millis(since_end));
        return Ok(Outcome { kept: true, ..outcome(status, &body, latency) });
    }
}

/// What an answer says: its status, and from its record whether the run started cold.
fn outcome(status: u16, body: &[u8], latency: Duration) -> Outcome {
    let record: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let annotation = |key: &str| {
        record["annotations"].as_array().and_then(|a| a.iter().find(|x| x["key"] == key)).map(|x| &x["value"])
    };
    let error = record["response"]["result"]["error"].as_str().or(record["error"].as_str());
    let refusal = matches!(status, 429 | 503).then(|| match error {
        Some(error) => error.chars().take(REFUSAL_CHARS).collect(),
        None => String::from_utf8_lossy(&body[..body.len().min(REFUSAL_CHARS)]).into_owned(),
    });
    Outcome {
        status,
        latency,
        cold: annotation("initTime").is_some(),
        wait: annotation("waitTime").and_then(serde_json::Value::as_u64).map(Duration::from_millis),
        refusal,
        kept: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_says_whether_its_run_started_cold() {
        let cold = br#"{"annotations":[{"key":"waitTime","value":12},{"key":"initTime","value":30}]}"#;
        let warm = br#"{"annotations":[{"key":"waitTime","value":1}]}"#;
        let at = Duration::from_millis(5);
        let (c, w) = (outcome(200, cold, at), outcome(200, warm, at));
        assert!(c.cold && !w.cold);
        assert_eq!((c.wait, w.wait), (Some(Duration::from_millis(12)), Some(Duration::from_millis(1))));
        let refused = outcome(503, br#"{"response":{"result":{"error":"no invoker has room"}}}"#, at);
        assert_eq!(refused.refusal.as_deref(), Some("no invoker has room"));
        let refused = outcome(429, br#"{"error":"too many"}"#, at);
        assert_eq!(refused.refusal.as_deref(), Some("too many"));
        assert_eq!(outcome(503, b"not json", at).refusal.as_deref(), Some("not json"));
    }
}
