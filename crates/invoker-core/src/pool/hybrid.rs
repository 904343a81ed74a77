//! The hybrid histogram keep-alive policy of "Serverless in the Wild" (Shahrad et al., USENIX
//! ATC 2020). Per action, a histogram of idle times (from the end of one activation to the
//! start of the next) in bins of `bin` (30 s) over `range`. The paper's bins are a minute, its
//! trace's resolution; an invoker measures idle times to the millisecond, and halving the bin
//! lets a pre-warm come, or a keep-alive end, half a minute nearer the calls: where memory is
//! short, 6 % fewer cold starts at 3 % less idle memory (BENCHMARKS.md). Once it is
//! representative (enough samples, and peaked: the coefficient of variation of its bin counts
//! at least `cv_threshold`), an action whose idle times start well after its last run has its
//! container unloaded at once and a new one pre-warmed shortly before the head percentile,
//! then kept to the tail percentile (each with the margin); one whose idle times start at once
//! is kept to the tail. Otherwise, and while idle times fall out of the range too often, the
//! fixed keep-alive.
//!
//! The policy keeps an action known while its idle times can still land in the histogram (the
//! core asks [`KeepAlivePolicy::holds`] before forgetting a key), and forgets its histogram when
//! the core forgets the key: one fixed-size histogram per action, no more.

use super::keep_alive::{IdleSpell, KeepAlivePolicy, Live};
use super::types::{HybridWindow, KeepAliveParams, KeyId};
use invoker_ids::Time;
use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

/// Bins per histogram at most.
const MAX_BINS: usize = 1440;
/// Idle ends remembered per action (as many containers as it had idle at once, within this).
const MAX_ENDS: usize = 64;
/// Histogram bins held for actions with nothing left in the pool, at most (8 bytes each: about
/// 19 MB): past this, the oldest holds are let go early, so that a tenant calling ever new
/// actions costs the invoker a bounded memory, not one history per action for `range`. With
/// the default range and bin (480 bins, 3.8 KB a history), 5,000 histories.
const MAX_HISTORY_BINS: usize = 2_400_000;

#[derive(Debug)]
struct History {
    bins: Box<[u32]>,
    /// The idle seconds summed per bin, so that a window is priced on what was measured, not
    /// on bin middles (which would make every sub-second gap cost half a minute).
    idle_s: Box<[f32]>,
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
    /// The priced plan, its rank, and the samples and worth it was drawn from: drawn again
    /// once the histogram has grown by a 32nd or the worth moved by a tenth, so that a busy
    /// action costs an idle event a lookup, not a search.
    priced: Option<(Plan, u64, u32, f64)>,
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
    /// seq → the spell, its deadline and its rank.
    spells: FxHashMap<u64, (IdleSpell, Time, u64)>,
    deadlines: BTreeSet<(Time, u64)>,
    /// (rank, since, seq): the lowest rank first, then the least recently used, pre-warmed or
    /// not. Evicting pre-warmed containers first wasted nearly all of them under memory
    /// pressure (BENCHMARKS.md): they are the ones a call is predicted for. The rank is what
    /// the action's window buys (priced): the cold starts it saved per GB·s it held, on the
    /// histogram; all ranks are 0 with the paper's percentiles (least recently used alone).
    order: BTreeSet<(u64, Time, u64)>,
    /// (when, key, which of its containers).
    prewarms: BTreeSet<(Time, KeyId, u32)>,
    holds: BTreeSet<(Time, KeyId)>,
    /// What idle memory fetched at the last evictions (priced): GB·s per cold start, as the
    /// ranks of the containers evicted for room say, and when. While memory is short, a cold
    /// start is worth no more than what keeping costs others; it relaxes, doubling every
    /// [`RELAX`], once evictions stop.
    margin: Option<(f64, Time)>,
    /// The latest time the core gave.
    now: Time,
}

/// Ranks are cold starts saved per GB·s held, times this, as integers.
const RANK_SCALE: f64 = 1e9;

