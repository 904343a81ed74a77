//! An HTTP trigger: calls to `/t/<app>/<source>` go to its function. Its document is stored
//! with its route (the index `/t/` reads), and shown with the endpoint it answers at.

use super::entity::{Entity, Retired, Scope, Selector};
use crate::api::error::ApiError;
use crate::api::fn_routes::docs::{
    annotations_of, check_name, merge_annotations, new_id, now, route_id, App, Docs, Trigger,
};
use invoker_store::DocKind;
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TriggerPut {
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
pub(super) struct TriggerQuery {
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

fn check_kind(kind: Option<&str>) -> Result<(), ApiError> {
    match kind {
        Some("http") => Ok(()),
        Some(other) => Err(ApiError::BadRequest(format!("type: '{other}' is not a trigger type here (http)"))),
        None => Err(ApiError::BadRequest("type: is required (http)".into())),
    }
}

/// No other trigger of `app` has this name or this source.
fn check_unique(docs: &Docs, app: &App, t: &Trigger) -> Result<(), ApiError> {
    let mut others: Vec<Trigger> = docs.list(DocKind::FnTrigger)?;
    others.retain(|o| o.app_id == app.id && o.id != t.id);
    if others.iter().any(|o| o.name == t.name) {
        return Err(ApiError::Conflict("Trigger already exists".into()));
    }
    if others.iter().any(|o| o.source == t.source) {
        return Err(ApiError::Conflict(format!("Trigger with source {} already exists in this app", t.source)));
    }
    Ok(())
}

impl Entity for Trigger {
    const KIND: DocKind = DocKind::FnTrigger;
    const TITLE: &'static str = "Trigger";
    type Put = TriggerPut;
    type Query = TriggerQuery;

    fn id(&self) -> &str {
        &self.id
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn selector(docs: &Docs, query: TriggerQuery) -> Result<Selector<Trigger>, ApiError> {
        let app_id = query.app_id.ok_or_else(|| ApiError::BadRequest("app_id: is required".into()))?;
        docs.app(&app_id)?;
        let TriggerQuery { fn_id, name, .. } = query;
        Ok(Box::new(move |t| {
            t.app_id == app_id
                && fn_id.as_ref().is_none_or(|f| *f == t.fn_id)
                && name.as_ref().is_none_or(|n| *n == t.name)
        }))
    }

    fn create(docs: &Docs, _: &Scope, put: TriggerPut) -> Result<(Trigger, Vec<Retired>), ApiError> {
        let name = put.name.ok_or_else(|| ApiError::BadRequest("name: is required".into()))?;
        check_name("name", &name)?;
        let app_id = put.app_id.ok_or_else(|| ApiError::BadRequest("app_id: is required".into()))?;
        let fn_id = put.fn_id.ok_or_else(|| ApiError::BadRequest("fn_id: is required".into()))?;
        check_kind(put.kind.as_deref())?;
        let source = put.source.ok_or_else(|| ApiError::BadRequest("source: is required".into()))?;
        check_source(&source)?;
        let app = docs.app(&app_id)?;
        let f = docs.function(&fn_id)?;
        if f.app_id != app.id {
            return Err(ApiError::BadRequest(format!("fn_id: fn {fn_id} is not of app {app_id}")));
        }
        let at = now();
        let t = Trigger {
            id: new_id(),
            name,
            app_id: app.id.clone(),
            fn_id: f.id,
            kind: "http".into(),
            source,
            annotations: annotations_of(put.annotations)?,
            created_at: at.clone(),
            updated_at: at,
        };
        check_unique(docs, &app, &t)?;
        Ok((t, vec![]))
    }

    /// Its source and annotations change; its name, app, function and type do not.
    fn update(mut self, docs: &Docs, _: &Scope, put: TriggerPut) -> Result<(Trigger, Vec<Retired>), ApiError> {
        for (field, said, is) in [
            ("name", &put.name, &self.name),
            ("app_id", &put.app_id, &self.app_id),
            ("fn_id", &put.fn_id, &self.fn_id),
            ("type", &put.kind, &self.kind),
        ] {
            if said.as_ref().is_some_and(|s| s != is) {
                return Err(ApiError::BadRequest(format!("{field}: a trigger's {field} cannot be changed")));
            }
        }
        let app = docs.app(&self.app_id)?;
        if let Some(source) = put.source.filter(|s| *s != self.source) {
            check_source(&source)?;
            let old = route_id(&app.name, &self.source);
            self.source = source;
            check_unique(docs, &app, &self)?;
            docs.delete(DocKind::FnRoute, &old)?;
        }
        merge_annotations(&mut self.annotations, put.annotations)?;
        self.updated_at = now();
        Ok((self, vec![]))
    }

    fn delete(self, docs: &Docs) -> Result<Vec<Retired>, ApiError> {
        let app: Option<App> = docs.get(DocKind::FnApp, &self.app_id)?;
        docs.delete_trigger(app.as_ref().map(|a| a.name.as_str()), &self)?;
        Ok(vec![])
    }

    fn store(&self, docs: &Docs) -> Result<(), ApiError> {
        docs.put_trigger(&docs.app(&self.app_id)?, self)
    }

    fn shown(mut self, docs: &Docs, scope: &Scope) -> Result<Trigger, ApiError> {
        let app = docs.app(&self.app_id)?;
        let endpoint = format!("http://{}/t/{}{}", scope.host, app.name, self.source);
        self.annotations.insert("fnproject.io/trigger/httpEndpoint".into(), Value::String(endpoint));
        Ok(self)
    }
}
