//! Predictors: what a group's demand (the memory its schedulers need now, in MB) asks of the
//! fleet, as a target in MB. Chosen per group (`predictor = "..."`); the decision core turns the
//! target into invokers and adds the hysteresis (`scale_down_after`), so a predictor says only
//! how much memory should be there.
//!
//! - `conservative`: seed 002's (Fn's): the demand now, nothing else.
//! - `windowed`: Knative's KPA: the mean over a 60 s stable window; past 200 % of what is active
//!   over a 6 s panic window it panics (the 6 s mean, never falling) until a whole stable window
//!   has passed without that.
//! - `seasonal`: ours. See [`Seasonal`].

use std::collections::VecDeque;
use std::time::Duration;

pub trait Predictor: Send {
    /// The target at `now` (a clock of the caller's, in order) for `demand_mb`, with
    /// `active_mb` the memory of the invokers now active.
    fn target_mb(&mut self, now: Duration, demand_mb: u64, active_mb: u64) -> u64;
}

/// The predictors by name, as configured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PredictorKind {
    /// The default until the simulator has judged the others on the traces.
    #[default]
    Conservative,
    Windowed,
    Seasonal,
}

impl PredictorKind {
    pub fn name(self) -> &'static str {
        match self {
            PredictorKind::Conservative => "conservative",
            PredictorKind::Windowed => "windowed",
            PredictorKind::Seasonal => "seasonal",
        }
    }

    /// A fresh predictor; `lead` is how long the control plane takes to bring an invoker up.
    pub fn build(self, lead: Duration) -> AnyPredictor {
        match self {
            PredictorKind::Conservative => AnyPredictor::Conservative(Conservative),
            PredictorKind::Windowed => AnyPredictor::Windowed(Windowed::knative()),
            PredictorKind::Seasonal => AnyPredictor::Seasonal(Seasonal::new(lead)),
        }
    }
}

pub enum AnyPredictor {
    Conservative(Conservative),
    Windowed(Windowed),
    Seasonal(Seasonal),
}

impl Predictor for AnyPredictor {
    fn target_mb(&mut self, now: Duration, demand_mb: u64, active_mb: u64) -> u64 {
        match self {
            AnyPredictor::Conservative(p) => p.target_mb(now, demand_mb, active_mb),
            AnyPredictor::Windowed(p) => p.target_mb(now, demand_mb, active_mb),
            AnyPredictor::Seasonal(p) => p.target_mb(now, demand_mb, active_mb),
        }
    }
}

/// Seed 002: the target is the demand.
pub struct Conservative;

impl Predictor for Conservative {
    fn target_mb(&mut self, _now: Duration, demand_mb: u64, _active_mb: u64) -> u64 {
        demand_mb
    }
}

/// Knative's KPA over memory instead of concurrency: `stable` and `panic` means of the demand,
/// panic entered when the panic mean reaches `panic_threshold` × what is active, left a whole
/// stable window after it last did, and in panic the target never falls. `utilization` is the
/// share of an invoker's memory the target aims to use (Knative's 70 % of the container
/// concurrency; 1.0 here, as for the other predictors, so that they compare on the policy and
/// not on a margin).
pub struct Windowed {
    stable: Duration,
    panic: Duration,
    panic_threshold: f64,
    utilization: f64,
    samples: VecDeque<(Duration, u64)>,
    /// When the panic threshold was last reached, while panicking.
    panicking_since: Option<Duration>,
    last: u64,
}

impl Windowed {
    /// KPA's defaults: 60 s stable, 6 s panic (10 %), panic at 200 %.
    pub fn knative() -> Self {
        Windowed {
            stable: Duration::from_secs(60),
            panic: Duration::from_secs(6),
            panic_threshold: 2.0,
            utilization: 1.0,
            samples: VecDeque::new(),
            panicking_since: None,
            last: 0,
        }
    }

    fn mean_since(&self, from: Duration) -> f64 {
        let (sum, n) =
            self.samples.iter().filter(|(t, _)| *t >= from).fold((0u64, 0u64), |(s, n), (_, d)| (s + d, n + 1));
        if n == 0 {
            0.0
        } else {
            sum as f64 / n as f64
        }
    }
}

impl Predictor for Windowed {
    fn target_mb(&mut self, now: Duration, demand_mb: u64, active_mb: u64) -> u64 {
        self.samples.push_back((now, demand_mb));
        while self.samples.front().is_some_and(|(t, _)| now.saturating_sub(*t) > self.stable) {
            self.samples.pop_front();
        }
        let stable = self.mean_since(now.saturating_sub(self.stable)) / self.utilization;
        let panic = self.mean_since(now.saturating_sub(self.panic)) / self.utilization;
        if panic >= self.panic_threshold * active_mb.max(1) as f64 {
            self.panicking_since = Some(now);
        } else if self.panicking_since.is_some_and(|since| now.saturating_sub(since) >= self.stable) {
            self.panicking_since = None;
        }
        let target = match self.panicking_since {
            Some(_) => (panic.ceil() as u64).max(self.last),
            None => stable.ceil() as u64,
        };
        self.last = target;
        target
    }
}

