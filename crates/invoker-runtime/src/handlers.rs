//! `/init` and `/run`: the action prepared once, then each run handed to an action process
//! through the actionloop protocol, with the sentinels after it.

use super::action::{ActionError, ActionProcess, Answered, InitSpec, PreparedAction};
use super::options::Launcher;
use super::sentinels::write_sentinels;
use super::stream;
use base64::Engine as _;
use bytes::Bytes;
use hyper::StatusCode;
use invoker_http::streamed::Streamed;
use invoker_http::{json_value, with_body, Response};
use invoker_wire::runtime::{EXITED_UNEXPECTEDLY, STREAM_TYPE};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::OnceLock;

pub(super) struct Runtime {
    pub(super) launcher: Launcher,
    pub(super) work: PathBuf,
    /// Held while `/init` runs, so that two cannot overlap.
    pub(super) initializing: tokio::sync::Mutex<()>,
    pub(super) action: OnceLock<PreparedAction>,
    pub(super) adopt: Option<tokio::net::UnixListener>,
    /// Started action processes not running anything. A run takes one (or starts one when all
    /// are busy, which only concurrent runs do) and gives it back unless it failed.
    pub(super) idle: parking_lot::Mutex<Vec<ActionProcess>>,
    /// `/init` asked that every run's lines start with its activation id (runs may overlap).
    pub(super) tag_logs: std::cell::Cell<bool>,
    /// The python or node launcher started with the runtime, waiting for the action
    /// (`ActionProcess::prestart`); `/init` hands it the action.
    pub(super) prestarted: parking_lot::Mutex<Option<ActionProcess>>,
}

impl Runtime {
    pub(super) fn kill_all(&self) {
        let prestarted = self.prestarted.lock().take();
        for mut process in self.idle.lock().drain(..).chain(prestarted) {
            process.kill();
        }
    }
}

pub(super) fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    json_value(status, &json!({ "error": message.to_string() }))
}

#[derive(Deserialize)]
struct InitBody {
    value: InitValue,
}

#[derive(Deserialize)]
struct InitValue {
    #[serde(default)]
    main: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    binary: bool,
    #[serde(default)]
    env: Map<String, Value>,
    /// Not OpenWhisk's: the invoker asks so when runs may overlap on this container.
    #[serde(default)]
    tag_logs: bool,
}

pub(super) async fn init(runtime: &Runtime, body: &[u8]) -> Response {
    let _exclusive = runtime.initializing.lock().await;
    if runtime.action.get().is_some() {
        return error(StatusCode::FORBIDDEN, "Cannot initialize the action more than once.");
    }
    let body: InitBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("the /init body is not valid: {e}")),
    };
    runtime.tag_logs.set(body.value.tag_logs);
    let spec = match init_spec(body.value) {
        Ok(spec) => spec,
        Err(message) => return error(StatusCode::FORBIDDEN, message),
    };
    let started = match PreparedAction::prepare(runtime.launcher, &runtime.work, spec) {
        Ok(action) => first_process(runtime, &action).await.map(|process| (action, process)),
        Err(e) => Err(e),
    };
    match started {
        Ok((action, process)) => {
            runtime.idle.lock().push(process);
            let _ = runtime.action.set(action);
            json_value(StatusCode::OK, &json!({ "ok": true }))
        }
        Err(e) => {
            // As OpenWhisk's OW_LOG_INIT_ERROR: the reason goes to the logs, then the sentinels.
            eprintln!("{e}");
            write_sentinels(None);
            error(StatusCode::BAD_GATEWAY, e)
        }
    }
}

/// The action's first process: the zygote's launcher where one comes, or the one started with
/// the runtime while it still waits; otherwise started here.
async fn first_process(runtime: &Runtime, action: &PreparedAction) -> Result<ActionProcess, ActionError> {
    if let (Launcher::Python, Some(listener)) = (runtime.launcher, &runtime.adopt) {
        if let Some(process) = ActionProcess::adopt(listener, action).await? {
            return Ok(process);
        }
    }
    let prestarted = runtime.prestarted.lock().take();
    if let Some(mut process) = prestarted {
        if process.waiting() {
            return process.hand(action).await;
        }
    }
    ActionProcess::start(action).await
}

