//! What each namespace's actions keep for themselves: the part of its limit
//! (`limits.namespace_concurrent`) they reserve with `reserved-concurrency`, the rest shared by
//! its other actions; and the containers they keep warm with `provisioned-concurrency`, within
//! `limits.namespace_provisioned`. Read from the store once per namespace, then kept current by
//! every save and delete of an action through this process.

use invoker_wire::model::Action;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// What one action, or a namespace's actions together, keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    pub reserved: u32,
    pub provisioned: u32,
}

impl Kept {
    pub fn of(action: &Action) -> Self {
        Kept {
            reserved: action.reserved_concurrency().unwrap_or(0),
            provisioned: action.provisioned_concurrency().unwrap_or(0),
        }
    }

    fn add(self, other: Kept) -> Kept {
        Kept {
            reserved: self.reserved.saturating_add(other.reserved),
            provisioned: self.provisioned.saturating_add(other.provisioned),
        }
    }
}

#[derive(Clone, Default)]
pub struct Reservations {
    /// Namespace → action → what it keeps; a namespace not read yet is absent, and an action
    /// that keeps nothing is not listed.
    by_namespace: Arc<Mutex<HashMap<String, HashMap<String, Kept>>>>,
}

impl Reservations {
    /// What the namespace's actions keep in all; `None` until it is read.
    pub fn total(&self, namespace: &str) -> Option<Kept> {
        let by_namespace = self.by_namespace.lock();
        by_namespace.get(namespace).map(|actions| actions.values().fold(Kept::default(), |sum, k| sum.add(*k)))
    }

    /// What the namespace's actions other than `name` keep; `None` until it is read.
    pub fn others(&self, namespace: &str, name: &str) -> Option<Kept> {
        let by_namespace = self.by_namespace.lock();
        let actions = by_namespace.get(namespace)?;
        Some(actions.iter().filter(|(n, _)| *n != name).fold(Kept::default(), |sum, (_, k)| sum.add(*k)))
    }

    /// The namespace as read from the store (a read that raced a save keeps what the save set).
    pub fn read(&self, namespace: &str, actions: impl IntoIterator<Item = (String, Kept)>) {
        let kept = actions.into_iter().filter(|(_, k)| *k != Kept::default());
        self.by_namespace.lock().entry(namespace.to_string()).or_insert_with(|| kept.collect());
    }

    /// An action saved keeping `kept`, or deleted (`None`).
    pub fn set(&self, namespace: &str, name: &str, kept: Option<Kept>) {
        let mut by_namespace = self.by_namespace.lock();
        let Some(actions) = by_namespace.get_mut(namespace) else { return };
        match kept.filter(|k| *k != Kept::default()) {
            Some(k) => actions.insert(name.to_string(), k),
            None => actions.remove(name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserved(r: u32) -> Kept {
        Kept { reserved: r, provisioned: 0 }
    }

    #[test]
    fn a_namespace_is_read_once_and_kept_by_its_saves_and_deletes() {
        let r = Reservations::default();
        assert_eq!(r.total("ns"), None);
        r.set("ns", "a", Some(reserved(5)));
        assert_eq!(r.total("ns"), None, "a save before the read changes nothing: the read has it");
        r.read("ns", [("a".to_string(), reserved(5)), ("b".to_string(), reserved(10))]);
        r.read("ns", [("c".to_string(), reserved(99))]);
        assert_eq!(r.total("ns"), Some(reserved(15)), "read once");
        r.set("ns", "c", Some(Kept { reserved: 3, provisioned: 2 }));
        r.set("ns", "a", None);
        assert_eq!(r.total("ns"), Some(Kept { reserved: 13, provisioned: 2 }));
        assert_eq!(r.others("ns", "b"), Some(Kept { reserved: 3, provisioned: 2 }));
    }
}
