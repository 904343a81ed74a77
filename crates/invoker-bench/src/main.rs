//! `invoker-bench`: the warm path measured side by side, in one run, alternating A/B:
//! **direct** blocking `/run` calls to K warm action runtimes (the project's own runtime, the
//! same command the invoker starts) against **invoker** blocking invokes of the same no-op
//! action through the REST API. Also a cold start each way and the invoker's resident memory.
//!
//! With `--docker-socket`, a second invoker on the Docker factory is measured in the same run,
//! its slices alternating with the process factory's: its invokes against direct `/run` calls
//! to the runtimes inside its own warm containers, and its cold starts.
//!
//! And an Fn function (`fn_side.rs`): its warm call through `POST /invoke/{fn_id}` against its
//! FDK called directly over the socket, and its cold start.
//!
//! Prints a report on stderr and one JSON line on stdout. `scripts/bench.sh` drives it.

mod cold;
mod floor;
mod fn_image;
mod fn_side;
mod load;
mod many_streams;
mod queue;
mod stream;
mod targets;
mod tracing_ab;

use clap::Parser;
use floor::{FloorKind, FloorProcess};
use load::{measure, median, run_json, with_floor, Samples};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use targets::{cold_starts, invoke, put_action, Direct, Invoker};

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
    /// Also measure resident memory with 1,000 idle containers (mock factory), and an invoker's
    /// resident memory along 300,000 warm activations.
    #[arg(long)]
    memory: bool,
    /// TOML appended to the measured invoker's configuration (an A/B of one setting, e.g.
    /// `[factory.process]\nunprivileged = false`).
    #[arg(long, default_value = "")]
    invoker_config: String,
    /// Measure only the resident-memory curve along 300,000 warm activations.
    #[arg(long)]
    rss_curve_only: bool,
    /// Also measure an invoker on the Docker factory, on the engine at this socket (with the
    /// images `scripts/build-images.sh` builds).
    #[arg(long)]
    docker_socket: Option<PathBuf>,
    /// New actions per kind for the cold starts by kind (python from the zygote and spawned,
    /// node); 0 skips them.
    #[arg(long, default_value_t = 20)]
    cold_kinds: usize,
    /// First calls to this many new python actions at once, after the cold starts by kind.
    #[arg(long, default_value_t = 50)]
    burst: usize,
    /// Measure only the cold starts by kind and the burst.
    #[arg(long)]
    cold_only: bool,
    /// Also measure the scheduler hop on the etcd at this URL: a scheduler in front of one
    /// invoker, against that invoker called directly, in the same run.
    #[arg(long)]
    etcd: Option<String>,
    /// Measure only the scheduler hop (with `--etcd`).
    #[arg(long)]
    scheduler_only: bool,
    /// Measure only an Fn function's warm path and cold start.
    #[arg(long)]
    fn_only: bool,
    /// Leave the Fn function out (it needs `scripts/fdk.sh`).
    #[arg(long)]
    no_fn: bool,
    /// Measure only the warm path with tracing off, exporting every trace, and 1 % of them.
    #[arg(long)]
    tracing_only: bool,
    /// Measure only the durable queue's intake (`queue.rs`): non-blocking invokes from this many
    /// callers for one slice, then the backlog's drain.
    #[arg(long)]
    queue_only: Option<usize>,
    /// Measure only streamed answers (`stream.rs`): each value's delay from its yield to the
    /// caller over this many calls, and 1 GiB streamed in 1 MiB values; on Docker too with
    /// `--docker-socket`.
    #[arg(long)]
    stream_only: Option<usize>,
    /// Measure only this many streams open at once on one invoker (`many_streams.rs`), each
    /// one value a second for `--stream-values` seconds.
    #[arg(long)]
    many_streams: Option<usize>,
    /// The values (seconds) of each stream of `--many-streams`.
    #[arg(long, default_value_t = 30)]
    stream_values: usize,
    /// Serve a floor (`floor.rs`) in front of these targets (unix sockets, or one
    /// `host:port`), and nothing else: how the benchmark starts each floor side.
    #[arg(long, num_args = 1..)]
    floor: Vec<String>,
    /// What the floor of `--floor` forwards to.
    #[arg(long, value_enum, default_value_t = floor::FloorKind::Openwhisk)]
    floor_kind: floor::FloorKind,
}

