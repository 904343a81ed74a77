//! One `warn` line in the invoker's log for every container given up (a connection error, a
//! timeout, a developer error, a failed `/init` or create): the container, the action and the
//! reason, so an operator can tell why the next call was cold. Bounded: the same reason for the
//! same action is logged at most once a second, however many containers it takes.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often one reason for one action is logged at most.
const EVERY: Duration = Duration::from_secs(1);

/// Entries kept at most; past it the oldest half goes (a burst over many actions).
const MAX_ENTRIES: usize = 4096;

#[derive(Default)]
pub struct DiscardLog {
    last: Mutex<HashMap<(String, &'static str), Instant>>,
}

impl DiscardLog {
    /// Logs that `container` of `action` was given up, for `why` (a short class: "timeout",
    /// "connection error", ...) with `detail`; returns whether the line was written.
    pub fn discarded(&self, container: u64, action: &str, why: &'static str, detail: &str) -> bool {
        let now = Instant::now();
        {
            let mut last = self.last.lock();
            let key = (action.to_string(), why);
            if last.get(&key).is_some_and(|at| now.duration_since(*at) < EVERY) {
                return false;
            }
            if last.len() >= MAX_ENTRIES {
                let mut ages: Vec<Instant> = last.values().copied().collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                last.retain(|_, at| *at > cut);
            }
            last.insert(key, now);
        }
        let detail: String = detail.chars().take(300).collect();
        tracing::warn!(container, action, reason = why, "container discarded: {why}: {detail}");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_reason_and_action_per_second() {
        let log = DiscardLog::default();
        assert!(log.discarded(1, "/ns/a", "timeout", "x"));
        assert!(!log.discarded(2, "/ns/a", "timeout", "x"), "the same reason again at once");
        assert!(log.discarded(3, "/ns/a", "connection error", "y"), "another reason");
        assert!(log.discarded(4, "/ns/b", "timeout", "x"), "another action");
    }
}