/// How fast the price evictions set relaxes once they stop.
const RELAX: Duration = Duration::from_secs(600);

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
            margin: None,
            now: Time::ZERO,
        }
    }

    fn bins(&self) -> usize {
        (self.params.range.as_micros() / self.params.bin.as_micros().max(1)).clamp(1, MAX_BINS as u128) as usize
    }

    /// Histories held at most: [`MAX_HISTORY_BINS`] in histograms of this range and bin.
    fn max_histories(&self) -> usize {
        MAX_HISTORY_BINS / self.bins()
    }

    /// The action's plan, and its spells' rank for eviction.
    fn plan(&mut self, spell: &IdleSpell) -> (Plan, u64) {
        match self.params.window {
            HybridWindow::Percentiles => (self.percentile_plan(spell.key), 0),
            HybridWindow::Priced => {
                let (params, bins, fallback) = (&self.params, self.bins(), self.fallback);
                let Some(h) = self.histories.get_mut(&spell.key) else { return (Plan::Fixed, 0) };
                let samples = h.in_range + h.out_of_range;
                let mut worth = params.start_second_worth_gb_s * spell.start_cost.as_secs_f64();
                if let Some((margin, at)) = self.margin {
                    let relaxed = margin * 2f64.powf(self.now.saturating_sub(at).as_secs_f64() / RELAX.as_secs_f64());
                    worth = worth.min(relaxed);
                }
                if let Some((plan, rank, at, was)) = h.priced {
                    if samples < at + (at / 32).max(1) && (worth - was).abs() <= 0.1 * was {
                        return (plan, rank);
                    }
                }
                let memory_gb = f64::from(spell.memory_mb) / 1024.0;
                let window = Window { memory_gb, worth, bin: params.bin, start: spell.start_cost };
                let (plan, rank) = if h.in_range < params.min_samples.max(1) {
                    let fixed_bins = (fallback.as_micros() / params.bin.as_micros().max(1)) as usize;
                    (Plan::Fixed, window.rank_of_keep(h, fixed_bins.clamp(1, bins)))
                } else {
                    window.cheapest(h, bins)
                };
                h.priced = Some((plan, rank, samples, worth));
                (plan, rank)
            }
        }
    }

    fn percentile_plan(&self, key: KeyId) -> Plan {
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
        let (spell, deadline, rank) = self.spells.remove(&seq)?;
        self.deadlines.remove(&(deadline, seq));
        self.order.remove(&(rank, spell.since, seq));
        Some(spell)
    }
}

impl KeepAlivePolicy for HybridHistogram {
    fn spell(&self, seq: u64) -> Option<(Time, Option<Time>)> {
        self.spells.get(&seq).map(|&(spell, deadline, _)| (spell.since, Some(deadline)))
    }

    fn idle(&mut self, spell: IdleSpell) {
        let range = self.params.range;
        let bins = self.bins();
        self.histories.entry(spell.key).or_insert_with(|| History {
            bins: vec![0; bins].into_boxed_slice(),
            idle_s: vec![0.0; bins].into_boxed_slice(),
            in_range: 0,
            out_of_range: 0,
            ends: VecDeque::new(),
            hold_until: Time::ZERO,
            prewarm_at: None,
            prewarm_count: 0,
            priced: None,
        });
        let (plan, rank) = self.plan(&spell);
        let history = self.histories.get_mut(&spell.key).expect("inserted above");
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
            // One hold per action, moved: a new entry per run would pile up one per activation
            // for the whole range.
            self.holds.remove(&(history.hold_until, spell.key));
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
        self.order.insert((rank, spell.since, spell.seq));
        self.spells.insert(spell.seq, (spell, deadline, rank));
    }

