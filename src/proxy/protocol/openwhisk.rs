//! OpenWhisk's action runtime protocol: the `/init` and `/run` bodies its runtimes read, and
//! how their answers become an activation outcome (the same rules as OpenWhisk's
//! `ActivationResponse`), and whether the container may be kept.

use super::answer::{Answer, Interpreted};
use super::client::{RuntimeClient, RuntimeError, RuntimeResponse};
use super::stream::StreamRelay;
use bytes::Bytes;
use invoker_http::body_parts::BodyParts;
use invoker_job::stream::StreamRequest;
use invoker_job::RunJob;
use invoker_wire::model::{epoch_ms, Action, Outcome};
use invoker_wire::result_json::ResultJson;
use invoker_wire::runtime::{EXITED_UNEXPECTEDLY, NOT_A_RESULT};
use serde_json::{json, Value};
use std::time::Duration;

/// `POST /init` with the action's code, main and environment; a 200 is success.
pub(super) async fn init(
    client: &RuntimeClient,
    action: &Action,
    api_host: &str,
    timeout: Duration,
) -> Result<(), Answer> {
    let mut body = json!({ "value": {
        "name": action.name,
        "main": action.exec.main.as_deref().unwrap_or("main"),
        "code": action.exec.code.as_deref().unwrap_or_default(),
        "binary": action.exec.binary,
        "env": {
            "__OW_NAMESPACE": action.namespace,
            "__OW_ACTION_NAME": format!("/{}/{}", action.namespace, action.name),
            "__OW_ACTION_VERSION": action.version,
            "__OW_API_HOST": api_host,
        },
    }});
    // Runs may overlap on this container: our runtime then starts each run's lines with its
    // activation id (see `factory::logs`); another runtime ignores the key.
    if action.limits.concurrency > 1 {
        body["value"]["tag_logs"] = Value::Bool(true);
    }
    // Serialising a JSON tree of strings and booleans cannot fail.
    let body = Bytes::from(serde_json::to_vec(&body).expect("a JSON value serialises"));
    match client.post("/init", body.into(), timeout).await {
        Ok(RuntimeResponse { status: 200, .. }) => Ok(()),
        failed => Err(failed),
    }
}

/// `POST /run` with the activation's parameters and context.
/// `stream`: a caller that takes a streamed answer, which our runtime sends a generator's
/// values to as they come (other runtimes answer one JSON as always).
pub(super) async fn run(
    client: &RuntimeClient,
    run: &RunJob,
    stream: Option<StreamRequest>,
    timeout: Duration,
) -> Answer {
    let meta = &run.meta;
    let context = RunContext {
        namespace: &meta.namespace,
        action_name: format!("/{}/{}", meta.namespace, meta.name),
        action_version: &meta.version,
        activation_id: &meta.activation_id,
        transaction_id: &run.transaction_id,
        deadline: (epoch_ms() + meta.limits.timeout).to_string(),
        api_key: run.api_key.as_deref(),
        traceparent: run.completion.trace().to_action().map_or("", |t| t.as_str()),
    };
    // `{"value":<the parameters>,<the context's members>}`, sent as its three parts: the
    // parameters as the bytes they came in (a slice of the caller's request, checked then, not
    // scanned or copied again), the context through serde. Strings only: it cannot fail.
    let mut context = serde_json::to_vec(&context).expect("a run context serialises");
    context[0] = b',';
    let body = BodyParts::new([Bytes::from_static(b"{\"value\":"), run.params.bytes(), Bytes::from(context)]);
    match stream {
        None => client.post("/run", body, timeout).await,
        Some(stream) => {
            let mut relay = StreamRelay::new(stream, client.max_result());
            client.post_streaming("/run", body, timeout, &mut relay).await
        }
    }
}

/// The `/run` body's members after `value` (the parameters, spliced in front of them), written
/// straight from the job (no JSON tree in between).
#[derive(serde::Serialize)]
struct RunContext<'a> {
    namespace: &'a str,
    action_name: String,
    action_version: &'a str,
    activation_id: &'a str,
    transaction_id: &'a str,
    /// Milliseconds since the epoch, as a string.
    deadline: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key: Option<&'a str>,
    /// Ours: the run's W3C `traceparent`, empty when it has none. OpenWhisk's runtimes export
    /// every key but `value` to the action as `__OW_<KEY>`, so the action reads
    /// `__OW_TRACEPARENT`. Always sent: a runtime keeps a key a run leaves out, and the next
    /// run of a warm container must not read the last one's.
    traceparent: &'a str,
}

