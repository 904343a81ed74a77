//! The continuous floors a fleet is judged against. The per-minute oracle ([`super::oracle`])
//! holds each minute's peak memory for the whole minute and packs it perfectly; these look at
//! every moment instead, from the calls running then:
//! - the **packing floor**: the invokers that hold those calls when each must fit whole on one
//!   invoker, packed first-fit decreasing (within 11/9 of the best packing plus one; no fleet
//!   that places calls whole can beat the best packing, and FFD is as near it as a policy may
//!   hope to get);
//! - the **memory floor**: their memory over an invoker's, rounded up (what no packing beats).
//!
//! Both integrated over the trace, in invoker-seconds.

use crate::sim::workload::Call;
use std::collections::BTreeMap;
use std::time::Duration;

/// First-fit decreasing of calls (memory size in MB → how many) into invokers of `invoker_mb`:
/// how many invokers. Calls of one size fill each invoker as far as they go before the next,
/// which is first fit item by item. A call larger than an invoker fits nowhere and is left out
/// (no fleet of this size runs it).
pub fn ffd_invokers<'a>(sizes: impl IntoIterator<Item = (&'a u32, &'a u64)>, invoker_mb: u64) -> u64 {
    let mut sizes: Vec<(u64, u64)> = sizes.into_iter().map(|(&mb, &n)| (u64::from(mb), n)).collect();
    sizes.sort_unstable_by_key(|&(mb, _)| std::cmp::Reverse(mb));
    // What each invoker opened so far has left.
    let mut room: Vec<u64> = Vec::new();
    for (mb, mut count) in sizes {
        if mb == 0 || mb > invoker_mb {
            continue;
        }
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

/// Both floors over a trace, in invoker-seconds, and their highest moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Floors {
    pub packing_seconds: f64,
    pub memory_seconds: f64,
    pub packing_max: u64,
}

