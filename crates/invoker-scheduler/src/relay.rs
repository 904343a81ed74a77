//! A blocking call whose action streams, through the scheduler: the invoker's body (the values
//! framed as the caller reads them) passed on part by part through a bounded channel, as the
//! invoker's own relay does, and the record asked of the invoker once the body ended. A caller
//! that leaves drops the invoker's connection, which stops the action there (its record says
//! so); an invoker lost mid-stream cuts the caller's body short, and the record says the
//! invoker was lost and how much went out (a guess, replaced by the invoker's record if it
//! comes back with one).

use super::guesses::Guesses;
use super::send::InvokerClient;
use invoker_http::streamed::{Passed, StreamPart, STREAM_PARTS};
use invoker_job::stream::{StreamRequest, StreamStart};
use invoker_job::RunJob;
use invoker_wire::model::{epoch_ms, ActivationRecord, KeyValue};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long the record is asked for once the stream ended (the invoker stores it as its relay
/// ends, a moment after the body's last part).
const RECORD_WAIT: Duration = Duration::from_secs(5);

/// What the relay needs of the scheduler.
pub struct Ends {
    pub client: Arc<InvokerClient>,
    pub guesses: Arc<Guesses>,
}

/// The invoker's streamed answer: a function's own headers (when its bytes go as it wrote
/// them), and the body.
pub struct Answer {
    pub headers: Option<Vec<(String, String)>>,
    pub body: hyper::body::Incoming,
}

/// Passes the answer's body on to the caller of `run` (`stream`), within `deadline`, then ends
/// `run` with the invoker's record.
pub async fn relay(
    ends: Ends,
    run: RunJob,
    stream: StreamRequest,
    answer: Answer,
    invoker: String,
    authority: String,
    deadline: Duration,
) {
    let Answer { headers, body } = answer;
    let (parts, receiver) = mpsc::channel(STREAM_PARTS);
    // A function answers a stream only with a 200 (its other answers come whole).
    let head = headers.map(|headers| (200, headers));
    let reading = stream.started.send(StreamStart { head, parts: receiver }).is_ok();
    let passed = tokio::time::timeout(deadline, pass_on(body, reading.then_some(&parts))).await;
    let lost = match passed {
        Ok(Ok(_)) => {
            let _ = parts.send(StreamPart::End).await;
            None
        }
        // The caller left: the invoker, its connection dropped, stops the action and says so.
        Ok(Err(PassFailed::CallerLeft)) => None,
        Ok(Err(PassFailed::InvokerLost(bytes, why))) => Some(format!(
            "invoker {invoker} was lost while it streamed the answer ({why}), after {bytes} bytes went to the caller"
        )),
        Err(_) => Some(format!("invoker {invoker} streamed past the call's deadline of {deadline:?}")),
    };
    drop(parts);
    let ran_on = KeyValue { key: "invoker".into(), value: json!(invoker) };
    let id = run.meta.activation_id.clone();
    let found = match lost {
        Some(_) => None,
        None => record_of(&ends.client, &authority, &id).await,
    };
    let record = match found {
        Some(mut record) => {
            record.annotations.push(ran_on);
            record
        }
        None => {
            let why = lost.unwrap_or_else(|| format!("invoker {invoker} streamed the answer; its record did not come"));
            let mut record = ActivationRecord::guess(&run.meta, &why, epoch_ms());
            record.annotations.push(ran_on);
            ends.guesses.add(&id, Some(&invoker), Instant::now());
            record
        }
    };
    run.completion.finish(record);
}

enum PassFailed {
    CallerLeft,
    InvokerLost(u64, String),
}

/// The body's parts to `parts` (none when the caller was answered otherwise); the bytes passed.
async fn pass_on(body: hyper::body::Incoming, parts: Option<&mpsc::Sender<StreamPart>>) -> Result<u64, PassFailed> {
    let mut bytes = 0u64;
    let passed = invoker_http::streamed::pass_on(body, parts, |data| bytes += data.len() as u64).await;
    match passed {
        Passed::Whole => Ok(bytes),
        Passed::ReaderLeft => Err(PassFailed::CallerLeft),
        Passed::Broken(e) => Err(PassFailed::InvokerLost(bytes, e.to_string())),
    }
}

/// The invoker's record of `id`, asked for until it has it (within [`RECORD_WAIT`]).
async fn record_of(client: &InvokerClient, authority: &str, id: &str) -> Option<ActivationRecord> {
    let until = Instant::now() + RECORD_WAIT;
    let ids = [id.to_string()];
    while Instant::now() < until {
        if let Some(found) = client.records(authority, &ids, Duration::from_secs(2)).await {
            if let Some(record) = found.into_iter().find(|r| r.activation_id == id) {
                return Some(record);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