fn developer(message: String) -> Interpreted {
    Interpreted {
        outcome: Outcome::DeveloperError,
        result: json!({ "error": message }).into(),
        reusable: false,
        timed_out: false,
    }
}

/// Interprets a `/run` (or failed `/init`) answer. `oom` says the container's memory limit
/// killed it; `max_result_bytes` is the payload limit.
pub(super) fn interpret(answer: Answer, timeout_ms: u64, oom: bool, max_result_bytes: usize) -> Interpreted {
    let response = match answer {
        Err(RuntimeError::Timeout) => {
            let message = format!("The action exceeded its time limits of {timeout_ms} milliseconds.");
            return Interpreted { timed_out: true, ..developer(message) };
        }
        Err(RuntimeError::TooLarge(limit)) => {
            return developer(format!(
                "The action produced a response that exceeded the allowed length: more than {limit} bytes."
            ));
        }
        Err(RuntimeError::Connection(_)) if oom => {
            return developer("The action exhausted its memory and was aborted.".into());
        }
        Err(RuntimeError::Stranger(why)) => {
            return developer(format!("The action's container was removed: {why}."));
        }
        // OpenWhisk's words exactly; what the connection said goes to the invoker's log.
        Err(RuntimeError::Connection(_)) => {
            return developer(EXITED_UNEXPECTEDLY.into());
        }
        Ok(r) => r,
    };
    // Checked by a scan; the bytes are the result as they came.
    let body = match ResultJson::from_bytes(response.body.clone()) {
        Ok(body) => body,
        Err(_) if oom => {
            developer(format!("The action exhausted its memory and was aborted. {}", response.text())).result
        }
        Err(_) => return developer(format!("The action did not produce a valid JSON response: {}", response.text())),
    };
    // As current OpenWhisk runtimes: a dictionary or an array is a result, anything else is
    // the developer's error.
    if !body.is_dict_or_array() {
        return developer(NOT_A_RESULT.into());
    }
    let size = response.body.len();
    if size > max_result_bytes {
        return developer(format!(
            "The action produced a response that exceeded the allowed length: {size} > {max_result_bytes} bytes."
        ));
    }
    match (response.status, body.field("error").is_some()) {
        (200, false) => Interpreted { outcome: Outcome::Success, result: body, reusable: true, timed_out: false },
        (200, true) => {
            Interpreted { outcome: Outcome::ApplicationError, result: body, reusable: true, timed_out: false }
        }
        _ if oom => developer("The action exhausted its memory and was aborted.".into()),
        (_, true) => Interpreted { result: body, ..developer(String::new()) },
        (status, false) => developer(format!("The action did not produce a valid response (HTTP {status}).")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(status: u16, body: Value) -> Answer {
        Ok(RuntimeResponse { status, body: body.to_string().into(), ..RuntimeResponse::default() })
    }

    #[test]
    fn outcomes_follow_openwhisk() {
        let r = interpret(ok(200, json!({"a": 1})), 100, false, 1000);
        assert_eq!((r.outcome, r.reusable), (Outcome::Success, true));
        let r = interpret(ok(200, json!({"error": "x"})), 100, false, 1000);
        assert_eq!((r.outcome, r.reusable), (Outcome::ApplicationError, true));
        let r = interpret(ok(502, json!({"error": "command exited"})), 100, false, 1000);
        assert_eq!(
            (r.outcome, r.reusable, r.result.to_value()),
            (Outcome::DeveloperError, false, json!({"error": "command exited"}))
        );
        let r = interpret(Err(RuntimeError::Timeout), 100, false, 1000);
        assert!(r.timed_out && r.result.to_value()["error"].as_str().unwrap().contains("100 milliseconds"));
        let r = interpret(
            Err(RuntimeError::Connection(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into())),
            100,
            true,
            1000,
        );
        assert!(r.result.to_value()["error"].as_str().unwrap().contains("memory"));
        let r = interpret(ok(200, json!([1, 2])), 100, false, 1000);
        assert_eq!((r.outcome, r.result.to_value()), (Outcome::Success, json!([1, 2])));
        let r = interpret(ok(200, json!(5)), 100, false, 1000);
        assert_eq!((r.outcome, r.result.to_value()), (Outcome::DeveloperError, json!({"error": NOT_A_RESULT})));
        let r = interpret(ok(200, json!({"big": "x".repeat(50)})), 100, false, 10);
        assert!(r.result.to_value()["error"].as_str().unwrap().contains("exceeded the allowed length"));
    }
}
