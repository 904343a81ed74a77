//! The Kafka-less activation shim: `POST /v1/activations` takes the `ActivationMessage` an
//! OpenWhisk controller puts on an invoker's topic and answers with the message the invoker
//! would put on `completed<N>`: a `CombinedCompletionAndResultMessage`. Kafka delivers at
//! least once, so a repeated `activationId` is answered from the first and never run twice.

use super::actions::{accepted, record_response};
use super::call::Call;
use super::call::Principal;
use super::error::record_status;
use super::error::ApiError;
use super::state::{load_action, AppState};
use crate::activation::{IntakeError, InvokeRequest, Invoked};
use bytes::Bytes;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::StatusCode;
use invoker_http::body_parts::BodyParts;
use invoker_http::streamed::Streamed;
use invoker_http::Follows;
use invoker_http::Response;
use invoker_job::stream::StreamFormat;
use invoker_job::CallRequest;
use invoker_telemetry::TraceParent;
use invoker_wire::cluster::{
    REPORT_START, STARTED_LINE, STREAMED_ANSWER, STREAM_AS_WRITTEN, STREAM_HEADERS, STREAM_TO, TWO_PARTS,
};
use invoker_wire::model::{
    is_activation_id, validate_entity_name, ActivationMessage, EncodedRecord, Outcome, RecordHead,
};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot::error::TryRecvError;

/// A scheduler of this cluster's message: its id and the action's cluster revision. `None` for
/// an OpenWhisk controller's (its revision is a document's, not a number).
fn scheduler_revision<'m>(msg: &'m ActivationMessage<'_>) -> Result<Option<(&'m str, u64)>, ApiError> {
    let (Some(index), Some(revision)) = (&msg.root_controller_index, &msg.revision) else { return Ok(None) };
    let Ok(revision) = revision.parse::<u64>() else { return Ok(None) };
    validate_entity_name("rootControllerIndex.asString", &index.as_string).map_err(ApiError::BadRequest)?;
    Ok(Some((&index.as_string, revision)))
}

/// Reads a message as the shim does before it looks for the action (what the fuzz targets
/// feed with arbitrary bytes).
#[cfg(feature = "test-util")]
pub(crate) fn read_message(body: &[u8], payload_max_bytes: usize) -> Result<(), ApiError> {
    let msg: ActivationMessage<'static> = super::call::parse_body(body)?;
    validate(&msg)?;
    scheduler_revision(&msg)?;
    call_request(&msg, payload_max_bytes)?;
    Ok(())
}

/// What an `ActivationMessage` may hold beyond its parameters.
pub(super) const ENVELOPE_BYTES: usize = 64 * 1024;

/// The largest message: the payload limit in base64 (a call's body), and the envelope.
pub(super) fn message_limit(payload_max_bytes: usize) -> usize {
    payload_max_bytes.div_ceil(3) * 4 + ENVELOPE_BYTES
}

/// The caller's request a message carries, decoded and within the payload limit.
fn call_request(msg: &ActivationMessage, payload_max_bytes: usize) -> Result<Option<Arc<CallRequest>>, ApiError> {
    let Some(request) = &msg.request else { return Ok(None) };
    let body = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, request.body.as_bytes())
        .map_err(|e| ApiError::BadRequest(format!("request.body: not base64 ({e})")))?;
    if body.len() > payload_max_bytes {
        return Err(ApiError::TooLarge(payload_max_bytes));
    }
    let headers = request.headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    Ok(Some(Arc::new(CallRequest { headers, body: body.into() })))
}

