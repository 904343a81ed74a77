//! The count oracle: what knowing the trace itself buys a fleet on one control plane. The
//! Azure 2019 samples give each function's calls per minute, and the simulator places them at
//! random instants within their minute (`[workload] arrivals`): no predictor can know those
//! instants, whatever it learns. This fleet knows everything else: every function's count in
//! the minute now, every duration, and which calls run now and when each will end. It asks, a
//! plane's lead ahead, for what the calls running then will hold: those already running that
//! will still run (known exactly) and the expected memory of those yet to come (each function's
//! rate this minute over the part of the lead its calls outlast), plus `z` standard deviations
//! of that expectation (arrivals at random instants: Poisson, their variance the same sum with
//! the memory squared). Its invokers are whole but its calls are not pinned (memory alone, as
//! the memory floor: no packing loss, no drain waiting for a call to end, no idle container, no
//! cold start held in memory), and a call is delayed only when the memory stays short for the
//! whole of what the delay threshold leaves after a container's start.
//!
//! It is not a floor (a cleverer use of the same knowledge may pay less), but every predictor
//! knows less than it and every real fleet pays more than memory alone: where its cheapest
//! `z` within the delay goal costs more than the cost goal, the goal is out of reach of a
//! predictor of this kind on that trace, and the reason is the instants, not the predictor.

use crate::sim::workload::Call;
use std::time::Duration;

/// The grid the fleet is sized on: a tenth of a second (a fraction of the fastest plane's lead).
const STEP: Duration = Duration::from_millis(100);

/// The count oracle's run at one confidence `z`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CountOracle {
    pub z: f64,
    pub invoker_seconds: f64,
    pub delayed: u64,
}

/// Each `z` of `zs` over `calls` up to `horizon`: invokers of `invoker_mb`, asked for `lead`
/// ahead; a call delayed when the memory is short from its arrival for longer than `grace`;
/// `minute` the trace's minute (shorter in a compressed replay).
pub fn sweep(
    calls: &[Call],
    horizon: Duration,
    invoker_mb: u64,
    lead: Duration,
    grace: Duration,
    minute: Duration,
    zs: &[f64],
) -> Vec<CountOracle> {
    let cells = (horizon.as_micros() / STEP.as_micros()) as usize + 1;
    let cell = |at: Duration| ((at.as_micros() / STEP.as_micros()) as usize).min(cells);
    let cell_up = |at: Duration| (at.as_micros().div_ceil(STEP.as_micros()) as usize).min(cells);
    let invoker_mb = invoker_mb.max(1) as f64;
    // What runs in each cell, and what of it was already running a lead before and outlasts it.
    let mut running = vec![0.0f64; cells + 1];
    let mut known = vec![0.0f64; cells + 1];
    // Per minute: each call's expected memory over the part of the lead it outlasts, and its
    // square (a Poisson count's variance is its mean).
    let minutes = (horizon.as_micros() / minute.as_micros().max(1)) as usize + 1;
    let (mut mean, mut variance) = (vec![0.0f64; minutes], vec![0.0f64; minutes]);
    for c in calls {
        let mb = f64::from(c.memory_mb);
        let (from, until) = (cell(c.at), cell_up(c.at + c.run));
        running[from] += mb;
        running[until] -= mb;
        if c.run > lead {
            known[cell_up(c.at + lead).min(until)] += mb;
            known[until] -= mb;
        }
        // Over a window of the lead, a call of this function is running at its end when it
        // came within its run: a share min(lead, run) / minute of the minute's calls.
        let share = c.run.min(lead).as_secs_f64() / minute.as_secs_f64();
        let m = (c.at.as_micros() / minute.as_micros().max(1)) as usize;
        if let Some((mean, variance)) = mean.get_mut(m).zip(variance.get_mut(m)) {
            *mean += mb * share;
            *variance += mb * mb * share;
        }
    }
    let cumulate = |v: &mut Vec<f64>| {
        let mut sum = 0.0;
        for x in v.iter_mut() {
            sum += *x;
            *x = sum;
        }
    };
    cumulate(&mut running);
    cumulate(&mut known);
    let minute_of = |k: usize| (((k as u128) * STEP.as_micros()) / minute.as_micros().max(1)) as usize;
    let grace_cells = (grace.as_micros() / STEP.as_micros()) as usize;
    zs.iter()
        .map(|&z| {
            let mut invoker_seconds = 0.0;
            // Whether the memory is short in each cell: what runs there beyond what is held.
            let mut short = vec![false; cells];
            for k in 0..cells {
                let m = minute_of(k).min(minutes - 1);
                let asked = known[k] + mean[m] + z * variance[m].sqrt();
                let held = (asked.max(0.0) / invoker_mb).ceil();
                let needed = (running[k].max(0.0) / invoker_mb).ceil();
                invoker_seconds += held.max(needed) * STEP.as_secs_f64();
                short[k] = running[k] > held * invoker_mb + 0.5;
            }
            // From each cell, how many cells on the memory stays short.
            let mut short_for = vec![0usize; cells + 1];
            for k in (0..cells).rev() {
                short_for[k] = if short[k] { short_for[k + 1] + 1 } else { 0 };
            }
            let delayed = calls.iter().filter(|c| short_for[cell(c.at).min(cells - 1)] > grace_cells).count() as u64;
            CountOracle { z, invoker_seconds, delayed }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(at_ms: u64, run_ms: u64, memory_mb: u32) -> Call {
        Call { at: Duration::from_millis(at_ms), action: 0, memory_mb, run: Duration::from_millis(run_ms) }
    }

    #[test]
    fn what_runs_past_the_lead_is_known_and_what_comes_is_hedged() {
        let minute = Duration::from_secs(60);
        let lead = Duration::from_secs(10);
        // One long call of 600 MB for the whole minute: known from a lead after its start.
        let calls = [call(0, 60_000, 600)];
        let runs = sweep(&calls, minute, 1024, lead, Duration::from_millis(500), minute, &[0.0]);
        // The expectation holds it: its minute's rate (1 / 60 s) over the lead it outlasts
        // (10 s) of 600 MB, 100 MB, is always asked, so one invoker for the whole minute.
        assert!((runs[0].invoker_seconds - 60.0).abs() < 0.2, "{runs:?}");
        assert_eq!(runs[0].delayed, 0);
    }

    #[test]
    fn a_burst_beyond_the_hedge_is_delayed_and_a_wider_hedge_holds_it() {
        let minute = Duration::from_secs(60);
        let lead = Duration::from_secs(10);
        // Six calls of 500 MB at once, each running 30 s: 3,000 MB, three invokers.
        let calls: Vec<Call> = (0..6).map(|_| call(20_000, 30_000, 500)).collect();
        let runs = sweep(&calls, minute, 1024, lead, Duration::from_millis(500), minute, &[0.0, 8.0]);
        // Expected over the lead: 6 × 500 MB × 10/60 = 500 MB, one invoker until the calls
        // are known (10 s after they came): short for 10 s, all six delayed.
        assert_eq!(runs[0].delayed, 6, "{runs:?}");
        // Eight standard deviations (sqrt(6 × 500² × 10/60) = 500 MB each) hold 4,500 MB:
        // five invokers all minute, none delayed.
        assert_eq!(runs[1].delayed, 0, "{runs:?}");
        assert!(runs[1].invoker_seconds > runs[0].invoker_seconds);
    }
}
