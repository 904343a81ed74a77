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
    Conservative,
    Windowed,
    /// The default: the fewest invoker-seconds on the traces' fleet comparison, with fewer
    /// calls delayed than `windowed` (`scenarios/fleet-*.toml`, BENCHMARKS.md).
    #[default]
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
/// share of an invoker's memory the target aims to use: Knative's default, 70 % (its per-pod
/// target is 70 % of the container concurrency). At 100 % its 60 s mean lags every burst: on
/// the 200-function sample it delayed 9 % of the calls (`scenarios/fleet-200.toml`).
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
    /// KPA's defaults: 60 s stable, 6 s panic (10 %), panic at 200 %, a 70 % target.
    pub fn knative() -> Self {
        Windowed {
            stable: Duration::from_secs(60),
            panic: Duration::from_secs(6),
            panic_threshold: 2.0,
            utilization: 0.7,
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
/// up, so every burst waits for it. This predictor targets the higher of two things:
/// - **What recurs.** For each second of a `period` (60 s) it keeps the peak demand there in each
///   of the last periods, and over the next `lead` (plus a second of slack) it asks for what
///   *both* of the last two periods needed there (the lower of the two peaks). A burst that
///   recurs each minute has its invokers up before it from its third minute on; one that does
///   not recur never raises the target beyond its own minute (a decayed profile, tried first,
///   held every one-off burst's invokers for minutes: 5 % more invoker-seconds than `windowed`).
/// - **What lasts.** The lowest demand of the last second, not the demand now: a
///   call that waits a fraction of a second for a container's next turn asks for an invoker that
///   would come up after it ran and then cost a minute of `scale_down_after`. Following only
///   rises that last a second (or any, when nothing is active) took 2 % off the invoker-seconds on the 200-function sample, for
///   a few more calls delayed (0.91 % against 0.51 %; `windowed`: 1.0 %). On a [`quick`]
///   plane the demand now: there the invoker comes while the call that asked for it still
///   waits, and the group gives it back within seconds (its hold,
///   [`crate::capacity::default_hold`]), so waiting a second to see the rise last would only
///   delay that call (`scenarios/fleet-50.toml`'s local plane with a 10 s hold: a window as
///   long as the plane's 200 ms delayed 0.79 % of the calls, none 0.38 %).
///
/// On a [`quick`] plane it is `conservative`: the demand now, without the profile. There a burst
/// that recurs gets its invokers within its own second anyway, and what the profile held ahead
/// of it was paid for and not needed: judged on both halves of both samples (functions split by
/// a hash of their names, `invoker simulate --half`), the profile cost 2 to 10 % more
/// invoker-seconds on the local plane and with standby pods for the same calls delayed (within
/// 0.02 points; BENCHMARKS.md, issue 79's section).
///
/// `scenarios/fleet-200.toml` and `fleet-50.toml` compare them (`BENCHMARKS.md`).
pub struct Seasonal {
    lead: Duration,
    period_s: u64,
    /// Per second of the period: the peak demand there in each of the (at most three) last
    /// periods it was seen in, as (period, peak), the latest last.
    profile: Vec<Vec<(u64, u64)>>,
    /// How long a rise must last to be followed: [`LASTING`], none on a [`quick`] plane.
    lasting: Duration,
    /// The demand over the last `lasting`, to see whether a rise lasted.
    recent: VecDeque<(Duration, u64)>,
}

/// How long a rise in demand must last before the seasonal predictor follows it.
const LASTING: Duration = Duration::from_secs(1);

/// A control plane that brings an invoker up in less than this is quick: a call that waits for
/// the invoker it made the group ask for can still start within its second (half of it left
/// for the invoker, half for its container's start). The local plane's processes register in
/// 60 to 130 ms on this machine; a pod's or a VM's take seconds.
pub const QUICK_LEAD: Duration = Duration::from_millis(500);

/// Whether a plane whose invokers take `lead` to come up is quick ([`QUICK_LEAD`]).
pub fn quick(lead: Duration) -> bool {
    lead < QUICK_LEAD
}

impl Seasonal {
    pub fn new(lead: Duration) -> Self {
        let lasting = if quick(lead) { Duration::ZERO } else { LASTING };
        Seasonal { lead, period_s: 60, profile: vec![Vec::new(); 60], lasting, recent: VecDeque::new() }
    }

    /// What second `second` of the clock is expected to need: the lower of what the two
    /// periods before its own needed there (nothing when either did not).
    fn expected(&self, second: u64) -> u64 {
        let period = second / self.period_s;
        let slot = &self.profile[(second % self.period_s) as usize];
        let peak_in = |p: u64| slot.iter().find(|(seen, _)| *seen == p).map(|(_, peak)| *peak);
        match (period.checked_sub(1).and_then(peak_in), period.checked_sub(2).and_then(peak_in)) {
            (Some(last), Some(before)) => last.min(before),
            _ => 0,
        }
    }
}

impl Predictor for Seasonal {
    fn target_mb(&mut self, now: Duration, demand_mb: u64, active_mb: u64) -> u64 {
        let second = now.as_secs();
        let period = second / self.period_s;
        let slot = &mut self.profile[(second % self.period_s) as usize];
        match slot.last_mut() {
            Some((seen, peak)) if *seen == period => *peak = (*peak).max(demand_mb),
            _ => {
                slot.push((period, demand_mb));
                if slot.len() > 3 {
                    slot.remove(0);
                }
            }
        }
        let coming = match quick(self.lead) {
            true => 0,
            false => (1..=self.lead.as_secs() + 1).map(|k| self.expected(second + k)).max().unwrap_or(0),
        };
        self.recent.push_back((now, demand_mb));
        // The demand is what the last look saw until the next one: the look before the
        // window's start still holds at its start and stays. Dropping it instead made the
        // rule hang on the rounds' jitter: a manager whose tick fires a millisecond late saw
        // only the demand now, while the simulator's exact ticks saw the one before too.
        let start = now.saturating_sub(self.lasting);
        while self.recent.get(1).is_some_and(|(t, _)| *t <= start) {
            self.recent.pop_front();
        }
        // With nothing active, no call ends to make room: waiting a second would only delay.
        let lasting = match active_mb {
            0 => demand_mb,
            _ => self.recent.iter().map(|(_, d)| *d).min().unwrap_or(demand_mb),
        };
        lasting.max(coming)
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
            // 70 % of the target is the demand.
            let target = p.target_mb(secs(i as f64 * 0.5), 700, 1024);
            assert!((1000..=1001).contains(&target), "{target}");
        }
        // A burst to 4x what is active: the 6 s mean passes 200 % within a few ticks.
        let mut t = 60.0;
        let mut target = 0;
        for _ in 0..12 {
            t += 0.5;
            target = p.target_mb(secs(t), 8000, 1024);
        }
        assert!(target >= 6000 / 7 * 10, "panic follows the 6 s mean: {target}");
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
        // Two minutes learn (a burst seen once is not expected again); from the third on, the
        // target is up 8 s ahead.
        assert!(before_burst.iter().filter(|(t, _)| *t < 120.0).all(|(_, target)| *target == 500));
        assert!(
            before_burst.iter().filter(|(t, _)| *t >= 120.0).all(|(_, target)| *target == 4000),
            "{before_burst:?}"
        );
        // Far from the burst, the demand.
        assert_eq!(p.target_mb(secs(240.0 + 50.0), 500, 0), 500);
    }

    #[test]
    fn seasonal_follows_a_rise_once_it_lasted_a_second() {
        let mut p = Seasonal::new(Duration::from_secs(1));
        assert_eq!(p.target_mb(secs(0.0), 100, 1024), 100);
        assert_eq!(p.target_mb(secs(0.5), 900, 1024), 100, "a blip is not followed");
        assert_eq!(p.target_mb(secs(1.0), 900, 1024), 100);
        assert_eq!(p.target_mb(secs(1.6), 900, 1024), 900, "lasted past a second");
        assert_eq!(p.target_mb(secs(2.0), 0, 1024), 0, "a fall is followed at once");
        assert_eq!(p.target_mb(secs(2.2), 300, 0), 300, "with nothing active, a rise is followed at once");
    }

    #[test]
    fn seasonal_on_a_quick_plane_follows_a_rise_at_once() {
        // Invokers that come in 200 ms come while the call that asked for one still waits.
        let mut p = Seasonal::new(Duration::from_millis(200));
        assert_eq!(p.target_mb(secs(0.0), 100, 1024), 100);
        assert_eq!(p.target_mb(secs(0.5), 900, 1024), 900, "followed at once");
        assert_eq!(p.target_mb(secs(0.7), 0, 1024), 0, "and a fall too");
        // What recurred is not asked for ahead of it there: the invoker comes within its second.
        let mut recurring = Seasonal::new(Duration::from_millis(200));
        for minute in 0..3 {
            let t = f64::from(minute) * 60.0;
            recurring.target_mb(secs(t + 29.0), 0, 1024);
            recurring.target_mb(secs(t + 30.0), 4000, 1024);
            recurring.target_mb(secs(t + 31.0), 0, 1024);
        }
        assert_eq!(recurring.target_mb(secs(209.0), 0, 1024), 0, "no profile on a quick plane");
        // A plane of a second or more waits for the rise to last, as before.
        let mut slow = Seasonal::new(Duration::from_secs(1));
        assert_eq!(slow.target_mb(secs(0.0), 100, 1024), 100);
        assert_eq!(slow.target_mb(secs(0.5), 900, 1024), 100);
    }

    #[test]
    fn seasonal_sees_the_last_second_whole_whatever_the_rounds_jitter() {
        // Rounds a tick apart, each a little late as a real timer fires: the demand seen a tick
        // ago held until now, so a rise seen once has not lasted a second yet.
        for late in [0.0, 0.001, 0.013] {
            let mut p = Seasonal::new(Duration::from_secs(1));
            let tick = 1.0 + late;
            assert_eq!(p.target_mb(secs(0.0), 100, 1024), 100);
            assert_eq!(p.target_mb(secs(tick), 900, 1024), 100, "late by {late}");
            assert_eq!(p.target_mb(secs(2.0 * tick), 900, 1024), 900, "late by {late}");
        }
    }

    #[test]
    fn seasonal_never_expects_a_burst_that_does_not_recur() {
        let mut p = Seasonal::new(Duration::from_secs(1));
        let mut t = 0.0;
        while t < 600.0 {
            let demand = if (30.0..33.0).contains(&t) { 8000 } else { 100 };
            let target = p.target_mb(secs(t), demand, 1024);
            if !(30.0..34.0).contains(&t) {
                assert_eq!(target, 100, "at {t}");
            }
            t += 0.5;
        }
    }
}
