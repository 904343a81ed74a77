//! `invoker`: runs the invoker on its embedded default (`config/default.toml`);
//! `invoker action-runtime` is the action runtime the process factory starts per container.

use clap::Parser;
use invoker::app::{InvokerApp, SchedulerApp};
use invoker::config::Config;
use invoker_runtime::RuntimeOptions;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A warm activation allocates about 180 times (HTTP, JSON, the record): mimalloc's per-thread
/// free lists cost a fraction of glibc malloc's bins on that path (see BENCHMARKS.md). Without
/// transparent huge pages (`no_thp`): with them, each thread's heap took a 2 MiB page.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    version,
    about = "A serverless invoker speaking OpenWhisk's protocols",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// Running the invoker: `invoker [FLAGS]`, or `invoker serve [FLAGS]`.
#[derive(clap::Args)]
struct ServeArgs {
    /// The configuration file. Without one: `config/default.toml` in the current directory (a
    /// checkout), else the same file compiled into the binary, with its data in
    /// `$XDG_DATA_HOME/invoker/data` (`~/.local/share/invoker/data`).
    #[arg(long, env = "INVOKER_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (overrides the file); port 0 picks a free one.
    #[arg(long, env = "INVOKER_LISTEN")]
    listen: Option<SocketAddr>,
    /// Directory for the store and process records (overrides the file).
    #[arg(long, env = "INVOKER_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// This invoker's id, unique in its cluster (overrides the file).
    #[arg(long, env = "INVOKER_ID")]
    invoker_id: Option<String>,
    /// etcd client URLs, comma-separated: register in that cluster (overrides `[cluster] etcd`).
    #[arg(long, env = "INVOKER_ETCD", value_delimiter = ',')]
    etcd: Vec<String>,
    /// What this invoker offers, comma-separated (overrides `[cluster] tags`).
    #[arg(long, value_delimiter = ',')]
    tags: Option<Vec<String>>,
    /// The memory this invoker offers to actions, in MB (overrides the process factory's
    /// `user_memory_mb`, or the mock factory's `node_memory_mb`); the capacity manager sets it.
    #[arg(long)]
    memory_mb: Option<u64>,
    /// Offer instead what this memory limit leaves beyond `--own-memory-mb` (the process
    /// factory's `memory_limit_file`: a pod's `/sys/fs/cgroup/memory.max`, which Kubernetes
    /// changes when it resizes the pod), read again every 100 ms.
    #[arg(long)]
    memory_limit_file: Option<PathBuf>,
    /// The invoker's own share of `--memory-limit-file`, in MB.
    #[arg(long, default_value_t = 0, requires = "memory_limit_file")]
    own_memory_mb: u64,
}

/// Running the scheduler: `invoker scheduler --etcd URL [FLAGS]`.
#[derive(clap::Args)]
struct SchedulerArgs {
    /// The configuration file (`config/cluster.toml` for a one-machine cluster).
    #[arg(long, env = "INVOKER_CONFIG", default_value = "config/cluster.toml")]
    config: PathBuf,
    /// Address to listen on (overrides the file); port 0 picks a free one.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Directory for the scheduler's store (overrides the file).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// etcd client URLs, comma-separated (overrides `[cluster] etcd`).
    #[arg(long, env = "INVOKER_ETCD", value_delimiter = ',')]
    etcd: Vec<String>,
    /// This scheduler's id, unique among the schedulers of one etcd (overrides `[scheduler] id`).
    #[arg(long)]
    scheduler_id: Option<String>,
}

