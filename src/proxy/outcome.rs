//! How a runtime's answer becomes an activation outcome, and whether the container may be kept.
//! Pure: the same rules as OpenWhisk's `ActivationResponse`.

use super::client::{RuntimeError, RuntimeResponse};
use crate::model::Outcome;
use serde_json::{json, Value};

/// The one message for a result that is neither a dictionary nor an array, whichever kind (the
/// runtime's own answer says the same).
pub const NOT_A_RESULT: &str = "The action did not return a dictionary or array.";

#[derive(Debug, PartialEq)]
pub struct Interpreted {
    pub outcome: Outcome,
    pub result: Value,
    /// False for developer and whisk errors: the container is removed, never reused.
    pub reusable: bool,
    pub timed_out: bool,
}

fn developer(message: String) -> Interpreted {
    Interpreted {
        outcome: Outcome::DeveloperError,
        result: json!({ "error": message }),
        reusable: false,
        timed_out: false,
    }
}

/// Interprets a `/run` (or failed `/init`) answer. `oom` says the container's memory limit
/// killed it; `max_result_bytes` is the payload limit.
pub fn interpret(
    answer: Result<RuntimeResponse, RuntimeError>,
    timeout_ms: u64,
    oom: bool,
    max_result_bytes: usize,
) -> Interpreted {
    let response = match answer {
        Err(RuntimeError::Timeout) => {
            let message = format!("The action exceeded its time limits of {timeout_ms} milliseconds.");
            return Interpreted { timed_out: true, ..developer(message) };
        }
        Err(RuntimeError::Connection(_)) if oom => {
            return developer("The action exhausted its memory and was aborted.".into());
        }
        Err(RuntimeError::Connection(e)) => {
            return developer(format!("The action did not produce a valid response and exited unexpectedly: {e}"));
        }
        Ok(r) => r,
    };
    let body = match response.body {
        Ok(body) => body,
        Err(text) if oom => developer(format!("The action exhausted its memory and was aborted. {text}")).result,
        Err(text) => return developer(format!("The action did not produce a valid JSON response: {text}")),
    };
    // As current OpenWhisk runtimes: a dictionary or an array is a result, anything else is
    // the developer's error.
    if !body.is_object() && !body.is_array() {
        return developer(NOT_A_RESULT.into());
    }
    let size = body.to_string().len();
    if size > max_result_bytes {
        return developer(format!(
            "The action produced a response that exceeded the allowed length: {size} > {max_result_bytes} bytes."
        ));
    }
    match (response.status, body.get("error").is_some()) {
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

    fn ok(status: u16, body: Value) -> Result<RuntimeResponse, RuntimeError> {
        Ok(RuntimeResponse { status, body: Ok(body) })
    }

    #[test]
    fn outcomes_follow_openwhisk() {
        let r = interpret(ok(200, json!({"a": 1})), 100, false, 1000);
        assert_eq!((r.outcome, r.reusable), (Outcome::Success, true));
        let r = interpret(ok(200, json!({"error": "x"})), 100, false, 1000);
        assert_eq!((r.outcome, r.reusable), (Outcome::ApplicationError, true));
        let r = interpret(ok(502, json!({"error": "command exited"})), 100, false, 1000);
        assert_eq!(
            (r.outcome, r.reusable, r.result),
            (Outcome::DeveloperError, false, json!({"error": "command exited"}))
        );
        let r = interpret(Err(RuntimeError::Timeout), 100, false, 1000);
        assert!(r.timed_out && r.result["error"].as_str().unwrap().contains("100 milliseconds"));
        let r = interpret(Err(RuntimeError::Connection("reset".into())), 100, true, 1000);
        assert!(r.result["error"].as_str().unwrap().contains("memory"));
        let r = interpret(ok(200, json!([1, 2])), 100, false, 1000);
        assert_eq!((r.outcome, r.result), (Outcome::Success, json!([1, 2])));
        let r = interpret(ok(200, json!(5)), 100, false, 1000);
        assert_eq!((r.outcome, r.result), (Outcome::DeveloperError, json!({"error": NOT_A_RESULT})));
        let r = interpret(ok(200, json!({"big": "x".repeat(50)})), 100, false, 10);
        assert!(r.result["error"].as_str().unwrap().contains("exceeded the allowed length"));
    }
}
