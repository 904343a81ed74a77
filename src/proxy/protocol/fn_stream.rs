//! Fn's http-stream contract (`../shared/reference/fn-http-stream.md`), as Fn's agent speaks
//! it to an unmodified FDK: the container's environment, one `POST /call` per activation over
//! the unix socket the function made, and the answer's status read as Fn's agent reads it.
//! Where the function's socket appears and when it counts as ready is the factories' side
//! (`factory::fn_socket`).

use super::answer::{Answer, Interpreted};
use super::client::{RuntimeClient, RuntimeError, RuntimeResponse};
use super::fn_relay::FnRelay;
use base64::Engine;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use invoker_http::is_hop_by_hop;
use invoker_job::stream::{StreamFormat, StreamRequest};
use invoker_job::RunJob;
use invoker_wire::model::{Action, Outcome};
use invoker_wire::runtime::{FN_LOGFRAME_HDR, FN_LOGFRAME_NAME};
use serde_json::{json, Map, Value};
use std::time::{Duration, SystemTime};

/// The environment Fn's agent gives a function, less the listener (the factory says where the
/// socket directory is): the app's configuration, then the function's (the function's wins),
/// then the agent's own variables. An action that is not an Fn function is its own app.
pub fn environment(action: &Action, memory_mb: u32) -> Vec<(String, String)> {
    let fn_ = action.fn_function();
    let mut env: Vec<(String, String)> = Vec::new();
    for config in [&fn_.app_config, &fn_.config] {
        for (k, v) in config {
            env.retain(|(name, _)| name != k);
            env.push((k.clone(), v.clone()));
        }
    }
    let ours = [
        ("FN_FORMAT", "http-stream".to_string()),
        ("FN_MEMORY", memory_mb.to_string()),
        ("FN_TYPE", "sync".into()),
        ("FN_FN_ID", fn_.fn_id),
        ("FN_APP_ID", fn_.app_id),
        ("FN_LOGFRAME_NAME", FN_LOGFRAME_NAME.to_string()),
        ("FN_LOGFRAME_HDR", FN_LOGFRAME_HDR.to_string()),
    ];
    env.retain(|(name, _)| !ours.iter().any(|(o, _)| o == name) && name != "FN_LISTENER");
    env.extend(ours.into_iter().map(|(k, v)| (k.to_string(), v)));
    env
}

/// `POST /call` with the caller's headers (hop-by-hop ones dropped), `Fn-Call-Id`,
/// `Fn-Deadline` and the run's `traceparent`; the caller's body, or the activation's parameters as JSON when it came
/// through OpenWhisk's API. Past `timeout` the connection is dropped (the FDKs do not enforce
/// the deadline themselves).
/// `stream`: a caller that takes a response in chunks as the function writes it.
pub(super) async fn call(
    client: &RuntimeClient,
    run: &RunJob,
    stream: Option<StreamRequest>,
    timeout: Duration,
) -> Answer {
    let mut headers = HeaderMap::new();
    let body = match &run.request {
        Some(request) => {
            for (name, value) in &request.headers {
                if is_hop_by_hop(name) || name.eq_ignore_ascii_case("host") || name.eq_ignore_ascii_case("expect") {
                    continue;
                }
                if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value)) {
                    headers.append(name, value);
                }
            }
            request.body.clone()
        }
        None => {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            // The parameters' own bytes (the request's), shared.
            run.params.bytes()
        }
    };
    let deadline = humantime::format_rfc3339_seconds(SystemTime::now() + timeout).to_string();
    // The run's `traceparent` takes the place of the caller's: the function's spans are the
    // run span's children.
    let traceparent = run.completion.trace().to_action().map(|t| t.as_str());
    let ours = [("fn-call-id", Some(run.meta.activation_id.as_str())), ("fn-deadline", Some(deadline.as_str()))];
    for (name, value) in ours.into_iter().chain([(invoker_telemetry::HEADER, traceparent)]) {
        if let Some(Ok(value)) = value.map(HeaderValue::try_from) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    // Only a caller that takes the function's bytes as it writes them (Fn's routes) gets them
    // so; one that asked for a stream of values (OpenWhisk's route) gets the whole answer.
    match stream.filter(|s| s.format == StreamFormat::AsWritten) {
        None => client.send("/call", &headers, body.into(), timeout).await,
        Some(stream) => client.send_streaming("/call", &headers, body.into(), timeout, &mut FnRelay::new(stream)).await,
    }
}

