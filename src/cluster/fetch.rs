//! An invoker's copy of the actions schedulers send it. A scheduler keeps actions in its own
//! store; an `ActivationMessage` names the action, its revision and the scheduler. The first
//! activation of a revision fetches it from that scheduler (its address from etcd, the
//! controller key to its internal route); later ones find it here. Kept apart from the
//! invoker's own store: nothing fetched is listed or served by the invoker's REST routes.

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use invoker_etcd::client::Etcd;
use invoker_etcd::kv::ClusterKv;
use invoker_store::action_cache::ActionCache;
use invoker_wire::cluster::authority;
use invoker_wire::cluster::{cluster_revision, scheduler_key, SchedulerRecord};
use invoker_wire::model::Action;
use parking_lot::Mutex;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Bound on one fetch, the etcd lookup and the connection included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("scheduler {0} is not registered in etcd")]
    UnknownScheduler(String),
    #[error("scheduler {scheduler}: {reason}")]
    Unreachable { scheduler: String, reason: String },
    /// The scheduler has no such action, or it changed since the message was sent.
    #[error("scheduler {scheduler} has no action {ns}/{name} at revision {revision}")]
    NotFound { scheduler: String, ns: String, name: String, revision: u64 },
}

pub struct RemoteActions {
    kv: Etcd,
    prefix: String,
    /// `Basic <base64 of the controller key>`.
    authorization: String,
    /// Keyed by (scheduler, namespace) and (name, revision).
    cache: Mutex<ActionCache>,
    /// Scheduler id → its API address, as last read from etcd.
    addresses: Mutex<HashMap<String, String>>,
}

impl RemoteActions {
    pub fn new(kv: Etcd, prefix: String, controller_key: &str, budget_bytes: usize) -> Self {
        let authorization = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(controller_key));
        RemoteActions {
            kv,
            prefix,
            authorization,
            cache: Mutex::new(ActionCache::new(budget_bytes)),
            addresses: Mutex::default(),
        }
    }

    /// `ns/name` at `revision` (a [`cluster_revision`]) as `scheduler` holds it.
    pub async fn action(
        &self,
        scheduler: &str,
        ns: &str,
        name: &str,
        revision: u64,
    ) -> Result<Arc<Action>, FetchError> {
        let key = (format!("{scheduler}\0{ns}"), format!("{name}\0{revision}"));
        if let Some(action) = self.cache.lock().get_as(&key) {
            return Ok(action);
        }
        let unreachable = |reason: String| FetchError::Unreachable { scheduler: scheduler.to_string(), reason };
        let fetched = tokio::time::timeout(FETCH_TIMEOUT, self.fetch(scheduler, ns, name, revision))
            .await
            .map_err(|_| unreachable(format!("no answer within {FETCH_TIMEOUT:?}")))??;
        let action = Arc::new(fetched);
        self.cache.lock().insert_as(key, action.clone());
        Ok(action)
    }

    /// From the scheduler's address as last read (etcd away does not stop the fetches of a
    /// known scheduler), read again from etcd when it is not known or does not answer there.
    async fn fetch(&self, scheduler: &str, ns: &str, name: &str, revision: u64) -> Result<Action, FetchError> {
        let known = self.addresses.lock().get(scheduler).cloned();
        if let Some(api) = known {
            match self.fetch_from(&api, scheduler, ns, name, revision).await {
                Err(FetchError::Unreachable { .. }) => {}
                done => return done,
            }
        }
        let api = self.address(scheduler).await?;
        self.addresses.lock().insert(scheduler.to_string(), api.clone());
        self.fetch_from(&api, scheduler, ns, name, revision).await
    }

    /// The scheduler's API address, from its key in etcd.
    async fn address(&self, scheduler: &str) -> Result<String, FetchError> {
        let unreachable = |reason: String| FetchError::Unreachable { scheduler: scheduler.to_string(), reason };
        let registered =
            self.kv.get(&scheduler_key(&self.prefix, scheduler)).await.map_err(|e| unreachable(e.to_string()))?;
        let (value, _) = registered.ok_or_else(|| FetchError::UnknownScheduler(scheduler.to_string()))?;
        let record: SchedulerRecord =
            serde_json::from_str(&value).map_err(|e| unreachable(format!("its registration does not decode: {e}")))?;
        Ok(record.api)
    }

    async fn fetch_from(
        &self,
        api: &str,
        scheduler: &str,
        ns: &str,
        name: &str,
        revision: u64,
    ) -> Result<Action, FetchError> {
        let unreachable = |reason: String| FetchError::Unreachable { scheduler: scheduler.to_string(), reason };
        let not_found = || FetchError::NotFound {
            scheduler: scheduler.to_string(),
            ns: ns.to_string(),
            name: name.to_string(),
            revision,
        };
        let host = authority(api).ok_or_else(|| unreachable(format!("its address {api} is not http://")))?;
        let path = format!(
            "/v1/internal/actions/{}/{}?revision={revision}",
            utf8_percent_encode(ns, NON_ALPHANUMERIC),
            utf8_percent_encode(name, NON_ALPHANUMERIC)
        );
        let (status, body) = get(host, &path, &self.authorization).await.map_err(unreachable)?;
        match status {
            200 => {}
            404 => return Err(not_found()),
            other => return Err(unreachable(format!("answered {other}: {}", String::from_utf8_lossy(&body)))),
        }
        let mut action: Action =
            serde_json::from_slice(&body).map_err(|e| unreachable(format!("the action does not decode: {e}")))?;
        // What was asked for, and nothing else: another namespace's action, or another
        // revision, would run under this one's key.
        if action.namespace != ns
            || action.name != name
            || cluster_revision(scheduler, action.revision, action.updated) != revision
        {
            return Err(not_found());
        }
        action.revision = revision;
        Ok(action)
    }
}

/// Largest action answer read: the largest code the API takes, with room for the rest.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// One GET on a new connection (a fetch happens once per action revision).
async fn get(authority: &str, path: &str, authorization: &str) -> Result<(u16, Bytes), String> {
    let mut sender = invoker_http::connect(authority).await.map_err(|e| e.to_string())?;
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::AUTHORIZATION, authorization)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_ANSWER).collect().await.map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes()))
}