pub(super) async fn activation_message(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    let caller = state.principal(call)?;
    let limit = message_limit(state.config.limits.payload_max_bytes);
    if call.body.len() > limit {
        return Err(ApiError::TooLarge(limit));
    }
    let msg: ActivationMessage<'static> = super::call::parse_body(&call.body)?;
    let transaction_id = validate(&msg)?;
    authorize(&caller, &msg)?;
    let request = call_request(&msg, state.config.limits.payload_max_bytes)?;
    let action = match (&caller, scheduler_revision(&msg)?, state.remote_actions()) {
        (Principal::Controller, Some((scheduler, revision)), Some(remote)) => {
            remote.action(scheduler, &msg.action.path, &msg.action.name, revision).await?
        }
        (Principal::Controller, Some((scheduler, _)), None) => {
            return Err(ApiError::Unavailable(format!(
                "scheduler {scheduler} sent an action this invoker cannot fetch: it needs [cluster] etcd and \
                 controller_key"
            )))
        }
        _ => load_action(state, &msg.action.path, &msg.action.name).await?,
    };
    // A controller waits for the end, as it would for the completion message on Kafka: the
    // invoker's own blocking wait is for callers that can fetch the record later.
    let wait = match caller {
        Principal::Controller => invoker_wire::cluster::controller_wait(
            Duration::from_millis(action.limits.timeout),
            state.config.pool.wait_deadline,
            state.config.proxy.init_timeout,
        ),
        _ => state.config.limits.blocking_wait,
    };
    let traceparent = msg.trace_context.as_ref().and_then(|headers| {
        TraceParent::of_headers(headers.iter().map(|(name, value)| (name.as_ref(), value.as_ref())))
    });
    let params = msg.content.map(std::borrow::Cow::into_owned).unwrap_or_default();
    // A caller that takes the result first and the whole record after (a scheduler of this
    // cluster says so with `Accept: application/x-ndjson`).
    let (whole, rest) = match takes_two_parts(call) {
        true => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        }
        false => (None, None),
    };
    let api_key = msg.user.authkey.filter(|_| action.provides_api_key()).map(|k| k.api_key.into_owned());
    // A scheduler keeping a queued call until it starts: told before `/run` goes out.
    let (start_notice, heard) = match (rest.is_some(), reports_start(call)) {
        (true, true) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        }
        _ => (None, None),
    };
    let invoke = InvokeRequest {
        request,
        action,
        params,
        subject: msg.user.subject.into_owned(),
        api_key,
        activation_id: Some(msg.activation_id.into_owned()),
        transaction_id,
        wait: msg.blocking.then_some(wait),
        traceparent,
        stream: match (&start_notice, msg.blocking) {
            (None, true) => stream_to(call)?,
            _ => None,
        },
        whole,
        start_notice,
    };
    let (heard, rest) = match (heard, rest) {
        (Some(heard), Some(rest)) => (heard, rest),
        (_, rest) => {
            let invoked = state.service.invoke(invoke).await?;
            return Ok(answer(state, invoked, rest, msg.transid));
        }
    };
    let service = state.service.clone();
    let (ended, mut end) = tokio::sync::oneshot::channel();
    // Its own task: once started, the call's end is the answer's second line, whatever
    // becomes of this handler.
    tokio::task::spawn_local(async move {
        let _ = ended.send(service.invoke(invoke).await);
    });
    let stopping = || ApiError::Unavailable("the invoker is stopping".into());
    tokio::select! {
        biased;
        invoked = &mut end => Ok(answer(state, invoked.map_err(|_| stopping())??, Some(rest), msg.transid)),
        ack = heard => match ack {
            Ok(ack) => Ok(started_answer(state, ack, end, rest, msg.transid)),
            // Ended without starting: answered as any call.
            Err(_) => Ok(answer(state, end.await.map_err(|_| stopping())??, Some(rest), msg.transid)),
        },
    }
}

/// The stream a scheduler's blocking call takes, should the action stream ([`STREAM_TO`]).
fn stream_to(call: &Call) -> Result<Option<StreamFormat>, ApiError> {
    let Some(value) = call.head.headers.get(STREAM_TO) else { return Ok(None) };
    let value = value.to_str().map_err(|_| ApiError::BadRequest(format!("{STREAM_TO}: not ASCII text")))?;
    if value == STREAM_AS_WRITTEN {
        return Ok(Some(StreamFormat::AsWritten));
    }
    match StreamFormat::from_accept(value) {
        Some(format) => Ok(Some(format)),
        None => Err(ApiError::BadRequest(format!("{STREAM_TO}: '{value}' is not a stream's content type"))),
    }
}

/// Whether the caller keeps the call until it starts ([`REPORT_START`]).
fn reports_start(call: &Call) -> bool {
    call.head.headers.contains_key(REPORT_START)
}

