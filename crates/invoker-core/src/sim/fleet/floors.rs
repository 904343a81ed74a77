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

use crate::capacity::packing::{ffd_invokers, memory_invokers, CallsByMb};
use crate::sim::workload::Call;
use std::time::Duration;

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
        let mut running = CallsByMb::new();
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
                    *running.entry(u64::from(mb)).or_default() += 1;
                    total_mb += u64::from(mb);
                } else if let Some(n) = running.get_mut(&u64::from(mb)) {
                    *n -= 1;
                    total_mb -= u64::from(mb);
                    if *n == 0 {
                        running.remove(&u64::from(mb));
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
    use std::time::Duration;

    fn call(at_s: f64, run_s: f64, mb: u32) -> Call {
        Call { at: Duration::from_secs_f64(at_s), action: 0, memory_mb: mb, run: Duration::from_secs_f64(run_s) }
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
}
