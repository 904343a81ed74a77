//! The verdict: the simulator's figures (calls, refused, delayed over a second, cold starts,
//! invoker-seconds, idle memory-time, reversals) from what really happened in the replay, and
//! from the simulator on the same calls, side by side. Times are given in the trace's own scale
//! (the replay's seconds times the factor), delays against a second of the trace.

use crate::drive::Outcome;
use crate::observe::FleetSeen;
use invoker_core::sim::fleet::{self, Scale};
use invoker_core::sim::scenario::Scenario;
use invoker_core::sim::workload::Call;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// How far apart the two sides may be on a figure and still agree (issue 61: 15 %).
pub const AGREEMENT: f64 = 0.15;

/// One side's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    pub calls: u64,
    pub completed: u64,
    pub refused: u64,
    /// Answered 202 past the scheduler's wait for room, kept in its queue (completed, or not,
    /// as their records say).
    pub kept_past_wait: u64,
    /// Neither completed nor refused: an error, or no answer in time.
    pub failed: u64,
    pub delayed_over_1s: u64,
    pub cold_starts: u64,
    /// In the trace's seconds.
    pub invoker_seconds: f64,
    pub invokers_max: u64,
    /// In the trace's seconds.
    pub idle_gb_s: f64,
    pub reversals: u64,
    /// Calls that found no invoker with room and waited for one (placed or refused), and their
    /// mean wait in the trace's seconds: how fast the fleet answers a call it has no room for.
    pub room_waits: u64,
    pub room_wait_mean_s: f64,
}

/// What the replay measured of the real parts, which the simulator then takes as its model's.
#[derive(Clone, Debug)]
pub struct Measured {
    /// From an invoker asked for to serving (the median; 1 s when none was seen).
    pub invoker_start: Duration,
    /// Each invoker's, as seen: the simulator draws its invokers' starts from these (the first,
    /// on an idle machine, comes up faster than those asked for under load).
    pub invoker_starts: Vec<Duration>,
    /// What every warm call costs beyond its run (HTTP, the scheduler's hop, the invoker, the
    /// runtime): the median over warm calls of the answer's latency less the run. The simulator
    /// dispatches without it, so neither side counts it as a wait.
    pub warm_overhead: Duration,
    /// The mean of the same: what the simulator holds each call's container and its
    /// scheduler's demand for beyond its run. Those are sums over time, which a tail of slow
    /// answers adds to and the median does not see.
    pub warm_overhead_mean: Duration,
    /// What each cold start added, at its invoker: the record's `waitTime` (from the invoker's
    /// acceptance to the run's start, the container's creation and `/init` included) less the
    /// warm calls' median. The simulator draws its starts from these; a wait at the scheduler
    /// for an invoker with room is not in them (the simulator models that wait itself).
    pub cold_starts: Vec<Duration>,
    /// From a pool's asking a container to go to its being gone (the mean; 10 ms, the
    /// simulator's default, when none was seen): a cold start that must make room waits for it.
    pub remove_latency: Duration,
}

fn median(mut values: Vec<Duration>) -> Option<Duration> {
    values.sort_unstable();
    values.get(values.len() / 2).copied()
}

impl Measured {
    pub fn of(calls: &[Call], outcomes: &[Outcome], seen: &FleetSeen) -> Measured {
        let warm = calls.iter().zip(outcomes).filter(|(_, o)| o.status == 200 && !o.cold);
        let overheads: Vec<Duration> = warm.map(|(c, o)| o.latency.saturating_sub(c.run)).collect();
        let warm_overhead_mean = match overheads.len() {
            0 => Duration::ZERO,
            n => overheads.iter().sum::<Duration>() / n as u32,
        };
        let warm_overhead = median(overheads).unwrap_or_default();
        let waits =
            |cold: bool| outcomes.iter().filter(move |o| o.status == 200 && o.cold == cold).filter_map(|o| o.wait);
        let warm_wait = median(waits(false).collect()).unwrap_or_default();
        let cold_starts = waits(true).map(|w| w.saturating_sub(warm_wait)).collect();
        Measured {
            invoker_start: median(seen.start_latencies.clone()).unwrap_or(Duration::from_secs(1)),
            invoker_starts: seen.start_latencies.clone(),
            warm_overhead,
            warm_overhead_mean,
            cold_starts,
            remove_latency: seen.remove_latency().unwrap_or(Duration::from_millis(10)),
        }
    }