impl Floors {
    /// From the calls, each running from its arrival for its run time, up to `horizon`.
    pub fn of(calls: &[Call], horizon: Duration, invoker_mb: u64) -> Floors {
        // +1 call of its size at its arrival, -1 at its end; ends first at equal times.
        let mut steps: Vec<(Duration, i8, u32)> = Vec::with_capacity(calls.len() * 2);
        for c in calls {
            steps.push((c.at, 1, c.memory_mb));
            steps.push((c.at + c.run, -1, c.memory_mb));
        }
        steps.sort_unstable_by_key(|&(at, delta, _)| (at, delta));
        let mut running: BTreeMap<u32, u64> = BTreeMap::new();
        let mut total_mb: u64 = 0;
        let mut floors = Floors::default();
        let mut i = 0;
        while i < steps.len() {
            let at = steps[i].0;
            if at >= horizon {
                break;
            }
            while i < steps.len() && steps[i].0 == at {
                let (_, delta, mb) = steps[i];
                if delta > 0 {
                    *running.entry(mb).or_default() += 1;
                    total_mb += u64::from(mb);
                } else if let Some(n) = running.get_mut(&mb) {
                    *n -= 1;
                    total_mb -= u64::from(mb);
                    if *n == 0 {
                        running.remove(&mb);
                    }
                }
                i += 1;
            }
            let until = steps.get(i).map_or(horizon, |s| s.0).min(horizon);
            let span = until.saturating_sub(at).as_secs_f64();
            let packed = ffd_invokers(&running, invoker_mb);
            floors.packing_seconds += packed as f64 * span;
            floors.memory_seconds += memory_invokers(total_mb, invoker_mb) as f64 * span;
            floors.packing_max = floors.packing_max.max(packed);
        }
        floors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn call(at_s: f64, run_s: f64, mb: u32) -> Call {
        Call { at: Duration::from_secs_f64(at_s), action: 0, memory_mb: mb, run: Duration::from_secs_f64(run_s) }
    }

    /// The burst that refused calls on the 1,000-function sample: 800 calls of 213 MB, four to
    /// a 1 GiB invoker, against the 167 invokers their megabytes ask for.
    #[test]
    fn calls_that_do_not_divide_an_invoker_take_invokers_by_the_call() {
        let burst = BTreeMap::from([(213u32, 800u64)]);
        assert_eq!(ffd_invokers(&burst, 1024), 200);
        assert_eq!(memory_invokers(800 * 213, 1024), 167);
        let exact = BTreeMap::from([(256u32, 800u64)]);
        assert_eq!(ffd_invokers(&exact, 1024), memory_invokers(800 * 256, 1024));
    }

    #[test]
    fn larger_calls_go_first_and_smaller_ones_fill_what_they_leave() {
        // 700 + 300 in one invoker, 600 + 400 in another, 500 alone: FFD opens three.
        let sizes = BTreeMap::from([(700u32, 1u64), (600, 1), (500, 1), (400, 1), (300, 1)]);
        assert_eq!(ffd_invokers(&sizes, 1024), 3);
        // One too large for any invoker fits nowhere and opens none.
        assert_eq!(ffd_invokers(&BTreeMap::from([(2048u32, 3u64)]), 1024), 0);
    }

    #[test]
    fn the_floors_integrate_what_runs_at_each_moment() {
        // Four 300 MB calls for 10 s (1,200 MB: two invokers of 1 GiB either way), then one
        // 100 MB call for 20 s.
        let mut calls: Vec<Call> = (0..4).map(|_| call(0.0, 10.0, 300)).collect();
        calls.push(call(10.0, 20.0, 100));
        let f = Floors::of(&calls, Duration::from_secs(60), 1024);
        assert_eq!(f.packing_seconds, 2.0 * 10.0 + 20.0);
        assert_eq!(f.memory_seconds, 2.0 * 10.0 + 20.0);
        assert_eq!(f.packing_max, 2);
        // Nine 213 MB calls for 30 s: 1,917 MB is two invokers, but four fit in one: three.
        let nine: Vec<Call> = (0..9).map(|_| call(0.0, 30.0, 213)).collect();
        let f = Floors::of(&nine, Duration::from_secs(60), 1024);
        assert_eq!((f.packing_seconds, f.memory_seconds), (90.0, 60.0));
        // What runs past the horizon counts up to it only.
        let f = Floors::of(&[call(50.0, 30.0, 512)], Duration::from_secs(60), 1024);
        assert_eq!(f.packing_seconds, 10.0);
    }

    proptest! {
        /// A burst of n calls of m MB on invokers of M MB takes ceil(n / floor(M / m)) invokers,
        /// never fewer than memory asks for; any mix packs into no fewer invokers than memory
        /// asks for and no more than twice that, plus one (first fit's bound).
        #[test]
        fn packing_is_bounded_by_memory_and_by_the_call(
            n in 1u64..2_000,
            m in 1u32..=1024,
            invoker_mb in prop::sample::select(vec![1024u64, 2048, 4096]),
            mix in prop::collection::btree_map(1u32..=4096, 1u64..50, 0..12),
        ) {
            let burst = BTreeMap::from([(m, n)]);
            let per = invoker_mb / u64::from(m);
            prop_assert_eq!(ffd_invokers(&burst, invoker_mb), n.div_ceil(per));
            prop_assert!(ffd_invokers(&burst, invoker_mb) >= memory_invokers(n * u64::from(m), invoker_mb));
            let fits: BTreeMap<u32, u64> = mix.into_iter().filter(|&(mb, _)| u64::from(mb) <= invoker_mb).collect();
            let total: u64 = fits.iter().map(|(&mb, &k)| u64::from(mb) * k).sum();
            let packed = ffd_invokers(&fits, invoker_mb);
            prop_assert!(packed >= memory_invokers(total, invoker_mb));
            prop_assert!(packed <= 2 * memory_invokers(total, invoker_mb) + 1);
        }
    }
}
