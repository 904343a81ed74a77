//! The calls a scenario makes, in virtual time, from a seeded generator or a trace.

use super::host::Host;
use super::scenario::{Arrivals, Half, ScenarioError, Workload};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// One call: when, to which action (with its memory), and how long it runs once dispatched.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub at: Duration,
    pub action: u32,
    pub memory_mb: u32,
    pub run: Duration,
}

/// A small seeded generator (xorshift64*), so that every run of a scenario is the same.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// The calls, sorted by time, and the number of distinct actions.
pub fn calls(workload: &Workload, seed: u64, host: &dyn Host) -> Result<(Vec<Call>, u32), ScenarioError> {
    let mut rng = Rng::new(seed);
    let mut calls = Vec::new();
    let actions = match workload {
        Workload::Bursts { actions, memory_mb, run_ms, bursts, burst_size, burst_every, burst_spread } => {
            let memory: Vec<u32> =
                (0..*actions).map(|_| rng.between(memory_mb[0].into(), memory_mb[1].into()) as u32).collect();
            let run: Vec<u64> = (0..*actions).map(|_| rng.between(run_ms[0], run_ms[1])).collect();
            for b in 0..*bursts {
                let start = *burst_every * b;
                for _ in 0..*burst_size {
                    let action = rng.between(0, u64::from(*actions) - 1) as u32;
                    let offset = rng.between(0, burst_spread.as_micros() as u64);
                    calls.push(Call {
                        at: start + Duration::from_micros(offset),
                        action,
                        memory_mb: memory[action as usize],
                        run: Duration::from_millis(run[action as usize]),
                    });
                }
            }
            *actions
        }
        Workload::Herd { calls: n, memory_mb, run_ms } => {
            for _ in 0..*n {
                calls.push(Call {
                    at: Duration::ZERO,
                    action: 0,
                    memory_mb: *memory_mb,
                    run: Duration::from_millis(*run_ms),
                });
            }
            1
        }
        Workload::Trace { dir, functions, minutes, timeout_ms, arrivals, half, rate } => {
            let trace = TraceRead {
                dir,
                functions: *functions,
                minutes: *minutes,
                timeout_ms: *timeout_ms,
                half: *half,
                rate: *rate,
            };
            trace_calls(host, &trace, *arrivals, &mut rng, &mut calls)?
        }
    };
    calls.sort_by_key(|c| c.at);
    Ok((calls, actions))
}

/// Rows of a CSV file with a header, by column name.
fn rows(host: &dyn Host, path: &Path) -> Result<(Vec<String>, Vec<Vec<String>>), ScenarioError> {
    let text = host.read(path)?;
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap_or_default().split(',').map(str::to_string).collect();
    let rows = lines.filter(|l| !l.is_empty()).map(|l| l.split(',').map(str::to_string).collect()).collect();
    Ok((header, rows))
}

fn column(header: &[String], name: &str, path: &Path) -> Result<usize, ScenarioError> {
    header
        .iter()
        .position(|h| h == name)
        .ok_or_else(|| ScenarioError::Trace { path: path.display().to_string(), reason: format!("no column {name}") })
}

/// Which sample to read, and how much of it.
struct TraceRead<'a> {
    dir: &'a Path,
    functions: u32,
    minutes: Option<u32>,
    timeout_ms: u64,
    half: Option<Half>,
    rate: u32,
}

