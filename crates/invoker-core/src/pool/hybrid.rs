//! The hybrid histogram keep-alive policy of "Serverless in the Wild" (Shahrad et al., USENIX
//! ATC 2020). Per action, a histogram of idle times (from the end of one activation to the
//! start of the next) in one-minute bins over `range`. Once it is representative (enough
//! samples, and peaked: the coefficient of variation of its bin counts at least
//! `cv_threshold`), an action whose idle times start well after its last run has its container
//! unloaded at once and a new one pre-warmed shortly before the head percentile, then kept to
//! the tail percentile (each with the margin); one whose idle times start at once is kept to the
//! tail. Otherwise, and while idle times fall out of the range too often, the fixed keep-alive.
//!
//! The policy keeps an action known while its idle times can still land in the histogram (the
//! core asks [`KeepAlivePolicy::holds`] before forgetting a key), and forgets its histogram when
//! the core forgets the key: one fixed-size histogram per action, no more.

use super::keep_alive::{IdleSpell, KeepAlivePolicy, Live};
use super::{KeepAliveParams, KeyId, Time};
use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

/// Bins per histogram at most (a day of minutes).
const MAX_BINS: usize = 1440;
/// Idle ends remembered per action (as many containers as it had idle at once, within this).
const MAX_ENDS: usize = 64;

#[derive(Debug)]
struct History {
    bins: Box<[u32]>,
    in_range: u32,
    out_of_range: u32,
    /// When its containers went idle, the latest last; an arrival takes the latest (the core
    /// reuses the most recently idle container first), so that with several containers each
    /// idle time is the one a container actually waits, not the gap between any two calls.
    ends: VecDeque<Time>,
    /// When the policy stops holding the action for its histogram (the latest end + range).
    hold_until: Time,
    /// The pre-warm planned for it, if any: when, and how many containers (as many as went
    /// idle since its last call: a burst of three is met by three).
    prewarm_at: Option<Time>,
    prewarm_count: u32,
}

/// What the histogram says about the next idle time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Not representative: the fixed keep-alive.
    Fixed,
    /// Keep the container this long after its run.
    Keep(Duration),
    /// Unload it, pre-warm another `after` the run, keep that one `keep`.
    Prewarm { after: Duration, keep: Duration },
}

#[derive(Debug)]
pub struct HybridHistogram {
    params: KeepAliveParams,
    /// The keep-alive while the histogram is not representative (`pool.idle_timeout`).
    fallback: Duration,
    histories: FxHashMap<KeyId, History>,
    /// seq → the spell and its deadline.
    spells: FxHashMap<u64, (IdleSpell, Time)>,
    deadlines: BTreeSet<(Time, u64)>,
    /// (since, seq): the least recently used first, pre-warmed or not. Evicting pre-warmed
    /// containers first wasted nearly all of them under memory pressure (BENCHMARKS.md): they
    /// are the ones a call is predicted for.
    order: BTreeSet<(Time, u64)>,
    /// (when, key, which of its containers).
    prewarms: BTreeSet<(Time, KeyId, u32)>,
    holds: BTreeSet<(Time, KeyId)>,
}

impl HybridHistogram {
    pub fn new(params: KeepAliveParams, fallback: Duration) -> Self {
        HybridHistogram {
            params,
            fallback,
            histories: FxHashMap::default(),
            spells: FxHashMap::default(),
            deadlines: BTreeSet::new(),
            order: BTreeSet::new(),
            prewarms: BTreeSet::new(),
            holds: BTreeSet::new(),
        }
    }

    fn bins(&self) -> usize {
        (self.params.range.as_micros() / self.params.bin.as_micros().max(1)).clamp(1, MAX_BINS as u128) as usize
    }

    fn plan(&self, key: KeyId) -> Plan {
        let Some(h) = self.histories.get(&key) else { return Plan::Fixed };
        let p = &self.params;
        let total = h.in_range + h.out_of_range;
        if h.in_range < p.min_samples || f64::from(h.out_of_range) > p.out_of_range_threshold * f64::from(total) {
            return Plan::Fixed;
        }
        let n = h.bins.len() as f64;
        let mean = f64::from(h.in_range) / n;
        let variance = h.bins.iter().map(|&c| (f64::from(c) - mean).powi(2)).sum::<f64>() / n;
        if variance.sqrt() / mean < p.cv_threshold {
            return Plan::Fixed;
        }
        let percentile = |pct: f64| -> usize {
            let target = (f64::from(h.in_range) * pct / 100.0).ceil().max(1.0) as u32;
            let mut seen = 0;
            h.bins
                .iter()
                .position(|&c| {
                    seen += c;
                    seen >= target
                })
                .unwrap_or(h.bins.len() - 1)
        };
        let head = p.bin * percentile(p.head_percentile) as u32;
        let tail = p.bin * (percentile(p.tail_percentile) as u32 + 1);
        let prewarm = head.mul_f64(1.0 - p.margin);
        let until = tail.mul_f64(1.0 + p.margin);
        if prewarm < p.bin {
            Plan::Keep(until)
        } else {
            Plan::Prewarm { after: prewarm, keep: until.saturating_sub(prewarm).max(p.bin) }
        }
    }

