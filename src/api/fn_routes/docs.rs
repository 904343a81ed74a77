//! Fn's entities as stored (apps, functions, triggers, each a document of its namespace) and the
//! rules their names, ids and configuration follow.

use crate::api::error::ApiError;
use invoker_store::{DocKind, Store};
use invoker_wire::model::{epoch_ms, Action};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// An app: a name, and configuration every function of it sees in its environment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct App {
    pub(super) id: String,
    pub(super) name: String,
    #[serde(default)]
    pub(super) config: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) annotations: Map<String, Value>,
    /// The machine shape its functions run on (Fn's `GENERIC_X86`, `GENERIC_ARM`,
    /// `GENERIC_X86_ARM`), as given at create; none when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) shape: Option<String>,
    pub(super) created_at: String,
    pub(super) updated_at: String,
}

/// A function as Fn's API shows it; its code and limits are its action's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Function {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) app_id: String,
    /// One of the kinds this invoker runs Fn functions with (`fn:python`).
    pub(super) image: String,
    /// MB.
    pub(super) memory: u32,
    /// Seconds.
    pub(super) timeout: u32,
    /// Seconds: an idle container of the function goes after this (its action's annotation
    /// carries it to the pool).
    pub(super) idle_timeout: u32,
    #[serde(default)]
    pub(super) config: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) annotations: Map<String, Value>,
    /// The machine shape it runs on (Fn's `GENERIC_X86`, `GENERIC_ARM`,
    /// `GENERIC_X86_ARM`), as given at create; none when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) shape: Option<String>,
    /// The secret in its invoke URL (`/invoke/<id>/<key>`), which Fn's client calls with no
    /// credential: 122 random bits, shown only inside the URL (to the namespace's keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) invoke_key: Option<String>,
    pub(super) created_at: String,
    pub(super) updated_at: String,
}

/// An HTTP trigger: calls to `/t/<app>/<source>` go to its function.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Trigger {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) app_id: String,
    pub(super) fn_id: String,
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) source: String,
    #[serde(default)]
    pub(super) annotations: Map<String, Value>,
    pub(super) created_at: String,
    pub(super) updated_at: String,
}

impl Function {
    /// The action that runs it: `<app>.<fn>` (both names are immutable).
    pub(super) fn action_name(&self, app: &App) -> String {
        format!("{}.{}", app.name, self.name)
    }
}

/// Fn's names: letters, digits, `_` and `-`, a letter, digit or `_` first (an action's name
/// is built from them).
pub(super) fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
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
pub(super) fn now() -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(epoch_ms())).to_string()
}

/// A new id (Fn's are ULIDs; ours are time-ordered too).
pub(super) fn new_id() -> String {
    invoker_wire::model::new_activation_id().to_uppercase()
}

/// A route's id: an app's name has no `/` and a source begins with one, so the two never run
/// together ambiguously.
pub(super) fn route_id(app_name: &str, source: &str) -> String {
    format!("{app_name}{source}")
}

/// The namespace of the invoke keys' index ([`DocKind::FnInvokeKey`]): no tenant's.
pub(super) const INVOKE_KEYS: &str = "";

/// Where an invoke key leads.
#[derive(Serialize, Deserialize)]
pub(super) struct InvokeKey {
    pub(super) ns: String,
    pub(super) fn_id: String,
}

/// A new function's invoke key.
pub(super) fn new_invoke_key() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The stored documents of one namespace, typed.
pub(super) struct Docs<'a> {
    pub(super) store: &'a Arc<dyn Store>,
    pub(super) ns: &'a str,
}

