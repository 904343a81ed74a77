//! What a group's demand takes in invokers when every call must fit whole on one invoker. The
//! megabytes of the calls are not enough: 800 calls of 213 MB hold 170,400 MB, 167 invokers of
//! 1 GiB by memory, but only four fit in one (852 MB, 172 MB stranded), so they take 200. The
//! schedulers report their calls by size ([`CallsByMb`]); the manager and the fleet simulator
//! turn that into the demand the predictors and the burst test take ([`packed_demand_mb`]).

use std::collections::BTreeMap;

/// Calls by the memory one of them takes, in MB: how many.
pub type CallsByMb = BTreeMap<u64, u64>;

/// Calls by size as a scheduler counts them for its demand report: those in flight or waiting
/// until they go, and those refused until the next report, which carries each refusal once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallTally {
    live: CallsByMb,
    refused: CallsByMb,
}

impl CallTally {
    /// A call of `mb` is sent to an invoker or starts waiting for one.
    pub fn came(&mut self, mb: u64) {
        *self.live.entry(mb).or_insert(0) += 1;
    }

    /// A call of `mb` is answered or stops waiting.
    pub fn went(&mut self, mb: u64) {
        if let Some(n) = self.live.get_mut(&mb) {
            *n -= 1;
            if *n == 0 {
                self.live.remove(&mb);
            }
        }
    }

    /// A call of `mb` was refused for lack of room.
    pub fn refused(&mut self, mb: u64) {
        *self.refused.entry(mb).or_insert(0) += 1;
    }

    /// What a report carries: the live calls and those refused since the last report, which
    /// are then forgotten.
    pub fn report(&mut self) -> CallsByMb {
        let mut calls = self.live.clone();
        for (mb, n) in std::mem::take(&mut self.refused) {
            *calls.entry(mb).or_insert(0) += n;
        }
        calls
    }
}

/// First-fit decreasing of `calls` into invokers of `invoker_mb`: how many invokers. Calls of
/// one size fill each invoker as far as they go before the next, which is first fit call by
/// call. FFD is within 11/9 of the best packing (plus one). A call larger than an invoker fits
/// nowhere and is left out (no invoker of the group runs it).
pub fn ffd_invokers(calls: &CallsByMb, invoker_mb: u64) -> u64 {
    // What each invoker opened so far has left.
    let mut room: Vec<u64> = Vec::new();
    for (&mb, &count) in calls.iter().rev() {
        if mb == 0 || mb > invoker_mb {
            continue;
        }
        let mut count = count;
        for left in room.iter_mut() {
            if count == 0 {
                break;
            }
            let k = count.min(*left / mb);
            *left -= k * mb;
            count -= k;
        }
        let per_invoker = invoker_mb / mb;
        while count > 0 {
            let k = count.min(per_invoker);
            room.push(invoker_mb - k * mb);
            count -= k;
        }
    }
    room.len() as u64
}

/// The invokers memory alone asks for: `total_mb` over `invoker_mb`, rounded up.
pub fn memory_invokers(total_mb: u64, invoker_mb: u64) -> u64 {
    total_mb.div_ceil(invoker_mb.max(1))
}

