//! Who may call: the keys of the config, each one principal's, looked up by the header its
//! clients send.

use super::call::{Call, Principal};
use super::error::ApiError;
use super::fn_routes::cache::FnCache;
use crate::activation::ActivationService;
use crate::cluster::fetch::RemoteActions;
use crate::config::Config;
use crate::pool::actor::PoolHandle;
use base64::Engine as _;
use hyper::HeaderMap;
use invoker_scheduler::Dispatcher;
use invoker_wire::model::{validate_entity_name, Action};
use std::collections::HashMap;
use std::sync::Arc;

pub struct AppState {
    pub service: ActivationService,
    pub config: Arc<Config>,
    /// API key → who holds it.
    keys: HashMap<String, Principal>,
    /// The `Authorization` header each key's clients send (`Basic <base64 of the key>`, or
    /// `Bearer <the key>` as Fn's client sends its token) → who holds it: most requests are one
    /// lookup, without decoding.
    headers: HashMap<String, Principal>,
    /// In a cluster: the actions schedulers send, fetched from them by revision.
    remote_actions: Option<Arc<RemoteActions>>,
    /// Where Fn's calls lead.
    pub(super) fn_cache: FnCache,
    /// What this process runs activations on: an invoker's pool, or a scheduler's dispatcher.
    pool: Option<PoolHandle>,
    dispatcher: Option<Arc<Dispatcher>>,
}

impl AppState {
    /// `config.admin.key` must be set by then (main generates one when the file has none).
    pub fn new(service: ActivationService, config: Arc<Config>) -> Self {
        let namespaces = config
            .namespaces
            .iter()
            .map(|(ns, key)| (key.clone(), Principal::Namespace { ns: ns.clone(), key: key.clone() }));
        let admin = config.admin.key.iter().map(|key| (key.clone(), Principal::Admin));
        let controllers = config.admin.controller_keys.iter().map(|key| (key.clone(), Principal::Controller));
        let keys: HashMap<String, Principal> = namespaces.chain(admin).chain(controllers).collect();
        let basic = keys.iter().map(|(key, who)| {
            (format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(key)), who.clone())
        });
        let bearer = keys.iter().map(|(key, who)| (format!("Bearer {key}"), who.clone()));
        let headers = basic.chain(bearer).collect();
        AppState {
            service,
            config,
            keys,
            headers,
            remote_actions: None,
            fn_cache: FnCache::default(),
            pool: None,
            dispatcher: None,
        }
    }

    /// An invoker's: its pool, for the routes that show or drive it.
    pub fn with_pool(mut self, pool: PoolHandle) -> Self {
        self.pool = Some(pool);
        self
    }

    /// A scheduler's: its dispatcher, for the routes that show its invokers.
    pub fn with_dispatcher(mut self, dispatcher: Arc<Dispatcher>) -> Self {
        self.dispatcher = Some(dispatcher);
        self
    }

    /// The invoker's pool; `None` in a scheduler.
    pub fn pool(&self) -> Option<&PoolHandle> {
        self.pool.as_ref()
    }

    /// The scheduler's dispatcher; `None` in an invoker.
    pub fn dispatcher(&self) -> Option<&Arc<Dispatcher>> {
        self.dispatcher.as_ref()
    }

    /// An invoker of a cluster: messages from its schedulers name actions it fetches.
    pub fn with_remote_actions(mut self, remote: Arc<RemoteActions>) -> Self {
        self.remote_actions = Some(remote);
        self
    }

    pub(crate) fn remote_actions(&self) -> Option<&RemoteActions> {
        self.remote_actions.as_deref()
    }

    /// Who holds the request's key, sent with basic auth (OpenWhisk's clients) or as a bearer
    /// token (Fn's: `FN_TOKEN` is the key); no key, or an unknown one, is a 401.
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let header =
            headers.get(hyper::header::AUTHORIZATION).and_then(|h| h.to_str().ok()).ok_or(ApiError::Unauthorized)?;
        if let Some(known) = self.headers.get(header) {
            return Ok(known.clone());
        }
        if let Some(token) = header.strip_prefix("Bearer ") {
            return self.keys.get(token.trim()).cloned().ok_or(ApiError::Unauthorized);
        }
        let encoded = header.strip_prefix("Basic ").ok_or(ApiError::Unauthorized)?;
        let decoded =
            base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| ApiError::Unauthorized)?;
        let key = String::from_utf8(decoded).map_err(|_| ApiError::Unauthorized)?;
        self.keys.get(&key).cloned().ok_or(ApiError::Unauthorized)
    }

    /// The principal of namespace `ns`'s key, while the config has the namespace.
    pub(crate) fn namespace_principal(&self, ns: &str) -> Option<Principal> {
        let key = self.config.namespaces.get(ns)?;
        Some(Principal::Namespace { ns: ns.to_string(), key: key.clone() })
    }

    /// Who sent `call`: as found before its body was read, or from its key now.
    pub(crate) fn principal(&self, call: &Call) -> Result<Principal, ApiError> {
        match &call.principal {
            Some(principal) => Ok(principal.clone()),
            None => self.authenticate(&call.head.headers),
        }
    }

    /// The namespace a namespace route acts in: `_` means the key's own; any other must be it.
    /// Only a namespace's key has one.
    pub(crate) fn namespace(&self, call: &Call, path_ns: &str) -> Result<(String, String), ApiError> {
        match self.principal(call)? {
            Principal::Namespace { ns, key } if path_ns == "_" || path_ns == ns => Ok((ns, key)),
            _ => Err(ApiError::Forbidden(path_ns.chars().take(256).collect())),
        }
    }

    /// Admin routes: the admin key, and no other.
    pub(crate) fn admin(&self, call: &Call) -> Result<(), ApiError> {
        self.only(call, Principal::Admin)
    }

    /// The cluster's internal routes: a controller key, and no other.
    pub(crate) fn controller(&self, call: &Call) -> Result<(), ApiError> {
        self.only(call, Principal::Controller)
    }

    fn only(&self, call: &Call, wanted: Principal) -> Result<(), ApiError> {
        if self.principal(call)? == wanted {
            Ok(())
        } else {
            Err(ApiError::Forbidden(call.head.uri.path().chars().take(256).collect()))
        }
    }
}

pub(crate) async fn load_action(state: &AppState, ns: &str, name: &str) -> Result<Arc<Action>, ApiError> {
    validate_entity_name("name", name).map_err(ApiError::BadRequest)?;
    // A read transaction on a page the cache holds: quick enough to run inline.
    state.service.store().get_action(ns, name)?.ok_or(ApiError::NotFound)
}
