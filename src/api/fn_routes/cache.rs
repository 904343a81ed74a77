//! Where Fn's calls lead, without a store read on the event loop: the action a function id, or
//! an app's trigger source, names, per namespace. What it holds stands while the store's
//! documents do not change ([`Store::docs_generation`]); any write of an app, a function or a
//! trigger empties it. The action itself is read through the store's action cache, which its
//! own updates keep true.

use invoker_store::Store;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

/// Entries kept at most; past it the cache starts over (a namespace's functions are few).
const MAX_ENTRIES: usize = 10_000;

#[derive(Clone, PartialEq, Eq, Hash)]
pub(in crate::api) enum Target {
    Function(String),
    /// An app's name, and a trigger's source.
    Trigger(String, String),
    /// A function's invoke key: what is held is `<namespace>\n<function id>`.
    InvokeKey(String),
}

#[derive(Default)]
pub(in crate::api) struct FnCache {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    generation: u64,
    names: FxHashMap<(String, Target), String>,
}

impl FnCache {
    /// The action name `target` of `namespace` leads to: held, or found by `find` (which reads
    /// the store) and held while the documents stand. `find`'s `None` (not found) is not held.
    pub(in crate::api) fn action_name<E>(
        &self,
        store: &dyn Store,
        namespace: &str,
        target: Target,
        find: impl FnOnce() -> Result<Option<String>, E>,
    ) -> Result<Option<String>, E> {
        let generation = store.docs_generation();
        let key = (namespace.to_string(), target);
        {
            let mut held = self.held.lock();
            if held.generation != generation {
                held.names.clear();
                held.generation = generation;
            }
            if let Some(name) = held.names.get(&key) {
                return Ok(Some(name.clone()));
            }
        }
        let found = find()?;
        if let Some(name) = &found {
            let mut held = self.held.lock();
            // Read before a write that came meanwhile: not kept.
            if held.generation == generation && store.docs_generation() == generation {
                if held.names.len() >= MAX_ENTRIES {
                    held.names.clear();
                }
                held.names.insert(key, name.clone());
            }
        }
        Ok(found)
    }
}