/// One factory under test: its invoker, K warm runtimes to call directly, the floor in front
/// of the same runtimes, and the figures.
struct Side {
    name: &'static str,
    invoker: Invoker,
    url: String,
    directs: Arc<Vec<Direct>>,
    floor: Option<FloorProcess>,
    direct: Samples,
    invoked: Samples,
    floored: Samples,
    runs: Vec<Value>,
    cold: Vec<Duration>,
}

impl Side {
    /// Starts the invoker, creates the no-op action and leaves K warm containers behind.
    async fn start(
        name: &'static str,
        exe: &Path,
        config: &str,
        http: &reqwest::Client,
        k: usize,
    ) -> anyhow::Result<Side> {
        let invoker = Invoker::start(exe, name, config)?;
        put_action(http, &invoker.base, "noop").await?;
        let url = invoker.url("noop", "blocking=true&result=true");
        // K overlapping slow calls leave K warm containers behind.
        let warm: Vec<_> = (0..k).map(|_| invoke(http, &url, json!({"sleep": 1.0}))).collect();
        for r in futures_util::future::join_all(warm).await {
            r?;
        }
        Ok(Side {
            name,
            invoker,
            url,
            directs: Arc::new(Vec::new()),
            floor: None,
            direct: Samples::default(),
            invoked: Samples::default(),
            floored: Samples::default(),
            runs: Vec::new(),
            cold: Vec::new(),
        })
    }

    async fn slice_direct(&mut self, c: usize, slice: Duration) -> Samples {
        let d = self.directs.clone();
        measure(c, slice, move |i| {
            let d = d.clone();
            async move { d[i % d.len()].run().await }
        })
        .await
    }

    async fn slice_invoker(&mut self, c: usize, slice: Duration, http: &reqwest::Client) -> Samples {
        slice_of(http, &self.url, c, slice).await
    }

    async fn slice_floor(&mut self, c: usize, slice: Duration, http: &reqwest::Client) -> Samples {
        match &self.floor {
            Some(floor) => slice_of(http, &floor.invoke_url(), c, slice).await,
            None => Samples::default(),
        }
    }

    /// Starts the floor in front of the runtimes at `sockets` (the direct side's).
    fn start_floor(&mut self, sockets: &[PathBuf]) -> anyhow::Result<()> {
        self.floor = Some(FloorProcess::start(FloorKind::Openwhisk, sockets)?);
        Ok(())
    }

    async fn cold_start(&mut self, http: &reqwest::Client, i: usize) -> anyhow::Result<()> {
        let name = format!("cold{i}");
        put_action(http, &self.invoker.base, &name).await?;
        let t = Instant::now();
        invoke(http, &self.invoker.url(&name, "blocking=true"), json!({})).await?;
        self.cold.push(t.elapsed());
        Ok(())
    }
}

