//! `invoker`: runs the invoker on its embedded default (`config/default.toml`);
//! `invoker action-runtime` is the action runtime the process factory starts per container.

use anyhow::Context as _;
use clap::Parser;
use invoker::activation::ActivationService;
use invoker::api::{configure, AppState};
use invoker::config::Config;
use invoker::factory::{Epoch, Factory};
use invoker::metrics::Metrics;
use invoker::pool::actor::{ContainerPool, PoolHandle};
use invoker::runtime::{Launcher, Listen, RuntimeOptions};
use invoker::store::{JournaledStore, Store};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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
    /// The configuration file.
    #[arg(long, env = "INVOKER_CONFIG", default_value = "config/default.toml")]
    config: PathBuf,
    /// Address to listen on (overrides the file); port 0 picks a free one.
    #[arg(long, env = "INVOKER_LISTEN")]
    listen: Option<SocketAddr>,
    /// Directory for the store and process records (overrides the file).
    #[arg(long, env = "INVOKER_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Serve the OpenWhisk action runtime protocol (/init, /run) for one container.
    ActionRuntime {
        /// ADDR:PORT or unix:PATH.
        #[arg(long)]
        listen: Listen,
        #[arg(long, value_enum)]
        launcher: Launcher,
        /// Where the action's code goes (a temporary directory when not given).
        #[arg(long, env = "INVOKER_WORK_DIR")]
        work_dir: Option<PathBuf>,
        /// Exit when this process (the invoker) dies.
        #[arg(long, env = "INVOKER_PARENT_PID")]
        parent_pid: Option<i32>,
    },
    /// Run the pool core in virtual time against a simulated cluster; prints a JSON summary.
    Simulate {
        #[arg(long)]
        scenario: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::ActionRuntime { listen, launcher, work_dir, parent_pid }) => {
            // No tracing here: the runtime's stdout and stderr are the action's logs.
            invoker::runtime::run(RuntimeOptions { listen, launcher, work_dir, parent_pid })?;
            return Ok(());
        }
        Some(Command::Simulate { scenario }) => {
            let scenario = invoker::sim::scenario::Scenario::load(&scenario)?;
            println!("{}", invoker::sim::run(&scenario)?);
            return Ok(());
        }
        None => {}
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let mut config = Config::from_file(&cli.config)?;
    if let Some(listen) = cli.listen {
        config.listen = listen;
    }
    if let Some(dir) = cli.data_dir {
        config.data_dir = dir;
    }
    if let Ok(key) = std::env::var("INVOKER_GUEST_KEY") {
        config.namespaces.insert("guest".into(), key);
    }
    config.validate()?;
    actix_web::rt::System::new().block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir).with_context(|| format!("data_dir {}", config.data_dir.display()))?;
    let store = JournaledStore::open(&config.data_dir.join("invoker.redb"), &config.data_dir.join("journal"))?;
    let recovered = store.recover_unfinished(invoker::model::epoch_ms())?;
    if recovered > 0 {
        tracing::warn!(recovered, "activations left unfinished by an earlier run got whisk-error records");
    }
    let store: Arc<dyn Store> = Arc::new(store);
    let epoch = Epoch(Instant::now());
    let factory = Factory::from_config(&config, epoch, store.clone()).await?;
    tracing::info!("{}", factory.describe());
    let metrics = Arc::new(Metrics::default());
    let listener = std::net::TcpListener::bind(config.listen).with_context(|| format!("listen {}", config.listen))?;
    let addr = listener.local_addr()?;
    // The HTTP front door, the pool and the proxies share one thread (the server's single
    // worker): a warm activation crosses no thread boundary inside the invoker. The runtimes
    // and the actions run on the other cores.
    let config = Arc::new(config);
    let service_cell: Arc<OnceLock<ActivationService>> = Arc::default();
    let (cell, cfg, store_for_workers, factory_for_workers) =
        (service_cell.clone(), config.clone(), store.clone(), factory.clone());
    let server = actix_web::HttpServer::new(move || {
        let service = cell.get_or_init(|| {
            let pool = PoolHandle::start(ContainerPool::new(
                factory_for_workers.clone(),
                epoch,
                cfg.pool.clone(),
                cfg.proxy.clone(),
                format!("http://{addr}"),
                cfg.limits.payload_max_bytes,
                metrics.clone(),
            ));
            ActivationService::new(store_for_workers.clone(), pool, metrics.clone(), cfg.limits.namespace_concurrent)
        });
        let api = configure(actix_web::web::Data::new(AppState::new(service.clone(), cfg.clone())));
        actix_web::App::new().configure(api)
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run();
    let handle = server.handle();
    if let Some(key) = config.namespaces.get("guest") {
        println!("guest auth: {key}");
    }
    println!("listening on {addr}");
    let retention = config.record_retention;
    let expiry_store = store.clone();
    actix_web::rt::spawn(async move {
        loop {
            let cutoff = invoker::model::epoch_ms().saturating_sub(retention.as_millis() as u64);
            let s = expiry_store.clone();
            let _ = tokio::task::spawn_blocking(move || s.expire(cutoff)).await;
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    });
    let server_task = actix_web::rt::spawn(server);
    let service = wait_for_service(&service_cell).await?;
    let pool = service.pool().clone();

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    tracing::info!("draining: new work gets 503, running work has {:?} to finish", config.shutdown_grace);
    service.set_draining();
    if tokio::time::timeout(config.shutdown_grace, pool.drain()).await.is_err() {
        tracing::warn!("the grace period passed with work still running");
    }
    factory.destroy_all().await;
    handle.stop(true).await;
    let _ = server_task.await;
    let unfinished = store.recover_unfinished(invoker::model::epoch_ms())?;
    if unfinished > 0 {
        tracing::warn!(unfinished, "activations that could not finish got whisk-error records");
    }
    Ok(())
}

/// The server's worker builds the service as it starts; shutdown needs it too.
async fn wait_for_service(cell: &OnceLock<ActivationService>) -> anyhow::Result<ActivationService> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(service) = cell.get() {
            return Ok(service.clone());
        }
        if Instant::now() > deadline {
            anyhow::bail!("the HTTP worker did not start within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
