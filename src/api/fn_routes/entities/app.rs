//! An app: a name, and configuration every function of it sees. Its update re-saves its
//! functions' actions (they carry the app's configuration); its delete takes its functions and
//! their triggers with it.

use super::entity::{Entity, Retired, Scope, Selector};
use super::function::{delete_function, function_action, FunctionCode};
use crate::api::error::ApiError;
use crate::api::fn_routes::docs::{
    annotations_of, check_name, check_shape, merge_annotations, merge_config, new_id, now, App, Docs, Function,
};
use invoker_store::DocKind;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AppPut {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    annotations: Map<String, Value>,
    #[serde(default)]
    #[allow(dead_code)]
    syslog_url: Option<String>,
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
pub(super) struct AppQuery {
    name: Option<String>,
}

/// The functions of `app`.
fn functions_of(docs: &Docs, app: &App) -> Result<Vec<Function>, ApiError> {
    let mut all: Vec<Function> = docs.list(DocKind::FnFunction)?;
    all.retain(|f| f.app_id == app.id);
    Ok(all)
}

impl Entity for App {
    const KIND: DocKind = DocKind::FnApp;
    const TITLE: &'static str = "App";
    type Put = AppPut;
    type Query = AppQuery;

    fn id(&self) -> &str {
        &self.id
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn selector(_: &Docs, query: AppQuery) -> Result<Selector<App>, ApiError> {
        Ok(Box::new(move |a| query.name.as_ref().is_none_or(|n| *n == a.name)))
    }

    fn create(docs: &Docs, _: &Scope, put: AppPut) -> Result<(App, Vec<Retired>), ApiError> {
        let name = put.name.ok_or_else(|| ApiError::BadRequest("name: is required".into()))?;
        check_name("name", &name)?;
        let mut config = BTreeMap::new();
        merge_config(&mut config, put.config)?;
        if docs.list::<App>(DocKind::FnApp)?.iter().any(|a| a.name == name) {
            return Err(ApiError::Conflict("App already exists".into()));
        }
        let at = now();
        Ok((
            App {
                id: new_id(),
                name,
                config,
                annotations: annotations_of(put.annotations)?,
                shape: check_shape(put.shape)?,
                created_at: at.clone(),
                updated_at: at,
            },
            vec![],
        ))
    }

    fn update(mut self, docs: &Docs, scope: &Scope, put: AppPut) -> Result<(App, Vec<Retired>), ApiError> {
        if put.name.as_ref().is_some_and(|n| *n != self.name) {
            return Err(ApiError::BadRequest("name: an app's name cannot be changed".into()));
        }
        merge_config(&mut self.config, put.config)?;
        merge_annotations(&mut self.annotations, put.annotations)?;
        self.updated_at = now();
        // Its functions see the new configuration in new containers.
        let mut retired = Vec::new();
        for f in functions_of(docs, &self)? {
            let code = FunctionCode::of(&*docs.action(&f)?);
            let action = function_action(&scope.config, &scope.ns, &self, &f, code)?;
            let saved = docs.store.put_action(action, true)?;
            retired.push(Retired { name: saved.name.clone(), now: Some(saved) });
        }
        Ok((self, retired))
    }

    fn delete(self, docs: &Docs) -> Result<Vec<Retired>, ApiError> {
        let mut retired = Vec::new();
        for f in functions_of(docs, &self)? {
            retired.push(delete_function(docs, &self, &f)?);
        }
        docs.delete(DocKind::FnApp, &self.id)?;
        Ok(retired)
    }
}
