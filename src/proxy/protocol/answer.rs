//! A runtime's answer, before and after its protocol interprets it: what both protocols hand
//! back to the proxy.

use super::client::{RuntimeError, RuntimeResponse};
use invoker_wire::model::Outcome;
use invoker_wire::result_json::ResultJson;

/// A runtime's answer as it came, before it is interpreted.
pub type Answer = Result<RuntimeResponse, RuntimeError>;

/// The short reason a container is given up after `answer` (for the invoker's log).
pub fn discard_reason(answer: &Answer, oom: bool) -> &'static str {
    match answer {
        _ if oom => "out of memory",
        Err(RuntimeError::Timeout) => "timeout",
        Err(RuntimeError::Connection(_)) => "runtime connection error",
        Err(RuntimeError::TooLarge(_)) => "answer too large",
        Err(RuntimeError::Stranger(_)) => "its runtime socket was not its own runtime's",
        Ok(_) => "developer error",
    }
}

/// What an answer means for the activation and the container.
#[derive(Debug, PartialEq)]
pub struct Interpreted {
    pub outcome: Outcome,
    pub result: ResultJson,
    /// False for developer and whisk errors: the container is removed, never reused.
    pub reusable: bool,
    pub timed_out: bool,
}
