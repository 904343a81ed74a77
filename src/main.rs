//! `invoker`: runs the invoker on its embedded default (`config/default.toml`);
//! `invoker action-runtime` is the action runtime the process factory starts per container.

use anyhow::Context as _;
use clap::Parser;
use invoker::activation::{ActivationService, Runner};
use invoker::api::AppState;
use invoker::cluster::etcd::Etcd;
use invoker::cluster::fetch::RemoteActions;
use invoker::cluster::registry::{Identity, Registrar, RegistryError};
use invoker::config::Config;
use invoker::factory::{ContainerFactory, Epoch, Factory};
use invoker::metrics::Metrics;
use invoker::pool::actor::{ContainerPool, PoolHandle};
use invoker::runtime::RuntimeOptions;
use invoker::scheduler::presence::Presence;
use invoker::scheduler::Dispatcher;
use invoker::store::{JournaledStore, Store};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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
    /// The configuration file.
    #[arg(long, env = "INVOKER_CONFIG", default_value = "config/default.toml")]
    config: PathBuf,
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

#[derive(clap::Subcommand)]
enum Command {
    /// Run the invoker (the same as no subcommand).
    Serve(ServeArgs),
    /// Serve the OpenWhisk action runtime protocol (/init, /run) for one container.
    ActionRuntime(RuntimeOptions),
    /// Set up one process-factory container (cgroups, namespaces, root, uid), then run its
    /// runtime command; the process factory starts every runtime through it.
    Sandbox(invoker::factory::sandbox::SandboxArgs),
    /// Wait for the invoker to die (stdin closes), then remove every container it left; the
    /// process factory starts one beside itself.
    #[command(hide = true)]
    Watchdog(invoker::factory::watchdog::WatchdogArgs),
    /// Run the scheduler: the front door of the invokers registered in etcd (the same REST
    /// API, actions in its own store, each activation placed on an invoker).
    Scheduler(SchedulerArgs),
    /// Run the pool core in virtual time against a simulated cluster; prints a JSON summary.
    Simulate {
        #[arg(long)]
        scenario: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::ActionRuntime(options)) => {
            // No tracing here: the runtime's stdout and stderr are the action's logs.
            invoker::runtime::run(options)?;
            return Ok(());
        }
        Some(Command::Sandbox(args)) => {
            let error = invoker::factory::sandbox::enter(args);
            eprintln!("{error}");
            std::process::exit(126);
        }
        Some(Command::Watchdog(args)) => {
            invoker::factory::watchdog::watch(args)?;
            return Ok(());
        }
        Some(Command::Simulate { scenario }) => {
            let scenario = invoker::sim::scenario::Scenario::load(&scenario)?;
            println!("{}", invoker::sim::run(&scenario)?);
            return Ok(());
        }
        Some(Command::Serve(args)) => return serve_invoker(args),
        Some(Command::Scheduler(args)) => return serve_scheduler(args),
        None => {}
    }
    serve_invoker(cli.serve)
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
}

/// The file, then the flags both commands take, then the guest key from the environment.
fn load_config(
    file: &std::path::Path,
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    etcd: Vec<String>,
) -> anyhow::Result<Config> {
    let mut config = Config::from_file(file)?;
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
    init_tracing();
    let mut config = load_config(&cli.config, cli.listen, cli.data_dir, cli.etcd)?;
    if let Some(id) = cli.invoker_id {
        config.invoker_id = id;
    }
    if let Some(tags) = cli.tags {
        config.cluster.tags = tags;
    }
    config.validate()?;
    actix_rt::System::new().block_on(serve(config))
}