/// A closed loop of `c` blocking invokes with empty parameters at `url`.
async fn slice_of(http: &reqwest::Client, url: &str, c: usize, slice: Duration) -> Samples {
    let (h, u) = (http.clone(), url.to_string());
    measure(c, slice, move |_| {
        let (h, u) = (h.clone(), u.clone());
        async move { invoke(&h, &u, json!({})).await }
    })
    .await
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.floor.is_empty() {
        return floor::serve(args.floor_kind, args.floor);
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench(args))
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let exe: PathBuf = std::env::current_exe()?.with_file_name("invoker");
    let slice = Duration::from_secs_f64(args.slice);
    let k = args.k.max(1);
    let http = reqwest::Client::builder().pool_max_idle_per_host(256).tcp_nodelay(true).build()?;
    if args.rss_curve_only {
        let curve = rss_curve(&exe, &http).await?;
        let memory: serde_json::Map<String, Value> =
            curve.iter().map(|(count, kb)| (format!("rss_kb_{}k", count / 1000), json!(kb))).collect();
        println!("{}", Value::Object(memory));
        return Ok(());
    }

    if args.scheduler_only {
        let etcd = args.etcd.as_deref().ok_or_else(|| anyhow::anyhow!("--scheduler-only needs --etcd"))?;
        let hop = scheduler_hop(&exe, etcd, &http, k, slice, args.rounds).await?;
        let ratio = hop.last().map_or(Value::Null, |r| r["rps_ratio"].clone());
        let floor_ratio = hop.last().map_or(Value::Null, |r| r["floor_ratio"].clone());
        let figures = json!({ "sched_added_p50_us_c1": hop[0]["added_p50_us"], "sched_rps_ratio_c8": ratio,
            "sched_floor_added_p50_us_c1": hop[0]["floor_added_p50_us"], "sched_floor_ratio_c8": floor_ratio });
        println!("{}", json!({ "scheduler": hop, "figures": figures }));
        return Ok(());
    }
    if let Some(callers) = args.queue_only {
        println!("{}", queue::queue_intake(&exe, &http, callers, k, slice).await?);
        return Ok(());
    }
    if let Some(streams) = args.many_streams {
        let report = many_streams::many_streams(&exe, streams, args.stream_values).await?;
        println!("{report}");
        return Ok(());
    }
    if let Some(calls) = args.stream_only {
        let mut report =
            json!({ "processes": stream::stream_side(&exe, &http, "processes", stream::LARGE_CALLS, calls).await? });
        if let Some(socket) = &args.docker_socket {
            let config = format!(
                "{}[factory]\nkind = \"docker\"\n[factory.docker]\nsocket = \"{}\"\n",
                stream::LARGE_CALLS,
                socket.display()
            );
            report["docker"] = stream::stream_side(&exe, &http, "docker", &config, calls).await?;
        }
        if let Some(etcd) = &args.etcd {
            let (_invoker, scheduler) = invoker_and_scheduler(&exe, etcd, &http, "stream").await?;
            report["scheduler"] = stream::measure(&http, "through a scheduler", &scheduler, calls, false).await?;
        }
        println!("{report}");
        return Ok(());
    }
    if args.tracing_only {
        println!("{}", tracing_ab::tracing_ab(&exe, &http, k, slice, args.rounds).await?);
        return Ok(());
    }
    if args.fn_only {
        println!(
            "{}",
            fn_side::fn_side(&exe, &http, k, slice, args.rounds, args.cold, args.docker_socket.as_deref()).await?
        );
        return Ok(());
    }
    let mut by_kind = match args.cold_kinds {
        0 => Value::Null,
        n => cold::cold_by_kind(&exe, &http, n, args.burst).await?,
    };
    if let (Some(socket), n @ 1..) = (&args.docker_socket, args.cold_kinds) {
        let docker = cold::cold_docker(&exe, &http, n, socket).await?;
        if let (Value::Object(all), Value::Object(docker)) = (&mut by_kind, docker) {
            all.extend(docker);
        }
    }
    if args.cold_only {
        println!("{by_kind}");
        return Ok(());
    }
    let config = format!("[proxy]\npause_grace = \"0s\"\n{}", args.invoker_config);
    let mut sides = vec![Side::start("bench", &exe, &config, &http, k).await?];
    let idle_rss_kb = {
        let fresh = Invoker::start(&exe, "idle", "")?;
        fresh.rss_kb()
    };
    let sockets = tempfile::Builder::new().prefix("invoker-bench-direct-").tempdir()?;
    let mut directs = Vec::new();
    let runtime_sockets: Vec<PathBuf> = (0..k).map(|i| sockets.path().join(format!("r{i}.sock"))).collect();
    for socket in &runtime_sockets {
        directs.push(Direct::start(&exe, socket).await?.0);
    }
    sides[0].directs = Arc::new(directs);
    sides[0].start_floor(&runtime_sockets)?;
    if let Some(socket) = &args.docker_socket {
        let config = format!(
            "[factory]\nkind = \"docker\"\n[factory.docker]\nsocket = \"{}\"\n[proxy]\npause_grace = \"0s\"\n",
            socket.display()
        );
        let mut docker = Side::start("docker", &exe, &config, &http, k).await?;
        let mut directs = Vec::new();
        for socket in docker.invoker.runtime_sockets() {
            directs.push(Direct::attach(&socket).await?);
        }
        anyhow::ensure!(directs.len() == k, "{} warm Docker runtimes, expected {k}", directs.len());
        docker.directs = Arc::new(directs);
        docker.start_floor(&docker.invoker.runtime_sockets())?;
        sides.push(docker);
    }

    let mut levels = vec![1, k];
    levels.dedup();
    for &c in &levels {
        for side in &mut sides {
            // Warm both paths; then every slice alternates, so drift hits all alike.
            side.slice_direct(c, Duration::from_millis(300)).await;
            side.slice_invoker(c, Duration::from_millis(300), &http).await;
            side.slice_floor(c, Duration::from_millis(300), &http).await;
        }
        for _ in 0..args.rounds {
            for side in &mut sides {
                let direct = side.slice_direct(c, slice).await;
                side.direct.add(direct);
                let invoked = side.slice_invoker(c, slice, &http).await;
                side.invoked.add(invoked);
                let floored = side.slice_floor(c, slice, &http).await;
                side.floored.add(floored);
            }
        }
        for side in &mut sides {
            let (mut direct, mut invoked) = (std::mem::take(&mut side.direct), std::mem::take(&mut side.invoked));
            eprintln!("{} (the floor: hyper to the same runtimes, `floor.rs`):", side.name);
            let mut run = run_json(c, &mut direct, &mut invoked);
            with_floor(&mut run, &mut std::mem::take(&mut side.floored));
            side.runs.push(run);
        }
    }
    let busy_rss_kb = sides[0].invoker.rss_kb();
    let starts = cold_starts(&http, &sides[0].invoker).await?;
    eprintln!("cold starts during the warm-up and the load: {starts} (the warm-up alone needs {k})");

    // Cold starts: a fresh action through each invoker, against a fresh runtime alone.
    let mut cold_direct = Vec::new();
    for i in 0..args.cold {
        for side in &mut sides {
            side.cold_start(&http, i).await?;
        }
        let (direct, took) = Direct::start(&exe, &sockets.path().join(format!("cold{i}.sock"))).await?;
        drop(direct);
        cold_direct.push(took);
    }
    let cd = median(cold_direct);
    let ci = median(std::mem::take(&mut sides[0].cold));
    let cold_added_ms = (ci.as_secs_f64() - cd.as_secs_f64()) * 1000.0;
    eprintln!(
        "cold    invoker {:.1} ms  direct (spawn + /init + /run) {:.1} ms  added {cold_added_ms:.1} ms",
        ms(ci),
        ms(cd)
    );

    let mut docker = Value::Null;
    if let Some(side) = sides.get_mut(1) {
        let cold = median(std::mem::take(&mut side.cold));
        eprintln!("docker cold: invoke → result {:.1} ms (create, start, /init, /run)", ms(cold));
        docker = side.runs.last().cloned().unwrap_or(Value::Null);
        docker["cold_invoker_ms"] = json!(ms(cold));
        docker["runs"] = Value::Array(side.runs.clone());
    }
    let runs = sides[0].runs.clone();
    drop(sides);

    let mut memory = json!({ "idle_rss_kb": idle_rss_kb, "after_load_rss_kb": busy_rss_kb });
    eprintln!("memory  invoker idle {idle_rss_kb} kB, after the load with {k} containers {busy_rss_kb} kB");
    if args.memory {
        let kb = thousand_idle_containers(&exe).await?;
        eprintln!("memory  invoker with 1,000 idle containers (mock factory, its runtimes in-process) {kb} kB");
        memory["thousand_idle_rss_kb"] = json!(kb);
        let curve = rss_curve(&exe, &http).await?;
        for (count, kb) in &curve {
            eprintln!("memory  invoker after {count} warm activations (c={RSS_CONCURRENCY}): {kb} kB");
            memory[format!("rss_kb_{}k", count / 1000)] = json!(kb);
        }
    }

    let hop = match &args.etcd {
        Some(etcd) => Some(scheduler_hop(&exe, etcd, &http, k, slice, args.rounds).await?),
        None => None,
    };

    let fn_figures = match args.no_fn {
        true => Value::Null,
        false => fn_side::fn_side(&exe, &http, k, slice, args.rounds, args.cold, args.docker_socket.as_deref()).await?,
    };

    let mut last = runs.last().cloned().unwrap_or(Value::Null);
    if let (Value::Object(figures), Some(last)) = (fn_figures, last.as_object_mut()) {
        last.extend(figures);
    }
    if let Some(hop) = hop {
        last["sched_added_p50_us_c1"] = hop[0]["added_p50_us"].clone();
        last["sched_rps_ratio_c8"] = hop.last().map_or(Value::Null, |r| r["rps_ratio"].clone());
        last["sched_floor_added_p50_us_c1"] = hop[0]["floor_added_p50_us"].clone();
        last["sched_floor_ratio_c8"] = hop.last().map_or(Value::Null, |r| r["floor_ratio"].clone());
        last["scheduler"] = Value::Array(hop);
    }
    if let (Value::Object(by_kind), Some(last)) = (by_kind, last.as_object_mut()) {
        last.extend(by_kind);
    }
    last["cold_added_ms"] = json!((cold_added_ms * 10.0).round() / 10.0);
    last["cold_invoker_ms"] = json!(ms(ci));
    last["cold_direct_ms"] = json!(ms(cd));
    last["memory"] = memory;
    last["cold_starts_in_warm_runs"] = json!(starts.saturating_sub(k as u64));
    last["floor_added_p50_us_c1"] = runs[0]["floor_added_p50_us"].clone();
    last["invoker_added_over_floor_p50_us_c1"] = runs[0]["added_over_floor_p50_us"].clone();
    last["runs"] = Value::Array(runs);
    if !docker.is_null() {
        last["docker"] = docker;
    }
    println!("{last}");
    Ok(())
}