    /// The median cold start (100 ms when none was seen).
    pub fn cold_start(&self) -> Duration {
        median(self.cold_starts.clone()).unwrap_or(Duration::from_millis(100))
    }

    /// What a call waited: its answer's latency less its run and the warm overhead.
    pub fn waited(&self, call: &Call, outcome: &Outcome) -> Duration {
        outcome.latency.saturating_sub(call.run).saturating_sub(self.warm_overhead)
    }
}

/// Where the two sides part, call by call: the calls refused and delayed by trace minute, why
/// each refused call was refused (as its record says), and what the calls waited by quantile
/// (beyond the run and a warm call's overhead, against the simulator's arrival to start; each
/// call's cold start in both). `simulated` is [`invoker_core::sim::fleet::managed_run`]'s.
pub fn troubles(calls: &[Call], outcomes: &[Outcome], measured: &Measured, scale: Scale, simulated: &Value) -> Value {
    let both = || calls.iter().zip(outcomes);
    let refused_at: Vec<Duration> = both().filter(|(_, o)| matches!(o.status, 429 | 503)).map(|(c, _)| c.at).collect();
    let delayed_at: Vec<Duration> = both().filter(|(c, o)| delayed(c, o, measured, scale)).map(|(c, _)| c.at).collect();
    let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
    for refusal in outcomes.iter().filter_map(|o| o.refusal.as_deref()) {
        *reasons.entry(refusal).or_default() += 1;
    }
    let mut waited: Vec<Duration> =
        both().filter(|(_, o)| matches!(o.status, 200 | 502)).map(|(c, o)| measured.waited(c, o)).collect();
    let count = |times: &[Duration]| fleet::by_minute(times, scale.minute);
    json!({
        "waits_ms": { "replay": fleet::quantiles_ms(&mut waited), "simulator": simulated["waits_ms"] },
        "refusals": reasons,
        "refused_by_minute": { "replay": count(&refused_at), "simulator": simulated["refused_by_minute"] },
        "delayed_by_minute": { "replay": count(&delayed_at), "simulator": simulated["delayed_by_minute"] },
    })
}

/// The two managers side by side: their first changes of demand or target over the first
/// [`fleet::EARLY_MINUTES`] trace minutes, their mean demand and target, and both by minute.
pub fn managers(seen: &FleetSeen, simulated: &Value, scale: Scale, horizon: Duration) -> Value {
    let span = horizon.as_secs_f64().max(1e-9);
    let early = (scale.minute * fleet::EARLY_MINUTES).as_secs_f64();
    let mut last = (u64::MAX, u64::MAX);
    let changes: Vec<(f64, u64, u64)> = seen
        .manager
        .iter()
        .filter(|&&(at, d, t)| at < early && std::mem::replace(&mut last, (d, t)) != (d, t))
        .map(|&(at, d, t)| ((at * 1000.0).round() / 1000.0, d, t))
        .collect();
    json!({
        "first_changes": { "replay": changes, "simulator": simulated["first_rounds"] },
        "demand_mb_mean": { "replay": (seen.demand_mb_s / span).round(), "simulator": simulated["demand_mb_mean"] },
        "target_mb_mean": { "replay": (seen.target_mb_s / span).round(), "simulator": simulated["target_mb_mean"] },
        "demand_and_target_by_minute": {
            "replay": seen.manager_by_minute(scale.minute, horizon),
            "simulator": simulated["manager_by_minute"],
        },
    })
}

/// Answered with a record after waiting longer than the scale's delay.
fn delayed(call: &Call, outcome: &Outcome, measured: &Measured, scale: Scale) -> bool {
    matches!(outcome.status, 200 | 502) && measured.waited(call, outcome) > scale.delayed_over
}

