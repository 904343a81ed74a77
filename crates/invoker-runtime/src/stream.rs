//! A run whose action streams (its `main` a generator): its values passed on to the invoker
//! line by line as the launcher writes them, or, for an invoker that did not ask for a stream,
//! gathered into the one JSON array OpenWhisk's clients expect.

use super::action::{ActionError, ActionProcess, StreamLine, MAX_RESULT_BYTES};
use super::sentinels::write_sentinels;
use bytes::Bytes;
use invoker_http::streamed::StreamPart;
use tokio::sync::mpsc;

/// Passes the stream `first` began on to `values`, a line each, until its end; the process
/// then takes the next run (`give_back`). An invoker that stops reading slows the action (the channel is
/// bounded, the launcher's pipe fills, its `write` blocks); one that leaves stops it: the
/// process is killed, and the next run starts another (the runtime itself is sound).
pub(super) async fn relay(
    mut process: ActionProcess,
    first: StreamLine,
    values: mpsc::Sender<StreamPart>,
    tag: Option<String>,
    give_back: impl FnOnce(ActionProcess),
) {
    let mut line: Result<StreamLine, ActionError> = Ok(first);
    loop {
        match line {
            Ok(StreamLine::Value(value)) => {
                if values.send(StreamPart::Data(as_line(value))).await.is_err() {
                    return left(process, tag);
                }
            }
            Ok(StreamLine::End(end)) => {
                give_back(process);
                // The action's lines are all out before the stream's end reaches the invoker.
                write_sentinels(tag.as_deref());
                if values.send(StreamPart::Data(as_line(end))).await.is_ok() {
                    let _ = values.send(StreamPart::End).await;
                }
                return;
            }
            Err(e) => {
                // The process died, or wrote what is not a stream's line: it is dropped (and
                // killed), and the stream ends with why.
                write_sentinels(tag.as_deref());
                let end = serde_json::json!({ "error": e.to_string() }).to_string();
                if values.send(StreamPart::Data(as_line(format!("={end}").into_bytes()))).await.is_ok() {
                    let _ = values.send(StreamPart::End).await;
                }
                return;
            }
        }
        line = tokio::select! {
            next = process.next_in_stream() => next,
            () = values.closed() => return left(process, tag),
        };
    }
}

fn left(mut process: ActionProcess, tag: Option<String>) {
    process.kill();
    write_sentinels(tag.as_deref());
}

/// A line as it goes to the invoker: its mark, its JSON and a newline (the launcher's line,
/// not copied).
fn as_line(mut line: Vec<u8>) -> Bytes {
    line.push(b'\n');
    Bytes::from(line)
}

/// The stream `first` began, gathered: `[v1,v2,...]` when it ends complete, the launcher's
/// `{"error": ...}` when the action failed along the way; no larger than a result may be.
pub(super) async fn collect(process: &mut ActionProcess, first: StreamLine) -> Result<Vec<u8>, ActionError> {
    let mut array = vec![b'['];
    let mut line = first;
    loop {
        match line {
            StreamLine::Value(_) => {
                if array.len() > 1 {
                    array.push(b',');
                }
                array.extend_from_slice(line.json());
                if array.len() as u64 >= MAX_RESULT_BYTES {
                    return Err(ActionError::TooLarge);
                }
            }
            StreamLine::End(_) => {
                let end = line.json();
                if serde_json::from_slice::<serde_json::Value>(end).is_ok_and(|v| v.get("error").is_some()) {
                    return Ok(end.to_vec());
                }
                array.push(b']');
                return Ok(array);
            }
        }
        line = process.next_in_stream().await?;
    }
}
