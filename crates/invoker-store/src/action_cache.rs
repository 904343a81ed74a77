//! The actions read on every invoke, kept whole in memory within a byte budget: an action's
//! code may be tens of megabytes, and an invoker that sees many actions must not keep every
//! one. The least recently used go first when an insert passes the budget.

use invoker_wire::model::Action;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// What an entry is found by: the namespace and the name of a stored action, or whatever pair
/// a cache of actions from elsewhere needs (`insert_as`).
pub type Key = (String, String);

pub struct ActionCache {
    entries: FxHashMap<Key, Entry>,
    budget: usize,
    bytes: usize,
    /// Advances on every use; an entry's `used` is the tick of its last use.
    tick: u64,
}

struct Entry {
    action: Arc<Action>,
    bytes: usize,
    used: u64,
}

/// An estimate of what an action holds in memory: its code, image and names, and its
/// parameters and annotations as JSON, plus a fixed overhead.
fn weight(action: &Action) -> usize {
    let json = |kv: &[invoker_wire::model::KeyValue]| {
        kv.iter().map(|p| p.key.len() + p.value.to_string().len()).sum::<usize>()
    };
    let exec = &action.exec;
    256 + action.namespace.len()
        + action.name.len()
        + action.version.len()
        + exec.kind.len()
        + exec.code.as_ref().map_or(0, String::len)
        + exec.main.as_ref().map_or(0, String::len)
        + exec.image.as_ref().map_or(0, String::len)
        + json(&action.parameters)
        + json(&action.annotations)
}

impl ActionCache {
    pub fn new(budget: usize) -> Self {
        ActionCache { entries: FxHashMap::default(), budget, bytes: 0, tick: 0 }
    }

    pub fn get(&mut self, namespace: &str, name: &str) -> Option<Arc<Action>> {
        self.get_as(&(namespace.to_string(), name.to_string()))
    }

    pub fn get_as(&mut self, key: &Key) -> Option<Arc<Action>> {
        let entry = self.entries.get_mut(key)?;
        self.tick += 1;
        entry.used = self.tick;
        Some(entry.action.clone())
    }

    /// Keeps `action` (replacing what the key held); an action larger than the whole budget is
    /// not kept.
    pub fn insert(&mut self, action: Arc<Action>) {
        self.insert_as((action.namespace.clone(), action.name.clone()), action);
    }

    /// Keeps `action` under `key` (replacing what it held).
    pub fn insert_as(&mut self, key: Key, action: Arc<Action>) {
        self.remove(&key.0, &key.1);
        let bytes = weight(&action);
        if bytes > self.budget {
            return;
        }
        self.tick += 1;
        self.bytes += bytes;
        self.entries.insert(key, Entry { action, bytes, used: self.tick });
        if self.bytes > self.budget {
            self.evict();
        }
    }

    pub fn remove(&mut self, namespace: &str, name: &str) {
        if let Some(e) = self.entries.remove(&(namespace.to_string(), name.to_string())) {
            self.bytes -= e.bytes;
        }
    }

    /// Drops the least recently used entries down to 90 % of the budget, so that a full cache
    /// sorts its entries once per tenth of the budget inserted, not on every insert.
    fn evict(&mut self) {
        let target = self.budget / 10 * 9;
        let mut by_use: Vec<(u64, Key)> = self.entries.iter().map(|(k, e)| (e.used, k.clone())).collect();
        by_use.sort_unstable_by_key(|(used, _)| *used);
        for (_, key) in by_use {
            if self.bytes <= target {
                break;
            }
            if let Some(e) = self.entries.remove(&key) {
                self.bytes -= e.bytes;
            }
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(name: &str, code_bytes: usize) -> Arc<Action> {
        Arc::new(Action::for_test(name, &"x".repeat(code_bytes)))
    }

    #[test]
    fn a_full_cache_stays_within_its_bytes_and_drops_the_least_recently_used() {
        let mut cache = ActionCache::new(100_000);
        for i in 0..50 {
            cache.insert(action(&format!("a{i}"), 9_000));
            // a0 is used after every insert: the most recently used, never the one to go.
            assert!(cache.get("guest", "a0").is_some(), "after inserting a{i}");
            assert!(cache.bytes() <= 100_000, "{} bytes after inserting a{i}", cache.bytes());
        }
        assert!(cache.len() < 50 && cache.len() >= 9, "{} kept", cache.len());
        assert!(cache.get("guest", "a49").is_some(), "the newest is kept");
        assert!(cache.get("guest", "a1").is_none(), "the oldest unused went first");
        let kept_bytes: usize = (0..50).filter_map(|i| cache.get("guest", &format!("a{i}"))).map(|a| weight(&a)).sum();
        assert_eq!(kept_bytes, cache.bytes(), "the count follows what is kept");
    }

    #[test]
    fn an_action_larger_than_the_budget_is_not_kept_and_a_replacement_counts_once() {
        let mut cache = ActionCache::new(10_000);
        cache.insert(action("big", 20_000));
        assert!(cache.is_empty() && cache.bytes() == 0);
        cache.insert(action("a", 1_000));
        let one = cache.bytes();
        cache.insert(action("a", 1_000));
        assert_eq!((cache.len(), cache.bytes()), (1, one));
        cache.remove("guest", "a");
        assert_eq!((cache.len(), cache.bytes()), (0, 0));
    }
}