    fn take(&mut self, seq: u64) -> Option<IdleSpell> {
        let (spell, deadline) = self.spells.remove(&seq)?;
        self.deadlines.remove(&(deadline, seq));
        self.order.remove(&(spell.since, seq));
        Some(spell)
    }
}

impl KeepAlivePolicy for HybridHistogram {
    fn idle(&mut self, spell: IdleSpell) {
        let range = self.params.range;
        let bins = self.bins();
        let plan = self.plan(spell.key);
        let history = self.histories.entry(spell.key).or_insert_with(|| History {
            bins: vec![0; bins].into_boxed_slice(),
            in_range: 0,
            out_of_range: 0,
            ends: VecDeque::new(),
            hold_until: Time::ZERO,
            prewarm_at: None,
            prewarm_count: 0,
        });
        let deadline = if spell.fresh {
            // A pre-warmed container: kept through the window the histogram predicts.
            let keep = match plan {
                Plan::Prewarm { keep, .. } => keep,
                Plan::Keep(keep) => keep,
                Plan::Fixed => self.fallback,
            };
            spell.since + keep
        } else {
            if history.ends.len() == MAX_ENDS {
                history.ends.pop_front();
            }
            history.ends.push_back(spell.since);
            history.hold_until = spell.since + range;
            self.holds.insert((history.hold_until, spell.key));
            match plan {
                Plan::Fixed => spell.since + self.fallback,
                Plan::Keep(keep) => spell.since + keep,
                Plan::Prewarm { after, .. } => {
                    let at = spell.since + after;
                    if let Some(old) = history.prewarm_at.replace(at) {
                        // The latest end sets the time; the containers planned so far move with it.
                        for i in 0..history.prewarm_count {
                            self.prewarms.remove(&(old, spell.key, i));
                            self.prewarms.insert((at, spell.key, i));
                        }
                    }
                    self.prewarms.insert((at, spell.key, history.prewarm_count));
                    history.prewarm_count += 1;
                    spell.since
                }
            }
        };
        self.deadlines.insert((deadline, spell.seq));
        self.order.insert((spell.since, spell.seq));
        self.spells.insert(spell.seq, (spell, deadline));
    }

    fn expired(&mut self, now: Time, live: Live) -> Option<IdleSpell> {
        while let Some(&(deadline, seq)) = self.deadlines.first() {
            let Some(&(spell, _)) = self.spells.get(&seq) else {
                self.deadlines.pop_first();
                continue;
            };
            if !live(&spell) {
                self.take(seq);
                continue;
            }
            if deadline > now {
                return None;
            }
            return self.take(seq);
        }
        None
    }