/// The scheduler hop: blocking invokes through a scheduler to one invoker against the same
/// invoker called directly, alternating slices at c=1 and c=k; one `run_json` per level (the
/// "direct" side is the invoker, the "invoker" side the scheduler).
/// An invoker and a scheduler in front of it, on the etcd at `etcd` (a prefix of this run's
/// own), once the scheduler sees the invoker healthy.
pub async fn invoker_and_scheduler(
    exe: &Path,
    etcd: &str,
    http: &reqwest::Client,
    name: &str,
) -> anyhow::Result<(Invoker, Invoker)> {
    let pid = std::process::id();
    let key = "0b0b0b0b-0000-4000-8000-000000000b0b:the-benchmarks-controller-secret";
    let cluster = format!(
        "[cluster]\netcd = [\"{etcd}\"]\nprefix = \"/bench{pid}{name}\"\npublish_interval = \"200ms\"\n\
         controller_key = \"{key}\"\n[admin]\ncontroller_keys = [\"{key}\"]\n[proxy]\npause_grace = \"0s\"\n"
    );
    let invoker = Invoker::start(exe, name, &cluster)?;
    let scheduler_config = format!("{cluster}[scheduler]\nid = \"bench{pid}{name}\"\n");
    let scheduler = Invoker::start_command(exe, &["scheduler"], &format!("sched-{name}"), &scheduler_config)?;
    let (user, pass) = scheduler.admin.split_once(':').unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = http.get(format!("{}/v1/invokers", scheduler.base)).basic_auth(user, Some(pass)).send().await?;
        let list: Value = r.json().await?;
        if list.as_array().is_some_and(|l| l.len() == 1 && l[0]["health"] == "healthy") {
            return Ok((invoker, scheduler));
        }
        anyhow::ensure!(Instant::now() < deadline, "the scheduler never saw its invoker: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scheduler_hop(
    exe: &Path,
    etcd: &str,
    http: &reqwest::Client,
    k: usize,
    slice: Duration,
    rounds: usize,
) -> anyhow::Result<Vec<Value>> {
    let (invoker, scheduler) = invoker_and_scheduler(exe, etcd, http, "hop").await?;
    let mut urls = Vec::new();
    for base in [&invoker.base, &scheduler.base] {
        put_action(http, base, "noop").await?;
        let url = format!("{base}/api/v1/namespaces/_/actions/noop?blocking=true&result=true");
        let warm: Vec<_> = (0..k).map(|_| invoke(http, &url, json!({"sleep": 1.0}))).collect();
        for r in futures_util::future::join_all(warm).await {
            r?;
        }
        urls.push(url);
    }
    // The hop's floor: a forwarder in front of the same invoker, and nothing else.
    let floor = FloorProcess::start(FloorKind::Forward, &[invoker.base.trim_start_matches("http://")])?;
    let floor_url = urls[0].replace(&invoker.base, &floor.base);
    let mut levels = vec![1, k];
    levels.dedup();
    let mut runs = Vec::new();
    for c in levels {
        for url in [&urls[0], &urls[1], &floor_url] {
            slice_of(http, url, c, Duration::from_millis(300)).await;
        }
        let (mut direct, mut hop, mut floored) = (Samples::default(), Samples::default(), Samples::default());
        for _ in 0..rounds {
            direct.add(slice_of(http, &urls[0], c, slice).await);
            hop.add(slice_of(http, &urls[1], c, slice).await);
            floored.add(slice_of(http, &floor_url, c, slice).await);
        }
        eprintln!(
            "scheduler hop (\"direct\": the invoker called directly; \"invoker\": through the scheduler; \
             the floor: a forwarder in front of the invoker):"
        );
        let mut run = run_json(c, &mut direct, &mut hop);
        with_floor(&mut run, &mut floored);
        runs.push(run);
    }
    Ok(runs)
}

/// Concurrency of the resident-memory curve (the tenant probe's load).
const RSS_CONCURRENCY: usize = 32;

/// A fresh invoker's resident memory after 2k, 10k, 30k, 100k and 300k blocking activations of one
/// warm action: whether it levels off or keeps growing.
async fn rss_curve(exe: &Path, http: &reqwest::Client) -> anyhow::Result<Vec<(u64, u64)>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let inv = Invoker::start(exe, "rss", "[proxy]\npause_grace = \"0s\"\n")?;
    put_action(http, &inv.base, "noop").await?;
    let url = Arc::new(inv.url("noop", "blocking=true&result=true"));
    let done = Arc::new(AtomicU64::new(0));
    let mut curve = Vec::new();
    for target in [2_000u64, 10_000, 30_000, 100_000, 300_000] {
        let workers = (0..RSS_CONCURRENCY).map(|_| {
            let (http, url, done) = (http.clone(), url.clone(), done.clone());
            tokio::spawn(async move {
                while done.fetch_add(1, Ordering::Relaxed) < target {
                    invoke(&http, &url, json!({})).await?;
                }
                anyhow::Ok(())
            })
        });
        for worker in futures_util::future::join_all(workers).await {
            worker??;
        }
        done.store(target, Ordering::Relaxed);
        curve.push((target, inv.rss_kb()));
    }
    Ok(curve)
}

/// The invoker's resident memory tracking 1,000 idle warm containers of 1,000 actions. The mock
/// factory runs each container's runtime inside the invoker, so this is an upper bound.
async fn thousand_idle_containers(exe: &Path) -> anyhow::Result<u64> {
    let config =
        "[factory]\nkind = \"mock\"\n[factory.mock]\nnode_memory_mb = 1000000\n[proxy]\npause_grace = \"0s\"\n";
    let inv = Invoker::start(exe, "memory", config)?;
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