fn init_spec(value: InitValue) -> Result<InitSpec, String> {
    let code = value.code.unwrap_or_default();
    if code.is_empty() {
        return Err("Missing main/no code to execute.".into());
    }
    let main = value.main.filter(|m| !m.is_empty()).unwrap_or_else(|| "main".into());
    let identifier = main
        .chars()
        .enumerate()
        .all(|(i, c)| c == '_' || c == '$' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
    if !identifier {
        return Err(format!("main '{main}' is not a function name"));
    }
    let code = if value.binary {
        base64::engine::general_purpose::STANDARD
            .decode(code.trim())
            .map_err(|e| format!("binary code is not base64: {e}"))?
    } else {
        code.into_bytes()
    };
    let env: BTreeMap<String, String> = value
        .env
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            (k, v)
        })
        .collect();
    Ok(InitSpec { main, code, binary: value.binary, env })
}

/// `streams`: the invoker takes a stream (`Accept: STREAM_TYPE`); otherwise a generator's
/// values are answered as one JSON array.
pub(super) async fn run_action(runtime: &Rc<Runtime>, body: Vec<u8>, streams: bool) -> Response {
    let Some(action) = runtime.action.get() else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no action defined yet");
    };
    let (line, tag) = match run_line(body, runtime.tag_logs.get()) {
        Ok(line) => line,
        Err(reason) => return error(StatusCode::BAD_REQUEST, reason),
    };
    let idle = runtime.idle.lock().pop();
    let process = match idle {
        Some(process) => Ok(process),
        None => ActionProcess::start(action).await,
    };
    let answer = match process {
        Err(e) => Err((StatusCode::BAD_GATEWAY, e.to_string())),
        Ok(mut process) => match process.run(line).await {
            Ok(Answered::Result(result)) => {
                runtime.idle.lock().push(process);
                Ok(result)
            }
            Ok(Answered::Stream(first)) if streams => {
                let (values, streamed) = Streamed::channel();
                let runtime = runtime.clone();
                let give_back = move |process| runtime.idle.lock().push(process);
                tokio::task::spawn_local(stream::relay(process, first, values, tag, give_back));
                let mut response = with_body(StatusCode::OK, STREAM_TYPE, Bytes::new());
                response.extensions_mut().insert(streamed);
                return response;
            }
            Ok(Answered::Stream(first)) => match stream::collect(&mut process, first).await {
                Ok(result) => {
                    runtime.idle.lock().push(process);
                    Ok(result)
                }
                Err(ActionError::Exited(_)) => Err(exited(runtime.launcher)),
                Err(e) => Err((StatusCode::BAD_GATEWAY, e.to_string())),
            },
            // The launcher's own error body, as OpenWhisk's runtime would answer it.
            Err(ActionError::Developer(body)) => {
                runtime.idle.lock().push(process);
                return sentinels_then(tag, with_body(StatusCode::BAD_GATEWAY, "application/json", body));
            }
            Err(e @ ActionError::NotAnObject) => {
                runtime.idle.lock().push(process);
                Err((StatusCode::BAD_GATEWAY, e.to_string()))
            }
            // A process that failed is dropped (and killed); the next run starts another.
            Err(ActionError::Exited(_)) => Err(exited(runtime.launcher)),
            Err(e) => Err((StatusCode::BAD_GATEWAY, e.to_string())),
        },
    };
    let response = match answer {
        Ok(result) => with_body(StatusCode::OK, "application/json", result),
        Err((status, reason)) => error(status, reason),
    };
    sentinels_then(tag, response)
}

/// The `/run` body as the line the launcher reads: checked to be one JSON object by a scan (no
/// tree, no second copy: a call's parameters may be hundreds of megabytes, and the runtime's
/// memory counts against the action's), its line breaks (white space between tokens, since a
/// JSON string holds none raw) made spaces, and, when runs are tagged, `"tag_logs":true` put
/// first with the activation id it tags with.
fn run_line(mut body: Vec<u8>, tag_logs: bool) -> Result<(Vec<u8>, Option<String>), String> {
    #[derive(Deserialize)]
    struct Context<'a> {
        #[serde(borrow, default)]
        activation_id: Option<std::borrow::Cow<'a, str>>,
    }
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err("the /run body must be a JSON object".into());
    }
    let tag = match serde_json::from_slice::<Context>(&body) {
        Err(e) => return Err(format!("the /run body is not JSON: {e}")),
        Ok(context) => context.activation_id.filter(|_| tag_logs).map(|id| id.into_owned()),
    };
    for byte in &mut body {
        if matches!(*byte, b'\n' | b'\r') {
            *byte = b' ';
        }
    }
    if tag.is_some() {
        // An activation id was read: the object has a member, so a comma follows the new one.
        let at = body.iter().position(|b| *b == b'{').map_or(0, |at| at + 1);
        body.splice(at..at, *br#""tag_logs":true,"#);
    }
    Ok((body, tag))
}