/// The answer as a result: its status, headers (hop-by-hop ones dropped) and body, the body as
/// text when it is UTF-8 and in base64 (`"encoding": "base64"`) when it is not.
fn result_of(response: &RuntimeResponse) -> Map<String, Value> {
    let text = |value: &HeaderValue| String::from_utf8_lossy(value.as_bytes()).into_owned();
    let headers = invoker_http::headers_json(response.headers.iter().map(|(name, value)| (name, text(value))));
    let mut result = Map::new();
    result.insert("statusCode".into(), json!(response.status));
    result.insert("headers".into(), Value::Object(headers));
    // Passed on as it came: the body here is its last part, and the stream is said.
    if let Some(streamed) = response.streamed {
        let stream = json!({ "parts": streamed.parts, "bytes": streamed.bytes, "end": streamed.end });
        result.insert("stream".into(), stream);
    }
    match std::str::from_utf8(&response.body) {
        Ok(text) => {
            result.insert("body".into(), Value::String(text.to_string()));
        }
        Err(_) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(&response.body);
            result.insert("body".into(), Value::String(encoded));
            result.insert("encoding".into(), Value::String("base64".into()));
        }
    }
    result
}

fn failed(outcome: Outcome, error: &str, reusable: bool, timed_out: bool) -> Interpreted {
    Interpreted { outcome, result: json!({ "error": error }).into(), reusable, timed_out }
}

/// Fn's agent's reading of an answer: 200 is the function's answer; 502 its failure and 504
/// its own timeout, the container kept; any other status, a dropped connection or a deadline
/// passed is the container's end.
pub(super) fn interpret(answer: Answer, oom: bool, max_result_bytes: usize) -> Interpreted {
    let response = match answer {
        Err(RuntimeError::Timeout) => return failed(Outcome::DeveloperError, "Timed out", false, true),
        Err(RuntimeError::TooLarge(_)) => {
            return failed(Outcome::DeveloperError, "function response body too large", false, false)
        }
        Err(RuntimeError::Connection(_)) if oom => {
            return failed(Outcome::DeveloperError, "The function exhausted its memory and was aborted.", false, false)
        }
        Err(RuntimeError::Connection(_)) => {
            return failed(Outcome::DeveloperError, "error receiving function response", false, false)
        }
        Err(RuntimeError::Stranger(why)) => {
            let said = format!("The function's container was removed: {why}.");
            return failed(Outcome::DeveloperError, &said, false, false);
        }
        Ok(response) => response,
    };
    if response.body.len() > max_result_bytes {
        return failed(Outcome::DeveloperError, "function response body too large", false, false);
    }
    let mut result = result_of(&response);
    let (outcome, timed_out) = match response.status {
        200 => {
            return Interpreted {
                outcome: Outcome::Success,
                result: Value::Object(result).into(),
                reusable: true,
                timed_out: false,
            }
        }
        502 => (Outcome::ApplicationError, false),
        504 => (Outcome::ApplicationError, true),
        _ if oom => {
            return failed(Outcome::DeveloperError, "The function exhausted its memory and was aborted.", false, false)
        }
        status => {
            let error = format!("invalid function response (HTTP {status})");
            return Interpreted {
                result: json!({ "error": error }).into(),
                ..failed(Outcome::DeveloperError, "", false, false)
            };
        }
    };
    let error = if timed_out { "Timed out" } else { "function failed" };
    result.insert("error".into(), Value::String(error.into()));
    Interpreted { outcome, result: Value::Object(result).into(), reusable: true, timed_out }
}

