//! Calls to Fn functions: `POST /invoke/{fn_id}` (the body in, the function's answer out) and
//! HTTP triggers at `/t/{app}/{source}` with Fn's gateway mapping both ways. Each call is an
//! activation with a record, as an OpenWhisk invoke is; its status is chosen in
//! `api::error::fn_record_status`.

use super::cache::Target;
use super::docs::{fn_not_found, Docs, InvokeKey, INVOKE_KEYS};
use crate::activation::{InvokeRequest, Invoked};
use crate::api::call::{Call, Principal};
use crate::api::error::{fn_record_status, ApiError};
use crate::api::state::AppState;
use base64::Engine as _;
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::StatusCode;
use invoker_http::is_hop_by_hop;
use invoker_http::streamed::Streamed;
use invoker_http::Response;
use invoker_job::stream::{StreamFormat, StreamStart};
use invoker_job::CallRequest;
use invoker_store::DocKind;
use invoker_telemetry::TraceParent;
use invoker_wire::model::{new_activation_id, Action, ActivationRecord};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// Headers of the caller's that never reach a function: its key, and what belongs to the
/// connection to us.
fn kept_from_caller(name: &str) -> bool {
    !(is_hop_by_hop(name) || name.eq_ignore_ascii_case("authorization") || name.eq_ignore_ascii_case("host"))
}

/// `POST /invoke/{fn_id}`: the caller's headers and body to the function; its status, headers
/// and body back, with `Fn-Call-Id`.
pub(in crate::api) async fn invoke(state: &AppState, call: &Call, fn_id: &str) -> Result<Response, ApiError> {
    let (ns, key) = state.namespace(call, "_")?;
    let store = state.service.store();
    let docs = Docs { store, ns: &ns };
    let target = Target::Function(fn_id.to_string());
    let name = state.fn_cache.action_name(&**store, &ns, target, || docs.action_name_of(fn_id).map(Some))?;
    let action = docs.action_named(name.as_deref(), fn_id)?;
    let headers = call.head.headers.iter().filter(|(n, _)| kept_from_caller(n.as_str()));
    let headers = headers.map(|(n, v)| (n.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()));
    let request = CallRequest { headers: headers.collect(), body: call.body.clone() };
    let image = action.exec.image.clone();
    let detached =
        call.head.headers.get("fn-invoke-type").is_some_and(|t| t.as_bytes().eq_ignore_ascii_case(b"detached"));
    let record = match run(state, &ns, key, action, request, detached).await? {
        Invoked::Done(record) => record,
        Invoked::Accepted(id) if detached => return Ok(detached_accepted(&id)),
        Invoked::Accepted(id) => return Ok(still_running(&id)),
        Invoked::Streaming { activation_id, start, .. } => {
            return Ok(streaming(&activation_id, start, Mapping::Invoke))
        }
    };
    Ok(answer(record.record(), image.as_deref(), Mapping::Invoke))
}

/// A detached call (`Fn-Invoke-Type: detached`), as Fn's agent answers it: 202 at once, its id
/// in `Fn-Call-Id`. It waits in the durable queue until it runs; its record says how it ended.
fn detached_accepted(id: &str) -> Response {
    let mut response = invoker_http::with_body(StatusCode::ACCEPTED, "application/json", Bytes::from_static(b"{}"));
    if let Ok(id) = HeaderValue::from_str(id) {
        response.headers_mut().insert("fn-call-id", id);
    }
    response
}

/// Whom a call to a function's invoke URL (`/invoke/{fn_id}/{invoke_key}`) speaks for: the
/// namespace of the function that holds the key, for that function only. Fn's client calls the
/// URL with no credential; the key, 122 random bits shown only to the namespace's keys, is it.
/// A key that leads nowhere, or to another function, is Fn's 404 (it tells nothing of others).
pub(in crate::api) fn invoke_key_holder(state: &AppState, fn_id: &str, key: &str) -> Result<Principal, ApiError> {
    let store = state.service.store();
    let index = Docs { store, ns: INVOKE_KEYS };
    let find = || {
        let found: Option<InvokeKey> = index.get(DocKind::FnInvokeKey, key)?;
        Ok::<_, ApiError>(found.map(|k| format!("{}\n{}", k.ns, k.fn_id)))
    };
    let held = state.fn_cache.action_name(&**store, INVOKE_KEYS, Target::InvokeKey(key.to_string()), find)?;
    let leads_to = held.as_deref().and_then(|h| h.split_once('\n'));
    match leads_to {
        Some((ns, id)) if id == fn_id => state.namespace_principal(ns).ok_or_else(|| fn_not_found("Fn", fn_id)),
        _ => Err(fn_not_found("Fn", fn_id)),
    }
}

