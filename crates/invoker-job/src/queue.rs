//! The durable queue's bounds: what waits now, by namespace, counted as calls are admitted and
//! as they start or end. The calls themselves are in the store (written before their 202) and
//! in the pool, where they wait as patient jobs behind blocking calls.

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// Why a call was not admitted: a 429 names the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueFull {
    #[error("the queue of asynchronous calls holds {limit} calls, its limit (queue.max_calls)")]
    Calls { limit: usize },
    #[error("namespace {namespace} has {limit} asynchronous calls waiting, its limit (queue.max_calls_per_namespace)")]
    Namespace { namespace: String, limit: usize },
    #[error("the queue of asynchronous calls holds {limit_mb} MB of parameters, its limit (queue.max_mb)")]
    Bytes { limit_mb: u64 },
}

/// The queue as `[queue]` sets it: its bounds and the default policy of a call in it (an
/// action's annotations set its own).
#[derive(Clone, Copy, Debug)]
pub struct QueueSettings {
    pub bounds: QueueBounds,
    pub max_event_age: std::time::Duration,
    pub max_retry_attempts: u32,
    pub retry_backoff: std::time::Duration,
}

/// When a queued call of `action` accepted at `accepted_at` (epoch ms) is past its age: its
/// action's `max-event-age` annotation, or `default_age`.
pub fn expires_at(action: &invoker_wire::model::Action, default_age: std::time::Duration, accepted_at: u64) -> u64 {
    let age = action.max_event_age_s().map_or(default_age, std::time::Duration::from_secs);
    accepted_at.saturating_add(age.as_millis() as u64)
}

/// The bounds, as `[queue]` sets them.
#[derive(Clone, Copy, Debug)]
pub struct QueueBounds {
    pub max_calls: usize,
    pub max_calls_per_namespace: usize,
    pub max_bytes: u64,
}

#[derive(Default)]
struct Held {
    calls: usize,
    bytes: u64,
    by_namespace: FxHashMap<Arc<str>, OfNamespace>,
}

/// One namespace's waiting calls: how many, and when each was accepted (for the oldest).
#[derive(Default)]
struct OfNamespace {
    calls: usize,
    since: std::collections::BTreeMap<u64, usize>,
}

/// What waits of one namespace, as `/metrics` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceDepth {
    pub namespace: String,
    pub calls: usize,
    /// When the oldest waiting call was accepted (epoch ms).
    pub oldest: u64,
}

/// What waits in the queue now; cheap to clone.
#[derive(Clone)]
pub struct QueueCounts {
    bounds: QueueBounds,
    held: Arc<Mutex<Held>>,
}

impl QueueCounts {
    pub fn new(bounds: QueueBounds) -> Self {
        QueueCounts { bounds, held: Arc::default() }
    }

    /// Counts one more waiting call of `namespace` holding `bytes`, accepted at `since` (epoch
    /// ms), if the bounds allow. `force`: counted whatever the bounds (a call accepted before:
    /// found by a restart, or a retry).
    pub fn admit(&self, namespace: &str, bytes: u64, since: u64, force: bool) -> Result<QueueTicket, QueueFull> {
        let b = self.bounds;
        let mut held = self.held.lock();
        let of_namespace = held.by_namespace.get(namespace).map_or(0, |n| n.calls);
        if !force {
            if held.calls >= b.max_calls {
                return Err(QueueFull::Calls { limit: b.max_calls });
            }
            if of_namespace >= b.max_calls_per_namespace {
                return Err(QueueFull::Namespace { namespace: namespace.into(), limit: b.max_calls_per_namespace });
            }
            if held.bytes.saturating_add(bytes) > b.max_bytes {
                return Err(QueueFull::Bytes { limit_mb: b.max_bytes >> 20 });
            }
        }
        let namespace: Arc<str> = match held.by_namespace.get_key_value(namespace) {
            Some((name, _)) => name.clone(),
            None => Arc::from(namespace),
        };
        held.calls += 1;
        held.bytes += bytes;
        let of = held.by_namespace.entry(namespace.clone()).or_default();
        of.calls += 1;
        *of.since.entry(since).or_default() += 1;
        Ok(QueueTicket { held: self.held.clone(), namespace, bytes, since })
    }

    /// Calls waiting, all namespaces together.
    pub fn calls(&self) -> usize {
        self.held.lock().calls
    }

    /// Calls waiting, by namespace, with the oldest's acceptance.
    pub fn by_namespace(&self) -> Vec<NamespaceDepth> {
        let held = self.held.lock();
        let mut out: Vec<_> = held
            .by_namespace
            .iter()
            .map(|(n, of)| NamespaceDepth {
                namespace: n.to_string(),
                calls: of.calls,
                oldest: of.since.keys().next().copied().unwrap_or_default(),
            })
            .collect();
        out.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        out
    }
}

/// One waiting call's place in the counts, given back when it is dropped (the call started,
/// ended, or was left for the next start).
pub struct QueueTicket {
    held: Arc<Mutex<Held>>,
    namespace: Arc<str>,
    bytes: u64,
    since: u64,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        held.calls -= 1;
        held.bytes -= self.bytes;
        if let Some(of) = held.by_namespace.get_mut(&self.namespace) {
            of.calls -= 1;
            if let Some(count) = of.since.get_mut(&self.since) {
                *count -= 1;
                if *count == 0 {
                    of.since.remove(&self.since);
                }
            }
            if of.calls == 0 {
                held.by_namespace.remove(&self.namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts() -> QueueCounts {
        QueueCounts::new(QueueBounds { max_calls: 3, max_calls_per_namespace: 2, max_bytes: 100 })
    }

    #[test]
    fn each_bound_refuses_with_its_name_and_a_ticket_gives_its_place_back() {
        let q = counts();
        let a1 = q.admit("a", 10, 5, false).unwrap();
        let _a2 = q.admit("a", 10, 7, false).unwrap();
        assert_eq!(q.admit("a", 10, 8, false).err(), Some(QueueFull::Namespace { namespace: "a".into(), limit: 2 }));
        assert_eq!(q.admit("b", 81, 8, false).err(), Some(QueueFull::Bytes { limit_mb: 0 }));
        let _b = q.admit("b", 10, 9, false).unwrap();
        assert_eq!(q.admit("c", 1, 9, false).err(), Some(QueueFull::Calls { limit: 3 }));
        let forced = q.admit("c", 1, 1, true).unwrap();
        assert_eq!(q.calls(), 4);
        drop(a1);
        drop(forced);
        let depth = |namespace: &str, calls, oldest| NamespaceDepth { namespace: namespace.into(), calls, oldest };
        assert_eq!(q.by_namespace(), [depth("a", 1, 7), depth("b", 1, 9)], "the oldest left, not the first");
        assert!(q.admit("c", 1, 10, false).is_ok());
    }
}