/// The sentinels go before the response: the invoker, answered, reads the container's pipes
/// to their end and finds them there, so the run's record is whole with its answer and
/// nothing waits for them.
fn sentinels_then(tag: Option<String>, response: Response) -> Response {
    write_sentinels(tag.as_deref());
    response
}

/// What OpenWhisk's runtime answers when the action's process exits under a run: the Go proxy
/// (python, native) says "command exited"; nodejs's whole server goes, and the invoker says
/// the action exited unexpectedly.
fn exited(launcher: Launcher) -> (StatusCode, String) {
    match launcher {
        Launcher::Python | Launcher::Native => (StatusCode::BAD_REQUEST, "command exited".into()),
        Launcher::Nodejs => (StatusCode::BAD_GATEWAY, EXITED_UNEXPECTEDLY.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Listen;
    use std::path::Path;

    fn value(v: Value) -> InitValue {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn init_needs_code_and_a_function_name() {
        assert!(init_spec(value(json!({}))).unwrap_err().contains("no code"));
        assert!(init_spec(value(json!({"code": "x", "main": "a;b"}))).unwrap_err().contains("not a function name"));
        assert!(init_spec(value(json!({"code": "x", "main": "9a"}))).is_err());
        assert_eq!(init_spec(value(json!({"code": "x", "main": ""}))).unwrap().main, "main");
        assert_eq!(init_spec(value(json!({"code": "x", "main": "$handle_1"}))).unwrap().main, "$handle_1");
    }

    #[test]
    fn binary_code_is_base64_and_env_values_are_strings() {
        let spec =
            init_spec(value(json!({"code": "aGk=", "binary": true, "env": {"A": "s", "B": 3, "C": {"x": true}}})))
                .unwrap();
        assert_eq!(spec.code, b"hi");
        assert_eq!(spec.env["A"], "s");
        assert_eq!(spec.env["B"], "3");
        assert_eq!(spec.env["C"], r#"{"x":true}"#);
        assert!(init_spec(value(json!({"code": "not base64!", "binary": true}))).unwrap_err().contains("base64"));
    }

    #[test]
    fn a_run_body_becomes_one_line_without_a_tree() {
        let body = b"{\"value\": {\"a\":\n [1,\r\n2], \"s\": \"x\\ny\"},\n \"activation_id\": \"abc\"}".to_vec();
        let (line, tag) = run_line(body.clone(), false).unwrap();
        assert_eq!((line.contains(&b'\n'), tag), (false, None));
        let parsed: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(parsed, json!({"value": {"a": [1, 2], "s": "x\ny"}, "activation_id": "abc"}));
        let (line, tag) = run_line(body, true).unwrap();
        assert_eq!(tag.as_deref(), Some("abc"));
        let parsed: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(parsed["tag_logs"], true);
        assert_eq!(run_line(b"{}".to_vec(), true).unwrap(), (b"{}".to_vec(), None));
        assert!(run_line(b"[1]".to_vec(), false).unwrap_err().contains("JSON object"));
        assert!(run_line(b"{\"a\":".to_vec(), false).unwrap_err().contains("not JSON"));
    }

    #[test]
    fn listen_is_an_address_or_a_unix_socket() {
        assert!(matches!("127.0.0.1:8080".parse::<Listen>(), Ok(Listen::Tcp(_))));
        assert!(matches!("unix:/tmp/a.sock".parse::<Listen>(), Ok(Listen::Unix(p)) if p == Path::new("/tmp/a.sock")));
        assert!("unix:".parse::<Listen>().is_err());
        assert!("localhost".parse::<Listen>().is_err());
    }
}
