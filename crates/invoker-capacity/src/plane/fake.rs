//! A control plane in memory, for tests (`test-util`): it records what it was asked, its
//! invokers "run" from their provisioning until their removal (or until a test says they
//! exited), and it never registers them: the test writes their records into etcd as an invoker
//! would, so that each step of the manager can be driven and checked.

use invoker_factory::plane::{ControlPlane, InvokerSpec, PlaneError};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[derive(Clone, Default)]
pub struct FakePlane {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// What was asked, in order: `provision <id>` and `remove <id>`.
    calls: Vec<String>,
    running: BTreeMap<String, InvokerSpec>,
    exited: BTreeMap<String, String>,
    found: BTreeSet<String>,
    forgotten: Vec<String>,
}

impl FakePlane {
    /// What the plane was asked, in order.
    pub fn calls(&self) -> Vec<String> {
        self.inner.lock().calls.clone()
    }

    /// The invokers running, with what they were started with.
    pub fn started(&self) -> BTreeMap<String, InvokerSpec> {
        self.inner.lock().running.clone()
    }

    /// `id` exits on its own, having said `error`.
    pub fn exit(&self, id: &str, error: &str) {
        let mut inner = self.inner.lock();
        inner.running.remove(id);
        inner.exited.insert(id.to_string(), error.to_string());
    }

    /// The invokers the manager forgot, in order.
    pub fn forgotten(&self) -> Vec<String> {
        self.inner.lock().forgotten.clone()
    }

    /// Invokers a manager before this one started, to be found.
    pub fn with_found(self, ids: &[&str]) -> Self {
        self.inner.lock().found = ids.iter().map(|id| id.to_string()).collect();
        self
    }
}

impl ControlPlane for FakePlane {
    async fn provision(&self, spec: &InvokerSpec) -> Result<(), PlaneError> {
        let mut inner = self.inner.lock();
        inner.calls.push(format!("provision {}", spec.id));
        inner.exited.remove(&spec.id);
        inner.running.insert(spec.id.clone(), spec.clone());
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), PlaneError> {
        let mut inner = self.inner.lock();
        inner.calls.push(format!("remove {id}"));
        inner.running.remove(id);
        inner.found.remove(id);
        Ok(())
    }

    fn running(&self, id: &str) -> Option<bool> {
        let inner = self.inner.lock();
        if inner.running.contains_key(id) || inner.found.contains(id) {
            Some(true)
        } else if inner.exited.contains_key(id) {
            Some(false)
        } else {
            None
        }
    }

    fn last_error(&self, id: &str) -> Option<String> {
        self.inner.lock().exited.get(id).cloned()
    }

    fn found(&self) -> Vec<String> {
        let inner = self.inner.lock();
        inner.found.iter().chain(inner.running.keys()).cloned().collect::<BTreeSet<_>>().into_iter().collect()
    }

    fn forget(&self, id: &str) {
        self.inner.lock().forgotten.push(id.to_string());
    }
}
