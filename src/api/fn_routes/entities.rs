//! `/v2/apps`, `/v2/fns` and `/v2/triggers`: create, read, update, delete and list, in the
//! key's namespace. Writes run on a blocking thread (each is a durable transaction).

use super::docs::{body, check_name, fn_not_found, merge_config, new_id, now, App, Docs, Function, Trigger};
use crate::api::actions;
use crate::api::call::{blocking, json, Call};
use crate::api::error::ApiError;
use crate::api::state::AppState;
use crate::config::RuntimeProtocol;
use crate::http::Response;
use crate::model::{Action, KeyValue};
use crate::store::{DocKind, Store};
use hyper::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Fn's defaults for a function: 128 MB, 30 s to run, 30 s idle.
const DEFAULT_MEMORY_MB: u32 = 128;
const DEFAULT_TIMEOUT_S: u32 = 30;
const DEFAULT_IDLE_TIMEOUT_S: u32 = 30;
/// Fn's bounds: a call runs at most 300 s; an idle container is kept at most an hour.
const MAX_TIMEOUT_S: u32 = 300;
const MAX_IDLE_TIMEOUT_S: u32 = 3600;

/// The namespace of the request's key and the store, for a blocking closure.
fn owned(state: &AppState, call: &Call) -> Result<(Arc<dyn Store>, String), ApiError> {
    let (ns, _) = state.namespace(call, "_")?;
    Ok((state.service.store().clone(), ns))
}