/// The answer to a call that started: [`STARTED_LINE`] now, and once the call ended, the
/// `CombinedCompletionAndResultMessage` with its whole record as the second line. `ack` fires
/// when the server takes the second part up, which is after it took the first: on the
/// invoker's one thread the started line is written to the connection before the run's
/// `/run` can go out.
fn started_answer(
    state: &AppState,
    ack: tokio::sync::oneshot::Sender<()>,
    end: tokio::sync::oneshot::Receiver<Result<Invoked, IntakeError>>,
    rest: tokio::sync::oneshot::Receiver<EncodedRecord>,
    transid: Value,
) -> Response {
    let user_memory_mb = state.pool().map_or(0, |p| p.user_memory_mb());
    let invoker_id = state.config.invoker_id.clone();
    let second = async move {
        let _ = ack.send(());
        let whole = match end.await.ok()?.ok()? {
            Invoked::Done(encoded) => rest.await.unwrap_or(encoded),
            // Not asked for (a scheduler's call takes no stream yet): dropped, it stops.
            Invoked::Accepted(_) | Invoked::Streaming { .. } => return None,
        };
        let mut ack = completion_message(&invoker_id, user_memory_mb, transid, &whole).to_vec();
        ack.push(b'\n');
        Some(Bytes::from(ack))
    };
    let mut response = invoker_http::with_body(StatusCode::OK, TWO_PARTS, Bytes::new());
    response.extensions_mut().insert(Follows::new(Bytes::from(format!("{STARTED_LINE}\n")), second));
    response
}

/// The answer to a call that ended (or was accepted) without a start reported.
fn answer(
    state: &AppState,
    invoked: Invoked,
    rest: Option<tokio::sync::oneshot::Receiver<EncodedRecord>>,
    transid: Value,
) -> Response {
    match invoked {
        Invoked::Accepted(id) => accepted(&id),
        // The values as the scheduler's caller reads them, as they come; the scheduler asks
        // for the record once the body ended.
        Invoked::Streaming { activation_id, start, .. } => {
            let mut response = invoker_http::with_body(StatusCode::OK, STREAMED_ANSWER, Bytes::new());
            response.extensions_mut().insert(Streamed::new(start.parts));
            if let Ok(id) = hyper::header::HeaderValue::from_str(&activation_id) {
                response.headers_mut().insert("x-openwhisk-activation-id", id);
            }
            // A function's own headers (its bytes go as they came): JSON escapes what a header
            // may not hold.
            let headers = start.head.map(|(_, headers)| serde_json::to_string(&headers).unwrap_or_default());
            if let Some(Ok(headers)) = headers.map(|h| hyper::header::HeaderValue::from_str(&h)) {
                response.headers_mut().insert(STREAM_HEADERS, headers);
            }
            response
        }
        Invoked::Done(encoded) => {
            let user_memory_mb = state.pool().map_or(0, |p| p.user_memory_mb());
            let invoker_id = state.config.invoker_id.clone();
            let status = record_status(encoded.head(), StatusCode::OK);
            let rest = rest.map(|mut rest| (rest.try_recv(), rest));
            let rest = match rest {
                Some((Err(TryRecvError::Empty), rest)) => rest,
                // The answer was the whole record (or it is here already): one message.
                Some((Ok(whole), _)) => {
                    let ack = completion_message(&invoker_id, user_memory_mb, transid, &whole);
                    return record_response(&whole.head().activation_id, status, ack.into());
                }
                Some((Err(TryRecvError::Closed), _)) | None => {
                    let ack = completion_message(&invoker_id, user_memory_mb, transid, &encoded);
                    return record_response(&encoded.head().activation_id, status, ack.into());
                }
            };
            // OpenWhisk's split: a `ResultMessage` as soon as the result is known, then the
            // `CombinedCompletionAndResultMessage` with the whole record, each on a line.
            let mut first = result_message(&transid, &encoded);
            first.push(b'\n');
            let second = async move {
                let whole = rest.await.ok()?;
                let mut ack = completion_message(&invoker_id, user_memory_mb, transid, &whole).to_vec();
                ack.push(b'\n');
                Some(Bytes::from(ack))
            };
            let mut response = record_response(&encoded.head().activation_id, status, BodyParts::default());
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(TWO_PARTS));
            response.extensions_mut().insert(Follows::new(first.into(), second));
            response
        }
    }
}

fn takes_two_parts(call: &Call) -> bool {
    call.head.headers.get_all(ACCEPT).iter().any(|v| v.to_str().is_ok_and(|v| v.contains(TWO_PARTS)))
}

/// OpenWhisk's `ResultMessage`: the record as the result made it, before its logs.
fn result_message(transid: &Value, encoded: &EncodedRecord) -> Vec<u8> {
    // A JSON value: encoding cannot fail.
    let transid = serde_json::to_vec(transid).expect("a transaction id serialises");
    let mut body = Vec::with_capacity(encoded.json.len() + transid.len() + 26);
    body.extend_from_slice(b"{\"transid\":");
    body.extend_from_slice(&transid);
    body.extend_from_slice(b",\"response\":");
    encoded.json.parts().iter().for_each(|part| body.extend_from_slice(part));
    body.push(b'}');
    body
}