    fn expired(&mut self, now: Time, live: Live) -> Option<IdleSpell> {
        self.now = self.now.max(now);
        while let Some(&(deadline, seq)) = self.deadlines.first() {
            let Some(&(spell, _, _)) = self.spells.get(&seq) else {
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
        Box::new(self.order.iter().filter_map(|(_, _, seq)| self.spells.get(seq).map(|(spell, _, _)| *spell)))
    }

    fn compact(&mut self, idle: usize, live: Live) {
        if self.spells.len() > 2 * idle + 64 {
            let ended: Vec<u64> = self.spells.iter().filter(|(_, (s, _, _))| !live(s)).map(|(seq, _)| *seq).collect();
            for seq in ended {
                self.take(seq);
            }
        }
    }

    fn evicted(&mut self, spell: &IdleSpell) {
        let rank = self.spells.get(&spell.seq).map_or(0, |&(_, _, rank)| rank);
        self.take(spell.seq);
        if self.params.window == HybridWindow::Priced && rank > 0 && rank < u64::MAX {
            let fetched = RANK_SCALE / rank as f64;
            let margin = match self.margin {
                Some((old, _)) => 0.8 * old + 0.2 * fetched,
                None => fetched,
            };
            self.margin = Some((margin, self.now));
        }
    }

    fn arrived(&mut self, key: KeyId, now: Time) {
        self.now = self.now.max(now);
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
                history.idle_s[bin] += idle.as_secs_f32();
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
            if until > now && self.histories.len() <= self.max_histories() {
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

/// What a window costs an action: its memory, what one of its cold starts is worth in idle
/// GB·s, the histogram's bin, and its start time (a pre-warm begins that much early).
struct Window {
    memory_gb: f64,
    worth: f64,
    bin: Duration,
    start: Duration,
}

impl Window {
    /// The window that costs least on the histogram, and its rank. A window runs from bin `a`
    /// (0: kept from the run's end; later: unloaded, pre-warmed to be ready then) to bin `e`.
    /// An idle time before it is a cold start; within it, warm, its idle memory-time paid;
    /// after it (or beyond the range), a cold start and the whole window paid. Unloading at
    /// once (every call cold) is a candidate too. Only bins that hold idle times can start or
    /// end the best window, so the search is quadratic in the bins used, not in the range.
    fn cheapest(&self, h: &History, bins: usize) -> (Plan, u64) {
        let used: Vec<usize> = (0..bins.min(h.bins.len())).filter(|&i| h.bins[i] > 0).collect();
        let total = f64::from(h.in_range + h.out_of_range);
        let bin_s = self.bin.as_secs_f64();
        // Prefix sums over the used bins: idle times, and their summed seconds, before each.
        let mut count_before = vec![0.0; used.len() + 1];
        let mut secs_before = vec![0.0; used.len() + 1];
        for (j, &i) in used.iter().enumerate() {
            count_before[j + 1] = count_before[j] + f64::from(h.bins[i]);
            secs_before[j + 1] = secs_before[j] + f64::from(h.idle_s[i]);
        }
        let mut best = (self.worth * total, Plan::Keep(Duration::ZERO), 0);
        // Starts: from the run's end, or at a used bin's start; ends: a used bin's end.
        let starts = std::iter::once((0usize, 0usize)).chain(used.iter().enumerate().map(|(j, &i)| (j, i)));
        for (first, a) in starts {
            for last in first..used.len() {
                let e = used[last] + 1;
                let warm = count_before[last + 1] - count_before[first];
                let warm_idle = (secs_before[last + 1] - secs_before[first]) - warm * a as f64 * bin_s;
                let after = total - count_before[last + 1];
                let held = warm_idle + after * (e - a) as f64 * bin_s;
                let cost = self.memory_gb * held + self.worth * (count_before[first] + after);
                if cost < best.0 {
                    let keep = self.bin * (e - a) as u32;
                    let plan = if a == 0 {
                        Plan::Keep(keep)
                    } else {
                        Plan::Prewarm { after: (self.bin * a as u32).saturating_sub(self.start), keep }
                    };
                    best = (cost, plan, self.rank(warm, held));
                }
            }
        }
        (best.1, best.2)
    }

    /// The rank of keeping every container `bins` bins after its run (the fixed keep-alive,
    /// while the histogram is too small to choose by), on what the histogram holds so far.
    fn rank_of_keep(&self, h: &History, bins: usize) -> u64 {
        let total = f64::from(h.in_range + h.out_of_range);
        let warm: f64 = h.bins[..bins].iter().map(|&c| f64::from(c)).sum();
        let warm_idle: f64 = h.idle_s[..bins].iter().map(|&s| f64::from(s)).sum();
        let held = warm_idle + (total - warm) * bins as f64 * self.bin.as_secs_f64();
        self.rank(warm, held)
    }

    /// Cold starts saved per GB·s held, scaled to an integer: the higher, the later evicted.
    fn rank(&self, warm: f64, held_s: f64) -> u64 {
        let paid = self.memory_gb * held_s;
        if paid <= 0.0 {
            return if warm > 0.0 { u64::MAX } else { 0 };
        }
        (warm / paid * RANK_SCALE).min(u64::MAX as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use invoker_ids::ContainerId;

    /// Serverless in the Wild's own windows (head and tail percentiles), on its one-minute bins.
    fn policy() -> HybridHistogram {
        let params = KeepAliveParams { window: HybridWindow::Percentiles, bin: MIN, ..KeepAliveParams::default() };
        HybridHistogram::new(params, Duration::from_secs(600))
    }

    /// The priced window on one-minute bins, where the figures below are easy to follow.
    fn priced() -> HybridHistogram {
        HybridHistogram::new(KeepAliveParams { bin: MIN, ..KeepAliveParams::default() }, Duration::from_secs(600))
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

    fn spell_of(key: u32, seq: u64, since: Duration, memory_mb: u32) -> IdleSpell {
        IdleSpell { key: KeyId(key), memory_mb, ..spell(seq, since, false) }
    }

    impl IdleSpell {
        fn fresh(self) -> IdleSpell {
            IdleSpell { fresh: true, ..self }
        }
    }

    #[test]
    fn priced_a_steady_gap_is_met_by_a_prewarm_ready_at_its_bin_and_kept_through_it() {
        let mut policy = priced();
        let t = learn(&mut policy, 20, 5 * MIN + Duration::from_secs(10));
        policy.idle(spell(100, t, false));
        assert_eq!(policy.expired(t, &|_| true).map(|s| s.seq), Some(100), "unloaded at once");
        // Ready when the 5-minute bin begins: started one start time (500 ms) before.
        let at = t + 5 * MIN - Duration::from_millis(500);
        assert_eq!(policy.prewarm_due(at - Duration::from_millis(1)), None);
        assert_eq!(policy.prewarm_due(at), Some(KeyId(1)));
        // Kept to the bin's end, no longer: the histogram holds nothing after it.
        let ready = t + 5 * MIN;
        policy.idle(spell(101, ready, true));
        assert_eq!(policy.expired(ready + MIN - Duration::from_millis(1), &|_| true), None);
        assert_eq!(policy.expired(ready + MIN, &|_| true).map(|s| s.seq), Some(101));
    }

    #[test]
    fn priced_calls_that_come_back_at_once_keep_the_container_only_as_long_as_they_do() {
        let mut policy = priced();
        let t = learn(&mut policy, 20, Duration::from_secs(20));
        policy.idle(spell(100, t, false));
        assert_eq!(policy.expired(t + MIN - Duration::from_millis(1), &|_| true), None);
        assert_eq!(policy.expired(t + MIN, &|_| true).map(|s| s.seq), Some(100), "not the fixed 10 minutes");
        assert_eq!(policy.prewarm_due(t + 10 * MIN), None);
    }

    /// Idle times spread evenly over four hours: a 2 GiB container is worth holding for almost
    /// none of them, a 16 MB one for most.
    #[test]
    fn priced_spread_idle_times_unload_a_large_container_and_keep_a_small_one() {
        let mut policy = priced();
        let mut t = Duration::ZERO;
        for seq in 0..48u64 {
            let gap = 5 * MIN * (seq as u32 % 48 + 1);
            for (key, memory) in [(1, 2048), (2, 16)] {
                policy.idle(spell_of(key, 2 * seq + key as u64, t, memory));
                policy.take(2 * seq + key as u64);
                policy.arrived(KeyId(key), t + gap);
            }
            t += gap;
        }
        policy.idle(spell_of(1, 1000, t, 2048));
        policy.idle(spell_of(2, 1001, t, 16));
        // Both unloaded at once; only the small one is pre-warmed, once its idle times are
        // dense enough that holding it pays (from 80 minutes: each 5 minutes earlier would
        // cost 33 × 5 minutes of 16 MB, more than the one cold start it saves), and kept to its
        // longest idle time in the range (235: the 240th falls out of it).
        assert_eq!(policy.expired(t, &|_| true).map(|s| s.seq), Some(1000));
        assert_eq!(policy.expired(t, &|_| true).map(|s| s.seq), Some(1001));
        let at = t + 80 * MIN - Duration::from_millis(500);
        assert_eq!(policy.prewarm_due(at - Duration::from_millis(1)), None);
        assert_eq!(policy.prewarm_due(at), Some(KeyId(2)));
        // The large one: every 5 minutes held costs more than a cold start, but for the last
        // idle time seen (235), whose bin it is held through alone.
        assert_eq!(policy.prewarm_due(t + 235 * MIN - Duration::from_millis(501)), None);
        assert_eq!(policy.prewarm_due(t + 235 * MIN), Some(KeyId(1)));
        policy.idle(spell_of(2, 1002, t + 80 * MIN, 16).fresh());
        assert_eq!(policy.expired(t + 235 * MIN, &|_| true), None);
        assert_eq!(policy.expired(t + 236 * MIN, &|_| true).map(|s| s.seq), Some(1002));
    }

    /// Room goes first from the container least likely to be used per GB it holds, not the
    /// one idle longest; and an eviction tells the policy what memory fetches, so that a cold
    /// start is worth keeping less until evictions stop.
    #[test]
    fn priced_eviction_takes_the_container_worth_least_and_sets_the_price_of_memory() {
        let mut policy = priced();
        // Key 1 comes back within a minute every time; key 2 within a minute one time in four,
        // else after 2 to 8 minutes: kept for them, but each GB·s held buys less.
        let mut t = Duration::ZERO;
        for seq in 0..40u64 {
            let gap2 = if seq % 4 == 0 { Duration::from_secs(30) } else { (2 + seq as u32 % 7) * MIN };
            policy.idle(spell_of(1, 2 * seq, t, 256));
            policy.take(2 * seq);
            policy.arrived(KeyId(1), t + Duration::from_secs(30));
            policy.idle(spell_of(2, 2 * seq + 1, t, 256));
            policy.take(2 * seq + 1);
            policy.arrived(KeyId(2), t + gap2);
            t += 10 * MIN;
        }
        policy.idle(spell_of(1, 1000, t, 256));
        policy.idle(spell_of(2, 1001, t + Duration::from_secs(5), 256));
        let order: Vec<u64> = policy.eviction_order().map(|s| s.seq).collect();
        assert_eq!(order, [1001, 1000], "the less likely one first, though idle for less time");
        let kept_before = policy.spells[&1001].1;
        let evicted = policy.eviction_order().next().unwrap();
        policy.evicted(&evicted);
        assert!(policy.margin.is_some(), "the eviction priced memory");
        // Key 2's next plan is drawn at that price: it keeps no longer than it did.
        policy.forget(KeyId(9));
        policy.histories.get_mut(&KeyId(2)).unwrap().priced = None;
        policy.idle(spell_of(2, 1002, t + Duration::from_secs(6), 256));
        let kept_after = policy.spells[&1002].1 - Duration::from_secs(1);
        assert!(kept_after <= kept_before, "{kept_after:?} against {kept_before:?}");
    }

    /// A tenant calling ever new actions: past `max_histories`, the oldest holds are let go
    /// at once (the core then forgets those actions, and the policy their histories).
    #[test]
    fn histories_held_are_bounded_whatever_the_number_of_actions() {
        let mut policy = HybridHistogram::new(KeepAliveParams::default(), Duration::from_secs(600));
        assert_eq!(policy.max_histories(), 5_000, "4 h of 30 s bins");
        let n = policy.max_histories() as u32 + 5;
        for key in 0..n {
            let since = Duration::from_millis(u64::from(key));
            policy.idle(spell_of(key, u64::from(key), since, 128));
            policy.take(u64::from(key));
        }
        let now = Duration::from_secs(1);
        let mut released = Vec::new();
        while let Some(key) = policy.released(now) {
            policy.forget(key);
            released.push(key.0);
        }
        assert_eq!(released, [0, 1, 2, 3, 4], "the oldest first, until the bound holds");
        assert_eq!(policy.histories.len(), policy.max_histories());
    }

    /// Idle times of 45 s: on the default 30 s bins the container goes at once and a pre-warm
    /// is ready as the second bin begins (15 s of idle memory a call); on the paper's minute
    /// (the default before) it could only be kept from the run's end (45 s a call).
    #[test]
    fn half_minute_bins_prewarm_within_the_first_minute() {
        let mut policy = HybridHistogram::new(KeepAliveParams::default(), Duration::from_secs(600));
        let t = learn(&mut policy, 20, Duration::from_secs(45));
        policy.idle(spell(100, t, false));
        assert_eq!(policy.expired(t, &|_| true).map(|s| s.seq), Some(100), "unloaded at once");
        assert_eq!(policy.prewarm_due(t + Duration::from_secs(29)), None);
        assert_eq!(policy.prewarm_due(t + Duration::from_millis(29_500)), Some(KeyId(1)));
        let mut minute = priced();
        let t = learn(&mut minute, 20, Duration::from_secs(45));
        minute.idle(spell(100, t, false));
        assert_eq!(minute.expired(t + Duration::from_secs(59), &|_| true), None, "kept from the run's end");
        assert_eq!(minute.prewarm_due(t + MIN), None);
    }

    /// A busy action holds one entry, whatever its number of runs.
    #[test]
    fn an_action_holds_one_entry_however_often_it_runs() {
        let mut policy = priced();
        learn(&mut policy, 1000, Duration::from_secs(1));
        assert_eq!(policy.holds.len(), 1);
        assert_eq!(policy.histories.len(), 1);
    }
}
