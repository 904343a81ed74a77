//! Actions: create or update, read, list, delete, and invoke.

use super::archive;
use super::call::{blocking, flag, json, page, Call, PageQuery};
use super::error::ApiError;
use super::state::{load_action, AppState};
use crate::activation::{InvokeRequest, Invoked};
use crate::config::{Config, KindLanguage};
use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::StatusCode;
use invoker_http::body_parts::BodyParts;
use invoker_http::streamed::Streamed;
use invoker_http::{with_body, with_parts, Response};
use invoker_job::stream::StreamFormat;
use invoker_wire::model::{epoch_ms, new_activation_id, validate_entity_name, Action, Exec, KeyValue, Limits};
use invoker_wire::params::Params;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;

pub(super) async fn list(state: &AppState, call: &Call, ns: &str) -> Result<Response, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    let (skip, limit) = page(&call.query::<PageQuery>()?)?;
    let store = state.service.store().clone();
    let actions = blocking(move || store.list_actions(&ns, skip, limit)).await??;
    Ok(json(StatusCode::OK, &actions.iter().map(action_json).collect::<Vec<_>>()))
}

fn action_json(a: &Action) -> Value {
    json!({
        "namespace": a.namespace, "name": a.name, "version": a.version, "exec": a.exec,
        "limits": a.limits, "parameters": a.parameters, "annotations": a.annotations,
        "publish": a.publish, "updated": a.updated,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionPut {
    exec: Option<Exec>,
    limits: Option<LimitsPut>,
    #[serde(default)]
    parameters: Vec<KeyValue>,
    #[serde(default)]
    annotations: Vec<KeyValue>,
    #[serde(default)]
    publish: bool,
    #[serde(default)]
    #[allow(dead_code)]
    namespace: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    name: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    version: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsPut {
    timeout: Option<u64>,
    memory: Option<u32>,
    logs: Option<u32>,
    concurrency: Option<u32>,
    disk: Option<u32>,
}

/// An action from a `PUT` body built by another route (Fn's functions), validated as a `PUT`.
pub(super) fn action_from_json(config: &Config, put: Value, ns: &str, name: &str) -> Result<Action, ApiError> {
    let put: ActionPut = serde_json::from_value(put).map_err(|e| ApiError::Internal(format!("an action body: {e}")))?;
    validate_action(config, put, ns, name)
}

fn validate_action(config: &Config, put: ActionPut, ns: &str, name: &str) -> Result<Action, ApiError> {
    let bad = |m: String| ApiError::BadRequest(m);
    let exec = put.exec.ok_or_else(|| bad("exec: is required".into()))?;
    let kinds = config.action_kinds();
    let Some(&kind_max) = kinds.get(exec.kind.as_str()) else {
        let known: Vec<_> = kinds.keys().copied().collect();
        return Err(bad(format!("exec.kind: '{}' is not a supported kind ({})", exec.kind, known.join(", "))));
    };
    // A function made from an image of its own holds its code in the image.
    match (exec.kind == invoker_factory::kinds::FN_IMAGE_KIND, exec.image.as_deref()) {
        (true, Some(image)) if invoker_wire::model::is_image_reference(image) => {}
        (true, Some(_)) => return Err(bad("exec.image: not an image reference (name[:tag][@digest])".into())),
        (true, None) => return Err(bad(format!("exec.image: is required for kind {}", exec.kind))),
        (false, _) if exec.code.as_deref().is_none_or(str::is_empty) => {
            return Err(bad("exec.code: is required and must not be empty".into()));
        }
        (false, _) => {}
    }
    if let Some(main) = exec.main.as_deref() {
        check_main(config.kind_language(&exec.kind), exec.binary, main).map_err(|e| bad(format!("exec.main: {e}")))?;
    }
    let l = &config.limits;
    let given =
        put.limits.unwrap_or(LimitsPut { timeout: None, memory: None, logs: None, concurrency: None, disk: None });
    let limits = Limits {
        timeout: given.timeout.unwrap_or(l.timeout_default_ms),
        memory: given.memory.unwrap_or(l.memory_default_mb),
        logs: given.logs.unwrap_or(l.logs_default_mb),
        concurrency: given.concurrency.unwrap_or(l.concurrency_default.min(kind_max)),
        disk: given.disk.unwrap_or(l.disk_default_mb),
    };
    let range = |field: &str, v: u64, lo: u64, hi: u64, unit: &str| {
        if v < lo || v > hi {
            Err(bad(format!("limits.{field}: {v} {unit} is outside the allowed range {lo}..={hi} {unit}")))
        } else {
            Ok(())
        }
    };
    range("timeout", limits.timeout, l.timeout_min_ms, l.timeout_max_ms, "ms")?;
    range("memory", limits.memory.into(), l.memory_min_mb.into(), l.memory_max_mb.into(), "MB")?;
    range("logs", limits.logs.into(), 0, l.logs_max_mb.into(), "MB")?;
    range("concurrency", limits.concurrency.into(), 1, l.concurrency_max.into(), "")?;
    range("disk", limits.disk.into(), l.disk_min_mb.into(), l.disk_max_mb.into(), "MB")?;
    if limits.concurrency > kind_max {
        let protocol = config.kinds.get(&exec.kind).map(|k| k.protocol).unwrap_or_default();
        let why = match protocol.max_runs_at_once() {
            Some(one) if one == kind_max => format!("its protocol, {protocol:?}, takes {one} call at a time"),
            _ => format!("{kind_max}, its max_concurrency"),
        };
        return Err(bad(format!(
            "limits.concurrency: {} is above what a container of kind '{}' takes at once ({why})",
            limits.concurrency, exec.kind
        )));
    }
    check_code_fits(config, &exec, limits.disk)?;
    for (i, p) in put.parameters.iter().enumerate() {
        if p.key.is_empty() {
            return Err(bad(format!("parameters[{i}].key: must not be empty")));
        }
    }
    check_queue_policy(&put.annotations).map_err(bad)?;
    Ok(Action {
        namespace: ns.into(),
        name: name.into(),
        version: String::new(),
        exec,
        limits,
        parameters: put.parameters,
        annotations: put.annotations,
        publish: put.publish,
        updated: epoch_ms(),
        revision: 0,
    })
}

/// An action's own policy for its asynchronous calls, in its annotations: whole numbers within
/// the bounds Lambda keeps (`max-retry-attempts` 0 to 2, `max-event-age` 60 to 21600 s), and
/// its destinations (`on-success`, `on-failure`), names of actions of its namespace.
fn check_queue_policy(annotations: &[KeyValue]) -> Result<(), String> {
    let bounds = [
        (invoker_wire::model::MAX_RETRY_ATTEMPTS, 0, u64::from(crate::config::RETRY_ATTEMPTS_MAX)),
        (
            invoker_wire::model::MAX_EVENT_AGE,
            crate::config::EVENT_AGE_MIN.as_secs(),
            crate::config::EVENT_AGE_MAX.as_secs(),
        ),
        (invoker_wire::model::MAX_CONCURRENCY, 1, invoker_wire::model::MAX_CONCURRENCY_MAX),
        (invoker_wire::model::RESERVED_CONCURRENCY, 1, invoker_wire::model::MAX_CONCURRENCY_MAX),
        (invoker_wire::model::PROVISIONED_CONCURRENCY, 1, invoker_wire::model::MAX_CONCURRENCY_MAX),
    ];
    for (key, lo, hi) in bounds {
        let Some(value) = annotations.iter().find(|a| a.key == key).map(|a| &a.value) else { continue };
        if !value.as_u64().is_some_and(|v| (lo..=hi).contains(&v)) {
            return Err(format!("annotations.{key}: {value} must be a whole number from {lo} to {hi}"));
        }
    }
    // Destinations name an action of the same namespace.
    for key in [invoker_wire::model::ON_SUCCESS, invoker_wire::model::ON_FAILURE] {
        let Some(value) = annotations.iter().find(|a| a.key == key).map(|a| &a.value) else { continue };
        let name = value.as_str().ok_or_else(|| format!("annotations.{key}: {value} must be an action's name"))?;
        validate_entity_name(&format!("annotations.{key}"), name)?;
    }
    Ok(())
}

/// An action's `reserved-concurrency` with its namespace's other reservations stays within
/// the namespace's limit, and its `provisioned-concurrency` within its cap and, with the
/// namespace's other provisioned containers, within `limits.namespace_provisioned` (checked at
/// each save: two saves at once may each pass alone; what is provisioned is bounded again
/// when it is applied).
async fn check_kept(state: &AppState, action: &Action) -> Result<(), ApiError> {
    let (reserved, provisioned) = (action.reserved_concurrency(), action.provisioned_concurrency());
    if reserved.is_none() && provisioned.is_none() {
        return Ok(());
    }
    let others = state.service.kept_by_others(&action.namespace, &action.name).await?;
    let limit = state.service.namespace_limit();
    if let Some(reserved) = reserved.filter(|r| others.reserved.saturating_add(*r) > limit) {
        return Err(ApiError::BadRequest(format!(
            "annotations.{}: {reserved} with the {} the namespace's other actions reserve is more than \
             limits.namespace_concurrent ({limit})",
            invoker_wire::model::RESERVED_CONCURRENCY,
            others.reserved
        )));
    }
    let Some(provisioned) = provisioned else { return Ok(()) };
    let key = invoker_wire::model::PROVISIONED_CONCURRENCY;
    if let Some(cap) = action.max_concurrency().filter(|cap| provisioned > *cap) {
        return Err(ApiError::BadRequest(format!(
            "annotations.{key}: {provisioned} is more than the action may run at once ({cap}, its \
             max-concurrency or reserved-concurrency)"
        )));
    }
    let bound = state.config.limits.namespace_provisioned;
    if others.provisioned.saturating_add(provisioned) > bound {
        return Err(ApiError::BadRequest(format!(
            "annotations.{key}: {provisioned} with the {} the namespace's other actions keep is more than \
             limits.namespace_provisioned ({bound})",
            others.provisioned
        )));
    }
    Ok(())
}

/// The code as it will lie in the container's directory fits the action's disk: a zip's
/// entries are checked one by one (and against `limits.archive_unpacked_max_mb`), any other
/// code by its size. Checked here rather than at the first run, where it would be the action's
/// failure.
fn check_code_fits(config: &Config, exec: &Exec, disk_mb: u32) -> Result<(), ApiError> {
    let bad = |m: String| ApiError::BadRequest(m);
    let disk = u64::from(disk_mb) * 1024 * 1024;
    let fits = |len: usize| {
        if len as u64 > disk {
            return Err(bad(format!(
                "exec.code: {len} bytes do not fit in limits.disk ({disk_mb} MB, what the container may write)"
            )));
        }
        Ok(())
    };
    let code = exec.code.as_deref().unwrap_or_default();
    if !exec.binary {
        return fits(code.len());
    }
    if !config.takes_zips(&exec.kind) {
        return Err(bad(format!(
            "exec.binary: kind '{}' runs code sent as text only, not a zip; send the code as text",
            exec.kind
        )));
    }
    let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, code.trim())
        .map_err(|e| bad(format!("exec.code: binary code must be base64 ({e})")))?;
    // A native executable is binary code too; only an archive has entries to check.
    if archive::is_zip(&bytes) {
        let configured = u64::from(config.limits.archive_unpacked_max_mb) * 1024 * 1024;
        let (max, bound) = if disk < configured {
            (disk, format!("limits.disk ({disk_mb} MB)"))
        } else {
            (configured, format!("limits.archive_unpacked_max_mb ({} MB)", config.limits.archive_unpacked_max_mb))
        };
        let unpacked = archive::check_zip(&bytes, max).map_err(|e| bad(format!("exec.code: {e}, {bound}")))?;
        // As the container's disk keeps them: whole pages, and a file each (the disk's files
        // run out before its bytes when they are many and small).
        let files = invoker_factory::own_disk::disk_inodes(disk_mb).saturating_sub(crate::config::DISK_INODES_RESERVED);
        if unpacked.files > files {
            return Err(bad(format!(
                "exec.code: the archive unpacks to {} files and directories, more than the {files} a disk of limits.disk \
                 ({disk_mb} MB) holds",
                unpacked.files
            )));
        }
        if unpacked.disk_bytes > disk {
            return Err(bad(format!(
                "exec.code: the archive takes {} bytes of disk unpacked (each file in whole 4 KiB pages), more than \
                 limits.disk ({disk_mb} MB)",
                unpacked.disk_bytes
            )));
        }
    } else {
        fits(bytes.len())?;
    }
    Ok(())
}

/// Whether `main` names a function as the kind's language does: an ASCII identifier in
/// python and node (`$` too in node; for a node zip also `file.function`, as OpenWhisk's
/// runtime splits it), and for any other kind a path without control characters. Empty is
/// refused (a runtime would run its default instead of what the user thought they named); left
/// out, it is the default, `main`.
fn check_main(language: KindLanguage, binary: bool, main: &str) -> Result<(), String> {
    let identifier = |s: &str, dollar: bool| {
        let word = |c: char| c == '_' || c.is_ascii_alphanumeric() || (dollar && c == '$');
        s.chars().next().is_some_and(|c| word(c) && !c.is_ascii_digit()) && s.chars().all(word)
    };
    if main.is_empty() {
        return Err("must not be empty (leave it out for the default, main)".into());
    }
    let (ok, what) = match language {
        KindLanguage::Python => (identifier(main, false), "a python function name (letters, digits and _)"),
        KindLanguage::Nodejs if binary => {
            let ok = match main.split_once('.') {
                Some((file, function)) => {
                    !file.is_empty()
                        && !file.contains(['/', '\0'])
                        && function.split('.').all(|part| identifier(part, true))
                }
                None => identifier(main, true),
            };
            (ok, "a javascript function name, or file.function in a zip")
        }
        KindLanguage::Nodejs => (identifier(main, true), "a javascript function name (letters, digits, _ and $)"),
        KindLanguage::Other => {
            (main.len() <= 1024 && !main.chars().any(char::is_control), "a name or path of at most 1024 characters")
        }
    };
    let shown: String = main.chars().take(80).collect();
    if ok {
        Ok(())
    } else {
        Err(format!("'{}' is not {what}", shown.escape_debug()))
    }
}

#[derive(Deserialize)]
pub(super) struct PutQuery {
    overwrite: Option<String>,
}

pub(super) async fn put(state: &AppState, call: &Call, ns: &str, name: &str) -> Result<Response, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    validate_entity_name("name", name).map_err(ApiError::BadRequest)?;
    let overwrite = flag("overwrite", &call.query::<PutQuery>()?.overwrite)?;
    let put: ActionPut = super::call::parse_body(&call.body)?;
    let action = validate_action(&state.config, put, &ns, name)?;
    check_kept(state, &action).await?;
    let store = state.service.store().clone();
    let saved = blocking(move || store.put_action(action, overwrite)).await??;
    state.service.retire_action(&saved.namespace, &saved.name, Some(&saved)).await;
    Ok(json(StatusCode::OK, &action_json(&saved)))
}

pub(super) async fn get(state: &AppState, call: &Call, ns: &str, name: &str) -> Result<Response, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    let action = load_action(state, &ns, name).await?;
    Ok(json(StatusCode::OK, &action_json(&action)))
}

pub(super) async fn delete(state: &AppState, call: &Call, ns: &str, name: &str) -> Result<Response, ApiError> {
    let (ns, _) = state.namespace(call, ns)?;
    validate_entity_name("name", name).map_err(ApiError::BadRequest)?;
    let store = state.service.store().clone();
    let name = name.to_string();
    let deleted = blocking(move || store.delete_action(&ns, &name)).await??.ok_or(ApiError::NotFound)?;
    state.service.retire_action(&deleted.namespace, &deleted.name, None).await;
    Ok(json(StatusCode::OK, &action_json(&deleted)))
}

#[derive(Deserialize)]
pub(super) struct InvokeQuery {
    blocking: Option<String>,
    result: Option<String>,
    timeout: Option<String>,
}

/// Takes the call's body: from here the parameters, a slice of it, are its one holder, and
/// they let it go once the runtime has them (a large body is not held until the answer).
pub(super) async fn invoke(state: &AppState, call: &mut Call, ns: &str, name: &str) -> Result<Response, ApiError> {
    let (ns, key) = state.namespace(call, ns)?;
    let (q, body) = (call.query::<InvokeQuery>()?, std::mem::take(&mut call.body));
    let limits = &state.config.limits;
    if body.len() > limits.payload_max_bytes {
        return Err(ApiError::TooLarge(limits.payload_max_bytes));
    }
    let (blocking, result_only) = (flag("blocking", &q.blocking)?, flag("result", &q.result)?);
    let max_wait = limits.blocking_wait;
    let wait = match q.timeout.as_deref() {
        None => max_wait,
        Some(t) => match t.parse::<u64>() {
            Ok(ms) if ms > 0 && Duration::from_millis(ms) <= max_wait => Duration::from_millis(ms),
            _ => {
                let max = max_wait.as_millis();
                return Err(ApiError::BadRequest(format!("timeout: '{t}' must be an integer from 1 to {max} (ms)")));
            }
        },
    };
    // Checked by a scan, passed on as the bytes they came as (`invoker_wire::params`).
    let params = Params::from_body(body).map_err(|e| ApiError::BadRequest(format!("request body: {e}")))?;
    let action = load_action(state, &ns, name).await?;
    let api_key = action.provides_api_key().then_some(key);
    let invoked = state
        .service
        .invoke(InvokeRequest {
            request: None,
            action,
            params,
            subject: ns.clone(),
            api_key,
            activation_id: None,
            transaction_id: new_activation_id(),
            wait: blocking.then_some(wait),
            traceparent: call.traceparent(),
            whole: None,
            start_notice: None,
            stream: stream_format(call)?,
        })
        .await?;
    Ok(invoke_response(invoked, result_only))
}

/// The stream a blocking caller takes, should the action stream its answer (`Accept`).
fn stream_format(call: &Call) -> Result<Option<StreamFormat>, ApiError> {
    let mut accept = call.head.headers.get_all(hyper::header::ACCEPT).iter();
    accept.try_fold(None, |found, value| {
        let value = value.to_str().map_err(|_| ApiError::BadRequest("Accept: not ASCII text".into()))?;
        Ok(found.or(StreamFormat::from_accept(value)))
    })
}

/// 200 done, 202 accepted, 502 the action failed, 503 nothing ran, 400 can never fit; a
/// stream's 200 goes as its first value came, its values after it as they come.
fn invoke_response(invoked: Invoked, result_only: bool) -> Response {
    let encoded = match invoked {
        Invoked::Accepted(id) => return accepted(&id),
        Invoked::Streaming { activation_id, format, start } => {
            let mut response = with_body(StatusCode::OK, format.content_type(), Bytes::new());
            response.headers_mut().insert(hyper::header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response.extensions_mut().insert(Streamed::new(start.parts));
            return with_activation_id(response, &activation_id);
        }
        Invoked::Done(encoded) => encoded,
    };
    let status = super::error::record_status(encoded.head(), StatusCode::BAD_GATEWAY);
    // The bytes the store wrote: the record is not encoded again for its answer.
    let body = match result_only {
        true => BodyParts::from(encoded.result_json()),
        false => BodyParts::new(encoded.json.parts().clone()),
    };
    record_response(&encoded.head().activation_id, status, body)
}

pub(super) fn accepted(id: &str) -> Response {
    with_activation_id(json(StatusCode::ACCEPTED, &json!({ "activationId": id })), id)
}

/// `response` with the `x-openwhisk-activation-id` header OpenWhisk's clients read.
fn with_activation_id(mut response: Response, id: &str) -> Response {
    if let Ok(id) = HeaderValue::from_str(id) {
        response.headers_mut().insert("x-openwhisk-activation-id", id);
    }
    response
}

/// `body` (JSON) with `status`, the activation's id, and Retry-After when nothing ran.
pub(super) fn record_response(activation_id: &str, status: StatusCode, body: BodyParts) -> Response {
    let mut response = with_activation_id(with_parts(status, "application/json", body), activation_id);
    if matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) {
        response.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
