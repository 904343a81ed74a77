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
//!
//! And each **ahead** of a control plane's lead ([`Floors::ahead`]): an invoker serves a lead
//! after it is asked for and costs from then, so a fleet that delays no call holds at each
//! moment what the next lead will need. Even knowing every call to come, the memory floor
//! ahead is the least such a fleet can pay (what the policies are judged against, beside the
//! floors that ignore the lead).
//!
//! Beside them, the **first-fit ideal**: what a fleet with no delay of any kind pays when calls,
//! as in any real fleet, stay where they were placed. Each call goes, at its arrival, to the
//! first invoker with room among those running calls (a new one if none has); an invoker
//! exists exactly while it holds a call. No provisioning time, no hold before a drain, no idle container: it is not a bound
//! on every policy (first fit is not the best placement that never moves a call), but it is
//! what the floors miss by repacking every moment, and what a managed fleet pays before any of
//! its own delays.

use crate::capacity::packing::{ffd_invokers, memory_invokers, CallsByMb};
use crate::sim::workload::Call;
use std::time::Duration;

/// Both floors over a trace, in invoker-seconds, and their highest moment; and the first-fit
/// ideal.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Floors {
    pub packing_seconds: f64,
    pub memory_seconds: f64,
    pub packing_max: u64,
    pub first_fit_seconds: f64,
    pub first_fit_max: u64,
    /// The memory floor's and the first-fit ideal's invokers over time, each as (from, count)
    /// up to the next entry or the horizon.
    memory_steps: Vec<(Duration, u64)>,
    first_fit_steps: Vec<(Duration, u64)>,
    horizon: Duration,
}

/// The memory floor and the first-fit ideal ahead of one lead (invoker-seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ahead {
    pub memory_seconds: f64,
    pub first_fit_seconds: f64,
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
        let mut floors = Floors { horizon, ..Floors::default() };
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
            let memory = memory_invokers(total_mb, invoker_mb);
            floors.memory_seconds += memory as f64 * span;
            floors.memory_steps.push((at, memory));
            floors.packing_max = floors.packing_max.max(packed);
        }
        let (first_fit_steps, first_fit_max) = first_fit(calls, horizon, invoker_mb);
        floors.first_fit_seconds = held_ahead(&first_fit_steps, horizon, Duration::ZERO);
        (floors.first_fit_steps, floors.first_fit_max) = (first_fit_steps, first_fit_max);
        floors
    }

    /// Both ahead of `lead`: at each moment, the most the next `lead` needs.
    pub fn ahead(&self, lead: Duration) -> Ahead {
        Ahead {
            memory_seconds: held_ahead(&self.memory_steps, self.horizon, lead),
            first_fit_seconds: held_ahead(&self.first_fit_steps, self.horizon, lead),
        }
    }
}

/// The integral up to `horizon` of `t ↦ max(steps over [t, t + lead])`, for a step function
/// given as (from, value) in time order. Level by level: the moments it is at least `v` are
/// those within `lead` before a moment the steps are, so each interval of the steps at `v` or
/// more is stretched back by `lead`, the overlaps merged.
fn held_ahead(steps: &[(Duration, u64)], horizon: Duration, lead: Duration) -> f64 {
    let top = steps.iter().map(|&(_, v)| v).max().unwrap_or(0);
    let mut total = 0.0;
    for level in 1..=top {
        let mut covered = Duration::ZERO;
        // The merged interval being built.
        let mut open: Option<(Duration, Duration)> = None;
        for (k, &(from, value)) in steps.iter().enumerate() {
            if value < level {
                continue;
            }
            let until = steps.get(k + 1).map_or(horizon, |s| s.0).min(horizon);
            let start = from.saturating_sub(lead);
            open = match open {
                Some((a, b)) if start <= b => Some((a, b.max(until))),
                Some((a, b)) => {
                    covered += b - a;
                    Some((start, until))
                }
                None => Some((start, until)),
            };
        }
        if let Some((a, b)) = open {
            covered += b.saturating_sub(a);
        }
        total += covered.as_secs_f64();
    }
    total
}