/// The instants within a minute (µs from its start) of `n` calls of function `action`.
fn arrivals_in_minute(arrivals: Arrivals, n: u64, action: u32, seed: u64, rng: &mut Rng) -> Vec<u64> {
    const MINUTE_US: u64 = 60_000_000;
    match arrivals {
        Arrivals::Uniform => (0..n).map(|_| rng.between(0, MINUTE_US - 1)).collect(),
        Arrivals::MinuteStart => (0..n).map(|_| rng.between(0, 999_999)).collect(),
        Arrivals::FixedSecond => {
            // The function's second, from the scenario's seed and the function alone.
            let second = Rng::new(seed ^ (u64::from(action) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)).between(0, 59);
            (0..n).map(|_| second * 1_000_000 + rng.between(0, 999_999)).collect()
        }
        Arrivals::Poisson => {
            if n == 0 {
                return Vec::new();
            }
            // Exponential gaps at n per minute, until the minute ends.
            let mean_gap_us = MINUTE_US as f64 / n as f64;
            let mut at = 0.0;
            let mut out = Vec::new();
            loop {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                at += -(1.0 - u).ln() * mean_gap_us;
                if at >= MINUTE_US as f64 {
                    break out;
                }
                out.push(at as u64);
            }
        }
    }
}

/// The Azure 2019 sample: each minute's invocations placed in the minute as `arrivals` says;
/// the function's `Average` duration (capped at the timeout) and its app's
/// `AverageAllocatedMb`.
fn trace_calls(
    host: &dyn Host,
    trace: &TraceRead<'_>,
    arrivals: Arrivals,
    rng: &mut Rng,
    calls: &mut Vec<Call>,
) -> Result<u32, ScenarioError> {
    let TraceRead { dir, functions, minutes, timeout_ms, half, rate } = *trace;
    // Drawn only where used: the other models replay as they did before there was a choice.
    let seed = if arrivals == Arrivals::FixedSecond { rng.next_u64() } else { 0 };
    let bad = |path: &Path, reason: String| ScenarioError::Trace { path: path.display().to_string(), reason };
    let (inv_path, run_path, mem_path) = (
        dir.join(format!("{functions}_inv.csv")),
        dir.join(format!("{functions}_run.csv")),
        dir.join(format!("{functions}_mem.csv")),
    );
    let (h, run_rows) = rows(host, &run_path)?;
    let (f, avg) = (column(&h, "HashFunction", &run_path)?, column(&h, "Average", &run_path)?);
    let mut run: HashMap<String, u64> = HashMap::new();
    for r in &run_rows {
        let ms: f64 = r.get(avg).and_then(|v| v.parse().ok()).ok_or_else(|| bad(&run_path, "bad Average".into()))?;
        run.insert(r[f].clone(), (ms.max(1.0) as u64).min(timeout_ms));
    }
    let (h, mem_rows) = rows(host, &mem_path)?;
    let (a, mb) = (column(&h, "HashApp", &mem_path)?, column(&h, "AverageAllocatedMb", &mem_path)?);
    let mut memory: HashMap<String, u32> = HashMap::new();
    for r in &mem_rows {
        let v: f64 = r.get(mb).and_then(|v| v.parse().ok()).ok_or_else(|| bad(&mem_path, "bad memory".into()))?;
        memory.insert(r[a].clone(), v.max(1.0) as u32);
    }
    let (h, inv_rows) = rows(host, &inv_path)?;
    let (f, a) = (column(&h, "HashFunction", &inv_path)?, column(&h, "HashApp", &inv_path)?);
    let first_minute = column(&h, "minute_1", &inv_path)?;
    let last = minutes.map_or(h.len(), |m| (first_minute + m as usize).min(h.len()));
    let kept = inv_rows.iter().filter(|r| half.is_none_or(|h| h.holds(&r[f])));
    for (action, r) in kept.enumerate() {
        let run_ms = *run.get(&r[f]).ok_or_else(|| bad(&run_path, format!("no durations for {}", r[f])))?;
        let memory_mb = *memory.get(&r[a]).ok_or_else(|| bad(&mem_path, format!("no memory for {}", r[a])))?;
        for (minute, cell) in r[first_minute..last].iter().enumerate() {
            let n: u64 = cell.parse().map_err(|_| bad(&inv_path, format!("bad count '{cell}'")))?;
            let n = n * u64::from(rate.max(1));
            for offset in arrivals_in_minute(arrivals, n, action as u32, seed, rng) {
                let at = Duration::from_secs(minute as u64 * 60) + Duration::from_micros(offset);
                calls.push(Call { at, action: action as u32, memory_mb, run: Duration::from_millis(run_ms) });
            }
        }
    }
    Ok(inv_rows.iter().filter(|r| half.is_none_or(|h| h.holds(&r[f]))).count() as u32)
}

