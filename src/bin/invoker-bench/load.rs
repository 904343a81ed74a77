//! Closed-loop load and its summary: requests per second and latency percentiles.

use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Samples {
    micros: Vec<u32>,
    elapsed: Duration,
    pub errors: usize,
}

impl Samples {
    pub fn add(&mut self, other: Samples) {
        self.micros.extend(other.micros);
        self.elapsed += other.elapsed;
        self.errors += other.errors;
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
    json!({
        "concurrency": concurrency,
        "direct_rps": d_rps.round(), "invoker_rps": i_rps.round(),
        "rps_ratio": (i_rps / d_rps.max(1e-9) * 1000.0).round() / 1000.0,
        "direct_p50_us": d50, "invoker_p50_us": i50, "direct_p90_us": d90, "invoker_p90_us": i90,
        "direct_p99_us": d99, "invoker_p99_us": i99,
        "added_p50_us": i50 as i64 - d50 as i64, "added_p99_us": i99 as i64 - d99 as i64,
        "errors": direct.errors + invoker.errors,
    })
}
