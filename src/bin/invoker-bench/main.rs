//! `invoker-bench`: the warm path measured side by side, in one run, alternating A/B:
//! **direct** blocking `/run` calls to K warm action runtimes (the project's own runtime, the
//! same command the invoker starts) against **invoker** blocking invokes of the same no-op
//! action through the REST API. Also a cold start each way and the invoker's resident memory.
//! Prints a report on stderr and one JSON line on stdout. `scripts/bench.sh` drives it.

use anyhow::{bail, Context as _};
use clap::Parser;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GUEST: &str =
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";
const NOOP: &str =
    "import time\ndef main(a):\n    s = a.get('sleep')\n    if s:\n        time.sleep(s)\n    return {}\n";

#[derive(Parser)]
struct Args {
    /// Concurrency K (and K warm containers).
    #[arg(long, default_value_t = 8)]
    k: usize,
    /// Seconds per measured slice; each mode gets `rounds` slices per concurrency.
    #[arg(long, default_value_t = 5.0)]
    slice: f64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Cold starts measured each way (the median is reported).
    #[arg(long, default_value_t = 5)]
    cold: usize,
    /// Also measure resident memory with 1,000 idle containers (mock factory).
    #[arg(long)]
    memory: bool,
}

struct Invoker {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Invoker {
    fn start(exe: &Path, extra: &str) -> anyhow::Result<Invoker> {
        let dir = tempfile::Builder::new().prefix("invoker-bench-").tempdir()?;
        let config = dir.path().join("bench.toml");
        std::fs::write(&config, format!("invoker_id = \"bench{}\"\n{extra}", std::process::id()))?;
        let mut child = Command::new(exe)
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("listening on ").map(str::to_string))
            .context("the invoker did not start")?;
        std::thread::spawn(move || for _ in lines {});
        Ok(Invoker { child, base: format!("http://{addr}"), _dir: dir })
    }

    fn rss_kb(&self) -> u64 {
        rss_kb(self.child.id())
    }
}

impl Drop for Invoker {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM);
        let _ = self.child.wait();
    }
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// One of the K runtimes called directly: the invoker's own runtime command on a unix socket.
struct Direct {
    child: Child,
    client: reqwest::Client,
}