impl Verdict {
    /// From the calls' answers and the fleet as watched. An answer with a record (200, or 502
    /// for an action's own error) completed; 429 and 503 were refused; anything else failed.
    pub fn of_replay(
        calls: &[Call],
        outcomes: &[Outcome],
        seen: &FleetSeen,
        measured: &Measured,
        scale: Scale,
        factor: f64,
    ) -> Verdict {
        let completed = outcomes.iter().filter(|o| matches!(o.status, 200 | 502)).count() as u64;
        let refused = outcomes.iter().filter(|o| matches!(o.status, 429 | 503)).count() as u64;
        let delayed = calls.iter().zip(outcomes).filter(|(c, o)| delayed(c, o, measured, scale)).count() as u64;
        Verdict {
            calls: calls.len() as u64,
            completed,
            refused,
            kept_past_wait: outcomes.iter().filter(|o| o.kept).count() as u64,
            failed: calls.len() as u64 - completed - refused,
            delayed_over_1s: delayed,
            cold_starts: outcomes.iter().filter(|o| o.cold).count() as u64,
            invoker_seconds: seen.invoker_seconds * factor,
            invokers_max: seen.invokers_max as u64,
            idle_gb_s: seen.idle_mb_s / 1024.0 * factor,
            reversals: seen.reversals,
            room_waits: seen.room_waits.map_or(0, |(_, n)| n),
            room_wait_mean_s: seen.room_waits.map_or(0.0, |(s, n)| s / n.max(1) as f64 * factor),
        }
    }

    /// From the simulator's summary of one managed run ([`invoker_core::sim::fleet::managed_run`]).
    pub fn of_simulator(summary: &Value, factor: f64) -> Verdict {
        let n = |key: &str| summary[key].as_u64().unwrap_or(0);
        let f = |key: &str| summary[key].as_f64().unwrap_or(0.0);
        Verdict {
            calls: n("activations"),
            completed: n("completed"),
            refused: n("refused"),
            kept_past_wait: n("kept_past_wait"),
            failed: n("failed") + n("lost") + n("killed_at_drain_deadline"),
            delayed_over_1s: n("delayed_over_1s"),
            cold_starts: n("cold_starts"),
            invoker_seconds: f("invoker_seconds_exact") * factor,
            invokers_max: n("invokers_max"),
            idle_gb_s: f("idle_gb_s_exact") * factor,
            reversals: n("reversals"),
            room_waits: n("room_waits"),
            room_wait_mean_s: f("room_wait_seconds") / n("room_waits").max(1) as f64 * factor,
        }
    }

    fn rows(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("calls", self.calls as f64),
            ("completed", self.completed as f64),
            ("refused", self.refused as f64),
            ("kept past wait", self.kept_past_wait as f64),
            ("failed", self.failed as f64),
            ("delayed over 1 s", self.delayed_over_1s as f64),
            ("cold starts", self.cold_starts as f64),
            ("invoker-seconds", self.invoker_seconds.round()),
            ("invokers at most", self.invokers_max as f64),
            ("idle memory GB·s", self.idle_gb_s.round()),
            ("reversals", self.reversals as f64),
            ("calls waiting for room", self.room_waits as f64),
            ("their mean wait, s", (self.room_wait_mean_s * 100.0).round() / 100.0),
        ]
    }
}

/// The figures the two sides must agree on within [`AGREEMENT`] (issue 61).
const COMPARED: [&str; 5] = ["cold starts", "delayed over 1 s", "invoker-seconds", "idle memory GB·s", "completed"];

/// How far `simulated` is from `real`, as a share of the larger (0 when both are 0).
fn difference(real: f64, simulated: f64) -> f64 {
    let larger = real.abs().max(simulated.abs());
    if larger == 0.0 {
        0.0
    } else {
        (simulated - real).abs() / larger
    }
}

