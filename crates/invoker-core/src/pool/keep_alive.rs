//! Keep-alive policies: which idle containers are kept, for how long, and which go first when
//! room is needed. The core tells the policy when a container becomes idle; it never tells it
//! when the container stops being idle (that would cost a search on every warm activation).
//! Instead each idle spell carries the core's mark, and the core passes a liveness check
//! whenever it asks the policy something: spells that ended are skipped and dropped lazily.

use super::types::KeyId;
use invoker_ids::{ContainerId, Time};
use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, VecDeque};
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
    /// The action's activations since the core last forgot it (all its containers gone).
    pub frequency: u32,
    /// What a cold start of the action costs: its measured start time (the average over all
    /// actions until it has one).
    pub start_cost: Duration,
    /// The container has run nothing yet: started ahead of a call (a pre-warm).
    pub fresh: bool,
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
    /// The core removed this spell's container to make room (it came from `eviction_order`).
    fn evicted(&mut self, _spell: &IdleSpell) {}
    /// A job of `key` arrived.
    fn arrived(&mut self, _key: KeyId, _now: Time) {}
    /// A key whose container the policy wants started now, ahead of its next call.
    fn prewarm_due(&mut self, _now: Time) -> Option<KeyId> {
        None
    }
    /// Whether the core must keep `key` known though nothing of it is left (the policy still
    /// learns from it, or will pre-warm it).
    fn holds(&self, _key: KeyId) -> bool {
        false
    }
    /// The live spell `seq`: when it began, and until when its container is kept if the
    /// policy sets a time (memory pressure may take it earlier). For the pool's view.
    fn spell(&self, seq: u64) -> Option<(Time, Option<Time>)>;
    /// A key the policy held and no longer does: the core forgets it if nothing of it is left.
    fn released(&mut self, _now: Time) -> Option<KeyId> {
        None
    }
    /// The core forgot `key`: so does the policy.
    fn forget(&mut self, _key: KeyId) {}
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

    fn spell(&self, seq: u64) -> Option<(Time, Option<Time>)> {
        // Spells are filed as they begin, their seqs rising.
        let at = self.spells.binary_search_by_key(&seq, |s| s.seq).ok()?;
        let since = self.spells[at].since;
        Some((since, Some(since + self.idle_timeout)))
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

/// Keep-alive as caching (FaasCache, ASPLOS 2021: greedy-dual-size-frequency). Every idle
/// container is kept while memory allows; when room is needed the one with the lowest priority
/// goes, `clock + frequency × start cost / memory`: rarely called, cheap to start, large
/// containers first. The clock rises to each evicted priority, so containers idle since long
/// ago age out against fresh ones.
#[derive(Debug)]
pub struct GreedyDual {
    max_idle: Option<Duration>,
    /// In priority units (start-cost microseconds per MB, times the frequency).
    clock: u64,
    /// seq → the spell and the priority it was filed under: every spell the policy holds
    /// (ended ones until compacted).
    spells: FxHashMap<u64, (IdleSpell, u64)>,
    /// (priority, seq), the lowest first.
    order: BTreeSet<(u64, u64)>,
    /// Seqs in the order their spells began, for `max_idle`.
    by_since: VecDeque<u64>,
}

impl GreedyDual {
    pub fn new(max_idle: Option<Duration>) -> Self {
        GreedyDual {
            max_idle,
            clock: 0,
            spells: FxHashMap::default(),
            order: BTreeSet::new(),
            by_since: VecDeque::new(),
        }
    }

    fn take(&mut self, seq: u64) -> Option<(IdleSpell, u64)> {
        let (spell, priority) = self.spells.remove(&seq)?;
        self.order.remove(&(priority, seq));
        Some((spell, priority))
    }
}

impl KeepAlivePolicy for GreedyDual {
    fn spell(&self, seq: u64) -> Option<(Time, Option<Time>)> {
        let since = self.spells.get(&seq)?.0.since;
        Some((since, self.max_idle.map(|max| since + max)))
    }

    fn idle(&mut self, spell: IdleSpell) {
        let cost = u64::try_from(spell.start_cost.as_micros()).unwrap_or(u64::MAX);
        let value = u64::from(spell.frequency.max(1)).saturating_mul(cost) / u64::from(spell.memory_mb.max(1));
        let priority = self.clock.saturating_add(value);
        self.order.insert((priority, spell.seq));
        if self.max_idle.is_some() {
            self.by_since.push_back(spell.seq);
        }
        self.spells.insert(spell.seq, (spell, priority));
    }

    fn expired(&mut self, now: Time, live: Live) -> Option<IdleSpell> {
        let max_idle = self.max_idle?;
        while let Some(&seq) = self.by_since.front() {
            let Some(&(spell, _)) = self.spells.get(&seq) else {
                self.by_since.pop_front();
                continue;
            };
            if !live(&spell) {
                self.by_since.pop_front();
                self.take(seq);
                continue;
            }
            if spell.since + max_idle > now {
                return None;
            }
            self.by_since.pop_front();
            return self.take(seq).map(|(spell, _)| spell);
        }
        None
    }

    fn eviction_order(&self) -> Box<dyn Iterator<Item = IdleSpell> + '_> {
        Box::new(self.order.iter().filter_map(|(_, seq)| self.spells.get(seq).map(|(spell, _)| *spell)))
    }

    fn compact(&mut self, idle: usize, live: Live) {
        if self.spells.len() > 2 * idle + 64 {
            self.spells.retain(|_, (s, _)| live(s));
            let spells = &self.spells;
            self.order.retain(|(_, seq)| spells.contains_key(seq));
            self.by_since.retain(|seq| spells.contains_key(seq));
        }
    }

    fn evicted(&mut self, spell: &IdleSpell) {
        if let Some((_, priority)) = self.take(spell.seq) {
            self.clock = self.clock.max(priority);
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
            frequency: 1,
            start_cost: Duration::from_millis(500),
            fresh: false,
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

    fn weighted(seq: u64, frequency: u32, start_ms: u64, memory_mb: u32) -> IdleSpell {
        IdleSpell { frequency, start_cost: Duration::from_millis(start_ms), memory_mb, ..spell(seq, 0) }
    }

    #[test]
    fn greedy_dual_evicts_the_rarely_called_cheap_and_large_first() {
        let mut policy = GreedyDual::new(None);
        policy.idle(weighted(1, 10, 500, 128)); // often called
        policy.idle(weighted(2, 1, 500, 128)); // rarely
        policy.idle(weighted(3, 1, 500, 512)); // rarely, and large
        policy.idle(weighted(4, 1, 2_000, 128)); // rarely, but costly to start
        let order: Vec<u64> = policy.eviction_order().map(|s| s.seq).collect();
        assert_eq!(order, vec![3, 2, 4, 1]);
        assert_eq!(policy.expired(Duration::from_secs(24 * 3600), &|_| true), None, "kept while memory allows");
    }

    #[test]
    fn greedy_dual_ages_what_stays_by_raising_its_clock_to_each_eviction() {
        let mut policy = GreedyDual::new(None);
        policy.idle(weighted(1, 3, 500, 128));
        policy.idle(weighted(2, 1, 500, 128));
        let first = policy.eviction_order().next().unwrap();
        assert_eq!(first.seq, 2);
        policy.evicted(&first);
        // Each eviction raises the clock, so newcomers are filed higher: spell 1, three times
        // as often called but idle through two evictions, has lost its head start over a
        // newcomer called once (priority 3 × 500 ms / 128 MB, against 2 + 1 of the same).
        policy.idle(weighted(3, 1, 500, 128));
        let next = policy.eviction_order().next().unwrap();
        assert_eq!(next.seq, 3);
        policy.evicted(&next);
        policy.idle(weighted(4, 1, 500, 128));
        let order: Vec<u64> = policy.eviction_order().map(|s| s.seq).collect();
        assert_eq!(order, vec![1, 4], "equal priorities, the older spell first");
        let next = policy.eviction_order().next().unwrap();
        policy.evicted(&next);
        policy.idle(weighted(5, 1, 500, 128));
        let order: Vec<u64> = policy.eviction_order().map(|s| s.seq).collect();
        assert_eq!(order, vec![4, 5]);
    }

    #[test]
    fn greedy_dual_with_max_idle_expires_in_order_and_skips_ended_spells() {
        let mut policy = GreedyDual::new(Some(Duration::from_millis(100)));
        for (seq, since) in [(1, 0), (2, 10), (3, 20)] {
            policy.idle(spell(seq, since));
        }
        let live = |s: &IdleSpell| s.seq != 1;
        assert_eq!(policy.expired(Duration::from_millis(105), &live), None);
        assert_eq!(policy.expired(Duration::from_millis(115), &live).map(|s| s.seq), Some(2));
        let order: Vec<u64> = policy.eviction_order().map(|s| s.seq).collect();
        assert_eq!(order, vec![3]);
    }
}
