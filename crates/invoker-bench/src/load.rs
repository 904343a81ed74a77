//! Closed-loop load and its summary: requests per second and latency percentiles.

use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Samples {
    micros: Vec<u32>,
    elapsed: Duration,
    pub errors: usize,
    cpu: CpuTicks,
}

/// Clock ticks (`/proc`, 100 per second) spent while a slice ran: by this benchmark process
/// (the load generator), by every CPU busy, and idle. On a machine whose cores are all busy, the
/// ratio of two paths' throughput is the inverse ratio of their CPU per request.
#[derive(Default, Clone, Copy)]
struct CpuTicks {
    load_generator: u64,
    busy: u64,
    idle: u64,
}

impl CpuTicks {
    fn now() -> CpuTicks {
        let numbers = |text: &str, skip: usize| -> Vec<u64> {
            text.split_whitespace().skip(skip).map_while(|n| n.parse().ok()).collect()
        };
        let own = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // After the command name, which may hold spaces: utime and stime are fields 14 and 15.
        let own = own.rsplit_once(')').map_or(Vec::new(), |(_, rest)| numbers(rest, 11));
        let all = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let all = numbers(all.lines().next().unwrap_or_default(), 1);
        let idle = all.get(3).copied().unwrap_or(0) + all.get(4).copied().unwrap_or(0);
        CpuTicks { load_generator: own.iter().take(2).sum(), busy: all.iter().sum::<u64>().saturating_sub(idle), idle }
    }

    fn since(self, before: CpuTicks) -> CpuTicks {
        CpuTicks {
            load_generator: self.load_generator.saturating_sub(before.load_generator),
            busy: self.busy.saturating_sub(before.busy),
            idle: self.idle.saturating_sub(before.idle),
        }
    }
}

impl Samples {
    pub fn add(&mut self, other: Samples) {
        self.micros.extend(other.micros);
        self.elapsed += other.elapsed;
        self.errors += other.errors;
        self.cpu.load_generator += other.cpu.load_generator;
        self.cpu.busy += other.cpu.busy;
        self.cpu.idle += other.cpu.idle;
    }

    /// Requests that succeeded.
    pub fn count(&self) -> usize {
        self.micros.len()
    }

    /// CPU per request in µs: the load generator's, all cores busy, all cores idle.
    pub fn cpu_per_request(&self) -> (u64, u64, u64) {
        let per = |ticks: u64| (ticks as f64 * 10_000.0 / self.micros.len().max(1) as f64).round() as u64;
        (per(self.cpu.load_generator), per(self.cpu.busy), per(self.cpu.idle))
    }

    pub fn summary(&mut self) -> (f64, u64, u64, u64) {
        self.micros.sort_unstable();
        let pct = |p: f64| -> u64 {
            if self.micros.is_empty() {
                return 0;
            }
            let i = ((self.micros.len() as f64 * p).ceil() as usize).clamp(1, self.micros.len()) - 1;
            u64::from(self.micros[i])
        };
        let rps = self.micros.len() as f64 / self.elapsed.as_secs_f64().max(1e-9);
        (rps, pct(0.5), pct(0.9), pct(0.99))
    }
}

/// A closed loop of `concurrency` callers for `slice`; caller i uses `call(i)`.
pub async fn measure<F, Fut>(concurrency: usize, slice: Duration, call: F) -> Samples
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let cpu_before = CpuTicks::now();
    let began = Instant::now();
    let end = began + slice;
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            while Instant::now() < end {
                let t = Instant::now();
                match call(i).await {
                    Ok(()) => samples.micros.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32),
                    Err(_) => samples.errors += 1,
                }
            }
            samples
        }));
    }
    let mut all = Samples::default();
    for t in tasks {
        all.add(t.await.unwrap_or_default());
    }
    all.elapsed = began.elapsed();
    all.cpu = CpuTicks::now().since(cpu_before);
    all
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

pub fn run_json(concurrency: usize, direct: &mut Samples, invoker: &mut Samples) -> Value {
    let (d_rps, d50, d90, d99) = direct.summary();
    let (i_rps, i50, i90, i99) = invoker.summary();
    eprintln!(
        "c={concurrency:<3} direct  {d_rps:>8.0} req/s  p50 {d50:>6} us  p90 {d90:>6} us  p99 {d99:>6} us  errors {}",
        direct.errors
    );
    eprintln!(
        "c={concurrency:<3} invoker {i_rps:>8.0} req/s  p50 {i50:>6} us  p90 {i90:>6} us  p99 {i99:>6} us  errors {}",
        invoker.errors
    );
    let ((d_gen, d_busy, d_idle), (i_gen, i_busy, i_idle)) = (direct.cpu_per_request(), invoker.cpu_per_request());
    eprintln!(
        "c={concurrency:<3} CPU per request: direct {d_busy} us busy ({d_gen} us the load generator), {d_idle} us idle; \
         invoker {i_busy} us busy ({i_gen} us the load generator), {i_idle} us idle"
    );
    json!({
        "concurrency": concurrency,
        "direct_rps": d_rps.round(), "invoker_rps": i_rps.round(),
        "rps_ratio": (i_rps / d_rps.max(1e-9) * 1000.0).round() / 1000.0,
        "direct_p50_us": d50, "invoker_p50_us": i50, "direct_p90_us": d90, "invoker_p90_us": i90,
        "direct_p99_us": d99, "invoker_p99_us": i99,
        "added_p50_us": i50 as i64 - d50 as i64, "added_p99_us": i99 as i64 - d99 as i64,
        "direct_cpu_us": d_busy, "invoker_cpu_us": i_busy, "direct_idle_us": d_idle, "invoker_idle_us": i_idle,
        "direct_load_generator_cpu_us": d_gen, "invoker_load_generator_cpu_us": i_gen,
        "errors": direct.errors + invoker.errors,
    })
}

/// Puts the floor's figures (`floor.rs`, measured in the same rounds) beside a run's: its
/// requests a second and p50, its ratio to the direct side, the real path's ratio to it, and
/// the real path's p50 over it.
pub fn with_floor(run: &mut Value, floor: &mut Samples) {
    let (f_rps, f50, f90, f99) = floor.summary();
    let (_, f_busy, _) = floor.cpu_per_request();
    let concurrency = run["concurrency"].as_u64().unwrap_or(0);
    eprintln!(
        "c={concurrency:<3} floor   {f_rps:>8.0} req/s  p50 {f50:>6} us  p90 {f90:>6} us  p99 {f99:>6} us  errors {}  \
         CPU {f_busy} us busy",
        floor.errors
    );
    let number = |key: &str| run[key].as_f64().unwrap_or(0.0);
    let ratio = |a: f64, b: f64| (a / b.max(1e-9) * 1000.0).round() / 1000.0;
    let (d_rps, i_rps) = (number("direct_rps"), number("invoker_rps"));
    let (d50, i50) = (number("direct_p50_us") as i64, number("invoker_p50_us") as i64);
    let figures = json!({
        "floor_rps": f_rps.round(), "floor_p50_us": f50, "floor_p99_us": f99, "floor_cpu_us": f_busy,
        "floor_ratio": ratio(f_rps, d_rps), "invoker_floor_ratio": ratio(i_rps, f_rps),
        "floor_added_p50_us": f50 as i64 - d50, "added_over_floor_p50_us": i50 - f50 as i64,
        "floor_errors": floor.errors,
    });
    if let (Some(run), Value::Object(figures)) = (run.as_object_mut(), figures) {
        run.extend(figures);
    }
}
