//! Queued (asynchronous) calls waiting for an invoker with room, in lines by action revision.
//! Only the first of a line tries placement: an action's calls are handed over in the order
//! they came, and a long backlog costs one placement per action for each new reading of the
//! cluster, not one per call. Every call in a line counts as waiting demand, so the capacity
//! manager sees the whole backlog, not only its heads.

use super::demand::{DemandLedger, Stage};
use super::view::RevisionKey;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Default)]
pub struct Backlog {
    lines: Mutex<HashMap<RevisionKey, VecDeque<u64>>>,
    /// Someone left a line: its next may be first now.
    moved: Notify,
    next: AtomicU64,
}

/// A call's place in its line; leaving it (dropping) lets the next one go first.
pub struct InLine<'a> {
    backlog: &'a Backlog,
    key: RevisionKey,
    id: u64,
    demand: Arc<DemandLedger>,
    tags: Vec<String>,
    memory_mb: u64,
}

impl Backlog {
    /// Joins the line of `key`: at its end, or (`front`: a call that was handed over and came
    /// back unstarted) at its front, ahead of the calls that came after it.
    pub fn join(
        &self,
        key: &RevisionKey,
        front: bool,
        demand: &Arc<DemandLedger>,
        tags: &[String],
        memory_mb: u64,
    ) -> InLine<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut lines = self.lines.lock();
        let line = lines.entry(key.clone()).or_default();
        if front {
            line.push_front(id);
        } else {
            line.push_back(id);
        }
        demand.add(tags, Stage::Waiting, memory_mb);
        InLine { backlog: self, key: key.clone(), id, demand: demand.clone(), tags: tags.to_vec(), memory_mb }
    }

    /// Calls waiting in every line.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lines.lock().values().map(VecDeque::len).sum()
    }
}

impl InLine<'_> {
    /// Returns once this call is the first of its line.
    pub async fn first(&self) {
        loop {
            let moved = self.backlog.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.is_first() {
                return;
            }
            moved.await;
        }
    }

    fn is_first(&self) -> bool {
        self.backlog.lines.lock().get(&self.key).and_then(|line| line.front()) == Some(&self.id)
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        {
            let mut lines = self.backlog.lines.lock();
            if let Some(line) = lines.get_mut(&self.key) {
                line.retain(|id| *id != self.id);
                if line.is_empty() {
                    lines.remove(&self.key);
                }
            }
        }
        self.demand.remove(&self.tags, Stage::Waiting, self.memory_mb);
        self.backlog.moved.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(name: &str) -> RevisionKey {
        ("ns".into(), name.into(), 1)
    }

    #[tokio::test]
    async fn a_line_goes_in_arrival_order_and_a_call_sent_back_goes_first() {
        let backlog = Backlog::default();
        let demand = Arc::new(DemandLedger::default());
        let a = backlog.join(&key("a"), false, &demand, &[], 128);
        let b = backlog.join(&key("a"), false, &demand, &[], 128);
        let other = backlog.join(&key("b"), false, &demand, &[], 128);
        assert!(a.is_first() && !b.is_first() && other.is_first(), "one line per action");
        let waiting = tokio::time::timeout(Duration::from_millis(50), b.first()).await;
        assert!(waiting.is_err(), "b waits behind a");
        drop(a);
        tokio::time::timeout(Duration::from_secs(1), b.first()).await.expect("b is first once a left");
        let back = backlog.join(&key("a"), true, &demand, &[], 128);
        assert!(back.is_first() && !b.is_first(), "sent back unstarted: ahead of those after it");
        assert_eq!(backlog.len(), 3);
        drop((back, b, other));
        assert_eq!(backlog.len(), 0);
    }
}