impl Docs<'_> {
    pub(super) fn get<T: DeserializeOwned>(&self, kind: DocKind, id: &str) -> Result<Option<T>, ApiError> {
        let Some(text) = self.store.get_doc(self.ns, kind, id)? else { return Ok(None) };
        serde_json::from_str(&text).map(Some).map_err(|e| ApiError::Internal(format!("stored {kind:?} {id}: {e}")))
    }

    pub(super) fn list<T: DeserializeOwned>(&self, kind: DocKind) -> Result<Vec<T>, ApiError> {
        let texts = self.store.list_docs(self.ns, kind)?;
        texts
            .iter()
            .map(|t| serde_json::from_str(t).map_err(|e| ApiError::Internal(format!("a stored {kind:?}: {e}"))))
            .collect()
    }

    pub(super) fn put<T: Serialize>(&self, kind: DocKind, id: &str, value: &T) -> Result<(), ApiError> {
        let text = serde_json::to_string(value).map_err(|e| ApiError::Internal(e.to_string()))?;
        self.store.put_doc(self.ns, kind, id, Some(&text))?;
        Ok(())
    }

    pub(super) fn delete(&self, kind: DocKind, id: &str) -> Result<(), ApiError> {
        self.store.put_doc(self.ns, kind, id, None)?;
        Ok(())
    }

    /// Stores a trigger and its route.
    pub(super) fn put_trigger(&self, app: &App, t: &Trigger) -> Result<(), ApiError> {
        self.put(DocKind::FnTrigger, &t.id, t)?;
        self.put(DocKind::FnRoute, &route_id(&app.name, &t.source), &t.id)
    }

    /// Deletes a trigger and its route (`app_name` none: its app is gone; a route left
    /// behind leads nowhere, since [`Docs::trigger_at`] checks what it finds).
    pub(super) fn delete_trigger(&self, app_name: Option<&str>, t: &Trigger) -> Result<(), ApiError> {
        self.delete(DocKind::FnTrigger, &t.id)?;
        match app_name {
            Some(name) => self.delete(DocKind::FnRoute, &route_id(name, &t.source)),
            None => Ok(()),
        }
    }

    /// The trigger at `/t/{app_name}{source}`, with its app: by its route, three reads. A
    /// trigger stored before routes were kept is found by reading them all, and gets its route;
    /// no app of that name is Fn's 404 for the app.
    pub(super) fn trigger_at(&self, app_name: &str, source: &str) -> Result<Option<(App, Trigger)>, ApiError> {
        let route = route_id(app_name, source);
        if let Some(id) = self.get::<String>(DocKind::FnRoute, &route)? {
            let trigger: Option<Trigger> = self.get(DocKind::FnTrigger, &id)?;
            if let Some(t) = trigger.filter(|t| t.source == source) {
                if let Some(app) = self.get::<App>(DocKind::FnApp, &t.app_id)?.filter(|a| a.name == app_name) {
                    return Ok(Some((app, t)));
                }
            }
        }
        let apps: Vec<App> = self.list(DocKind::FnApp)?;
        let app = apps.into_iter().find(|a| a.name == app_name).ok_or_else(|| fn_not_found("App", app_name))?;
        let triggers: Vec<Trigger> = self.list(DocKind::FnTrigger)?;
        let Some(t) = triggers.into_iter().find(|t| t.app_id == app.id && t.source == source) else { return Ok(None) };
        self.put(DocKind::FnRoute, &route, &t.id)?;
        Ok(Some((app, t)))
    }

    pub(super) fn app(&self, id: &str) -> Result<App, ApiError> {
        self.get(DocKind::FnApp, id)?.ok_or_else(|| fn_not_found("App", id))
    }

    pub(super) fn function(&self, id: &str) -> Result<Function, ApiError> {
        self.get(DocKind::FnFunction, id)?.ok_or_else(|| fn_not_found("Fn", id))
    }

    /// The name of the action that runs function `fn_id`, from its and its app's documents.
    pub(super) fn action_name_of(&self, fn_id: &str) -> Result<String, ApiError> {
        let function = self.function(fn_id)?;
        Ok(function.action_name(&self.app(&function.app_id)?))
    }

    /// The action `name` (a function's, `what` naming it for Fn's 404), through the store's
    /// action cache.
    pub(super) fn action_named(&self, name: Option<&str>, what: &str) -> Result<Arc<Action>, ApiError> {
        let found = match name {
            Some(name) => self.store.get_action(self.ns, name)?,
            None => None,
        };
        found.ok_or_else(|| fn_not_found("Fn", what))
    }

    /// A function's action, as the pool runs it.
    pub(super) fn action(&self, function: &Function) -> Result<Arc<Action>, ApiError> {
        let name = function.action_name(&self.app(&function.app_id)?);
        self.action_named(Some(&name), &function.id)
    }
}

/// Fn's 404 words: "App not found: <id>", and so on for "Fn" and "Trigger".
pub(super) fn fn_not_found(title: &str, id: &str) -> ApiError {
    let shown: String = id.chars().take(64).collect();
    ApiError::NotFoundNamed(format!("{title} not found: {shown}"))
}

/// A JSON body of `T`, or Fn's 400 naming the field.
pub(super) fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("request body: a JSON object is required".into()));
    }
    crate::api::call::parse_body(bytes)
}

/// Fn's annotation change: each key set, a key given `""` or `null` removed (a new entity's
/// first annotations are a change of none). Fn's bounds: keys of printable ASCII, at most 128
/// bytes; values at most 512 bytes as JSON; at most 100 keys.
pub(super) fn merge_annotations(
    annotations: &mut Map<String, Value>,
    change: Map<String, Value>,
) -> Result<(), ApiError> {
    for (key, value) in change {
        if key.is_empty() || !key.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
            return Err(ApiError::BadRequest(
                "Invalid annotation key, annotation keys must be non-empty ascii strings excluding whitespace".into(),
            ));
        }
        if key.len() > 128 {
            return Err(ApiError::BadRequest(
                "Invalid annotation key length, annotation keys may not be larger than 128 bytes".into(),
            ));
        }
        if value.is_null() || value == "" {
            annotations.remove(&key);
            continue;
        }
        if serde_json::to_vec(&value).map_or(usize::MAX, |v| v.len()) > 512 {
            return Err(ApiError::BadRequest(
                "Invalid annotation value length, annotation values may not be larger than 512 bytes when serialized \
                 as JSON"
                    .into(),
            ));
        }
        annotations.insert(key, value);
    }
    if annotations.len() > 100 {
        return Err(ApiError::BadRequest(
            "Invalid annotation change, new key(s) exceed maximum permitted number of annotations keys (100)".into(),
        ));
    }
    Ok(())
}

