//! An action's `max-concurrency` across a cluster. Each scheduler lets at most its share of
//! the cap through at once, `ceil(cap / schedulers)` with the schedulers it reads in etcd, so
//! all of them together run at most `cap + schedulers - 1` (the rounding); while a scheduler
//! joins or leaves, until every one has read it, the shares may add up to more for a refresh
//! interval. Every invoker also holds the cap for what it runs, whoever sent it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Instant;
use tokio::sync::Notify;

/// An action, by namespace and name (its revisions share the cap).
type ActionName = (String, String);

#[derive(Default)]
pub struct Caps {
    passed: Mutex<HashMap<ActionName, u32>>,
    /// A permit went back: waiters look again.
    released: Notify,
}

/// One activation let through; dropping it lets the next one through.
pub struct Permit<'a> {
    caps: &'a Caps,
    action: ActionName,
}

/// What [`Caps::pass`] waited for, in vain.
#[derive(Debug)]
pub struct AtCap;

/// A scheduler's share of `cap` among `schedulers`.
pub fn share(cap: u32, schedulers: usize) -> u32 {
    cap.div_ceil(u32::try_from(schedulers.max(1)).unwrap_or(u32::MAX)).max(1)
}

impl Caps {
    /// Waits until fewer than `share()` of the action's activations passed here and have not
    /// ended, then lets this one through; `AtCap` at `until`. `share` is asked again at each
    /// look (the schedulers counted may change meanwhile).
    pub async fn pass(
        &self,
        namespace: &str,
        name: &str,
        share: impl Fn() -> u32,
        until: Instant,
    ) -> Result<Permit<'_>, AtCap> {
        let action = (namespace.to_string(), name.to_string());
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut passed = self.passed.lock();
                let count = passed.entry(action.clone()).or_insert(0);
                if *count < share() {
                    *count += 1;
                    return Ok(Permit { caps: self, action });
                }
                if *count == 0 {
                    passed.remove(&action);
                }
            }
            if tokio::time::timeout_at(until.into(), released).await.is_err() {
                return Err(AtCap);
            }
        }
    }

    /// Activations of `namespace/name` let through and not ended.
    pub fn running(&self, namespace: &str, name: &str) -> u32 {
        self.passed.lock().get(&(namespace.to_string(), name.to_string())).copied().unwrap_or(0)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        {
            let mut passed = self.caps.passed.lock();
            if let Some(count) = passed.get_mut(&self.action) {
                *count -= 1;
                if *count == 0 {
                    passed.remove(&self.action);
                }
            }
        }
        self.caps.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_shares_add_up_to_the_cap_and_at_most_one_more_per_other_scheduler() {
        for cap in 1..50u32 {
            for schedulers in 1..8usize {
                let total = share(cap, schedulers) * schedulers as u32;
                assert!(total >= cap && total < cap + schedulers as u32, "cap {cap}, {schedulers} schedulers: {total}");
            }
        }
    }

    #[tokio::test]
    async fn past_its_share_an_activation_waits_for_one_to_end() {
        let caps = Caps::default();
        let soon = || Instant::now() + Duration::from_millis(50);
        let one = caps.pass("ns", "a", || 2, soon()).await.unwrap();
        let _two = caps.pass("ns", "a", || 2, soon()).await.unwrap();
        let _other = caps.pass("ns", "b", || 2, soon()).await.unwrap();
        assert!(caps.pass("ns", "a", || 2, soon()).await.is_err(), "a third of a at a share of two");
        let waiting = caps.pass("ns", "a", || 2, Instant::now() + Duration::from_secs(5));
        let ((), third) = tokio::join!(async { drop(one) }, waiting);
        assert!(third.is_ok());
        assert_eq!(caps.running("ns", "a"), 2);
    }
}
