//! Herd avoidance that adapts: estimates of how long an action's runs and container starts
//! take, so that a job may wait for a busy container when that is expected to free up sooner
//! than a new container would start (seed 001's open question).
//!
//! In the time a start takes, a busy container finishes about `start / run` runs, each freeing
//! it for a waiting job; so that many waiting jobs per busy container (times its concurrency)
//! need no new container. When the estimate proves wrong (the oldest waiting job has already
//! waited longer than a start takes), the core starts containers as if there were none.

use std::time::Duration;

/// Exponentially weighted moving average, weight 1/4 on the newest sample, in whole
/// microseconds (8 bytes: every action key holds two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ewma(u64);

const NO_SAMPLE: u64 = u64::MAX;

impl Default for Ewma {
    fn default() -> Self {
        Ewma(NO_SAMPLE)
    }
}

impl Ewma {
    pub(super) fn add(&mut self, sample: Duration) {
        let sample = u64::try_from(sample.as_micros()).unwrap_or(NO_SAMPLE - 1).min(NO_SAMPLE - 1);
        self.0 = match self.0 {
            NO_SAMPLE => sample,
            mean if sample >= mean => mean + (sample - mean) / 4,
            mean => mean - (mean - sample) / 4,
        };
    }

    pub(super) fn get(self) -> Option<Duration> {
        (self.0 != NO_SAMPLE).then(|| Duration::from_micros(self.0))
    }
}

/// Bound on the jobs one busy container is expected to take before a start would finish, so
/// that runs estimated near zero do not make a queue look free.
const MAX_TURNS: u128 = 1_000;

/// Waiting jobs that `busy` containers of concurrency `concurrency` are expected to take
/// before a new container would be ready.
pub(super) fn served_before_a_start(busy: usize, concurrency: usize, run: Duration, start: Duration) -> usize {
    let turns = start.as_micros() / run.as_micros().max(1);
    busy.saturating_mul(concurrency).saturating_mul(turns.min(MAX_TURNS) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_moves_a_quarter_of_the_way() {
        let mut e = Ewma::default();
        e.add(Duration::from_millis(100));
        e.add(Duration::from_millis(200));
        assert_eq!(e.get(), Some(Duration::from_millis(125)));
        e.add(Duration::from_millis(25));
        assert_eq!(e.get(), Some(Duration::from_millis(100)));
    }

    #[test]
    fn busy_containers_cover_jobs_only_when_runs_are_shorter_than_starts() {
        let ms = Duration::from_millis;
        assert_eq!(served_before_a_start(4, 1, ms(50), ms(200)), 16);
        assert_eq!(served_before_a_start(4, 2, ms(50), ms(200)), 32);
        assert_eq!(served_before_a_start(4, 1, ms(500), ms(200)), 0);
        assert_eq!(served_before_a_start(1, 1, Duration::ZERO, ms(200)), 1_000);
    }
}
