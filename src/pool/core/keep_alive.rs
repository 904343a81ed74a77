//! Keep-alive policies: which idle containers are kept, for how long, and which go first when
//! room is needed. The core tells the policy when a container becomes idle; it never tells it
//! when the container stops being idle (that would cost a search on every warm activation).
//! Instead each idle spell carries the core's mark, and the core passes a liveness check
//! whenever it asks the policy something: spells that ended are skipped and dropped lazily.

use super::{ContainerId, KeyId, Time};
use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::Duration;

/// One period during which a container sat idle, from `since` until it took work or went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleSpell {
    /// The core's mark for this spell: live while the container's mark still equals it.
    pub seq: u64,
    pub container: ContainerId,
    pub key: KeyId,
    pub memory_mb: u32,
    pub since: Time,
}

/// Whether a spell is still going on (the container is still idle since then).
pub type Live<'a> = &'a dyn Fn(&IdleSpell) -> bool;

pub trait KeepAlivePolicy: Debug + Send {
    /// A container became idle.
    fn idle(&mut self, spell: IdleSpell);
    /// A live spell whose keep-alive has run out at `now`, taken out of the policy; the core
    /// removes its container and asks again until `None`.
    fn expired(&mut self, now: Time, live: Live) -> Option<IdleSpell>;
    /// Spells, the first to evict first, when the core must make room. Ended spells may be
    /// among them; the core skips those.
    fn eviction_order(&self) -> Box<dyn Iterator<Item = IdleSpell> + '_>;
    /// Drops ended spells if they outnumber the `idle` live ones enough to matter.
    fn compact(&mut self, idle: usize, live: Live);
}

/// A fixed idle timeout, and least recently used first for eviction (OpenWhisk's and Fn's
/// policy, and the baseline the simulator compares smarter ones with).
#[derive(Debug)]
pub struct FixedKeepAlive {
    idle_timeout: Duration,
    /// Spells in the order they began: the least recently used first.
    spells: VecDeque<IdleSpell>,
}

impl FixedKeepAlive {
    pub fn new(idle_timeout: Duration) -> Self {
        FixedKeepAlive { idle_timeout, spells: VecDeque::new() }
    }
}

impl KeepAlivePolicy for FixedKeepAlive {
    fn idle(&mut self, spell: IdleSpell) {
        self.spells.push_back(spell);
    }

    fn expired(&mut self, now: Time, live: Live) -> Option<IdleSpell> {
        while let Some(spell) = self.spells.front() {
            if !live(spell) {
                self.spells.pop_front();
                continue;
            }
            if spell.since + self.idle_timeout > now {
                return None;
            }
            return self.spells.pop_front();
        }
        None
    }

    fn eviction_order(&self) -> Box<dyn Iterator<Item = IdleSpell> + '_> {
        Box::new(self.spells.iter().copied())
    }

    fn compact(&mut self, idle: usize, live: Live) {
        if self.spells.len() > 2 * idle + 64 {
            self.spells.retain(|s| live(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spell(seq: u64, since_ms: u64) -> IdleSpell {
        IdleSpell {
            seq,
            container: ContainerId(seq),
            key: KeyId(0),
            memory_mb: 128,
            since: Duration::from_millis(since_ms),
        }
    }

    #[test]
    fn expires_live_spells_in_order_and_skips_ended_ones() {
        let mut policy = FixedKeepAlive::new(Duration::from_millis(100));
        for (seq, since) in [(1, 0), (2, 10), (3, 20)] {
            policy.idle(spell(seq, since));
        }
        let live = |s: &IdleSpell| s.seq != 1;
        assert_eq!(policy.expired(Duration::from_millis(105), &live), None, "spell 2 runs out at 110");
        assert_eq!(policy.expired(Duration::from_millis(115), &live).map(|s| s.seq), Some(2));
        let order: Vec<u64> = policy.eviction_order().map(|s| s.seq).collect();
        assert_eq!(order, vec![3], "spell 2 was taken out, spell 1 dropped as ended");
    }
}
