//! A function: an action of a kind with the `fn` protocol, named `<app>.<fn>`, whose document
//! holds what Fn's API says of it. Every write of it writes its action too, checked as any
//! action `PUT` is.

use super::entity::{Entity, Retired, Scope, Selector};
use crate::api::actions;
use crate::api::error::ApiError;
use crate::api::fn_routes::docs::{
    annotations_of, check_name, check_shape, merge_annotations, merge_config, new_id, new_invoke_key, now, App, Docs,
    Function, InvokeKey, Trigger, INVOKE_KEYS,
};
use crate::config::Config;
use invoker_factory::kinds::{RuntimeProtocol, FN_IMAGE_KIND};
use invoker_store::DocKind;
use invoker_wire::model::{Action, KeyValue};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The annotation with the URL that calls a function (Fn's `FnInvokeEndpointAnnotation`).
const INVOKE_ENDPOINT: &str = "fnproject.io/fn/invokeEndpoint";

/// Fn's defaults for a function: 128 MB, 30 s to run, 30 s idle.
const DEFAULT_MEMORY_MB: u32 = 128;
const DEFAULT_TIMEOUT_S: u32 = 30;
const DEFAULT_IDLE_TIMEOUT_S: u32 = 30;
/// Fn's bounds: a call runs at most 300 s; an idle container is kept at most an hour.
const MAX_TIMEOUT_S: u32 = 300;
const MAX_IDLE_TIMEOUT_S: u32 = 3600;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FunctionPut {
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
    /// Fn's machine shape: kept at create; an update does not change it, as on Fn's server.
    #[serde(default)]
    shape: Option<String>,
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
pub(super) struct FunctionQuery {
    app_id: Option<String>,
    name: Option<String>,
}

/// A function's code and handler, kept in its action (an update that sends neither keeps them).
pub(super) struct FunctionCode {
    code: Option<String>,
    main: Option<String>,
}

impl FunctionCode {
    pub(super) fn of(action: &Action) -> Self {
        FunctionCode { code: action.exec.code.clone(), main: action.exec.main.clone() }
    }
}

/// The action that runs `f` of `app`, validated as any action `PUT` is (limits, code size,
/// the kind's concurrency), with its Fn ids and configuration in its `fn` annotation.
pub(super) fn function_action(
    config: &Config,
    ns: &str,
    app: &App,
    f: &Function,
    code: FunctionCode,
) -> Result<Action, ApiError> {
    // `fn:image` is only ever the kind of a function with an image of its own.
    let fn_kind =
        f.image != FN_IMAGE_KIND && config.kinds.get(&f.image).is_some_and(|k| k.protocol == RuntimeProtocol::Fn);
    let own_image = !fn_kind && !f.image.starts_with("fn:") && invoker_wire::model::is_image_reference(&f.image);
    if own_image && !config.factory.kind.runs_images() {
        return Err(ApiError::BadRequest(format!(
            "image: '{}' is an image of the function's own, which the {} factory does not run \
             (factory.kind = \"docker\" or \"kubernetes\" runs it; or name one of the fn kinds)",
            f.image,
            config.factory.kind.name()
        )));
    }
    if !fn_kind && !own_image {
        let mut kinds: Vec<&str> = config
            .kinds
            .iter()
            .filter(|(name, k)| k.protocol == RuntimeProtocol::Fn && *name != FN_IMAGE_KIND)
            .map(|(name, _)| name.as_str())
            .collect();
        kinds.sort_unstable();
        return Err(ApiError::BadRequest(format!(
            "image: '{}' is neither an image nor a kind this invoker runs Fn functions with ({})",
            f.image.chars().take(256).collect::<String>(),
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
    let said = invoker_wire::model::FnFunction {
        fn_id: f.id.clone(),
        app_id: app.id.clone(),
        config: f.config.clone(),
        app_config: app.config.clone(),
        idle_timeout_s: Some(f.idle_timeout),
    };
    let exec = match own_image {
        true => json!({ "kind": FN_IMAGE_KIND, "image": f.image, "main": code.main }),
        false => json!({ "kind": f.image, "code": code.code, "main": code.main }),
    };
    let mut annotations =
        vec![KeyValue { key: "fn".into(), value: serde_json::to_value(said).expect("strings serialise") }];
    annotations.extend(call_policy(f, app));
    let put = json!({
        "exec": exec,
        "limits": { "memory": f.memory, "timeout": u64::from(f.timeout) * 1000, "concurrency": 1 },
        "annotations": annotations,
    });
    actions::action_from_json(config, put, ns, &f.action_name(app))
}

/// The policy of the function's calls, from its annotations (`fn update function app f
/// --annotation max-retry-attempts=0`), as its action's: `max-concurrency`,
/// `provisioned-concurrency`, and for its
/// detached calls `max-retry-attempts` and `max-event-age` as given, `on-success` and
/// `on-failure` naming a function of its app. Checked as an action's are.
fn call_policy(f: &Function, app: &App) -> Vec<KeyValue> {
    let mut policy = Vec::new();
    for key in [
        invoker_wire::model::MAX_CONCURRENCY,
        invoker_wire::model::PROVISIONED_CONCURRENCY,
        invoker_wire::model::MAX_RETRY_ATTEMPTS,
        invoker_wire::model::MAX_EVENT_AGE,
    ] {
        if let Some(value) = f.annotations.get(key) {
            policy.push(KeyValue { key: key.into(), value: value.clone() });
        }
    }
    for key in [invoker_wire::model::ON_SUCCESS, invoker_wire::model::ON_FAILURE] {
        if let Some(value) = f.annotations.get(key) {
            let value = match value.as_str() {
                Some(name) => json!(format!("{}.{name}", app.name)),
                None => value.clone(),
            };
            policy.push(KeyValue { key: key.into(), value });
        }
    }
    policy
}

/// Gives `f` an invoke key, with its entry in the index, if it has none (a function stored
/// before invoke keys were kept gets one at its next update).
fn keep_invoke_key(docs: &Docs, f: &mut Function) -> Result<(), ApiError> {
    if f.invoke_key.is_none() {
        let key = new_invoke_key();
        let leads_to = InvokeKey { ns: docs.ns.to_string(), fn_id: f.id.clone() };
        Docs { store: docs.store, ns: INVOKE_KEYS }.put(DocKind::FnInvokeKey, &key, &leads_to)?;
        f.invoke_key = Some(key);
    }
    Ok(())
}

/// Deletes the function, its triggers and its action.
pub(super) fn delete_function(docs: &Docs, app: &App, f: &Function) -> Result<Retired, ApiError> {
    for t in docs.list::<Trigger>(DocKind::FnTrigger)?.into_iter().filter(|t| t.fn_id == f.id) {
        docs.delete_trigger(Some(&app.name), &t)?;
    }
    let name = f.action_name(app);
    docs.store.delete_action(docs.ns, &name)?;
    if let Some(key) = &f.invoke_key {
        Docs { store: docs.store, ns: INVOKE_KEYS }.delete(DocKind::FnInvokeKey, key)?;
    }
    docs.delete(DocKind::FnFunction, &f.id)?;
    Ok(Retired { name, now: None })
}

impl Entity for Function {
    const KIND: DocKind = DocKind::FnFunction;
    const TITLE: &'static str = "Fn";
    type Put = FunctionPut;
    type Query = FunctionQuery;

    fn id(&self) -> &str {
        &self.id
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn selector(docs: &Docs, query: FunctionQuery) -> Result<Selector<Function>, ApiError> {
        let app_id = query.app_id.ok_or_else(|| ApiError::BadRequest("app_id: is required".into()))?;
        docs.app(&app_id)?;
        let name = query.name;
        Ok(Box::new(move |f| f.app_id == app_id && name.as_ref().is_none_or(|n| *n == f.name)))
    }

    fn create(docs: &Docs, scope: &Scope, put: FunctionPut) -> Result<(Function, Vec<Retired>), ApiError> {
        let name = put.name.ok_or_else(|| ApiError::BadRequest("name: is required".into()))?;
        check_name("name", &name)?;
        let app_id = put.app_id.ok_or_else(|| ApiError::BadRequest("app_id: is required".into()))?;
        let image = put.image.ok_or_else(|| ApiError::BadRequest("image: is required".into()))?;
        let mut fn_config = BTreeMap::new();
        merge_config(&mut fn_config, put.config)?;
        let app = docs.app(&app_id)?;
        if docs.list::<Function>(DocKind::FnFunction)?.iter().any(|f| f.app_id == app.id && f.name == name) {
            return Err(ApiError::Conflict("Fn already exists".into()));
        }
        let at = now();
        let mut f = Function {
            id: new_id(),
            name,
            app_id: app.id.clone(),
            image,
            memory: put.memory.unwrap_or(DEFAULT_MEMORY_MB),
            timeout: put.timeout.unwrap_or(DEFAULT_TIMEOUT_S),
            idle_timeout: put.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT_S),
            config: fn_config,
            annotations: annotations_of(put.annotations)?,
            shape: check_shape(put.shape)?,
            invoke_key: None,
            created_at: at.clone(),
            updated_at: at,
        };
        let code = FunctionCode { code: put.code, main: put.main };
        docs.store.put_action(function_action(&scope.config, &scope.ns, &app, &f, code)?, false)?;
        keep_invoke_key(docs, &mut f)?;
        Ok((f, vec![]))
    }

    fn update(mut self, docs: &Docs, scope: &Scope, put: FunctionPut) -> Result<(Function, Vec<Retired>), ApiError> {
        if put.name.as_ref().is_some_and(|n| *n != self.name) {
            return Err(ApiError::BadRequest("name: a function's name cannot be changed".into()));
        }
        if put.app_id.as_ref().is_some_and(|a| *a != self.app_id) {
            return Err(ApiError::BadRequest("app_id: a function's app cannot be changed".into()));
        }
        let app = docs.app(&self.app_id)?;
        let kept = FunctionCode::of(&*docs.action(&self)?);
        self.image = put.image.unwrap_or(self.image);
        self.memory = put.memory.unwrap_or(self.memory);
        self.timeout = put.timeout.unwrap_or(self.timeout);
        self.idle_timeout = put.idle_timeout.unwrap_or(self.idle_timeout);
        merge_config(&mut self.config, put.config)?;
        merge_annotations(&mut self.annotations, put.annotations)?;
        self.updated_at = now();
        let code = FunctionCode { code: put.code.or(kept.code), main: put.main.or(kept.main) };
        let saved = docs.store.put_action(function_action(&scope.config, &scope.ns, &app, &self, code)?, true)?;
        keep_invoke_key(docs, &mut self)?;
        Ok((self, vec![Retired { name: saved.name.clone(), now: Some(saved) }]))
    }

    fn delete(self, docs: &Docs) -> Result<Vec<Retired>, ApiError> {
        let app = docs.app(&self.app_id)?;
        Ok(vec![delete_function(docs, &app, &self)?])
    }

    /// With the URL that calls it, as Fn's server shows every function: Fn's client calls that
    /// URL for `fn invoke`, with no credential, so the URL carries the function's invoke key
    /// (and only that URL shows it).
    fn shown(mut self, _: &Docs, scope: &Scope) -> Result<Function, ApiError> {
        let endpoint = match self.invoke_key.take() {
            Some(key) => format!("http://{}/invoke/{}/{key}", scope.host, self.id),
            None => format!("http://{}/invoke/{}", scope.host, self.id),
        };
        self.annotations.insert(INVOKE_ENDPOINT.into(), Value::String(endpoint));
        Ok(self)
    }
}
