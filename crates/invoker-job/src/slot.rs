//! Each namespace's count of activations in flight, and the slot that holds one of them until
//! the activation's record is written.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The in-flight counts of every namespace with one or more activations in flight.
#[derive(Clone, Default)]
pub struct NamespaceSlots {
    counts: Arc<Mutex<HashMap<String, u32>>>,
}

impl NamespaceSlots {
    /// A slot of `namespace`, or `None` when it already holds `limit`.
    pub fn take(&self, namespace: &str, limit: u32) -> Option<NamespaceSlot> {
        let mut counts = self.counts.lock();
        let n = counts.entry(namespace.to_string()).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(NamespaceSlot { counts: self.counts.clone(), namespace: namespace.to_string() })
    }
}

/// One in-flight activation of a namespace; released on drop.
pub struct NamespaceSlot {
    counts: Arc<Mutex<HashMap<String, u32>>>,
    namespace: String,
}

impl Drop for NamespaceSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        if let Some(n) = counts.get_mut(&self.namespace) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_holds_at_most_its_limit_and_a_dropped_slot_frees_one() {
        let slots = NamespaceSlots::default();
        let a = slots.take("a", 2).unwrap();
        let _b = slots.take("a", 2).unwrap();
        assert!(slots.take("a", 2).is_none());
        assert!(slots.take("other", 2).is_some(), "namespaces count apart");
        drop(a);
        assert!(slots.take("a", 2).is_some());
        assert!(slots.counts.lock().get("other").is_none(), "a namespace with nothing in flight is forgotten");
    }
}