/// Ours. Serverless demand is bursty and, in the Azure traces, strongly periodic: a large share
/// of functions are timer-triggered, on the minute or on multiples of it, so a group's demand
/// peaks at the same second of each minute. Scaling to the demand now (`conservative`) or to a
/// mean (`windowed`) answers a burst only after it arrived, and an invoker takes `lead` to come
/// up, so every burst waits for it. This predictor keeps, for each second of a `period` (60 s),
/// the peak demand seen in that second, decayed each period by `keep` (a profile of the last few
/// periods), and targets the highest of: the demand now, and the profile over the next `lead`
/// (plus one second of slack), so that invokers are up when the burst recurs. A burst that does
/// not recur fades out of the profile within a few periods; the decision core's hysteresis keeps
/// the fleet from shrinking between recurring bursts of one period anyway.
pub struct Seasonal {
    lead: Duration,
    period_s: u64,
    keep: f64,
    /// Per second of the period: the peak demand seen there, and the period it was seen in.
    profile: Vec<(f64, u64)>,
}

impl Seasonal {
    pub fn new(lead: Duration) -> Self {
        Seasonal { lead, period_s: 60, keep: 0.5, profile: vec![(0.0, 0); 60] }
    }

    /// What second `second` of the clock is expected to need, from the periods before it.
    fn expected(&self, second: u64) -> f64 {
        let (peak, seen) = self.profile[(second % self.period_s) as usize];
        let periods_ago = (second / self.period_s).saturating_sub(seen);
        if periods_ago == 0 {
            return peak;
        }
        peak * self.keep.powi((periods_ago - 1).min(64) as i32)
    }
}

impl Predictor for Seasonal {
    fn target_mb(&mut self, now: Duration, demand_mb: u64, _active_mb: u64) -> u64 {
        let second = now.as_secs();
        let period = second / self.period_s;
        let demand = demand_mb as f64;
        // A slot written in an earlier period holds that period's peak, decayed once per period.
        let decayed = match self.expected(second) {
            e if self.profile[(second % self.period_s) as usize].1 == period => e,
            e => e * self.keep,
        };
        self.profile[(second % self.period_s) as usize] = (decayed.max(demand), period);
        let coming = (1..=self.lead.as_secs() + 1).map(|k| self.expected(second + k)).fold(0.0, f64::max);
        demand.max(coming).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn conservative_is_the_demand() {
        let mut p = PredictorKind::Conservative.build(Duration::from_secs(1));
        assert_eq!(p.target_mb(secs(0.0), 700, 0), 700);
        assert_eq!(p.target_mb(secs(0.5), 0, 1024), 0);
    }

    #[test]
    fn windowed_averages_and_panics_on_a_burst_and_holds_it() {
        let mut p = Windowed::knative();
        for i in 0..120 {
            assert_eq!(p.target_mb(secs(i as f64 * 0.5), 1000, 1024), 1000);
        }
        // A burst to 4x what is active: the 6 s mean passes 200 % within a few ticks.
        let mut t = 60.0;
        let mut target = 0;
        for _ in 0..12 {
            t += 0.5;
            target = p.target_mb(secs(t), 8000, 1024);
        }
        assert!(target >= 6000, "panic follows the 6 s mean: {target}");
        // The burst ends: in panic the target does not fall...
        for _ in 0..20 {
            t += 0.5;
            assert!(p.target_mb(secs(t), 0, 8192) >= target);
        }
        // ...until a whole stable window passed without the threshold; then the 60 s mean.
        for _ in 0..130 {
            t += 0.5;
            target = p.target_mb(secs(t), 0, 8192);
        }
        assert_eq!(target, 0);
    }

    #[test]
    fn seasonal_is_up_before_a_burst_that_recurs_each_minute() {
        let mut p = Seasonal::new(Duration::from_secs(10));
        let demand = |t: f64| if (t % 60.0) >= 30.0 && (t % 60.0) < 35.0 { 4000 } else { 500 };
        let mut before_burst = Vec::new();
        for i in 0..(4 * 120) {
            let t = i as f64 * 0.5;
            let target = p.target_mb(secs(t), demand(t), 0);
            if (t % 60.0) >= 22.0 && (t % 60.0) < 30.0 {
                before_burst.push((t, target));
            }
        }
        // The first minute learns; from the second on, the target is up 8 s ahead.
        assert!(before_burst.iter().filter(|(t, _)| *t < 60.0).all(|(_, target)| *target == 500));
        assert!(before_burst.iter().filter(|(t, _)| *t >= 60.0).all(|(_, target)| *target >= 2000), "{before_burst:?}");
        // Far from the burst, the demand.
        assert_eq!(p.target_mb(secs(240.0 + 50.0), 500, 0), 500);
    }

    #[test]
    fn seasonal_forgets_a_burst_that_does_not_recur() {
        let mut p = Seasonal::new(Duration::from_secs(1));
        let mut t = 0.0;
        while t < 600.0 {
            let demand = if (30.0..31.0).contains(&t) { 8000 } else { 100 };
            let target = p.target_mb(secs(t), demand, 0);
            if t > 400.0 {
                assert!(target < 200, "a single burst fades: {target} at {t}");
            }
            t += 0.5;
        }
    }
}
