//! What the trace itself asks of a fleet, before any policy: the memory its activations hold
//! at once, minute by minute. The oracle and the fixed fleets are sized from it.

use crate::sim::workload::Call;
use std::time::Duration;

/// The memory the calls hold at once, if each ran from its arrival for its duration.
pub struct DemandProfile {
    /// Per minute of the trace: the most memory held at once within it.
    pub peak_mb_per_minute: Vec<u64>,
    /// The memory held on average over the trace (MB·s of runs within it, over its length).
    pub mean_mb: f64,
}

impl DemandProfile {
    pub fn of(calls: &[Call], minutes: usize) -> Self {
        let horizon = Duration::from_secs(minutes as u64 * 60);
        // +memory at a call's arrival, -memory at its end; ends first at equal times.
        let mut steps: Vec<(Duration, i64)> = Vec::with_capacity(calls.len() * 2);
        let mut mb_us: u128 = 0;
        for c in calls {
            let end = c.at + c.run;
            steps.push((c.at, i64::from(c.memory_mb)));
            steps.push((end, -i64::from(c.memory_mb)));
            mb_us += u128::from(c.memory_mb) * (end.min(horizon).saturating_sub(c.at)).as_micros();
        }
        steps.sort_unstable_by_key(|&(at, delta)| (at, delta));
        let mut peak = vec![0u64; minutes];
        let mut held: i64 = 0;
        let mut minute = 0usize;
        for (at, delta) in steps {
            let at_minute = (at.as_secs() / 60) as usize;
            // What was held when a minute began is held in it too.
            while minute < at_minute.min(minutes) {
                minute += 1;
                if let Some(p) = peak.get_mut(minute) {
                    *p = (*p).max(held as u64);
                }
            }
            held += delta;
            if let Some(p) = peak.get_mut(at_minute) {
                *p = (*p).max(held.max(0) as u64);
            }
        }
        let mean_mb = if minutes == 0 { 0.0 } else { mb_us as f64 / horizon.as_micros() as f64 };
        DemandProfile { peak_mb_per_minute: peak, mean_mb }
    }

    /// The oracle's fleet, per minute: the fewest invokers of `invoker_mb` whose memory holds
    /// that minute's peak (a floor: it packs perfectly and knows the future).
    pub fn oracle_invokers(&self, invoker_mb: u64) -> Vec<u32> {
        self.peak_mb_per_minute.iter().map(|&mb| mb.div_ceil(invoker_mb) as u32).collect()
    }

    /// A fixed fleet that holds the trace's highest minute.
    pub fn fixed_for_peak(&self, invoker_mb: u64) -> u32 {
        self.oracle_invokers(invoker_mb).into_iter().max().unwrap_or(0).max(1)
    }

    /// A fixed fleet that holds the trace's mean.
    pub fn fixed_for_mean(&self, invoker_mb: u64) -> u32 {
        ((self.mean_mb / invoker_mb as f64).ceil() as u32).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(at_s: f64, run_s: f64, mb: u32) -> Call {
        Call { at: Duration::from_secs_f64(at_s), action: 0, memory_mb: mb, run: Duration::from_secs_f64(run_s) }
    }

    #[test]
    fn peaks_per_minute_count_runs_that_span_minutes() {
        // 100 MB from 10 s for 2 minutes; 300 MB at 70 s for 5 s; 50 MB at 130 s for 1 s.
        let calls = [call(10.0, 120.0, 100), call(70.0, 5.0, 300), call(130.0, 1.0, 50)];
        let p = DemandProfile::of(&calls, 4);
        // At 130 s the long call ends as the short one begins: they do not overlap.
        assert_eq!(p.peak_mb_per_minute, vec![100, 400, 100, 0]);
        let mean = (100.0 * 120.0 + 300.0 * 5.0 + 50.0) / 240.0;
        assert!((p.mean_mb - mean).abs() < 1e-6, "{}", p.mean_mb);
        assert_eq!(p.oracle_invokers(256), vec![1, 2, 1, 0]);
        assert_eq!((p.fixed_for_peak(256), p.fixed_for_mean(256)), (2, 1));
    }

    #[test]
    fn back_to_back_calls_do_not_add_up() {
        let calls = [call(0.0, 1.0, 200), call(1.0, 1.0, 200)];
        assert_eq!(DemandProfile::of(&calls, 1).peak_mb_per_minute, vec![200]);
    }
}