impl Direct {
    async fn start(exe: &Path, socket: &Path) -> anyhow::Result<(Direct, Duration)> {
        let began = Instant::now();
        let child = Command::new(exe)
            .args(["action-runtime", "--launcher", "python", "--listen"])
            .arg(format!("unix:{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::UnixStream::connect(socket).await.is_err() {
            if Instant::now() > deadline {
                bail!("the runtime did not listen on {}", socket.display());
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let client = reqwest::Client::builder().unix_socket(socket).build()?;
        let direct = Direct { child, client };
        let init = json!({"value": {"name": "noop", "main": "main", "code": NOOP, "binary": false, "env": {}}});
        let r = direct.client.post("http://localhost/init").json(&init).send().await?;
        if !r.status().is_success() {
            bail!("/init: {}", r.text().await?);
        }
        direct.run().await?;
        Ok((direct, began.elapsed()))
    }

    async fn run(&self) -> anyhow::Result<()> {
        let body = json!({"value": {}, "namespace": "guest", "action_name": "/guest/noop", "action_version": "0.0.1",
            "activation_id": "0123456789abcdef0123456789abcdef", "transaction_id": "bench", "deadline": "0"});
        let r = self.client.post("http://localhost/run").json(&body).send().await?;
        if !r.status().is_success() {
            bail!("/run: {}", r.status());
        }
        r.bytes().await?;
        Ok(())
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Default)]
struct Samples {
    micros: Vec<u32>,
    elapsed: Duration,
    errors: usize,
}

impl Samples {
    fn add(&mut self, other: Samples) {
        self.micros.extend(other.micros);
        self.elapsed += other.elapsed;
        self.errors += other.errors;
    }

    fn summary(&mut self) -> (f64, u64, u64, u64) {
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
async fn measure<F, Fut>(concurrency: usize, slice: Duration, call: F) -> Samples
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

async fn invoke(client: &reqwest::Client, url: &str, params: Value) -> anyhow::Result<()> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let r = client.post(url).basic_auth(user, Some(pass)).json(&params).send().await?;
    let status = r.status();
    r.bytes().await?;
    if status != 200 {
        bail!("invoke: {status}");
    }
    Ok(())
}

async fn put_action(client: &reqwest::Client, base: &str, name: &str) -> anyhow::Result<()> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let action = json!({"exec": {"kind": "python:3", "code": NOOP}, "limits": {"memory": 128, "concurrency": 1}});
    let r = client
        .put(format!("{base}/api/v1/namespaces/_/actions/{name}?overwrite=true"))
        .basic_auth(user, Some(pass))
        .json(&action)
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("create {name}: {}", r.text().await?);
    }
    Ok(())
}

/// Containers started so far, from the invoker's own metrics.
async fn cold_starts(client: &reqwest::Client, base: &str) -> anyhow::Result<u64> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let text = client.get(format!("{base}/metrics")).basic_auth(user, Some(pass)).send().await?.text().await?;
    Ok(text
        .lines()
        .find(|l| l.starts_with("invoker_container_starts_total{start=\"cold\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn run_json(concurrency: usize, direct: &mut Samples, invoker: &mut Samples) -> Value {
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let exe: PathBuf = std::env::current_exe()?.with_file_name("invoker");
    let slice = Duration::from_secs_f64(args.slice);
    let k = args.k.max(1);

    let inv = Invoker::start(&exe, "[proxy]\npause_grace = \"0s\"\n")?;
    let idle_rss_kb = inv.rss_kb();
    let http = reqwest::Client::builder().pool_max_idle_per_host(256).tcp_nodelay(true).build()?;
    put_action(&http, &inv.base, "noop").await?;
    let url = format!("{}/api/v1/namespaces/_/actions/noop?blocking=true&result=true", inv.base);
    // K overlapping slow calls leave K warm containers behind.
    let warm: Vec<_> = (0..k).map(|_| invoke(&http, &url, json!({"sleep": 1.0}))).collect();
    for r in futures_util::future::join_all(warm).await {
        r?;
    }

    let sockets = tempfile::Builder::new().prefix("invoker-bench-direct-").tempdir()?;
    let mut directs = Vec::new();
    for i in 0..k {
        directs.push(Direct::start(&exe, &sockets.path().join(format!("r{i}.sock"))).await?.0);
    }
    let directs = std::sync::Arc::new(directs);

    let mut runs = Vec::new();
    let mut levels = vec![1, k];
    levels.dedup();
    for &c in &levels {
        let (mut direct, mut invoker) = (Samples::default(), Samples::default());
        // Warm both paths, then alternate A/B so drift hits both alike.
        let d = directs.clone();
        measure(c, Duration::from_millis(300), move |i| {
            let d = d.clone();
            async move { d[i % d.len()].run().await }
        })
        .await;
        for _ in 0..args.rounds {
            let d = directs.clone();
            direct.add(
                measure(c, slice, move |i| {
                    let d = d.clone();
                    async move { d[i % d.len()].run().await }
                })
                .await,
            );
            let (h, u) = (http.clone(), url.clone());
            invoker.add(
                measure(c, slice, move |_| {
                    let (h, u) = (h.clone(), u.clone());
                    async move { invoke(&h, &u, json!({})).await }
                })
                .await,
            );
        }
        runs.push(run_json(c, &mut direct, &mut invoker));
    }
    let busy_rss_kb = inv.rss_kb();
    let cold_starts = cold_starts(&http, &inv.base).await?;
    eprintln!("cold starts during the warm-up and the load: {cold_starts} (the warm-up alone needs {k})");

    // Cold starts: a fresh action through the invoker against a fresh runtime alone.
    let (mut cold_invoker, mut cold_direct) = (Vec::new(), Vec::new());
    for i in 0..args.cold {
        let name = format!("cold{i}");
        put_action(&http, &inv.base, &name).await?;
        let t = Instant::now();
        invoke(&http, &format!("{}/api/v1/namespaces/_/actions/{name}?blocking=true", inv.base), json!({})).await?;
        cold_invoker.push(t.elapsed());
        let (direct, took) = Direct::start(&exe, &sockets.path().join(format!("cold{i}.sock"))).await?;
        drop(direct);
        cold_direct.push(took);
    }
    let (ci, cd) = (median(cold_invoker), median(cold_direct));
    let cold_added_ms = (ci.as_secs_f64() - cd.as_secs_f64()) * 1000.0;
    eprintln!(
        "cold    invoker {:.1} ms  direct (spawn + /init + /run) {:.1} ms  added {cold_added_ms:.1} ms",
        ci.as_secs_f64() * 1000.0,
        cd.as_secs_f64() * 1000.0
    );
    drop(directs);
    drop(inv);

    let mut memory = json!({ "idle_rss_kb": idle_rss_kb, "after_load_rss_kb": busy_rss_kb });
    eprintln!("memory  invoker idle {idle_rss_kb} kB, after the load with {k} containers {busy_rss_kb} kB");
    if args.memory {
        let kb = thousand_idle_containers(&exe).await?;
        eprintln!("memory  invoker with 1,000 idle containers (mock factory, its runtimes in-process) {kb} kB");
        memory["thousand_idle_rss_kb"] = json!(kb);
    }

    let mut last = runs.last().cloned().unwrap_or(Value::Null);
    last["cold_added_ms"] = json!((cold_added_ms * 10.0).round() / 10.0);
    last["cold_invoker_ms"] = json!((ci.as_secs_f64() * 10_000.0).round() / 10.0);
    last["cold_direct_ms"] = json!((cd.as_secs_f64() * 10_000.0).round() / 10.0);
    last["memory"] = memory;
    last["cold_starts_in_warm_runs"] = json!(cold_starts.saturating_sub(k as u64));
    last["runs"] = Value::Array(runs);
    println!("{last}");
    Ok(())
}

/// The invoker's resident memory tracking 1,000 idle warm containers of 1,000 actions. The mock
/// factory runs each container's runtime inside the invoker, so this is an upper bound.
async fn thousand_idle_containers(exe: &Path) -> anyhow::Result<u64> {
    let config =
        "[factory]\nkind = \"mock\"\n[factory.mock]\nnode_memory_mb = 1000000\n[proxy]\npause_grace = \"0s\"\n";
    let inv = Invoker::start(exe, config)?;
    let http = reqwest::Client::new();
    for chunk in (0..1000).collect::<Vec<_>>().chunks(50) {
        let calls = chunk.iter().map(|i| {
            let (http, base) = (http.clone(), inv.base.clone());
            async move {
                let name = format!("a{i}");
                put_action(&http, &base, &name).await?;
                invoke(&http, &format!("{base}/api/v1/namespaces/_/actions/{name}?blocking=true"), json!({})).await
            }
        });
        for r in futures_util::future::join_all(calls).await {
            r?;
        }
    }
    Ok(inv.rss_kb())
}