/// A shape as Fn's server takes it (none is none).
pub(super) fn check_shape(shape: Option<String>) -> Result<Option<String>, ApiError> {
    match shape.as_deref() {
        None | Some("") => Ok(None),
        Some("GENERIC_X86" | "GENERIC_ARM" | "GENERIC_X86_ARM") => Ok(shape),
        Some(_) => Err(ApiError::BadRequest("Invalid app shape".into())),
    }
}

/// A new entity's annotations, as given: a change of none.
pub(super) fn annotations_of(given: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut annotations = Map::new();
    merge_annotations(&mut annotations, given)?;
    Ok(annotations)
}

/// Fn's config update: each key set, and a key given an empty value removed.
pub(super) fn merge_config(
    config: &mut BTreeMap<String, String>,
    update: BTreeMap<String, String>,
) -> Result<(), ApiError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn app(id: &str, name: &str) -> App {
        App {
            id: id.into(),
            name: name.into(),
            config: BTreeMap::new(),
            annotations: Map::new(),
            shape: None,
            created_at: now(),
            updated_at: now(),
        }
    }

    pub(super) fn trigger(id: &str, app_id: &str, source: &str) -> Trigger {
        Trigger {
            id: id.into(),
            name: id.into(),
            app_id: app_id.into(),
            fn_id: "F".into(),
            kind: "http".into(),
            source: source.into(),
            annotations: Map::new(),
            created_at: now(),
            updated_at: now(),
        }
    }

    #[test]
    pub(super) fn a_trigger_is_found_by_its_route_without_reading_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(invoker_store::RedbStore::open(&dir.path().join("s.redb")).unwrap());
        let docs = Docs { store: &store, ns: "guest" };
        let (a, b) = (app("A", "shop"), app("B", "blog"));
        docs.put(DocKind::FnApp, &a.id, &a).unwrap();
        docs.put(DocKind::FnApp, &b.id, &b).unwrap();
        docs.put_trigger(&a, &trigger("T1", "A", "/cart")).unwrap();
        docs.put_trigger(&b, &trigger("T2", "B", "/cart")).unwrap();
        // A document that cannot be read: any listing of the triggers would fail on it.
        store.put_doc("guest", DocKind::FnTrigger, "BAD", Some("not json")).unwrap();
        let (found_app, found) = docs.trigger_at("shop", "/cart").unwrap().unwrap();
        assert_eq!((found_app.id.as_str(), found.id.as_str()), ("A", "T1"));
        assert_eq!(docs.trigger_at("blog", "/cart").unwrap().unwrap().1.id, "T2");
        // Another namespace sees none of them.
        let other = Docs { store: &store, ns: "other" };
        assert!(matches!(other.trigger_at("shop", "/cart"), Err(ApiError::NotFoundNamed(_))));
        store.put_doc("guest", DocKind::FnTrigger, "BAD", None).unwrap();

        // Deleted: its route goes too, and the lookup finds nothing.
        docs.delete_trigger(Some("shop"), &trigger("T1", "A", "/cart")).unwrap();
        assert!(docs.trigger_at("shop", "/cart").unwrap().is_none());
        assert!(store.get_doc("guest", DocKind::FnRoute, "shop/cart").unwrap().is_none());
        // A trigger stored before routes were kept is found by reading them all, and gets one.
        docs.put(DocKind::FnTrigger, "T3", &trigger("T3", "A", "/old")).unwrap();
        assert_eq!(docs.trigger_at("shop", "/old").unwrap().unwrap().1.id, "T3");
        assert_eq!(store.get_doc("guest", DocKind::FnRoute, "shop/old").unwrap().as_deref(), Some("\"T3\""));
        assert!(matches!(docs.trigger_at("nope", "/old"), Err(ApiError::NotFoundNamed(_))));
    }

    #[test]
    fn annotations_change_as_fns_do_and_keep_fns_bounds() {
        let given = |v: serde_json::Value| v.as_object().unwrap().clone();
        let mut a = annotations_of(given(serde_json::json!({"team": "blue", "n": 1}))).unwrap();
        merge_annotations(&mut a, given(serde_json::json!({"team": "", "n": null, "new": {"x": [1]}}))).unwrap();
        assert_eq!(
            serde_json::Value::Object(a.clone()),
            serde_json::json!({"new": {"x": [1]}}),
            "\"\" and null remove"
        );
        for bad in
            [serde_json::json!({"a key": 1}), serde_json::json!({"": 1}), serde_json::json!({"k": "x".repeat(600)})]
        {
            let e = merge_annotations(&mut a, given(bad.clone())).unwrap_err().to_string();
            assert!(e.contains("Invalid annotation"), "{bad}: {e}");
        }
        let many: Map<String, Value> = (0..101).map(|i| (format!("k{i}"), Value::from(i))).collect();
        assert!(annotations_of(many).is_err(), "at most 100 keys");
        assert_eq!(check_shape(Some("GENERIC_ARM".into())).unwrap().as_deref(), Some("GENERIC_ARM"));
        assert!(check_shape(Some("RISCV".into())).is_err());
    }
}
