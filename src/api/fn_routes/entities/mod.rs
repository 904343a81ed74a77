//! `/v2/apps`, `/v2/fns` and `/v2/triggers`: create, read, update, delete and list, in the
//! key's namespace, one path for the three (each entity says what differs, [`Entity`]). Writes
//! run on a blocking thread (each is a durable transaction); the actions they replaced or
//! deleted are retired from the pool after.

mod app;
mod entity;
mod function;
mod trigger;

use super::docs::{body, App, Docs, Function, Trigger};
use crate::api::call::{blocking, json, Call};
use crate::api::error::ApiError;
use crate::api::state::AppState;
use entity::{Entity, Retired, Scope};
use hyper::{Method, StatusCode};
use invoker_http::Response;
use serde_json::json;

/// Which of Fn's entities a route names.
#[derive(Clone, Copy, Debug)]
pub(in crate::api) enum Entities {
    Apps,
    Functions,
    Triggers,
}

/// `/v2/<entities>` (`id` none) and `/v2/<entities>/{id}`.
pub(in crate::api) async fn entities(
    state: &AppState,
    call: &Call,
    entities: Entities,
    id: Option<&str>,
) -> Result<Response, ApiError> {
    match (entities, id) {
        (Entities::Apps, None) => collection::<App>(state, call).await,
        (Entities::Apps, Some(id)) => item::<App>(state, call, id).await,
        (Entities::Functions, None) => collection::<Function>(state, call).await,
        (Entities::Functions, Some(id)) => item::<Function>(state, call, id).await,
        (Entities::Triggers, None) => collection::<Trigger>(state, call).await,
        (Entities::Triggers, Some(id)) => item::<Trigger>(state, call, id).await,
    }
}

/// The key's namespace, and what a write may need.
fn scope(state: &AppState, call: &Call) -> Result<Scope, ApiError> {
    let (ns, _) = state.namespace(call, "_")?;
    let host = call.head.headers.get(hyper::header::HOST).and_then(|h| h.to_str().ok());
    let host = host.unwrap_or("localhost").chars().take(256).collect();
    Ok(Scope { config: state.config.clone(), ns, host })
}

async fn retire(state: &AppState, ns: &str, retired: Vec<Retired>) {
    for r in retired {
        state.service.retire_action(ns, &r.name, r.now.as_ref()).await;
    }
}

/// `GET /v2/<entities>?...` (a listing, by name) and `POST /v2/<entities>` (a create).
async fn collection<E: Entity>(state: &AppState, call: &Call) -> Result<Response, ApiError> {
    let scope = scope(state, call)?;
    let store = state.service.store().clone();
    match call.head.method {
        Method::GET => {
            let query = call.query()?;
            let docs = Docs { store: &store, ns: &scope.ns };
            let selected = E::selector(&docs, query)?;
            let mut all: Vec<E> = docs.list(E::KIND)?;
            all.retain(|e| selected(e));
            all.sort_by(|a, b| a.name().cmp(b.name()));
            let shown: Vec<E> = all.into_iter().map(|e| e.shown(&docs, &scope)).collect::<Result<_, _>>()?;
            Ok(json(StatusCode::OK, &json!({ "items": shown })))
        }
        Method::POST => {
            let put = body(&call.body)?;
            let ns = scope.ns.clone();
            let (created, retired) = blocking(move || {
                let docs = Docs { store: &store, ns: &scope.ns };
                let (created, retired) = E::create(&docs, &scope, put)?;
                created.store(&docs)?;
                Ok::<_, ApiError>((created.shown(&docs, &scope)?, retired))
            })
            .await??;
            retire(state, &ns, retired).await;
            Ok(json(StatusCode::OK, &created))
        }
        _ => Err(ApiError::MethodNotAllowed { method: call.head.method.to_string(), allowed: "GET, POST" }),
    }
}

/// `GET`, `PUT` and `DELETE` of `/v2/<entities>/{id}`.
async fn item<E: Entity>(state: &AppState, call: &Call, id: &str) -> Result<Response, ApiError> {
    let scope = scope(state, call)?;
    let store = state.service.store().clone();
    let id = id.to_string();
    let ns = scope.ns.clone();
    match call.head.method {
        Method::GET => {
            let docs = Docs { store: &store, ns: &scope.ns };
            Ok(json(StatusCode::OK, &E::read(&docs, &id)?.shown(&docs, &scope)?))
        }
        Method::PUT => {
            let put = body(&call.body)?;
            let (updated, retired) = blocking(move || {
                let docs = Docs { store: &store, ns: &scope.ns };
                let (updated, retired) = E::read(&docs, &id)?.update(&docs, &scope, put)?;
                updated.store(&docs)?;
                Ok::<_, ApiError>((updated.shown(&docs, &scope)?, retired))
            })
            .await??;
            retire(state, &ns, retired).await;
            Ok(json(StatusCode::OK, &updated))
        }
        Method::DELETE => {
            let retired = blocking(move || {
                let docs = Docs { store: &store, ns: &scope.ns };
                E::read(&docs, &id)?.delete(&docs)
            })
            .await??;
            retire(state, &ns, retired).await;
            // Fn answers a delete with 204 and no body; its client takes any other 2xx as an error.
            Ok(invoker_http::with_body(StatusCode::NO_CONTENT, "text/plain", ""))
        }
        _ => Err(ApiError::MethodNotAllowed { method: call.head.method.to_string(), allowed: "GET, PUT, DELETE" }),
    }
}
