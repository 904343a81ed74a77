//! Fn's routes on the same server and keys as OpenWhisk's: the `v2` API subset a user of Fn
//! needs (apps, functions, HTTP triggers), `POST /invoke/{fn_id}`, and HTTP triggers at
//! `/t/{app}/{source}`. Everything lives in the key's namespace. An Fn function is an action
//! (named `<app>.<fn>`, of a kind with the `fn` protocol), so the pool, limits, records and the
//! scheduler treat it as any other; its document (`DocKind::FnFunction`) holds what Fn's API
//! says of it. Errors are Fn's `{"message": ...}` (`ApiError::into_fn_response`).

mod calls;
mod entities;

pub(super) use calls::{invoke, trigger};
pub(super) use entities::{app, apps, function, functions, trigger_doc, triggers};

use super::error::ApiError;
use crate::model::{epoch_ms, Action};
use crate::store::{DocKind, Store};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// An app: a name, and configuration every function of it sees in its environment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct App {
    id: String,
    name: String,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    annotations: Map<String, Value>,
    created_at: String,
    updated_at: String,
}

/// A function as Fn's API shows it; its code and limits are its action's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Function {
    id: String,
    name: String,
    app_id: String,
    /// One of the kinds this invoker runs Fn functions with (`fn:python`).
    image: String,
    /// MB.
    memory: u32,
    /// Seconds.
    timeout: u32,
    /// Seconds. Kept and shown; the pool's keep-alive policy, not the function, decides when
    /// an idle container goes.
    idle_timeout: u32,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    annotations: Map<String, Value>,
    created_at: String,
    updated_at: String,
}

/// An HTTP trigger: calls to `/t/<app>/<source>` go to its function.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Trigger {
    id: String,
    name: String,
    app_id: String,
    fn_id: String,
    #[serde(rename = "type")]
    kind: String,
    source: String,
    #[serde(default)]
    annotations: Map<String, Value>,
    created_at: String,
    updated_at: String,
}

impl Function {
    /// The action that runs it: `<app>.<fn>` (both names are immutable).
    fn action_name(&self, app: &App) -> String {
        format!("{}.{}", app.name, self.name)
    }
}

/// Fn's names: letters, digits, `_` and `-`, a letter, digit or `_` first (an action's name
/// is built from them).
fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(64).collect();
        Err(ApiError::BadRequest(format!(
            "{field}: '{shown}' is not a valid name (letters, digits, _ and -, a letter, digit or _ first; at most 100)"
        )))
    }
}

/// Now, as Fn's API writes times.
fn now() -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(epoch_ms())).to_string()
}

/// A new id (Fn's are ULIDs; ours are time-ordered too).
fn new_id() -> String {
    crate::model::new_activation_id().to_uppercase()
}

/// The stored documents of one namespace, typed.
struct Docs<'a> {
    store: &'a Arc<dyn Store>,
    ns: &'a str,
}

impl Docs<'_> {
    fn get<T: DeserializeOwned>(&self, kind: DocKind, id: &str) -> Result<Option<T>, ApiError> {
        let Some(text) = self.store.get_doc(self.ns, kind, id)? else { return Ok(None) };
        serde_json::from_str(&text).map(Some).map_err(|e| ApiError::Internal(format!("stored {kind:?} {id}: {e}")))
    }

    fn list<T: DeserializeOwned>(&self, kind: DocKind) -> Result<Vec<T>, ApiError> {
        let texts = self.store.list_docs(self.ns, kind)?;
        texts
            .iter()
            .map(|t| serde_json::from_str(t).map_err(|e| ApiError::Internal(format!("a stored {kind:?}: {e}"))))
            .collect()
    }

    fn put<T: Serialize>(&self, kind: DocKind, id: &str, value: &T) -> Result<(), ApiError> {
        let text = serde_json::to_string(value).map_err(|e| ApiError::Internal(e.to_string()))?;
        self.store.put_doc(self.ns, kind, id, Some(&text))?;
        Ok(())
    }

    fn delete(&self, kind: DocKind, id: &str) -> Result<(), ApiError> {
        self.store.put_doc(self.ns, kind, id, None)?;
        Ok(())
    }

    fn app(&self, id: &str) -> Result<App, ApiError> {
        self.get(DocKind::FnApp, id)?.ok_or_else(|| fn_not_found("app", id))
    }

    fn function(&self, id: &str) -> Result<Function, ApiError> {
        self.get(DocKind::FnFunction, id)?.ok_or_else(|| fn_not_found("fn", id))
    }

    /// A function's action, as the pool runs it.
    fn action(&self, function: &Function) -> Result<Arc<Action>, ApiError> {
        let app = self.app(&function.app_id)?;
        self.store.get_action(self.ns, &function.action_name(&app))?.ok_or_else(|| fn_not_found("fn", &function.id))
    }
}

/// Fn's 404 words.
fn fn_not_found(what: &str, id: &str) -> ApiError {
    let shown: String = id.chars().take(64).collect();
    ApiError::NotFoundNamed(match what {
        "app" => format!("App not found: {shown}"),
        "trigger" => format!("Trigger not found: {shown}"),
        _ => format!("Fn not found: {shown}"),
    })
}

/// A JSON body of `T`, or Fn's 400 naming the field.
fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("request body: a JSON object is required".into()));
    }
    super::parse_body(bytes)
}

/// Fn's config update: each key set, and a key given an empty value removed.
fn merge_config(config: &mut BTreeMap<String, String>, update: BTreeMap<String, String>) -> Result<(), ApiError> {
    for (k, v) in update {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(ApiError::BadRequest(format!("config: '{k}': a key is non-empty, without '=' or NUL")));
        }
        if v.is_empty() {
            config.remove(&k);
        } else {
            config.insert(k, v);
        }
    }
    Ok(())
}