/// Any method at `/t/{app}/{source}`: the trigger of `app` with that source calls its function
/// with Fn's gateway headers (`Fn-Http-Method`, `Fn-Http-Request-Url`, `Fn-Intent:
/// httprequest`, every header `X` as `Fn-Http-H-X` but `Content-Type`); the function's
/// `Fn-Http-Status` becomes the status and its `Fn-Http-H-X` headers `X`.
pub(in crate::api) async fn trigger(
    state: &AppState,
    call: &Call,
    app: &str,
    source: &str,
) -> Result<Response, ApiError> {
    let (ns, key) = state.namespace(call, "_")?;
    let store = state.service.store();
    let docs = Docs { store, ns: &ns };
    let target = Target::Trigger(app.to_string(), source.to_string());
    let name = state.fn_cache.action_name(&**store, &ns, target, || {
        let Some((_, trigger)) = docs.trigger_at(app, source)? else { return Ok(None) };
        docs.action_name_of(&trigger.fn_id).map(Some)
    })?;
    let name = name.ok_or_else(|| ApiError::NotFoundNamed(format!("Trigger not found: {source}")))?;
    let action = docs.action_named(Some(&name), source)?;
    let host = call.head.headers.get(hyper::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let path = call.head.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("http://{host}{path}");
    let headers = call.head.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
    let request =
        CallRequest { headers: gateway_request(call.head.method.as_str(), &url, headers), body: call.body.clone() };
    let image = action.exec.image.clone();
    let record = match run(state, &ns, key, action, request, false).await? {
        Invoked::Done(record) => record,
        Invoked::Accepted(id) => return Ok(still_running(&id)),
        Invoked::Streaming { activation_id, start, .. } => {
            return Ok(streaming(&activation_id, start, Mapping::Gateway))
        }
    };
    Ok(answer(record.record(), image.as_deref(), Mapping::Gateway))
}

/// One call, blocking (as long as the function may run, and the wait for a container), or
/// `detached`: queued, answered once it is durable.
async fn run(
    state: &AppState,
    ns: &str,
    key: String,
    action: Arc<Action>,
    request: CallRequest,
    detached: bool,
) -> Result<Invoked, ApiError> {
    let limits = &state.config.limits;
    if request.body.len() > limits.payload_max_bytes {
        return Err(ApiError::TooLarge(limits.payload_max_bytes));
    }
    let wait = Duration::from_millis(action.limits.timeout).max(limits.blocking_wait) + Duration::from_secs(5);
    let api_key = action.provides_api_key().then_some(key);
    let traceparent = TraceParent::of_headers(request.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    let invoked = state
        .service
        .invoke(InvokeRequest {
            traceparent,
            request: Some(Arc::new(request)),
            action,
            params: invoker_wire::params::Params::empty(),
            subject: ns.to_string(),
            api_key,
            activation_id: None,
            transaction_id: new_activation_id(),
            wait: (!detached).then_some(wait),
            whole: None,
            start_notice: None,
            // A response in chunks goes to a waiting caller as the function writes it.
            stream: (!detached).then_some(StreamFormat::AsWritten),
        })
        .await?;
    Ok(invoked)
}

/// Past the wait the call still runs, and its record will say how it ended.
fn still_running(id: &str) -> Response {
    let mut response = invoker_http::json_value(StatusCode::GATEWAY_TIMEOUT, &json!({ "message": "Timed out" }));
    if let Ok(id) = HeaderValue::from_str(id) {
        response.headers_mut().insert("fn-call-id", id);
    }
    response
}

/// How a function's answer goes back: as it is (`/invoke`), or through Fn's HTTP gateway.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mapping {
    Invoke,
    Gateway,
}

/// The response for a finished call: the function's own answer on success, Fn's
/// `{"message": ...}` with Fn's status otherwise (naming the function's own `image` when that
/// is what failed); `Fn-Call-Id` either way.
fn answer(record: &ActivationRecord, image: Option<&str>, mapping: Mapping) -> Response {
    let mut response = match fn_record_status(record, image) {
        Err((status, message)) => invoker_http::json_value(status, &json!({ "message": message })),
        Ok(()) => {
            // The function's response as the invoker wrote it: decoded here, where it is read.
            let result = &record.response.result.to_value();
            let empty = Map::new();
            let headers = result["headers"].as_object().unwrap_or(&empty);
            function_response(headers, mapping, body_of(result))
        }
    };
    if let Ok(id) = HeaderValue::from_str(&record.activation_id) {
        response.headers_mut().insert("fn-call-id", id);
    }
    response
}

/// The function's answer with `headers` (as its record keeps them) and `body`, mapped for
/// the route.
fn function_response(headers: &Map<String, Value>, mapping: Mapping, body: Bytes) -> Response {
    let (status, headers) = match mapping {
        Mapping::Invoke => (StatusCode::OK, headers.iter().map(|(k, v)| (k.clone(), v)).collect()),
        Mapping::Gateway => gateway_response(headers),
    };
    let mut response = invoker_http::with_body(status, "application/json", body);
    response.headers_mut().remove(CONTENT_TYPE);
    for (name, value) in headers {
        let (Ok(name), Some(Ok(value))) =
            (HeaderName::try_from(name.as_str()), value.as_str().map(HeaderValue::try_from))
        else {
            continue;
        };
        if !is_hop_by_hop(name.as_str()) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// A function's 200 in chunks, passed on as it comes: its headers (mapped for the route, as a
/// whole answer's are), then its parts; `Fn-Call-Id` names the call whose record says how it
/// ended.
fn streaming(id: &str, start: StreamStart, mapping: Mapping) -> Response {
    let headers = invoker_http::headers_json(start.head.map(|(_, headers)| headers).unwrap_or_default());
    let mut response = function_response(&headers, mapping, Bytes::new());
    response.extensions_mut().insert(Streamed::new(start.parts));
    if let Ok(id) = HeaderValue::from_str(id) {
        response.headers_mut().insert("fn-call-id", id);
    }
    response
}

/// The function's body as it sent it (stored as text, or base64 when it was not UTF-8).
fn body_of(result: &Value) -> Bytes {
    let text = result["body"].as_str().unwrap_or_default();
    if result["encoding"] == "base64" {
        if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(text) {
            return bytes.into();
        }
    }
    Bytes::copy_from_slice(text.as_bytes())
}

/// Go's canonical header name (`x-custom-thing` → `X-Custom-Thing`), as Fn's gateway writes
/// the names it prefixes.
fn canonical(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() });
        upper = c == '-';
    }
    out
}