/// The demand a predictor and the burst test take, in MB: the megabytes reported, raised to
/// just past the memory of one invoker fewer than the calls take packed whole (first-fit
/// decreasing), so that in invokers (rounded up) it is never less than the packing. Where the
/// calls pack without stranded room it stays their megabytes, so a predictor's averages and a
/// `headroom_mb` below an invoker keep their meaning. A report without calls by size (from a
/// scheduler of an earlier version) counts by memory.
pub fn packed_demand_mb(total_mb: u64, calls: &CallsByMb, invoker_mb: u64) -> u64 {
    match ffd_invokers(calls, invoker_mb) {
        0 => total_mb,
        n => total_mb.max((n - 1).saturating_mul(invoker_mb) + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{Action, Event, GroupCore, GroupSpec};
    use crate::predictor::{Predictor as _, PredictorKind};
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn calls_that_do_not_divide_an_invoker_take_invokers_by_the_call() {
        let burst = CallsByMb::from([(213, 800)]);
        assert_eq!(ffd_invokers(&burst, 1024), 200);
        assert_eq!(memory_invokers(800 * 213, 1024), 167);
        assert_eq!(packed_demand_mb(800 * 213, &burst, 1024).div_ceil(1024), 200);
        // Calls that pack without stranded room: their megabytes, whatever the packing.
        assert_eq!(packed_demand_mb(800 * 256, &CallsByMb::from([(256, 800)]), 1024), 800 * 256);
        assert_eq!(packed_demand_mb(3 * 256, &CallsByMb::from([(256, 3)]), 1024), 3 * 256);
        let exact = CallsByMb::from([(256, 800)]);
        assert_eq!(ffd_invokers(&exact, 1024), memory_invokers(800 * 256, 1024));
        // Without calls by size, the megabytes.
        assert_eq!(packed_demand_mb(800 * 213, &CallsByMb::new(), 1024), 800 * 213);
    }

    #[test]
    fn larger_calls_go_first_and_smaller_ones_fill_what_they_leave() {
        // 700 + 300 in one invoker, 600 + 400 in another, 500 alone.
        let calls = CallsByMb::from([(700, 1), (600, 1), (500, 1), (400, 1), (300, 1)]);
        assert_eq!(ffd_invokers(&calls, 1024), 3);
        // One too large for any invoker fits nowhere and opens none.
        assert_eq!(ffd_invokers(&CallsByMb::from([(2048, 3)]), 1024), 0);
    }

    #[test]
    fn a_report_carries_the_live_calls_and_each_refusal_once() {
        let mut tally = CallTally::default();
        tally.came(512);
        tally.came(512);
        tally.refused(128);
        assert_eq!(tally.report(), CallsByMb::from([(128, 1), (512, 2)]));
        tally.went(512);
        assert_eq!(tally.report(), CallsByMb::from([(512, 1)]));
        tally.went(512);
        tally.went(64);
        assert_eq!(tally.report(), CallsByMb::new());
    }

    fn spec(max: u32, invoker_mb: u64) -> GroupSpec {
        GroupSpec {
            name: "g".into(),
            min: 0,
            max,
            invoker_memory_mb: invoker_mb,
            max_step: 20,
            scale_down_after: Duration::from_secs(60),
            drain_deadline: Duration::from_secs(50),
            provision_timeout: Duration::from_secs(120),
            headroom_mb: 0,
            settle: Duration::ZERO,
            drain_order: crate::capacity::DrainOrder::LeastBusy,
        }
    }

    proptest! {
        /// A burst of n calls of m MB on invokers of M MB takes ceil(n / floor(M / m))
        /// invokers, never fewer than memory asks for, and the group asks for that many (within
        /// `max`) under every predictor; any mix packs into no fewer invokers than memory asks
        /// for and no more than twice that, plus one (first fit's bound).
        #[test]
        fn a_burst_gets_the_invokers_its_calls_fit_in(
            n in 1u64..2_000,
            m in 1u64..=1024,
            invoker_mb in prop::sample::select(vec![1024u64, 2048, 4096]),
            max in 1u32..300,
            kind in prop::sample::select(vec![PredictorKind::Conservative, PredictorKind::Windowed, PredictorKind::Seasonal]),
            mix in prop::collection::btree_map(1u64..=4096, 1u64..50, 0..12),
        ) {
            let burst = CallsByMb::from([(m, n)]);
            let needed = n.div_ceil(invoker_mb / m);
            prop_assert_eq!(ffd_invokers(&burst, invoker_mb), needed);
            prop_assert!(needed >= memory_invokers(n * m, invoker_mb));

            // The burst arrives with nothing active: every predictor follows it at once.
            let demand_mb = packed_demand_mb(n * m, &burst, invoker_mb);
            let mut predictor = kind.build(Duration::from_secs(1));
            let target_mb = predictor.target_mb(Duration::from_secs(1), demand_mb, 0);
            let mut core = GroupCore::new(spec(max, invoker_mb));
            let mut asked = 0u64;
            // Rounds of `max_step` until nothing more is asked for.
            for round in 0..(max / 20 + 2) {
                let at = Duration::from_secs(1) + Duration::from_millis(u64::from(round));
                for d in core.handle(Event::Tick { target_mb }, at) {
                    if let Action::Provision { ids } = d.action {
                        asked += ids.len() as u64;
                    }
                }
            }
            prop_assert!(asked >= needed.min(u64::from(max)), "asked {} of {} (max {})", asked, needed, max);
            prop_assert!(asked <= u64::from(max));

            let fits: CallsByMb = mix.into_iter().filter(|&(mb, _)| mb <= invoker_mb).collect();
            let total: u64 = fits.iter().map(|(&mb, &k)| mb * k).sum();
            let packed = ffd_invokers(&fits, invoker_mb);
            prop_assert!(packed >= memory_invokers(total, invoker_mb));
            prop_assert!(packed <= 2 * memory_invokers(total, invoker_mb) + 1);
        }
    }
}