/// A synthetic day in the Azure 2019 sample's format: the files `N_inv.csv`, `N_run.csv` and
/// `N_mem.csv` for `functions` functions (name and text, for the host to write), and how many
/// calls it holds: a
/// skewed mix as real fleets have (one function in a hundred called about 20 times a minute,
/// nine about twice, the rest about once an hour), for replays at a scale the samples lack
/// (1,000 functions make about 600,000 calls).
pub fn synthetic_trace(functions: u32, seed: u64) -> (Vec<(String, String)>, u64) {
    let mut rng = Rng::new(seed);
    let minutes: Vec<String> = (1..=1440).map(|m| format!("minute_{m}")).collect();
    let mut inv = format!("HashFunction,HashOwner,HashApp,{}\n", minutes.join(","));
    let percentiles =
        |name: &str, list: &[&str]| list.iter().map(|p| format!("{name}_{p}")).collect::<Vec<_>>().join(",");
    let mut run = format!(
        "HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum,{}\n",
        percentiles("percentile_Average", &["0", "1", "25", "50", "75", "99", "100"])
    );
    let mut mem = format!(
        "HashOwner,HashApp,SampleCount,AverageAllocatedMb,{}\n",
        percentiles("AverageAllocatedMb", &["pct1", "pct5", "pct25", "pct50", "pct75", "pct95", "pct99", "pct100"])
    );
    let mut total = 0u64;
    for f in 0..functions {
        let h = format!("f{f:04}");
        let per_minute = match f % 100 {
            0 => 20,
            1..=9 => 2,
            _ => 0,
        };
        let counts: Vec<String> = (0..1440)
            .map(|_| {
                let n = if per_minute > 0 {
                    rng.between(per_minute / 2, per_minute * 3 / 2)
                } else {
                    u64::from(rng.between(0, 60) == 0)
                };
                total += n;
                n.to_string()
            })
            .collect();
        inv.push_str(&format!("{h},{h},{h},{}\n", counts.join(",")));
        let avg = rng.between(10, 2000);
        run.push_str(&format!("{h},{h},{h},{avg},1,{avg},{avg}{}\n", format!(",{avg}").repeat(7)));
        let mb = rng.between(64, 400);
        mem.push_str(&format!("{h},{h},1,{mb}{}\n", format!(",{mb}").repeat(8)));
    }
    let files = [("inv", inv), ("run", run), ("mem", mem)];
    (files.into_iter().map(|(suffix, text)| (format!("{functions}_{suffix}.csv"), text)).collect(), total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::path::PathBuf;

    /// Files in memory, and the paths asked for.
    struct InMemory(Vec<(String, String)>, RefCell<Vec<PathBuf>>);

    impl Host for InMemory {
        fn read(&self, path: &Path) -> Result<String, ScenarioError> {
            self.1.borrow_mut().push(path.to_path_buf());
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let found = self.0.iter().find(|(n, _)| n == name).map(|(_, text)| text.clone());
            found.ok_or_else(|| ScenarioError::Trace { path: path.display().to_string(), reason: "absent".into() })
        }

        fn elapsed(&self) -> Duration {
            Duration::ZERO
        }
    }

    #[test]
    fn a_trace_is_read_through_the_host_and_replays_every_call_it_counts() {
        let (files, total) = synthetic_trace(20, 3);
        let host = InMemory(files, RefCell::default());
        let workload = Workload::Trace {
            dir: "/traces".into(),
            functions: 20,
            minutes: None,
            timeout_ms: 600_000,
            arrivals: Arrivals::Uniform,
            half: None,
            rate: 1,
        };
        let (replayed, actions) = calls(&workload, 1, &host).unwrap();
        assert_eq!((replayed.len() as u64, actions), (total, 20));
        assert!(replayed.windows(2).all(|w| w[0].at <= w[1].at), "sorted by time");
        let asked: Vec<_> = host.1.borrow().iter().map(|p| p.display().to_string()).collect();
        assert_eq!(asked, ["/traces/20_run.csv", "/traces/20_mem.csv", "/traces/20_inv.csv"]);
        // A file the host lacks is the trace's error, naming the file.
        let missing = Workload::Trace {
            dir: "/traces".into(),
            functions: 7,
            minutes: None,
            timeout_ms: 1,
            arrivals: Arrivals::Uniform,
            half: None,
            rate: 1,
        };
        let error = calls(&missing, 1, &host).unwrap_err().to_string();
        assert!(error.contains("/traces/7_run.csv"), "{error}");
    }

    /// The two halves split a sample's functions: each has some, none is in both, and together
    /// they replay every call of the whole; a rate replays each count that many times over.
    #[test]
    fn the_two_halves_split_a_samples_functions_and_keep_every_call_and_a_rate_multiplies_them() {
        let (files, total) = synthetic_trace(40, 3);
        let host = InMemory(files, RefCell::default());
        let read = |half, rate| {
            let workload = Workload::Trace {
                dir: "/traces".into(),
                functions: 40,
                minutes: None,
                timeout_ms: 600_000,
                arrivals: Arrivals::Uniform,
                half,
                rate,
            };
            calls(&workload, 1, &host).unwrap()
        };
        let (a, a_functions) = read(Some(Half::A), 1);
        let (b, b_functions) = read(Some(Half::B), 1);
        assert_eq!(read(None, 3).0.len() as u64, 3 * total, "a rate of 3: every count three times over");
        assert!(a_functions > 0 && b_functions > 0, "{a_functions} / {b_functions}");
        assert_eq!(a_functions + b_functions, 40);
        assert_eq!(a.len() as u64 + b.len() as u64, total);
        let names: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
        assert!(names.iter().all(|n| Half::A.holds(n) != Half::B.holds(n)), "each name in one half");
    }

    /// Each model places a minute's calls where it says: uniform and Poisson anywhere in it
    /// (Poisson's count varying around the trace's), timers in its first second, and each
    /// function's calls in a second of its own, the same every minute.
    #[test]
    fn arrivals_within_a_minute_follow_the_chosen_model() {
        let (files, total) = synthetic_trace(20, 3);
        let host = InMemory(files, RefCell::default());
        let read = |arrivals| {
            let workload = Workload::Trace {
                dir: "/traces".into(),
                functions: 20,
                minutes: None,
                timeout_ms: 600_000,
                arrivals,
                half: None,
                rate: 1,
            };
            calls(&workload, 1, &host).unwrap().0
        };
        let within = |c: &Call| c.at.as_micros() as u64 % 60_000_000;
        assert_eq!(read(Arrivals::Uniform).len() as u64, total);
        let timers = read(Arrivals::MinuteStart);
        assert_eq!(timers.len() as u64, total);
        assert!(timers.iter().all(|c| within(c) < 1_000_000));
        let fixed = read(Arrivals::FixedSecond);
        assert_eq!(fixed.len() as u64, total);
        let mut second_of: HashMap<u32, u64> = HashMap::new();
        for c in &fixed {
            let second = within(c) / 1_000_000;
            assert_eq!(*second_of.entry(c.action).or_insert(second), second, "function {}", c.action);
        }
        assert!(second_of.values().collect::<std::collections::BTreeSet<_>>().len() > 1, "not all one second");
        let poisson = read(Arrivals::Poisson);
        let n = poisson.len() as f64;
        assert!((n - total as f64).abs() < 0.05 * total as f64, "{n} against {total}");
        assert!(poisson.windows(2).all(|w| w[0].at <= w[1].at));
    }
}
