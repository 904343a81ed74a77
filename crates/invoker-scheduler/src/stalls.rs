//! Invokers that took no hand-over in time: a frozen process (SIGSTOP, a long stall of its
//! disk or its host) still accepts TCP connections, so only the missing `100 Continue` shows it
//! ([`super::send::Sent::Unheard`]). A stalled invoker is not placed on; what it already holds
//! stays its own. One probe per stalled invoker pings it until it answers (or leaves the
//! cluster), and then it is placed on again.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How long one ping may take before the next is tried.
pub const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// The pause between pings of a stalled invoker.
pub const PING_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Default)]
pub struct Stalls {
    /// Invoker id → since when.
    stalled: Mutex<BTreeMap<String, Instant>>,
}

impl Stalls {
    /// Marks `id` stalled; true when it was not (the caller starts its probe).
    pub fn mark(&self, id: &str) -> bool {
        let mut stalled = self.stalled.lock();
        if stalled.contains_key(id) {
            return false;
        }
        stalled.insert(id.to_string(), Instant::now());
        true
    }

    /// Takes `id` back; how long it was stalled.
    pub fn clear(&self, id: &str) -> Option<Duration> {
        self.stalled.lock().remove(id).map(|since| since.elapsed())
    }

    pub fn contains(&self, id: &str) -> bool {
        self.stalled.lock().contains_key(id)
    }

    pub fn ids(&self) -> BTreeSet<String> {
        self.stalled.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_per_stall() {
        let stalls = Stalls::default();
        assert!(stalls.mark("a"));
        assert!(!stalls.mark("a"), "already stalled: its probe runs");
        assert!(stalls.contains("a") && !stalls.contains("b"));
        assert!(stalls.clear("a").is_some());
        assert!(stalls.clear("a").is_none());
        assert!(stalls.mark("a"), "stalled again: a new probe");
    }
}