#[derive(clap::Args)]
struct CapacityArgs {
    #[arg(long, env = "INVOKER_CONFIG", default_value = "config/cluster.toml")]
    config: PathBuf,
    /// Address to listen on (`GET /v1/capacity`, `/metrics`); port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:3234")]
    listen: SocketAddr,
    /// Directory for the manager's key and its invokers' data, logs and pid files.
    #[arg(long, default_value = "data/capacity")]
    data_dir: PathBuf,
    /// etcd client URLs, comma-separated (overrides `[cluster] etcd`).
    #[arg(long, env = "INVOKER_ETCD", value_delimiter = ',')]
    etcd: Vec<String>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Run the invoker (the same as no subcommand).
    Serve(ServeArgs),
    /// Serve the OpenWhisk action runtime protocol (/init, /run) for one container.
    ActionRuntime(RuntimeOptions),
    /// Set up one process-factory container (cgroups, namespaces, root, uid), then run its
    /// runtime command; the process factory starts every runtime through it.
    Sandbox(invoker_process::sandbox::SandboxArgs),
    /// Wait for the invoker to die (stdin closes), then remove every container it left; the
    /// process factory starts one beside itself.
    #[command(hide = true)]
    Watchdog(invoker_process::watchdog::WatchdogArgs),
    /// Fork each process-factory container's sandbox on the invoker's request (its stdin the
    /// invoker's socket); the process factory starts one beside itself.
    #[command(hide = true)]
    SandboxServer(invoker_process::sandbox_fork::ServerArgs),
    /// Run the scheduler: the front door of the invokers registered in etcd (the same REST
    /// API, actions in its own store, each activation placed on an invoker).
    Scheduler(SchedulerArgs),
    /// Run the capacity manager: invoker groups sized to the demand the schedulers report
    /// (`[capacity]`), one active manager per cluster.
    Capacity(CapacityArgs),
    /// Offer an Fn function's unix socket on TCP, from a container beside it in its pod (the
    /// Kubernetes factory's Fn pods); listens once the function is ready.
    FnBridge(invoker::factory::fn_bridge::FnBridgeArgs),
    /// Replay a trace's calls through a live cluster on this machine (etcd, a scheduler, the
    /// capacity manager and its invokers), compressed in time, and print what happened beside
    /// what the simulator says of the same calls.
    Replay(invoker_replay::ReplayArgs),
    /// Run the pool core in virtual time against a simulated cluster; prints a JSON summary.
    Simulate {
        #[arg(long)]
        scenario: PathBuf,
        /// Only one half of a trace's functions (`a` or `b`, split by a hash of their names).
        #[arg(long)]
        half: Option<invoker_core::sim::scenario::Half>,
        /// A trace's calls this many times over (a stress of its rates).
        #[arg(long)]
        rate: Option<u32>,
        /// The scenario's seed instead of its own (the instants drawn within each minute).
        #[arg(long)]
        seed: Option<u64>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::ActionRuntime(options)) => {
            // No tracing here: the runtime's stdout and stderr are the action's logs.
            invoker_runtime::run(options)?;
            return Ok(());
        }
        Some(Command::Sandbox(args)) => {
            let error = invoker_process::sandbox::enter(args, None, None);
            eprintln!("{error}");
            std::process::exit(126);
        }
        Some(Command::SandboxServer(args)) => {
            use std::os::fd::AsFd as _;
            let control = std::io::stdin().as_fd().try_clone_to_owned()?;
            invoker_process::sandbox_fork::serve(control, &args.pid_dir)?;
            return Ok(());
        }
        Some(Command::Watchdog(args)) => {
            invoker_process::watchdog::watch(args)?;
            return Ok(());
        }
        Some(Command::FnBridge(args)) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            if let Err(e) = runtime.block_on(invoker::factory::fn_bridge::run(args)) {
                // The last line: the pod's termination message says why.
                eprintln!("Error: {e}");
                std::process::exit(1);
            }
            return Ok(());
        }
        Some(Command::Simulate { scenario, half, rate, seed }) => {
            let mut scenario = invoker::sim::load(&scenario)?;
            if let Some(half) = half {
                scenario.only_half(half);
            }
            if let Some(rate) = rate {
                scenario.rate_times(rate);
            }
            if let Some(seed) = seed {
                scenario.seed = seed;
            }
            println!("{}", invoker::sim::run(&scenario)?);
            return Ok(());
        }
        Some(Command::Replay(args)) => {
            let scenario = invoker::sim::load(&args.scenario)?;
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let host = invoker::sim::Machine::default();
            let verdict = runtime.block_on(invoker_replay::replay(&args, scenario, &host))?;
            println!("{verdict}");
            return Ok(());
        }
        Some(Command::Serve(args)) => return serve_invoker(args),
        Some(Command::Scheduler(args)) => return serve_scheduler(args),
        Some(Command::Capacity(args)) => return serve_capacity(args),
        None => {}
    }
    serve_invoker(cli.serve)
}

/// Log lines, and traces when `[tracing]` or the `OTEL_*` variables say where; the guard
/// flushes the last spans when dropped, after the runtime has stopped.
fn init_tracing(config: &Config, service: &str) -> anyhow::Result<invoker_telemetry::Telemetry> {
    let telemetry = invoker_telemetry::Telemetry::init(&config.tracing.settings(), service)?;
    raise_open_files();
    Ok(telemetry)
}

