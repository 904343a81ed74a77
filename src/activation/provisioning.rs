//! An action's provisioned containers (`provisioned-concurrency`), handed to what keeps them
//! (an invoker's pool, or a scheduler that spreads them over its invokers): at every save of the
//! action, and at a start for every stored action that keeps any. Each namespace's actions keep at most `limits.namespace_provisioned` in all: a `PUT`
//! past it is refused (`api::actions`), and what reaches the pool is bounded again here, so
//! that no other route (an Fn function, two saves at once) gets past it.

use super::ActivationService;
use invoker_store::StoreError;
use invoker_wire::model::Action;
use std::collections::BTreeMap;
use std::sync::Arc;

impl ActivationService {
    /// Provisioned containers kept by each namespace's actions at most (0: none).
    pub fn with_namespace_provisioned(mut self, bound: u32) -> Self {
        self.namespace_provisioned = bound;
        self
    }

    /// `action` was saved: its provisioned containers (none if it names none), within what its
    /// namespace's other actions leave of the bound; kept by this invoker's pool, or spread
    /// over the invokers by this scheduler. Its older revisions keep none once retired.
    pub(super) async fn provision_saved(&self, action: &Action) {
        let count = match action.provisioned_concurrency() {
            None => 0,
            Some(wanted) => match self.kept_by_others(&action.namespace, &action.name).await {
                Ok(others) => self.within_bound(action, wanted, others.provisioned),
                Err(e) => {
                    tracing::warn!(action = %action.path(), "its namespace's provisioned containers cannot be read: {e}");
                    return;
                }
            },
        };
        self.runner.provision(Arc::new(action.clone()), count).await;
    }

    /// At a start: every stored action that keeps provisioned containers, each namespace's in
    /// name order within its bound.
    pub async fn provision_stored(&self) -> Result<(), StoreError> {
        let store = self.store.clone();
        let keep = |a: &Action| a.provisioned_concurrency().is_some();
        let found = tokio::task::spawn_blocking(move || store.find_actions(&keep)).await.map_err(|e| {
            StoreError::Io { what: "reading the provisioned actions".into(), source: std::io::Error::other(e) }
        })??;
        let mut by_namespace: BTreeMap<String, Vec<Action>> = BTreeMap::new();
        for action in found {
            by_namespace.entry(action.namespace.clone()).or_default().push(action);
        }
        for mut actions in by_namespace.into_values() {
            actions.sort_by(|a, b| a.name.cmp(&b.name));
            let mut kept = 0u32;
            for action in actions {
                let wanted = action.provisioned_concurrency().unwrap_or(0);
                let count = self.within_bound(&action, wanted, kept);
                kept = kept.saturating_add(count);
                self.runner.provision(Arc::new(action), count).await;
            }
        }
        Ok(())
    }

    /// What `action` may keep of the `wanted` it asks for, when its namespace's other actions
    /// keep `others`: the bound, and its own cap, hold.
    fn within_bound(&self, action: &Action, wanted: u32, others: u32) -> u32 {
        let left = self.namespace_provisioned.saturating_sub(others);
        let count = wanted.min(left).min(action.max_concurrency().unwrap_or(u32::MAX));
        if count < wanted {
            tracing::warn!(
                action = %action.path(),
                wanted,
                count,
                "provisioned-concurrency is past what its namespace may keep (limits.namespace_provisioned) \
                 or its cap: only {count} are kept"
            );
        }
        count
    }
}
