//! Each namespace's reserved concurrency: the part of its limit (`limits.namespace_concurrent`)
//! that actions keep for themselves with `reserved-concurrency`. The rest is shared by its other
//! actions. Read from the store once per namespace, then kept current by every save and delete
//! of an action through this process.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Clone, Default)]
pub struct Reservations {
    /// Namespace → action → its reservation; a namespace not read yet is absent.
    by_namespace: Arc<Mutex<HashMap<String, HashMap<String, u32>>>>,
}

impl Reservations {
    /// What the namespace's actions reserve in all; `None` until it is read.
    pub fn total(&self, namespace: &str) -> Option<u32> {
        let by_namespace = self.by_namespace.lock();
        by_namespace.get(namespace).map(|actions| actions.values().fold(0u32, |sum, r| sum.saturating_add(*r)))
    }

    /// What the namespace's actions other than `name` reserve; `None` until it is read.
    pub fn others(&self, namespace: &str, name: &str) -> Option<u32> {
        let by_namespace = self.by_namespace.lock();
        let actions = by_namespace.get(namespace)?;
        Some(actions.iter().filter(|(n, _)| *n != name).fold(0u32, |sum, (_, r)| sum.saturating_add(*r)))
    }

    /// The namespace as read from the store (a read that raced a save keeps what the save set).
    pub fn read(&self, namespace: &str, actions: impl IntoIterator<Item = (String, u32)>) {
        self.by_namespace.lock().entry(namespace.to_string()).or_insert_with(|| actions.into_iter().collect());
    }

    /// An action saved with `reserved` (or without one), or deleted (`None`).
    pub fn set(&self, namespace: &str, name: &str, reserved: Option<u32>) {
        let mut by_namespace = self.by_namespace.lock();
        let Some(actions) = by_namespace.get_mut(namespace) else { return };
        match reserved {
            Some(r) => actions.insert(name.to_string(), r),
            None => actions.remove(name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_read_once_and_kept_by_its_saves_and_deletes() {
        let r = Reservations::default();
        assert_eq!(r.total("ns"), None);
        r.set("ns", "a", Some(5));
        assert_eq!(r.total("ns"), None, "a save before the read changes nothing: the read has it");
        r.read("ns", [("a".to_string(), 5), ("b".to_string(), 10)]);
        r.read("ns", [("c".to_string(), 99)]);
        assert_eq!(r.total("ns"), Some(15), "read once");
        r.set("ns", "c", Some(3));
        r.set("ns", "a", None);
        assert_eq!((r.total("ns"), r.others("ns", "b")), (Some(13), Some(3)));
    }
}