/// Whether an answer is one of the contract's (200, 502, 504): anything else may mean the
/// container died, and its OOM state is worth reading.
pub(super) fn within_contract(answer: &Answer) -> bool {
    matches!(answer, Ok(RuntimeResponse { status: 200 | 502 | 504, .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Answer {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(HeaderName::try_from(*k).unwrap(), HeaderValue::try_from(*v).unwrap());
        }
        Ok(RuntimeResponse { status, headers: map, body: bytes::Bytes::copy_from_slice(body), streamed: None })
    }

    #[test]
    fn a_200_passes_status_headers_and_body_and_keeps_the_container() {
        let headers = [("content-type", "text/plain"), ("keep-alive", "75"), ("x-a", "1"), ("x-a", "2")];
        let r = interpret(answer(200, &headers, b"hello"), false, 1000);
        assert_eq!((r.outcome, r.reusable, r.timed_out), (Outcome::Success, true, false));
        assert_eq!(
            r.result.to_value(),
            json!({"statusCode": 200, "headers": {"content-type": "text/plain", "x-a": "1, 2"}, "body": "hello"})
        );
        let r = interpret(answer(200, &[], &[0xff, 0x00]), false, 1000);
        assert_eq!(
            (r.result.to_value()["body"].as_str(), r.result.to_value()["encoding"].as_str()),
            (Some("/wA="), Some("base64"))
        );
    }

    #[test]
    fn a_502_is_the_functions_failure_and_a_504_its_timeout_both_keep_the_container() {
        let r = interpret(answer(502, &[], b"boom"), false, 1000);
        assert_eq!((r.outcome, r.reusable, r.timed_out), (Outcome::ApplicationError, true, false));
        assert_eq!(
            (r.result.to_value()["error"].as_str(), r.result.to_value()["body"].as_str()),
            (Some("function failed"), Some("boom"))
        );
        let r = interpret(answer(504, &[], b""), false, 1000);
        assert_eq!((r.outcome, r.reusable, r.timed_out), (Outcome::ApplicationError, true, true));
    }

    #[test]
    fn another_status_a_broken_connection_a_deadline_or_too_much_removes_the_container() {
        let r = interpret(answer(400, &[], b"{\"message\":\"Invalid method\"}"), false, 1000);
        assert_eq!((r.outcome, r.reusable), (Outcome::DeveloperError, false));
        assert_eq!(r.result.to_value()["error"], "invalid function response (HTTP 400)");
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let r = interpret(Err(RuntimeError::Connection(reset.into())), false, 1000);
        assert_eq!(
            (r.reusable, r.result.to_value()["error"].as_str()),
            (false, Some("error receiving function response"))
        );
        let r = interpret(Err(RuntimeError::Timeout), false, 1000);
        assert_eq!((r.reusable, r.timed_out, r.result.to_value()["error"].as_str()), (false, true, Some("Timed out")));
        let r = interpret(answer(200, &[], &[b'x'; 11]), false, 10);
        assert_eq!(
            (r.reusable, r.result.to_value()["error"].as_str()),
            (false, Some("function response body too large"))
        );
        assert!(within_contract(&answer(502, &[], b"")) && !within_contract(&answer(503, &[], b"")));
    }

    #[test]
    fn the_functions_config_wins_over_its_apps_and_the_agents_variables_over_both() {
        let mut action = Action::for_test("f", "x");
        let said = json!({"fn_id": "01F", "app_id": "01A",
            "app_config": {"A": "app", "B": "app"}, "config": {"B": "fn", "FN_MEMORY": "9"}});
        action.annotations.push(invoker_wire::model::KeyValue { key: "fn".into(), value: said });
        let env = environment(&action, 256);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!((get("A"), get("B")), (Some("app"), Some("fn")));
        assert_eq!(
            (get("FN_MEMORY"), get("FN_FORMAT"), get("FN_TYPE")),
            (Some("256"), Some("http-stream"), Some("sync"))
        );
        assert_eq!((get("FN_FN_ID"), get("FN_APP_ID")), (Some("01F"), Some("01A")));
        assert_eq!(env.iter().filter(|(n, _)| n == "FN_MEMORY").count(), 1);
        action.annotations.clear();
        let env = environment(&action, 128);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!((get("FN_FN_ID"), get("FN_APP_ID")), (Some("guest/f"), Some("guest")), "an action is its own app");
    }
}