/// Every container holds a few descriptors of the invoker's (its pipes, sockets, locks): with
/// a soft limit of 1,024 a few hundred containers would exhaust it. The hard limit is what the
/// operator allows; the soft one is raised to it (containers get their own bound, see
/// `sandbox::CONTAINER_OPEN_FILES`).
fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "raised the soft limit of open files"),
            Err(e) => tracing::warn!(soft, hard, "the soft limit of open files could not be raised: {e}"),
        },
        Ok((soft, _)) => tracing::info!(open_files = soft, "the limit of open files"),
        Err(e) => tracing::warn!("the limit of open files could not be read: {e}"),
    }
}

/// The embedded default (`config/default.toml` as this binary was built with it).
const EMBEDDED_DEFAULT: &str = include_str!("../config/default.toml");

/// The invoker's configuration when none is named: `config/default.toml` where a checkout has
/// it, else the embedded default, whose relative `data_dir` goes under the user's data
/// directory rather than wherever the command was started.
fn load_default_config(
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    etcd: Vec<String>,
) -> anyhow::Result<Config> {
    let in_checkout = std::path::Path::new("config/default.toml");
    if in_checkout.exists() {
        return load_config(in_checkout, listen, data_dir, etcd);
    }
    let mut config = Config::from_toml(EMBEDDED_DEFAULT)?;
    if config.data_dir.is_relative() {
        let base = std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share")))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no config file, and neither XDG_DATA_HOME nor HOME to keep data in: pass --config or --data-dir"
                )
            })?;
        config.data_dir = base.join("invoker").join(&config.data_dir);
    }
    apply_flags(config, listen, data_dir, etcd)
}

/// The file, then the flags both commands take, then the guest key from the environment.
fn load_config(
    file: &std::path::Path,
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    etcd: Vec<String>,
) -> anyhow::Result<Config> {
    apply_flags(Config::from_file(file)?, listen, data_dir, etcd)
}

fn apply_flags(
    mut config: Config,
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    etcd: Vec<String>,
) -> anyhow::Result<Config> {
    if let Some(listen) = listen {
        config.listen = listen;
    }
    if let Some(dir) = data_dir {
        config.data_dir = dir;
    }
    if !etcd.is_empty() {
        config.cluster.etcd = etcd;
    }
    if let Ok(key) = std::env::var("INVOKER_GUEST_KEY") {
        config.namespaces.insert("guest".into(), key);
    }
    Ok(config)
}

fn serve_invoker(cli: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &cli.config {
        Some(file) => load_config(file, cli.listen, cli.data_dir, cli.etcd)?,
        None => load_default_config(cli.listen, cli.data_dir, cli.etcd)?,
    };
    let _telemetry = init_tracing(&config, "invoker")?;
    if let Some(id) = cli.invoker_id {
        config.invoker_id = id;
    }
    if let Some(tags) = cli.tags {
        // `--tags=` is none.
        config.cluster.tags = tags.into_iter().filter(|t| !t.is_empty()).collect();
    }
    if let Some(mb) = cli.memory_mb {
        config.factory.set_memory_mb(mb)?;
    }
    if let Some(file) = cli.memory_limit_file {
        config.factory.follow_memory_limit(file, cli.own_memory_mb)?;
    }
    actix_rt::System::new().block_on(async {
        let app = InvokerApp::start(config).await?;
        print_keys(app.config(), app.addr());
        terminated().await?;
        Ok(app.stop().await?)
    })
}

fn print_keys(config: &Config, addr: SocketAddr) {
    if let Some(key) = config.namespaces.get("guest") {
        println!("guest auth: {key}");
    }
    if let Some(key) = &config.admin.key {
        println!("admin auth: {key}");
    }
    println!("listening on {addr}");
}

async fn terminated() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    Ok(())
}

fn serve_scheduler(cli: SchedulerArgs) -> anyhow::Result<()> {
    let mut config = load_config(&cli.config, cli.listen, cli.data_dir, cli.etcd)?;
    let _telemetry = init_tracing(&config, "invoker-scheduler")?;
    if let Some(id) = cli.scheduler_id {
        config.scheduler.id = id;
    }
    actix_rt::System::new().block_on(async {
        let app = SchedulerApp::start(config).await?;
        print_keys(app.config(), app.addr());
        terminated().await?;
        Ok(app.stop().await?)
    })
}

fn serve_capacity(cli: CapacityArgs) -> anyhow::Result<()> {
    let config = load_config(&cli.config, Some(cli.listen), Some(cli.data_dir), cli.etcd)?;
    let _telemetry = init_tracing(&config, "invoker-capacity")?;
    actix_rt::System::new().block_on(async {
        let app = invoker::app::CapacityApp::start(config).await?;
        if let Some(key) = &app.config().admin.key {
            println!("admin auth: {key}");
        }
        println!("listening on {}", app.addr());
        terminated().await?;
        app.stop().await;
        Ok(())
    })
}