fn items<T: serde::Serialize>(items: Vec<T>) -> Response {
    json(StatusCode::OK, &json!({ "items": items }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppPut {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    annotations: Map<String, Value>,
    #[serde(default)]
    #[allow(dead_code)]
    syslog_url: Option<String>,
    // Fields Fn's clients send back as they read them.
    #[serde(default)]
    #[allow(dead_code)]
    id: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    created_at: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    updated_at: Option<String>,
}

#[derive(Deserialize)]
struct ByName {
    name: Option<String>,
}

/// `POST /v2/apps` and `GET /v2/apps[?name=]`.
pub(in crate::api) async fn apps(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    let (store, ns) = owned(state, call)?;
    if call.head.method == Method::GET {
        let q: ByName = call.query()?;
        let mut apps: Vec<App> = Docs { store: &store, ns: &ns }.list(DocKind::FnApp)?;
        apps.retain(|a| q.name.as_ref().is_none_or(|n| *n == a.name));
        apps.sort_by(|a, b| a.name.cmp(&b.name));
        return Ok(items(apps));
    }
    let put: AppPut = body(&call.body)?;
    let name = put.name.ok_or_else(|| ApiError::BadRequest("name: is required".into()))?;
    check_name("name", &name)?;
    let mut config = BTreeMap::new();
    merge_config(&mut config, put.config)?;
    let created = blocking(move || {
        let docs = Docs { store: &store, ns: &ns };
        if docs.list::<App>(DocKind::FnApp)?.iter().any(|a| a.name == name) {
            return Err(ApiError::Conflict("App already exists".into()));
        }
        let at = now();
        let app =
            App { id: new_id(), name, config, annotations: put.annotations, created_at: at.clone(), updated_at: at };
        docs.put(DocKind::FnApp, &app.id, &app)?;
        Ok(app)
    })
    .await??;
    Ok(json(StatusCode::OK, &created))
}

/// `GET`, `PUT` (config and annotations; the name is immutable) and `DELETE` (with its
/// functions and triggers) of `/v2/apps/{id}`.
pub(in crate::api) async fn app(state: &AppState, call: &Call, id: &str) -> Result<Response, ApiError> {
    let (store, ns) = owned(state, call)?;
    let id = id.to_string();
    match call.head.method {
        Method::GET => Ok(json(StatusCode::OK, &Docs { store: &store, ns: &ns }.app(&id)?)),
        Method::PUT => {
            let put: AppPut = body(&call.body)?;
            let config = state.config.clone();
            let (updated, saved) = blocking(move || {
                let docs = Docs { store: &store, ns: &ns };
                let mut app = docs.app(&id)?;
                if put.name.as_ref().is_some_and(|n| *n != app.name) {
                    return Err(ApiError::BadRequest("name: an app's name cannot be changed".into()));
                }
                merge_config(&mut app.config, put.config)?;
                app.annotations.extend(put.annotations);
                app.updated_at = now();
                docs.put(DocKind::FnApp, &app.id, &app)?;
                // Its functions see the new configuration in new containers.
                let mut saved = Vec::new();
                for f in docs.list::<Function>(DocKind::FnFunction)?.into_iter().filter(|f| f.app_id == app.id) {
                    let action = docs.action(&f)?;
                    saved.push(store.put_action(function_action(&config, &ns, &app, &f, action_code(&action))?, true)?);
                }
                Ok((app, saved))
            })
            .await??;
            for action in saved {
                state.service.retire_action(&action.namespace, &action.name, Some(&action)).await;
            }
            Ok(json(StatusCode::OK, &updated))
        }
        Method::DELETE => {
            let (ns, deleted) = blocking(move || {
                let docs = Docs { store: &store, ns: &ns };
                let app = docs.app(&id)?;
                let mut deleted = Vec::new();
                for f in docs.list::<Function>(DocKind::FnFunction)?.into_iter().filter(|f| f.app_id == app.id) {
                    deleted.push(delete_function(&docs, &app, &f)?);
                }
                docs.delete(DocKind::FnApp, &app.id)?;
                Ok::<_, ApiError>((ns, deleted))
            })
            .await??;
            for name in deleted {
                state.service.retire_action(&ns, &name, None).await;
            }
            Ok(json(StatusCode::OK, &json!({ "message": "App deleted" })))
        }
        _ => Err(ApiError::MethodNotAllowed { method: call.head.method.to_string(), allowed: "GET, PUT, DELETE" }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionPut {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    app_id: Option<String>,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    memory: Option<u32>,
    #[serde(default)]
    timeout: Option<u32>,
    #[serde(default)]
    idle_timeout: Option<u32>,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    annotations: Map<String, Value>,
    /// Ours: the function's code, for a kind that takes it (`fn:python`, `fn:node`).
    #[serde(default)]
    code: Option<String>,
    /// Ours: the handler a kind's command names (`fn:python`: the function in `func.py`).
    #[serde(default)]
    main: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    id: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    created_at: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    updated_at: Option<String>,
}

#[derive(Deserialize)]
struct FunctionQuery {
    app_id: Option<String>,
    name: Option<String>,
}

/// The code and handler of a function's action, to carry over an update that sends neither.
fn action_code(action: &Action) -> (Option<String>, Option<String>) {
    (action.exec.code.clone(), action.exec.main.clone())
}

/// The action that runs `f` of `app`, validated as any action `PUT` is (limits, code size,
/// the kind's concurrency), with its Fn ids and configuration in its `fn` annotation.
fn function_action(
    config: &crate::config::Config,
    ns: &str,
    app: &App,
    f: &Function,
    (code, main): (Option<String>, Option<String>),
) -> Result<Action, ApiError> {
    let fn_kind = config.kinds.get(&f.image).is_some_and(|k| k.protocol == RuntimeProtocol::Fn);
    if !fn_kind {
        let mut kinds: Vec<&str> = config
            .kinds
            .iter()
            .filter(|(_, k)| k.protocol == RuntimeProtocol::Fn)
            .map(|(name, _)| name.as_str())
            .collect();
        kinds.sort_unstable();
        return Err(ApiError::BadRequest(format!(
            "image: '{}' is not a kind this invoker runs Fn functions with ({})",
            f.image,
            kinds.join(", ")
        )));
    }
    if !(1..=MAX_TIMEOUT_S).contains(&f.timeout) {
        return Err(ApiError::BadRequest(format!("timeout: {} s is outside 1..={MAX_TIMEOUT_S} s", f.timeout)));
    }
    if !(1..=MAX_IDLE_TIMEOUT_S).contains(&f.idle_timeout) {
        return Err(ApiError::BadRequest(format!(
            "idle_timeout: {} s is outside 1..={MAX_IDLE_TIMEOUT_S} s",
            f.idle_timeout
        )));
    }
    let said = crate::model::FnFunction {
        fn_id: f.id.clone(),
        app_id: app.id.clone(),
        config: f.config.clone(),
        app_config: app.config.clone(),
        idle_timeout_s: Some(f.idle_timeout),
    };
    let put = json!({
        "exec": { "kind": f.image, "code": code, "main": main },
        "limits": { "memory": f.memory, "timeout": u64::from(f.timeout) * 1000, "concurrency": 1 },
        "annotations": [KeyValue { key: "fn".into(), value: serde_json::to_value(said).expect("strings serialise") }],
    });
    actions::action_from_json(config, put, ns, &f.action_name(app))
}

/// Deletes the function, its triggers and its action; returns the action's name.
fn delete_function(docs: &Docs, app: &App, f: &Function) -> Result<String, ApiError> {
    for t in docs.list::<Trigger>(DocKind::FnTrigger)?.into_iter().filter(|t| t.fn_id == f.id) {
        docs.delete_trigger(Some(&app.name), &t)?;
    }
    let name = f.action_name(app);
    docs.store.delete_action(docs.ns, &name)?;
    docs.delete(DocKind::FnFunction, &f.id)?;
    Ok(name)
}

/// `POST /v2/fns` and `GET /v2/fns?app_id=[&name=]`.
pub(in crate::api) async fn functions(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    let (store, ns) = owned(state, call)?;
    if call.head.method == Method::GET {
        let q: FunctionQuery = call.query()?;
        let app_id = q.app_id.ok_or_else(|| ApiError::BadRequest("app_id: is required".into()))?;
        let docs = Docs { store: &store, ns: &ns };
        docs.app(&app_id)?;
        let mut fns: Vec<Function> = docs.list(DocKind::FnFunction)?;
        fns.retain(|f| f.app_id == app_id && q.name.as_ref().is_none_or(|n| *n == f.name));
        fns.sort_by(|a, b| a.name.cmp(&b.name));
        return Ok(items(fns));
    }
    let put: FunctionPut = body(&call.body)?;
    let name = put.name.ok_or_else(|| ApiError::BadRequest("name: is required".into()))?;
    check_name("name", &name)?;
    let app_id = put.app_id.ok_or_else(|| ApiError::BadRequest("app_id: is required".into()))?;
    let image = put.image.ok_or_else(|| ApiError::BadRequest("image: is required".into()))?;
    let mut fn_config = BTreeMap::new();
    merge_config(&mut fn_config, put.config)?;
    let config = state.config.clone();
    let created = blocking(move || {
        let docs = Docs { store: &store, ns: &ns };
        let app = docs.app(&app_id)?;
        if docs.list::<Function>(DocKind::FnFunction)?.iter().any(|f| f.app_id == app.id && f.name == name) {
            return Err(ApiError::Conflict("Fn already exists".into()));
        }
        let at = now();
        let f = Function {
            id: new_id(),
            name,
            app_id: app.id.clone(),
            image,
            memory: put.memory.unwrap_or(DEFAULT_MEMORY_MB),
            timeout: put.timeout.unwrap_or(DEFAULT_TIMEOUT_S),
            idle_timeout: put.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT_S),
            config: fn_config,
            annotations: put.annotations,
            created_at: at.clone(),
            updated_at: at,
        };
        store.put_action(function_action(&config, &ns, &app, &f, (put.code, put.main))?, false)?;
        docs.put(DocKind::FnFunction, &f.id, &f)?;
        Ok(f)
    })
    .await??;
    Ok(json(StatusCode::OK, &created))
}

/// `GET`, `PUT` (the name and app are immutable) and `DELETE` (with its triggers) of
/// `/v2/fns/{id}`.
pub(in crate::api) async fn function(state: &AppState, call: &Call, id: &str) -> Result<Response, ApiError> {
    let (store, ns) = owned(state, call)?;
    let id = id.to_string();
    match call.head.method {
        Method::GET => Ok(json(StatusCode::OK, &Docs { store: &store, ns: &ns }.function(&id)?)),
        Method::PUT => {
            let put: FunctionPut = body(&call.body)?;
            let config = state.config.clone();
            let (updated, saved) = blocking(move || {
                let docs = Docs { store: &store, ns: &ns };
                let mut f = docs.function(&id)?;
                if put.name.as_ref().is_some_and(|n| *n != f.name) {
                    return Err(ApiError::BadRequest("name: a function's name cannot be changed".into()));
                }
                if put.app_id.as_ref().is_some_and(|a| *a != f.app_id) {
                    return Err(ApiError::BadRequest("app_id: a function's app cannot be changed".into()));
                }
                let app = docs.app(&f.app_id)?;
                let (code, main) = action_code(&*docs.action(&f)?);
                f.image = put.image.unwrap_or(f.image);
                f.memory = put.memory.unwrap_or(f.memory);
                f.timeout = put.timeout.unwrap_or(f.timeout);
                f.idle_timeout = put.idle_timeout.unwrap_or(f.idle_timeout);
                merge_config(&mut f.config, put.config)?;
                f.annotations.extend(put.annotations);
                f.updated_at = now();
                let action = function_action(&config, &ns, &app, &f, (put.code.or(code), put.main.or(main)))?;
                let saved = store.put_action(action, true)?;
                docs.put(DocKind::FnFunction, &f.id, &f)?;
                Ok((f, saved))
            })
            .await??;
            state.service.retire_action(&saved.namespace, &saved.name, Some(&saved)).await;
            Ok(json(StatusCode::OK, &updated))
        }
        Method::DELETE => {
            let (ns, name) = blocking(move || {
                let docs = Docs { store: &store, ns: &ns };
                let f = docs.function(&id)?;
                let app = docs.app(&f.app_id)?;
                Ok::<_, ApiError>((ns.clone(), delete_function(&docs, &app, &f)?))
            })
            .await??;
            state.service.retire_action(&ns, &name, None).await;
            Ok(json(StatusCode::OK, &json!({ "message": "Fn deleted" })))
        }
        _ => Err(ApiError::MethodNotAllowed { method: call.head.method.to_string(), allowed: "GET, PUT, DELETE" }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TriggerPut {
    name: Option<String>,
    app_id: Option<String>,
    fn_id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    source: Option<String>,
    #[serde(default)]
    annotations: Map<String, Value>,
    #[serde(default)]
    #[allow(dead_code)]
    id: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    created_at: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    updated_at: Option<String>,
}

#[derive(Deserialize)]
struct TriggerQuery {
    app_id: Option<String>,
    fn_id: Option<String>,
    name: Option<String>,
}

/// A trigger's source: a path, `/` first, without a query or fragment.
fn check_source(source: &str) -> Result<(), ApiError> {
    let ok = source.starts_with('/')
        && source.len() <= 1024
        && !source.contains("//")
        && !source.chars().any(|c| c.is_control() || c.is_whitespace() || c == '?' || c == '#');
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "source: '{}' is not a path ('/' first, no '//', query, fragment or spaces; at most 1024)",
            source.chars().take(64).collect::<String>()
        )))
    }
}

/// The trigger as Fn shows it: with the endpoint it answers at.
fn shown(mut t: Trigger, app: &App, host: &str) -> Trigger {
    let endpoint = format!("http://{host}/t/{}{}", app.name, t.source);
    t.annotations.insert("fnproject.io/trigger/httpEndpoint".into(), Value::String(endpoint));
    t
}

fn host_of(call: &Call) -> String {
    let host = call.head.headers.get(hyper::header::HOST).and_then(|h| h.to_str().ok());
    host.unwrap_or("localhost").chars().take(256).collect()
}

/// `POST /v2/triggers` and `GET /v2/triggers?app_id=[&fn_id=][&name=]`.
pub(in crate::api) async fn triggers(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    let (store, ns) = owned(state, call)?;
    let host = host_of(call);
    if call.head.method == Method::GET {
        let q: TriggerQuery = call.query()?;
        let app_id = q.app_id.ok_or_else(|| ApiError::BadRequest("app_id: is required".into()))?;
        let docs = Docs { store: &store, ns: &ns };
        let app = docs.app(&app_id)?;
        let mut all: Vec<Trigger> = docs.list(DocKind::FnTrigger)?;
        all.retain(|t| {
            t.app_id == app_id
                && q.fn_id.as_ref().is_none_or(|f| *f == t.fn_id)
                && q.name.as_ref().is_none_or(|n| *n == t.name)
        });
        all.sort_by(|a, b| a.name.cmp(&b.name));
        return Ok(items(all.into_iter().map(|t| shown(t, &app, &host)).collect()));
    }
    let put: TriggerPut = body(&call.body)?;
    let name = put.name.ok_or_else(|| ApiError::BadRequest("name: is required".into()))?;
    check_name("name", &name)?;
    let app_id = put.app_id.ok_or_else(|| ApiError::BadRequest("app_id: is required".into()))?;
    let fn_id = put.fn_id.ok_or_else(|| ApiError::BadRequest("fn_id: is required".into()))?;
    match put.kind.as_deref() {
        Some("http") => {}
        Some(other) => return Err(ApiError::BadRequest(format!("type: '{other}' is not a trigger type here (http)"))),
        None => return Err(ApiError::BadRequest("type: is required (http)".into())),
    }
    let source = put.source.ok_or_else(|| ApiError::BadRequest("source: is required".into()))?;
    check_source(&source)?;
    let created = blocking(move || {
        let docs = Docs { store: &store, ns: &ns };
        let app = docs.app(&app_id)?;
        let f = docs.function(&fn_id)?;
        if f.app_id != app.id {
            return Err(ApiError::BadRequest(format!("fn_id: fn {fn_id} is not of app {app_id}")));
        }
        let existing: Vec<Trigger> = docs.list(DocKind::FnTrigger)?;
        if existing.iter().any(|t| t.app_id == app.id && t.name == name) {
            return Err(ApiError::Conflict("Trigger already exists".into()));
        }
        if existing.iter().any(|t| t.app_id == app.id && t.source == source) {
            return Err(ApiError::Conflict(format!("Trigger with source {source} already exists in this app")));
        }
        let at = now();
        let t = Trigger {
            id: new_id(),
            name,
            app_id: app.id.clone(),
            fn_id: f.id,
            kind: "http".into(),
            source,
            annotations: put.annotations,
            created_at: at.clone(),
            updated_at: at,
        };
        docs.put_trigger(&app, &t)?;
        Ok(shown(t, &app, &host))
    })
    .await??;
    Ok(json(StatusCode::OK, &created))
}

/// `GET` and `DELETE` of `/v2/triggers/{id}`.
pub(in crate::api) async fn trigger_doc(state: &AppState, call: &Call, id: &str) -> Result<Response, ApiError> {
    let (store, ns) = owned(state, call)?;
    let host = host_of(call);
    let id = id.to_string();
    let docs = Docs { store: &store, ns: &ns };
    let t: Trigger = docs.get(DocKind::FnTrigger, &id)?.ok_or_else(|| fn_not_found("trigger", &id))?;
    match call.head.method {
        Method::GET => {
            let app = docs.app(&t.app_id)?;
            Ok(json(StatusCode::OK, &shown(t, &app, &host)))
        }
        Method::DELETE => {
            blocking(move || {
                let docs = Docs { store: &store, ns: &ns };
                let app: Option<App> = docs.get(DocKind::FnApp, &t.app_id)?;
                docs.delete_trigger(app.as_ref().map(|a| a.name.as_str()), &t)
            })
            .await??;
            Ok(json(StatusCode::OK, &json!({ "message": "Trigger deleted" })))
        }
        _ => Err(ApiError::MethodNotAllowed { method: call.head.method.to_string(), allowed: "GET, DELETE" }),
    }
}