/// The first-fit ideal's invokers over time, as (from, invokers open) steps up to `horizon`,
/// and the most at once (see the module's doc).
fn first_fit(calls: &[Call], horizon: Duration, invoker_mb: u64) -> (Vec<(Duration, u64)>, u64) {
    // (time, 0 = an end before 1 = an arrival, call index).
    let mut steps: Vec<(Duration, u8, usize)> = Vec::with_capacity(calls.len() * 2);
    for (i, c) in calls.iter().enumerate() {
        steps.push((c.at, 1, i));
        steps.push((c.at + c.run, 0, i));
    }
    steps.sort_unstable();
    // Each invoker's memory in use and its calls; where each call went.
    let mut used: Vec<(u64, u32)> = Vec::new();
    let mut on: Vec<Option<usize>> = vec![None; calls.len()];
    let (mut held, mut most, mut last) = (Vec::new(), 0u64, Duration::ZERO);
    let mut open = 0u64;
    for (at, kind, i) in steps {
        let at = at.min(horizon);
        if at > last {
            held.push((last, open));
        }
        last = at;
        if at >= horizon {
            break;
        }
        let mb = u64::from(calls[i].memory_mb).min(invoker_mb);
        if kind == 1 {
            // The first open invoker with room; else an empty one (a new invoker).
            let open_with_room = used.iter().position(|&(u, n)| n > 0 && u + mb <= invoker_mb);
            let slot = open_with_room.or_else(|| used.iter().position(|&(_, n)| n == 0)).unwrap_or_else(|| {
                used.push((0, 0));
                used.len() - 1
            });
            if used[slot].1 == 0 {
                open += 1;
            }
            used[slot].0 += mb;
            used[slot].1 += 1;
            on[i] = Some(slot);
            most = most.max(open);
        } else if let Some(slot) = on[i].take() {
            used[slot].0 -= mb;
            used[slot].1 -= 1;
            if used[slot].1 == 0 {
                open -= 1;
            }
        }
    }
    if last < horizon {
        held.push((last, open));
    }
    (held, most)
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
        assert_eq!(f.first_fit_seconds, 10.0);
    }

    /// Ahead of a lead, each moment holds the most the next lead needs: a 10 s call at 20 s,
    /// 5 s ahead, is held from 15 s; a gap shorter than the lead is held through.
    #[test]
    fn ahead_of_a_lead_each_moment_holds_what_the_lead_after_it_needs() {
        let one = Floors::of(&[call(20.0, 10.0, 512)], Duration::from_secs(60), 1024);
        let ahead = one.ahead(Duration::from_secs(5));
        assert_eq!((ahead.memory_seconds, ahead.first_fit_seconds), (15.0, 15.0));
        assert_eq!(one.ahead(Duration::ZERO).memory_seconds, one.memory_seconds);
        // 900 MB from 10 s to 12 s, 200 MB beside it from 11.5 s (two invokers for half a
        // second), 900 MB again from 15 s to 17 s.
        let calls = [call(10.0, 2.0, 900), call(11.5, 1.0, 200), call(15.0, 2.0, 900)];
        let f = Floors::of(&calls, Duration::from_secs(60), 1024);
        assert_eq!(f.memory_seconds, 1.5 + 2.0 * 0.5 + 0.5 + 2.0);
        // 5 s ahead: one invoker from 5 s to 17 s (the gap from 12.5 s to 15 s is shorter than
        // the lead), a second from 6.5 s to 12 s.
        let ahead = f.ahead(Duration::from_secs(5));
        assert_eq!((ahead.memory_seconds, ahead.first_fit_seconds), (12.0 + 5.5, 12.0 + 5.5));
        // Nothing is held before the trace starts.
        assert_eq!(f.ahead(Duration::from_secs(30)).memory_seconds, 17.0 + 12.0);
    }

    /// Calls stay where they were placed: when its neighbour ends, a call keeps its invoker,
    /// though repacked it would share another's.
    #[test]
    fn the_first_fit_ideal_never_moves_a_call() {
        // 600 and 400 MB share the first invoker, the second 600 MB takes a second. At 10 s the
        // first 600 MB call ends: 400 + 600 would fit one invoker, but neither call moves.
        let calls = [call(0.0, 10.0, 600), call(0.0, 60.0, 600), call(0.0, 60.0, 400)];
        let f = Floors::of(&calls, Duration::from_secs(60), 1024);
        assert_eq!(f.packing_seconds, 2.0 * 10.0 + 50.0);
        assert_eq!(f.first_fit_seconds, 2.0 * 60.0);
        assert_eq!((f.first_fit_max, f.packing_max), (2, 2));
    }
}