/// Both verdicts as one JSON value, and the same as a table on stderr.
pub fn side_by_side(
    scenario: &Scenario,
    factor: f64,
    calls: usize,
    measured: &Measured,
    (real, simulated): (&Verdict, &Verdict),
    invokers_by_minute: (Vec<f64>, Value),
) -> Value {
    let mut rows = Vec::new();
    let mut agree = true;
    eprintln!("{:<20} {:>14} {:>14} {:>8}", "figure", "replay", "simulator", "apart");
    for ((name, r), (_, s)) in real.rows().into_iter().zip(simulated.rows()) {
        let apart = difference(r, s);
        if COMPARED.contains(&name) && apart > AGREEMENT {
            agree = false;
        }
        eprintln!("{name:<20} {r:>14} {s:>14} {:>7.1}%", apart * 100.0);
        rows.push(json!({ "figure": name, "replay": r, "simulator": s, "apart_pct": (apart * 1000.0).round() / 10.0 }));
    }
    json!({
        "scenario": scenario.name,
        "factor": factor,
        "calls": calls,
        "measured": {
            "invoker_start_ms": measured.invoker_start.as_millis() as u64,
            "invoker_starts_ms": measured.invoker_starts.iter().map(|d| d.as_millis() as u64).collect::<Vec<_>>(),
            "cold_start_ms_p50": (measured.cold_start().as_secs_f64() * 1000.0 * 10.0).round() / 10.0,
            "cold_starts_measured": measured.cold_starts.len(),
            "warm_overhead_ms": (measured.warm_overhead.as_secs_f64() * 1000.0 * 10.0).round() / 10.0,
            "warm_overhead_mean_ms": (measured.warm_overhead_mean.as_secs_f64() * 1000.0 * 10.0).round() / 10.0,
            "remove_latency_ms": (measured.remove_latency.as_secs_f64() * 1000.0 * 10.0).round() / 10.0,
        },
        "rows": rows,
        "agree_within_15_pct": agree,
        "invokers_by_minute": { "replay": invokers_by_minute.0, "simulator": invokers_by_minute.1 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(run_ms: u64) -> Call {
        Call { at: Duration::ZERO, action: 0, memory_mb: 128, run: Duration::from_millis(run_ms) }
    }

    fn answered(status: u16, latency_ms: u64, cold: bool) -> Outcome {
        let wait = Some(Duration::from_millis(if cold { 31 } else { 1 }));
        Outcome { status, latency: Duration::from_millis(latency_ms), cold, wait, refusal: None, kept: false }
    }

    /// At 60×, a call that waited more than 1/60 s (its answer's latency less its run and the
    /// warm calls' overhead) is delayed; 503 is refused, no answer failed; the fleet's seconds
    /// are the trace's.
    #[test]
    fn the_replays_verdict_counts_in_the_traces_scale() {
        let calls = [call(100), call(100), call(100), call(100)];
        let outcomes =
            [answered(200, 110, false), answered(200, 140, true), answered(503, 1, false), Outcome::default()];
        let seen = FleetSeen {
            invoker_seconds: 10.0,
            idle_mb_s: 1024.0,
            reversals: 1,
            room_waits: Some((0.5, 2)),
            ..FleetSeen::default()
        };
        let m = Measured::of(&calls, &outcomes, &seen);
        assert_eq!((m.cold_start(), m.warm_overhead), (Duration::from_millis(30), Duration::from_millis(10)));
        // Warm overheads of 10, 12 and 50 ms: the median 12, the mean (what calls are held for) 24.
        let warm = [call(100), call(100), call(100)];
        let tail = [answered(200, 110, false), answered(200, 112, false), answered(200, 150, false)];
        let held = Measured::of(&warm, &tail, &seen);
        assert_eq!(
            (held.warm_overhead, held.warm_overhead_mean),
            (Duration::from_millis(12), Duration::from_millis(24))
        );
        let v = Verdict::of_replay(&calls, &outcomes, &seen, &m, Scale::compressed(60.0), 60.0);
        assert_eq!((v.completed, v.refused, v.failed, v.delayed_over_1s, v.cold_starts), (2, 1, 1, 1, 1));
        assert_eq!((v.invoker_seconds, v.idle_gb_s, v.reversals), (600.0, 60.0, 1));
        assert_eq!((v.room_waits, v.room_wait_mean_s), (2, 15.0), "two waits of 0.25 s: 15 s of the trace");
    }

    #[test]
    fn figures_apart_by_more_than_fifteen_percent_disagree() {
        assert_eq!(difference(0.0, 0.0), 0.0);
        assert!(difference(100.0, 90.0) <= AGREEMENT && difference(100.0, 80.0) > AGREEMENT);
    }
}