/// A namespace's key submits only for itself: the action's path (packages are not supported:
/// the path is the namespace), the identity's namespace and its subject are all the key's
/// namespace. A controller key submits for anyone; the admin key for no one.
fn authorize(caller: &Principal, msg: &ActivationMessage) -> Result<(), ApiError> {
    let forbidden = || ApiError::Forbidden(msg.action.path.chars().take(256).collect());
    match caller {
        Principal::Controller => Ok(()),
        Principal::Admin => Err(forbidden()),
        Principal::Namespace { ns, .. } => {
            if msg.action.path != *ns || msg.user.namespace.name != *ns {
                return Err(forbidden());
            }
            if msg.user.subject != *ns {
                return Err(ApiError::Forbidden(format!(
                    "{} as subject {} (user.subject must be the key's own)",
                    ns,
                    msg.user.subject.chars().take(256).collect::<String>()
                )));
            }
            Ok(())
        }
    }
}

/// Checks what serde cannot; returns the transaction id (`transid` is `[id, startMillis, ...]`).
fn validate(msg: &ActivationMessage) -> Result<String, ApiError> {
    let bad = |m: &str| ApiError::BadRequest(m.into());
    let tid = match &msg.transid {
        Value::Array(parts) => match parts.first() {
            Some(Value::String(id)) if !id.is_empty() && id.len() <= 64 => id.clone(),
            _ => {
                return Err(bad(
                    "transid: the first element must be the transaction id, a string of 1 to 64 characters",
                ))
            }
        },
        _ => return Err(bad("transid: must be an array [id, startMillis]")),
    };
    if !is_activation_id(&msg.activation_id) {
        return Err(bad("activationId: must be 32 hexadecimal digits"));
    }
    if msg.action.path.contains('/') {
        return Err(bad("action.path: packages are not supported; the path must be the namespace"));
    }
    validate_entity_name("action.path", &msg.action.path).map_err(ApiError::BadRequest)?;
    validate_entity_name("action.name", &msg.action.name).map_err(ApiError::BadRequest)?;
    validate_entity_name("user.namespace.name", &msg.user.namespace.name).map_err(ApiError::BadRequest)?;
    if msg.user.subject.is_empty() || msg.user.subject.len() > 256 {
        return Err(bad("user.subject: must be 1 to 256 characters"));
    }
    if let Some(v) = &msg.action.version {
        if v.len() > 32 {
            return Err(bad("action.version: at most 32 characters"));
        }
    }
    Ok(tid)
}

/// OpenWhisk's `CombinedCompletionAndResultMessage`, with this invoker as `instance`, less its
/// `response`: the record goes in as the bytes it was encoded to once.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct CompletionMessage {
    transid: Value,
    is_system_error: bool,
    instance: Value,
}

fn completion_message(id: &str, user_memory_mb: u64, transid: Value, encoded: &EncodedRecord) -> Bytes {
    let rest = completion_fields(id, user_memory_mb, transid, encoded.head());
    // Fields of strings, numbers and JSON values: encoding cannot fail.
    let rest = serde_json::to_vec(&rest).expect("a completion message serialises");
    // `{"response":<record>,` then the rest's fields, without its own `{`.
    let mut body = Vec::with_capacity(encoded.json.len() + rest.len() + 13);
    body.extend_from_slice(b"{\"response\":");
    encoded.json.parts().iter().for_each(|part| body.extend_from_slice(part));
    body.push(b',');
    body.extend_from_slice(&rest[1..]);
    body.into()
}

fn completion_fields(id: &str, user_memory_mb: u64, transid: Value, record: &RecordHead) -> CompletionMessage {
    let digits = id.trim_start_matches(|c: char| !c.is_ascii_digit());
    let instance: u64 = digits.parse().unwrap_or(0);
    CompletionMessage {
        transid,
        is_system_error: record.outcome == Outcome::WhiskError,
        instance: json!({
            "instance": instance,
            "uniqueName": id,
            "displayedName": id,
            "userMemory": format!("{user_memory_mb} MB"),
            "instanceType": "invoker",
            "tags": [],
            "dedicatedNamespaces": [],
        }),
    }
}