/// The admin key: the configured one, else the one generated at first start and kept in the
/// store (so that it survives restarts without being written into the config file).
fn admin_key(config: &Config, store: &dyn Store) -> anyhow::Result<String> {
    if let Some(key) = &config.admin.key {
        return Ok(key.clone());
    }
    if let Some(key) = store.get_setting("admin_key")? {
        return Ok(key);
    }
    let key = format!("{}:{}{}", uuid::Uuid::new_v4(), uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    store.put_setting("admin_key", &key)?;
    Ok(key)
}

/// The data dir, its store (activations an earlier run left unfinished get their records), the
/// admin key, and the bound listener.
async fn open(config: &mut Config, file: &str) -> anyhow::Result<(Arc<dyn Store>, tokio::net::TcpListener)> {
    std::fs::create_dir_all(&config.data_dir).with_context(|| format!("data_dir {}", config.data_dir.display()))?;
    // Traversable (a container's directory lies under it), not listable.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&config.data_dir, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("data_dir {}", config.data_dir.display()))?;
    let action_cache_bytes = usize::try_from(config.store.action_cache_mb)?.saturating_mul(1024 * 1024);
    let store = JournaledStore::open_with_cache(
        &config.data_dir.join(file),
        &config.data_dir.join("journal"),
        action_cache_bytes,
    )?;
    let recovered = store.recover_unfinished(invoker::model::epoch_ms())?;
    if recovered > 0 {
        tracing::warn!(recovered, "activations left unfinished by an earlier run got whisk-error records");
    }
    let store: Arc<dyn Store> = Arc::new(store);
    config.admin.key = Some(admin_key(config, store.as_ref())?);
    let listener = std::net::TcpListener::bind(config.listen).with_context(|| format!("listen {}", config.listen))?;
    listener.set_nonblocking(true)?;
    Ok((store, tokio::net::TcpListener::from_std(listener)?))
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

/// Stops the API (requests in flight finish), then gives whatever is still unfinished its
/// whisk-error record: the last step of both commands.
async fn stop_serving(
    stop: tokio_util::sync::CancellationToken,
    server: actix_rt::task::JoinHandle<()>,
    store: &dyn Store,
) -> anyhow::Result<()> {
    stop.cancel();
    let _ = server.await;
    let unfinished = store.recover_unfinished(invoker::model::epoch_ms())?;
    if unfinished > 0 {
        tracing::warn!(unfinished, "activations that could not finish got whisk-error records");
    }
    Ok(())
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let mut config = config;
    let (store, listener) = open(&mut config, "invoker.redb").await?;
    let addr = listener.local_addr()?;
    // Before the factory, whose start cleans up what an earlier run of this invoker id left:
    // a second invoker with a live one's id must not touch the first one's containers.
    let registrar = register(&config, addr).await?;
    let epoch = Epoch(Instant::now());
    let factory = Factory::from_config(&config, epoch, store.clone()).await?;
    tracing::info!("{}", factory.describe());
    let metrics = Arc::new(Metrics::default());
    // The HTTP front door, the pool and the proxies share this one thread: a warm activation
    // crosses no thread boundary inside the invoker. The runtimes and the actions run on the
    // other cores.
    let config = Arc::new(config);
    let pool = PoolHandle::start(
        ContainerPool::new(
            factory.clone(),
            epoch,
            config.pool.clone(),
            config.proxy.clone(),
            format!("http://{addr}"),
            config.limits.payload_max_bytes,
            metrics.clone(),
        )
        .with_protocols(config.kinds.iter().map(|(kind, k)| (kind.clone(), k.protocol)).collect())
        .with_kind_concurrency(config.action_kinds().into_iter().map(|(kind, max)| (kind.to_string(), max)).collect()),
    );
    let service = ActivationService::new(store.clone(), pool.clone(), metrics, config.limits.namespace_concurrent);
    let mut state = AppState::new(service.clone(), config.clone());
    if let (true, Some(key)) = (config.cluster.enabled(), &config.cluster.controller_key) {
        let remote = RemoteActions::new(
            Etcd::new(&config.cluster.etcd)?,
            config.cluster.prefix.clone(),
            key,
            action_cache_bytes(&config)?,
        );
        state = state.with_remote_actions(Arc::new(remote));
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let server_task = actix_rt::spawn(invoker::api::server::serve(listener, Arc::new(state), stop.clone()));
    print_keys(&config, addr);
    actix_rt::spawn(expire_records(store.clone(), config.record_retention, config.store.expire_every));
    let registration_stop = tokio_util::sync::CancellationToken::new();
    let registration = registrar.map(|r| actix_rt::spawn(r.run(service.clone(), registration_stop.clone())));

    terminated().await?;
    tracing::info!("draining: new work gets 503, running work has {:?} to finish", config.shutdown_grace);
    service.set_draining();
    if tokio::time::timeout(config.shutdown_grace, pool.drain()).await.is_err() {
        tracing::warn!("the grace period passed with work still running");
    }
    factory.destroy_all().await;
    registration_stop.cancel();
    if let Some(task) = registration {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
    }
    stop_serving(stop, server_task, store.as_ref()).await
}

fn action_cache_bytes(config: &Config) -> anyhow::Result<usize> {
    Ok(usize::try_from(config.store.action_cache_mb)?.saturating_mul(1024 * 1024))
}

fn serve_scheduler(cli: SchedulerArgs) -> anyhow::Result<()> {
    init_tracing();
    let mut config = load_config(&cli.config, cli.listen, cli.data_dir, cli.etcd)?;
    if let Some(id) = cli.scheduler_id {
        config.scheduler.id = id;
    }
    config.validate()?;
    anyhow::ensure!(config.cluster.enabled(), "the scheduler needs etcd: --etcd URL or [cluster] etcd");
    anyhow::ensure!(
        config.cluster.controller_key.is_some(),
        "the scheduler needs [cluster] controller_key, a key its invokers list in [admin] controller_keys"
    );
    actix_rt::System::new().block_on(schedule(config))
}

/// The scheduler: its store and REST API, its dispatcher reading the cluster from etcd, and its
/// own key there (claimed before it serves: a live scheduler's id is refused).
async fn schedule(mut config: Config) -> anyhow::Result<()> {
    let (store, listener) = open(&mut config, "scheduler.redb").await?;
    let addr = listener.local_addr()?;
    let cluster = &config.cluster;
    let api = cluster.advertise.clone().unwrap_or_else(|| format!("http://{addr}"));
    let mut presence =
        Presence::new(Etcd::new(&cluster.etcd)?, &cluster.prefix, &config.scheduler.id, api, cluster.lease_ttl);
    match presence.claim().await {
        Ok(()) => {}
        Err(e @ RegistryError::IdTaken { .. }) => return Err(e.into()),
        Err(e) => tracing::warn!("not registered in etcd yet: {e}; serving, and retrying"),
    }
    let key = cluster.controller_key.clone().expect("checked at start");
    let dispatcher = Arc::new(Dispatcher::new(&config, Etcd::new(&cluster.etcd)?, &key));
    let metrics = Arc::new(Metrics::default());
    let service = ActivationService::with_runner(
        store.clone(),
        Runner::Cluster(dispatcher.clone()),
        metrics,
        config.limits.namespace_concurrent,
    );
    let config = Arc::new(config);
    let state = Arc::new(AppState::new(service.clone(), config.clone()));
    let stop = tokio_util::sync::CancellationToken::new();
    let background = tokio_util::sync::CancellationToken::new();
    actix_rt::spawn(dispatcher.clone().refresh(background.clone()));
    let presence = actix_rt::spawn(presence.run(background.clone()));
    actix_rt::spawn(expire_records(store.clone(), config.record_retention, config.store.expire_every));
    let server_task = actix_rt::spawn(invoker::api::server::serve(listener, state, stop.clone()));
    print_keys(&config, addr);
    terminated().await?;
    tracing::info!("stopping: new work gets 503, work on invokers has {:?} to end", config.shutdown_grace);
    service.set_draining();
    let deadline = Instant::now() + config.shutdown_grace;
    while dispatcher.active() > 0 && Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    background.cancel();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), presence).await;
    stop_serving(stop, server_task, store.as_ref()).await
}

/// With `[cluster]` configured: takes this invoker's id in etcd (refused when a live invoker
/// holds it). An etcd that does not answer does not keep the invoker from serving: the
/// registration is retried until it does.
async fn register(config: &Config, addr: SocketAddr) -> anyhow::Result<Option<Registrar<Etcd>>> {
    let cluster = &config.cluster;
    if !cluster.enabled() {
        return Ok(None);
    }
    let identity = Identity {
        invoker_id: config.invoker_id.clone(),
        api: cluster.advertise.clone().unwrap_or_else(|| format!("http://{addr}")),
        tags: cluster.tags.clone(),
        min_mb: u64::from(config.limits.memory_min_mb),
    };
    let mut registrar = Registrar::new(Etcd::new(&cluster.etcd)?, cluster.clone(), identity);
    match registrar.claim().await {
        Ok(()) => tracing::info!(etcd = cluster.etcd.join(","), "registered in the cluster"),
        Err(e @ RegistryError::IdTaken { .. }) => return Err(e.into()),
        Err(e) => tracing::warn!("not registered in the cluster yet: {e}; serving, and retrying"),
    }
    Ok(Some(registrar))
}

/// Removes records older than `retention`, every `every`; a failure is logged and tried again
/// at the next round.
async fn expire_records(store: Arc<dyn Store>, retention: std::time::Duration, every: std::time::Duration) {
    loop {
        let cutoff = invoker::model::epoch_ms().saturating_sub(retention.as_millis() as u64);
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.expire(cutoff)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!(removed, "expired activation records"),
            Ok(Err(e)) => tracing::warn!("expiring activation records failed: {e}"),
            Err(e) => tracing::warn!("expiring activation records failed: {e}"),
        }
        tokio::time::sleep(every).await;
    }
}