/// The headers a function behind an HTTP trigger gets: each of the caller's as
/// `Fn-Http-H-<Name>` (`Content-Type` as it is), and the gateway's own three.
fn gateway_request<'a>(
    method: &str,
    url: &str,
    headers: impl Iterator<Item = (&'a str, &'a [u8])>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, value) in headers {
        if !kept_from_caller(name) {
            continue;
        }
        let value = String::from_utf8_lossy(value).into_owned();
        if name.eq_ignore_ascii_case("content-type") {
            out.push(("Content-Type".to_string(), value));
        } else {
            out.push((format!("Fn-Http-H-{}", canonical(name)), value));
        }
    }
    out.push(("Fn-Http-Method".into(), method.to_string()));
    out.push(("Fn-Http-Request-Url".into(), url.to_string()));
    out.push(("Fn-Intent".into(), "httprequest".into()));
    out
}

/// Fn's gateway on the way back: `Fn-Http-Status` is the status (200 without one), each
/// `Fn-Http-H-X` is `X`, `Content-Type` stays, the rest (the FDK's own) goes.
fn gateway_response(headers: &Map<String, Value>) -> (StatusCode, Vec<(String, &Value)>) {
    let status = headers.get("fn-http-status").and_then(Value::as_str).and_then(|s| s.trim().parse::<u16>().ok());
    let status = status.and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::OK);
    let mut out = Vec::new();
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if let Some(original) = lower.strip_prefix("fn-http-h-") {
            out.push((original.to_string(), value));
        } else if lower == "content-type" {
            out.push((lower, value));
        }
    }
    (status, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_prefixes_the_callers_headers_but_content_type_and_drops_its_key() {
        let headers = [
            ("content-type", b"text/plain".as_slice()),
            ("x-custom-thing", b"1"),
            ("authorization", b"Basic secret"),
            ("connection", b"keep-alive"),
            ("host", b"example"),
        ];
        let out = gateway_request("PUT", "http://h/t/app/x?q=1", headers.into_iter());
        let get = |k: &str| out.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("Content-Type"), Some("text/plain"));
        assert_eq!(get("Fn-Http-H-X-Custom-Thing"), Some("1"));
        assert_eq!((get("Fn-Http-Method"), get("Fn-Intent")), (Some("PUT"), Some("httprequest")));
        assert_eq!(get("Fn-Http-Request-Url"), Some("http://h/t/app/x?q=1"));
        assert!(!out.iter().any(|(n, v)| n.to_ascii_lowercase().contains("authorization") || v.contains("secret")));
        assert!(!out.iter().any(|(n, _)| n.to_ascii_lowercase().contains("connection") || n.ends_with("Host")));
    }

    #[test]
    fn the_gateway_takes_the_functions_status_and_unprefixes_its_headers() {
        let headers = json!({"fn-http-status": "201", "fn-http-h-x-made": "yes", "content-type": "text/html",
                             "fn-fdk-version": "fdk-python/0.1.128"});
        let (status, out) = gateway_response(headers.as_object().unwrap());
        assert_eq!(status, StatusCode::CREATED);
        let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-made"], "the FDK's own headers stay behind");
        let (status, _) = gateway_response(json!({"fn-http-status": "teapot"}).as_object().unwrap());
        assert_eq!(status, StatusCode::OK);
    }

    #[test]
    fn a_body_comes_back_as_the_function_sent_it() {
        assert_eq!(body_of(&json!({"body": "hi"})), Bytes::from_static(b"hi"));
        assert_eq!(body_of(&json!({"body": "/wA=", "encoding": "base64"})), Bytes::from_static(&[0xff, 0x00]));
        assert_eq!(canonical("x-custom-THING"), "X-Custom-Thing");
    }
}