    fn eviction_order(&self) -> Box<dyn Iterator<Item = IdleSpell> + '_> {
        Box::new(self.order.iter().filter_map(|(_, seq)| self.spells.get(seq).map(|(spell, _)| *spell)))
    }

    fn compact(&mut self, idle: usize, live: Live) {
        if self.spells.len() > 2 * idle + 64 {
            let ended: Vec<u64> = self.spells.iter().filter(|(_, (s, _))| !live(s)).map(|(seq, _)| *seq).collect();
            for seq in ended {
                self.take(seq);
            }
        }
    }

    fn evicted(&mut self, spell: &IdleSpell) {
        self.take(spell.seq);
    }

    fn arrived(&mut self, key: KeyId, now: Time) {
        let Some(history) = self.histories.get_mut(&key) else { return };
        if let Some(at) = history.prewarm_at.take() {
            for i in 0..std::mem::take(&mut history.prewarm_count) {
                self.prewarms.remove(&(at, key, i));
            }
        }
        let Some(end) = history.ends.pop_back() else { return };
        let idle = now.saturating_sub(end);
        let bin = (idle.as_micros() / self.params.bin.as_micros().max(1)) as usize;
        match history.bins.get_mut(bin) {
            Some(count) => {
                *count += 1;
                history.in_range += 1;
            }
            None => history.out_of_range += 1,
        }
    }

    fn prewarm_due(&mut self, now: Time) -> Option<KeyId> {
        let &(at, key, _) = self.prewarms.first()?;
        if at > now {
            return None;
        }
        self.prewarms.pop_first();
        if let Some(history) = self.histories.get_mut(&key) {
            if !self.prewarms.iter().next().is_some_and(|&(a, k, _)| a == at && k == key) {
                history.prewarm_at = None;
                history.prewarm_count = 0;
            }
        }
        Some(key)
    }

    fn holds(&self, key: KeyId) -> bool {
        self.histories.get(&key).is_some_and(|h| h.prewarm_at.is_some() || self.holds.contains(&(h.hold_until, key)))
    }

    fn released(&mut self, now: Time) -> Option<KeyId> {
        while let Some(&(until, key)) = self.holds.first() {
            if until > now {
                return None;
            }
            self.holds.pop_first();
            // A later run renewed the hold: this entry is stale.
            if self.histories.get(&key).is_some_and(|h| h.hold_until == until) {
                return Some(key);
            }
        }
        None
    }

    fn forget(&mut self, key: KeyId) {
        if let Some(history) = self.histories.remove(&key) {
            if let Some(at) = history.prewarm_at {
                for i in 0..history.prewarm_count {
                    self.prewarms.remove(&(at, key, i));
                }
            }
            self.holds.remove(&(history.hold_until, key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::ContainerId;

    fn policy() -> HybridHistogram {
        HybridHistogram::new(KeepAliveParams::default(), Duration::from_secs(600))
    }

    fn spell(seq: u64, since: Duration, fresh: bool) -> IdleSpell {
        IdleSpell {
            seq,
            container: ContainerId(seq),
            key: KeyId(1),
            memory_mb: 256,
            since,
            frequency: 1,
            start_cost: Duration::from_millis(500),
            fresh,
        }
    }

    const MIN: Duration = Duration::from_secs(60);

    /// Runs that end at `t` and calls that come `every` later, `n` times.
    fn learn(policy: &mut HybridHistogram, n: u64, every: Duration) -> Duration {
        let mut t = Duration::ZERO;
        for seq in 0..n {
            policy.idle(spell(seq, t, false));
            policy.take(seq);
            t += every;
            policy.arrived(KeyId(1), t);
        }
        t
    }

    #[test]
    fn until_the_histogram_is_representative_the_fixed_keep_alive_holds() {
        let mut policy = policy();
        let t = learn(&mut policy, 5, 5 * MIN);
        policy.idle(spell(100, t, false));
        assert_eq!(policy.expired(t + 9 * MIN, &|_| true), None);
        assert_eq!(policy.expired(t + 10 * MIN, &|_| true).map(|s| s.seq), Some(100));
        assert_eq!(policy.prewarm_due(t + 60 * MIN), None);
    }

    #[test]
    fn regular_idle_times_unload_at_once_and_prewarm_before_the_next_call() {
        let mut policy = policy();
        let t = learn(&mut policy, 20, 5 * MIN + Duration::from_secs(10));
        policy.idle(spell(100, t, false));
        assert_eq!(policy.expired(t, &|_| true).map(|s| s.seq), Some(100), "unloaded at once");
        assert!(policy.holds(KeyId(1)), "kept known for its pre-warm");
        // Head 5 min, less the 10 % margin: 4.5 min.
        assert_eq!(policy.prewarm_due(t + 4 * MIN), None);
        assert_eq!(policy.prewarm_due(t + 4 * MIN + Duration::from_secs(30)), Some(KeyId(1)));
        assert_eq!(policy.prewarm_due(t + 5 * MIN), None, "one container was idle: one pre-warm");
        // The pre-warmed container stays to the tail (6 min + 10 %), less the pre-warm time.
        let ready = t + 4 * MIN + Duration::from_secs(31);
        policy.idle(spell(101, ready, true));
        assert_eq!(policy.eviction_order().next().map(|s| s.seq), Some(101));
        assert_eq!(policy.expired(ready + 2 * MIN, &|_| true), None);
        assert_eq!(policy.expired(ready + 3 * MIN, &|_| true).map(|s| s.seq), Some(101));
    }

    #[test]
    fn idle_times_that_start_at_once_keep_the_container_to_the_tail() {
        let mut policy = policy();
        // Mostly within a minute, a few up to three: no pre-warm, kept 4 min + 10 %.
        let mut t = Duration::ZERO;
        for seq in 0..30u64 {
            policy.idle(spell(seq, t, false));
            policy.take(seq);
            t += if seq % 10 == 0 { 3 * MIN } else { Duration::from_secs(20) };
            policy.arrived(KeyId(1), t);
        }
        policy.idle(spell(100, t, false));
        assert_eq!(policy.expired(t + 4 * MIN, &|_| true), None);
        assert_eq!(policy.expired(t + 5 * MIN, &|_| true).map(|s| s.seq), Some(100));
        assert_eq!(policy.prewarm_due(t + 10 * MIN), None);
    }

    #[test]
    fn a_call_before_the_prewarm_cancels_it_and_a_forgotten_key_leaves_nothing() {
        let mut policy = policy();
        let t = learn(&mut policy, 20, 5 * MIN + Duration::from_secs(10));
        policy.idle(spell(100, t, false));
        policy.expired(t, &|_| true);
        policy.arrived(KeyId(1), t + MIN);
        assert_eq!(policy.prewarm_due(t + 10 * MIN), None, "the call came first");
        assert_eq!(policy.released(t + 3 * 3600 * Duration::from_secs(1)), None);
        assert_eq!(policy.released(t + 4 * 3600 * Duration::from_secs(1)), Some(KeyId(1)), "held for the range");
        assert!(!policy.holds(KeyId(1)));
        policy.forget(KeyId(1));
        assert!(policy.histories.is_empty() && policy.prewarms.is_empty() && policy.holds.is_empty());
    }
}
