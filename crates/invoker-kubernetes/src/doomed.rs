//! The pods this invoker wants gone and has not seen go: creations the API server did not
//! answer (it may still make the pod, later) and deletions it refused, did not answer, or did
//! not carry out in time. A pod left there would run a tenant's code with nothing to end it
//! until the invoker restarts, so each is deleted again whenever the watch shows it, and the
//! factory looks every `RETRY` as well as at every change.

use std::collections::VecDeque;
use std::time::Duration;

/// How often the factory looks again, changes or not.
pub const RETRY: Duration = Duration::from_secs(1);
/// Pods remembered at most; past it the oldest is dropped (with a warning).
const KEPT: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The creation went unanswered: the pod may show later, and goes when it does.
    Unanswered,
    /// A deletion failed: tried again while the pod shows; forgotten once it does not.
    DeleteFailed,
}

#[derive(Debug, Default)]
pub struct DoomedPods {
    pods: VecDeque<(String, Why)>,
}

impl DoomedPods {
    /// Remembers `name`; an unanswered creation stays one (the pod may not have shown yet).
    /// Returns the name dropped to stay within the bound, if any.
    pub fn remember(&mut self, name: &str, why: Why) -> Option<String> {
        if let Some((_, known)) = self.pods.iter_mut().find(|(n, _)| n == name) {
            if why == Why::Unanswered {
                *known = Why::Unanswered;
            }
            return None;
        }
        let dropped = (self.pods.len() == KEPT).then(|| self.pods.pop_front()).flatten().map(|(n, _)| n);
        self.pods.push_back((name.to_string(), why));
        dropped
    }

    /// The pods to delete now: those `shown` (each handed out once; a deletion that fails
    /// remembers it again). Unanswered creations not shown wait; failed deletions of pods no
    /// longer shown are forgotten, as those pods are gone.
    pub fn due(&mut self, shown: impl Fn(&str) -> bool) -> Vec<String> {
        let mut due = Vec::new();
        self.pods.retain(|(name, why)| {
            if shown(name) {
                due.push(name.clone());
                return false;
            }
            *why == Why::Unanswered
        });
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_creation_waits_until_its_pod_shows_then_is_due_once() {
        let mut doomed = DoomedPods::default();
        doomed.remember("a", Why::Unanswered);
        assert!(doomed.due(|_| false).is_empty());
        assert_eq!(doomed.pods.len(), 1, "still waiting for the pod to show");
        assert_eq!(doomed.due(|n| n == "a"), vec!["a"]);
        assert!(doomed.pods.is_empty(), "handed out once");
    }

    #[test]
    fn a_failed_deletion_is_due_while_its_pod_shows_and_forgotten_when_gone() {
        let mut doomed = DoomedPods::default();
        doomed.remember("a", Why::DeleteFailed);
        doomed.remember("b", Why::DeleteFailed);
        assert_eq!(doomed.due(|n| n == "a"), vec!["a"]);
        assert!(doomed.pods.is_empty(), "b is not shown: it is gone after all");
    }

    #[test]
    fn a_failed_deletion_of_an_unanswered_creation_keeps_waiting_for_the_pod() {
        let mut doomed = DoomedPods::default();
        doomed.remember("a", Why::Unanswered);
        doomed.remember("a", Why::DeleteFailed);
        assert!(doomed.due(|_| false).is_empty());
        assert_eq!(doomed.pods.len(), 1);
        doomed.remember("b", Why::DeleteFailed);
        doomed.remember("b", Why::Unanswered);
        assert!(doomed.due(|_| false).is_empty());
        assert_eq!(doomed.pods.len(), 2, "b became an unanswered creation");
    }

    #[test]
    fn past_the_bound_the_oldest_is_dropped() {
        let mut doomed = DoomedPods::default();
        for i in 0..KEPT {
            assert_eq!(doomed.remember(&format!("p{i}"), Why::Unanswered), None);
        }
        assert_eq!(doomed.remember("new", Why::Unanswered), Some("p0".to_string()));
        assert_eq!(doomed.pods.len(), KEPT);
        assert_eq!(doomed.due(|n| n == "p0" || n == "new"), vec!["new"]);
    }
}
