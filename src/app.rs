//! One assembly: a running invoker or scheduler made from its `Config` (its store, factory,
//! pool, REST API, cluster tasks and record retention), and its orderly stop. `main.rs` and
//! the integration tests build the invoker through here, so that a test runs what a user runs.
//! Both must be called inside an actix system (the pool and its proxies are actors on it).

use crate::activation::ActivationService;
use crate::api::AppState;
use crate::cluster::fetch::RemoteActions;
use crate::cluster::registry::{Identity, Registrar};
use crate::config::Config;
use crate::factory::Factory;
use crate::pool::actor::{ContainerPool, PoolHandle};
use invoker_core::placement::PlacementConfig;
use invoker_etcd::claim::ClaimError;
use invoker_etcd::client::{Etcd, EtcdError};
use invoker_factory::contract::ContainerFactory;
use invoker_factory::contract::Epoch;
use invoker_factory::error::FactoryError;
use invoker_job::queue::{QueueBounds, QueueSettings};
use invoker_metrics::Metrics;
use invoker_scheduler::presence::Presence;
use invoker_scheduler::{Dispatcher, DispatcherSettings, SchedulerRunner};
use invoker_store::{JournalOptions, JournaledStore, Recovered, Store, StoreError};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("data_dir {path}: {source}")]
    DataDir { path: String, source: std::io::Error },
    #[error("listen {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Factory(#[from] FactoryError),
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error(transparent)]
    Registry(#[from] ClaimError),
    /// What a scheduler or a capacity manager needs and its config lacks.
    #[error("{0}")]
    Config(&'static str),
    /// A config that does not hold together (`Config::validate`): every command checks the
    /// config it assembles, whoever made it (a file, flags, a test).
    #[error(transparent)]
    Invalid(#[from] crate::config::ConfigError),
    #[error("the capacity manager's invokers directory: {0}")]
    Plane(std::io::Error),
    #[cfg(feature = "kubernetes")]
    #[error("the capacity manager's Kubernetes plane: {0}")]
    KubernetesPlane(invoker_kubernetes::KubeError),
}

/// What both commands share: the store, the API server and the record retention.
struct Serving {
    addr: SocketAddr,
    store: Arc<dyn Store>,
    state: Arc<AppState>,
    service: ActivationService,
    stop: CancellationToken,
    server: actix_rt::task::JoinHandle<()>,
    expiry: actix_rt::task::JoinHandle<()>,
}

impl Serving {
    /// Stops the API (requests in flight finish), then gives whatever is still unfinished its
    /// whisk-error record, and waits up to `within` for a full disk to take what is held in
    /// memory alone, saying what it could not write: the last step of every command.
    async fn stop(self, within: Duration) -> Result<(), AppError> {
        self.stop.cancel();
        let _ = self.server.await;
        self.expiry.abort();
        let recovered = self.store.recover_unfinished(invoker_wire::model::epoch_ms())?;
        if !recovered.guessed.is_empty() {
            tracing::warn!(
                unfinished = recovered.guessed.len(),
                "activations that could not finish got whisk-error records"
            );
        }
        if !recovered.queued.is_empty() {
            tracing::info!(queued = recovered.queued.len(), "queued calls not started are kept for the next start");
        }
        let store = self.store.clone();
        let unwritten = tokio::task::spawn_blocking(move || store.write_out(within)).await.unwrap_or_default();
        if !unwritten.is_empty() {
            tracing::error!(
                count = unwritten.len(),
                activations = %unwritten.join(","),
                "records the disk had no room for within {within:?}: lost with this stop"
            );
        }
        Ok(())
    }
}

/// A running invoker.
pub struct InvokerApp {
    serving: Serving,
    config: Arc<Config>,
    pool: PoolHandle,
    factory: Factory,
    registration: Option<(CancellationToken, actix_rt::task::JoinHandle<()>)>,
    /// Stops what follows the cluster beside the registration (the provisioned asks).
    following: CancellationToken,
}

impl InvokerApp {
    /// The invoker `config` describes, on the factory it names.
    pub async fn start(config: Config) -> Result<Self, AppError> {
        Self::start_on(config, None).await
    }

    /// The same on a factory made beforehand (a test's mock factory, whose calls it counts);
    /// `None`: the one the config names.
    pub async fn start_on(mut config: Config, factory: Option<Factory>) -> Result<Self, AppError> {
        config.validate()?;
        let Opened { store, listener, recovered } = open(&mut config, "invoker.redb")?;
        let addr = listener.local_addr().map_err(|source| AppError::Listen { addr: config.listen, source })?;
        // Before the factory, whose start cleans up what an earlier run of this invoker id left:
        // a second invoker with a live one's id must not touch the first one's containers.
        let registrar = register(&config, addr).await?;
        let epoch = Epoch(Instant::now());
        let factory = match factory {
            Some(factory) => factory,
            None => match Factory::from_config(&config, epoch, store.clone()).await {
                Ok(factory) => factory,
                Err(e) => {
                    // An invoker that does not start takes its registration with it: no
                    // scheduler may send work to an address that will not answer.
                    if let Some(registrar) = registrar {
                        registrar.release().await;
                    }
                    return Err(e.into());
                }
            },
        };
        tracing::info!("{}", factory.describe());
        let metrics = Arc::new(Metrics::default());
        // The HTTP front door, the pool and the proxies share this one thread: a warm
        // activation crosses no thread boundary inside the invoker. The runtimes and the
        // actions run on the other cores.
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
            .with_kind_concurrency(
                config.action_kinds().into_iter().map(|(kind, max)| (kind.to_string(), max)).collect(),
            ),
        );
        let runner = Arc::new(pool.clone());
        let service = ActivationService::new(store.clone(), runner, metrics, config.limits.namespace_concurrent)
            .named(&config.invoker_id)
            .with_queue(queue_settings(&config))
            .with_namespace_provisioned(config.limits.namespace_provisioned);
        service.run_retries();
        if let Err(e) = service.provision_stored().await {
            tracing::warn!("the actions' provisioned containers could not be read: {e}");
        }
        // What an earlier run left: those that started end (and are retried by their policy),
        // those never started run now, oldest first.
        for call in recovered.interrupted {
            let _ = service.interrupted(call);
        }
        for call in recovered.queued {
            service.requeue(call).await;
        }
        let mut state = AppState::new(service.clone(), config.clone()).with_pool(pool.clone());
        let following = CancellationToken::new();
        if let (true, Some(key)) = (config.cluster.enabled(), &config.cluster.controller_key) {
            let kv = Etcd::new(&config.cluster.etcd)?;
            let prefix = config.cluster.prefix.clone();
            let mine = invoker_wire::cluster::provisioned_prefix(&prefix, &config.invoker_id);
            let asks = invoker_etcd::kv::ClusterKv::mirror(&kv, &mine, following.clone());
            let remote = Arc::new(RemoteActions::new(kv, prefix.clone(), key, action_cache_bytes(&config)));
            state = state.with_remote_actions(remote.clone());
            let (id, pool, stop) = (config.invoker_id.clone(), pool.clone(), following.clone());
            actix_rt::spawn(crate::cluster::provisioned::follow(asks, prefix, id, remote, pool, stop));
        }
        let serving = serve(listener, addr, store, Arc::new(state), service.clone(), &config);
        let registration = registrar.map(|r| {
            let stop = CancellationToken::new();
            let r = match config.factory.memory_limit() {
                Some(_) => r.following_offer(factory.stats()),
                None => r,
            };
            (stop.clone(), actix_rt::spawn(r.run(service, pool.clone(), stop)))
        });
        Ok(InvokerApp { serving, config, pool, factory, registration, following })
    }

    pub fn addr(&self) -> SocketAddr {
        self.serving.addr
    }

    /// The config as it runs (with the admin key it uses).
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The REST API's state, whose `handle` answers a request in-process.
    pub fn state(&self) -> &Arc<AppState> {
        &self.serving.state
    }

    pub fn service(&self) -> &ActivationService {
        &self.serving.service
    }

    /// The invoker's pool.
    pub fn pool(&self) -> &PoolHandle {
        &self.pool
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.serving.store
    }

    pub fn factory(&self) -> &Factory {
        &self.factory
    }

    /// Drains as SIGTERM does: new work gets 503, running work has `shutdown_grace` to
    /// finish, every container is removed, what could not finish gets its record.
    pub async fn stop(self) -> Result<(), AppError> {
        let grace = self.config.shutdown_grace;
        let began = std::time::Instant::now();
        tracing::info!("draining: new work gets 503, running work has {grace:?} to finish");
        self.serving.service.set_draining();
        self.following.cancel();
        if tokio::time::timeout(grace, self.pool.drain()).await.is_err() {
            tracing::warn!("the grace period passed with work still running");
        }
        self.factory.destroy_all().await;
        if let Some((stop, task)) = self.registration {
            stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        self.serving.stop(grace.saturating_sub(began.elapsed()).max(Duration::from_secs(5))).await
    }
}

/// A running scheduler: its store and REST API, its dispatcher reading the cluster from etcd,
/// and its own key there (claimed before it serves: a live scheduler's id is refused).
pub struct SchedulerApp {
    serving: Serving,
    config: Arc<Config>,
    dispatcher: Arc<Dispatcher>,
    background: CancellationToken,
    presence: actix_rt::task::JoinHandle<()>,
    demand: actix_rt::task::JoinHandle<()>,
}

impl SchedulerApp {
    pub async fn start(mut config: Config) -> Result<Self, AppError> {
        config.validate()?;
        if !config.cluster.enabled() {
            return Err(AppError::Config("the scheduler needs etcd: --etcd URL or [cluster] etcd"));
        }
        let Some(key) = config.cluster.controller_key.clone() else {
            return Err(AppError::Config(
                "the scheduler needs [cluster] controller_key, a key its invokers list in [admin] controller_keys",
            ));
        };
        let Opened { store, recovered, listener } = open(&mut config, "scheduler.redb")?;
        let addr = listener.local_addr().map_err(|source| AppError::Listen { addr: config.listen, source })?;
        let cluster = &config.cluster;
        let api = cluster.advertise.clone().unwrap_or_else(|| format!("http://{addr}"));
        let mut presence =
            Presence::new(Etcd::new(&cluster.etcd)?, &cluster.prefix, &config.scheduler.id, api, cluster.lease_ttl);
        match presence.claim().await {
            Ok(()) => {}
            Err(e @ ClaimError::IdTaken { .. }) => return Err(e.into()),
            Err(e) => tracing::warn!("not registered in etcd yet: {e}; serving, and retrying"),
        }
        let s = &config.scheduler;
        let settings = DispatcherSettings {
            id: s.id.clone(),
            prefix: cluster.prefix.clone(),
            max_reschedules: s.max_reschedules,
            max_in_flight: s.max_in_flight,
            refresh_interval: s.refresh_interval,
            placement: PlacementConfig { managed_fraction: s.managed_fraction, blackbox_fraction: s.blackbox_fraction },
            wait_deadline: config.pool.wait_deadline,
            init_timeout: config.proxy.init_timeout,
            handover_timeout: s.handover_timeout,
            wait_for_room: s.wait_for_room,
            registration_grace: s.registration_grace.unwrap_or(cluster.lease_ttl),
        };
        let dispatcher = Arc::new(Dispatcher::new(settings, Etcd::new(&cluster.etcd)?, &key));
        let metrics = Arc::new(Metrics::default());
        let runner = Arc::new(SchedulerRunner(dispatcher.clone()));
        let service = ActivationService::new(store.clone(), runner, metrics, config.limits.namespace_concurrent)
            .named(&config.scheduler.id)
            .with_queue(queue_settings(&config))
            .with_namespace_provisioned(config.limits.namespace_provisioned);
        if let Some(keeper) = service.queue_keeper() {
            dispatcher.keep_queued_in(Arc::new(keeper));
        }
        service.run_retries();
        let config = Arc::new(config);
        let state = Arc::new(AppState::new(service.clone(), config.clone()).with_dispatcher(dispatcher.clone()));
        let background = CancellationToken::new();
        actix_rt::spawn(dispatcher.clone().refresh(background.clone()));
        // What an earlier run left: calls an invoker started have their records there (asked
        // for, as guesses are), those never handed over go to the invokers now, oldest first.
        let mut guessed = recovered.guessed;
        guessed.extend(recovered.interrupted.into_iter().filter_map(|call| service.interrupted(call)));
        for call in recovered.queued {
            service.requeue(call).await;
        }
        actix_rt::spawn(dispatcher.clone().confirm_guesses(store.clone(), guessed, background.clone()));
        let presence = actix_rt::spawn(presence.run(background.clone()));
        let cluster = &config.cluster;
        let demand = actix_rt::spawn(invoker_scheduler::demand::report(
            Etcd::new(&cluster.etcd)?,
            cluster.prefix.clone(),
            config.scheduler.id.clone(),
            cluster.lease_ttl,
            dispatcher.demand.clone(),
            background.clone(),
        ));
        if let Err(e) = service.provision_stored().await {
            tracing::warn!("the actions' provisioned containers could not be read: {e}");
        }
        actix_rt::spawn(dispatcher.clone().publish_provisioned(cluster.lease_ttl, background.clone()));
        let serving = serve(listener, addr, store, state, service, &config);
        Ok(SchedulerApp { serving, config, dispatcher, background, presence, demand })
    }

    pub fn addr(&self) -> SocketAddr {
        self.serving.addr
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// New work gets 503; work on invokers has `shutdown_grace` to end.
    pub async fn stop(self) -> Result<(), AppError> {
        let grace = self.config.shutdown_grace;
        tracing::info!("stopping: new work gets 503, work on invokers has {grace:?} to end");
        self.serving.service.set_draining();
        let deadline = Instant::now() + grace;
        while self.dispatcher.active() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.background.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.presence).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.demand).await;
        self.serving.stop(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(5))).await
    }
}

/// A running capacity manager (`invoker capacity`): the manager, leading or standby, and its
/// small API.
pub struct CapacityApp {
    addr: SocketAddr,
    config: Arc<Config>,
    stop: CancellationToken,
    manager: actix_rt::task::JoinHandle<()>,
    api: actix_rt::task::JoinHandle<()>,
}

impl CapacityApp {
    pub async fn start(mut config: Config) -> Result<Self, AppError> {
        config.validate()?;
        use invoker_capacity::plane::{local::LocalPlane, AnyPlane};
        if !config.cluster.enabled() {
            return Err(AppError::Config("the capacity manager needs etcd: --etcd URL or [cluster] etcd"));
        }
        if config.capacity.groups.is_empty() {
            return Err(AppError::Config("the capacity manager needs at least one [capacity.groups.<name>]"));
        }
        let Some(config_file) = config.source.clone() else {
            return Err(AppError::Config("the capacity manager starts its invokers with its own config file"));
        };
        // No store: managers of one machine may share a data dir (a standby adopts the
        // invokers the active one started), so the admin key is a file of its own.
        let data_dir = |source| AppError::DataDir { path: config.data_dir.display().to_string(), source };
        std::fs::create_dir_all(&config.data_dir).map_err(data_dir)?;
        if config.admin.key.is_none() {
            config.admin.key = Some(shared_admin_key(&config.data_dir.join("admin_key")).map_err(data_dir)?);
        }
        let listener = bind(&config)?;
        let addr = listener.local_addr().map_err(|source| AppError::Listen { addr: config.listen, source })?;
        let exe = std::env::current_exe().map_err(AppError::Plane)?;
        // An invoker stopped has its shutdown grace to drain, and a little more to exit.
        let stop_grace = config.shutdown_grace + Duration::from_secs(15);
        let cluster = &config.cluster;
        let (plane, lead, newest_only, standby) = match config.capacity.groups.values().next().map(|g| g.control_plane)
        {
            #[cfg(feature = "kubernetes")]
            Some(invoker_core::capacity::ControlPlaneKind::Kubernetes) => {
                let plane = invoker_kubernetes::plane::KubernetesPlane::new(
                    config.capacity.kubernetes.clone(),
                    cluster.etcd.clone(),
                    config.capacity.groups.clone(),
                )
                .await
                .map_err(AppError::KubernetesPlane)?;
                // A pod is scheduled, its image pulled and its invoker started: seconds; a standby
                // pod is grown in a fraction of one.
                let lead = plane.lead();
                // A StatefulSet gives back only its highest pod; with standby pods, any one
                // shrinks back in place.
                let newest_only = plane.standby() == 0;
                (AnyPlane::Kubernetes(Box::new(plane)), lead, newest_only, !newest_only)
            }
            // Local (a build without a plane a group names was refused by the config's checks).
            _ => {
                let plane =
                    LocalPlane::new(exe, config_file, cluster.etcd.clone(), config.data_dir.clone(), stop_grace)
                        .map_err(AppError::Plane)?;
                (AnyPlane::Local(plane), invoker_capacity::plane::local::LEAD, false, false)
            }
        };
        let api = cluster.advertise.clone().unwrap_or_else(|| format!("http://{addr}"));
        let settings = invoker_capacity::manager::ManagerSettings {
            prefix: cluster.prefix.clone(),
            tick: config.capacity.tick,
            groups: config.capacity.groups.clone(),
            publish_interval: cluster.publish_interval,
            lease_ttl: cluster.lease_ttl,
            api,
            lead,
            newest_only,
            standby,
        };
        let manager = invoker_capacity::manager::Manager::new(Etcd::new(&cluster.etcd)?, settings, plane);
        let admin = config.admin.key.clone().unwrap_or_default();
        let http = invoker_capacity::http::CapacityApi::new(&admin, manager.status.clone(), manager.metrics.clone());
        let stop = CancellationToken::new();
        let manager = actix_rt::spawn(manager.run(stop.clone()));
        let api = actix_rt::spawn(http.serve(listener, stop.clone()));
        Ok(CapacityApp { addr, config: Arc::new(config), stop, manager, api })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Steps down (the lease is revoked: a standby takes over at once); the invokers go on
    /// serving, and a manager started again adopts them.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.manager).await;
        let _ = self.api.await;
    }
}

/// The data dir, its store (activations an earlier run left unfinished get their records), the
/// admin key, and the bound listener.
/// What [`open`] gives: the store, the activations an earlier run left unfinished (now recorded
/// as guesses), and the listener.
/// The durable queue's bounds and default policy, as `[queue]` sets them.
fn queue_settings(config: &Config) -> QueueSettings {
    let queue = &config.queue;
    QueueSettings {
        bounds: QueueBounds {
            max_calls: queue.max_calls,
            max_calls_per_namespace: queue.max_calls_per_namespace,
            max_bytes: queue.max_mb.saturating_mul(1024 * 1024),
        },
        max_event_age: queue.max_event_age,
        max_retry_attempts: queue.max_retry_attempts,
        retry_backoff: queue.retry_backoff,
    }
}

struct Opened {
    store: Arc<dyn Store>,
    recovered: Recovered,
    listener: tokio::net::TcpListener,
}

fn open(config: &mut Config, file: &str) -> Result<Opened, AppError> {
    let data_dir = |source| AppError::DataDir { path: config.data_dir.display().to_string(), source };
    std::fs::create_dir_all(&config.data_dir).map_err(data_dir)?;
    // Traversable (a container's directory lies under it), not listable.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&config.data_dir, std::fs::Permissions::from_mode(0o711)).map_err(data_dir)?;
    let options = JournalOptions {
        action_cache_bytes: action_cache_bytes(config),
        end_reserve_bytes: config.store.end_reserve_mb.saturating_mul(1024 * 1024),
    };
    let store = JournaledStore::open_with(&config.data_dir.join(file), &config.data_dir.join("journal"), options)?;
    let recovered = store.recover_unfinished(invoker_wire::model::epoch_ms())?;
    if !recovered.guessed.is_empty() {
        tracing::warn!(
            recovered = recovered.guessed.len(),
            "activations left unfinished by an earlier run got whisk-error records, written as guesses"
        );
    }
    if !recovered.queued.is_empty() {
        tracing::info!(queued = recovered.queued.len(), "queued calls an earlier run did not start are run now");
    }
    let store: Arc<dyn Store> = Arc::new(store);
    config.admin.key = Some(admin_key(config, store.as_ref())?);
    Ok(Opened { store, recovered, listener: bind(config)? })
}

/// The listener on `config.listen`.
fn bind(config: &Config) -> Result<tokio::net::TcpListener, AppError> {
    let listen = |source| AppError::Listen { addr: config.listen, source };
    let listener = std::net::TcpListener::bind(config.listen).map_err(listen)?;
    listener.set_nonblocking(true).map_err(listen)?;
    tokio::net::TcpListener::from_std(listener).map_err(listen)
}

/// A fresh admin key (`uuid:secret`, as OpenWhisk's keys).
fn new_admin_key() -> String {
    format!("{}:{}{}", uuid::Uuid::new_v4(), uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// The admin key: the configured one, else the one generated at first start and kept in the
/// store (so that it survives restarts without being written into the config file).
fn admin_key(config: &Config, store: &dyn Store) -> Result<String, StoreError> {
    if let Some(key) = &config.admin.key {
        return Ok(key.clone());
    }
    if let Some(key) = store.get_setting("admin_key")? {
        return Ok(key);
    }
    let key = new_admin_key();
    store.put_setting("admin_key", &key)?;
    Ok(key)
}

/// The key in `path`, or a new one written there (readable by its owner only) if there is
/// none; two processes starting at once read the one that was written first.
fn shared_admin_key(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let key = new_admin_key();
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(mut file) => {
            file.write_all(key.as_bytes())?;
            file.sync_all()?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let held = std::fs::read_to_string(path)?;
                if held.contains(':') || Instant::now() > deadline {
                    return Ok(held.trim().to_string());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Err(e) => Err(e),
    }
}

fn action_cache_bytes(config: &Config) -> usize {
    usize::try_from(config.store.action_cache_mb).unwrap_or(usize::MAX).saturating_mul(1024 * 1024)
}

/// The REST API on `listener`, and the record retention.
fn serve(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    store: Arc<dyn Store>,
    state: Arc<AppState>,
    service: ActivationService,
    config: &Config,
) -> Serving {
    let stop = CancellationToken::new();
    let server = actix_rt::spawn(crate::api::server::serve(listener, state.clone(), stop.clone()));
    let expiry = actix_rt::spawn(expire_records(store.clone(), config.record_retention, config.store.expire_every));
    Serving { addr, store, state, service, stop, server, expiry }
}

/// With `[cluster]` configured: takes this invoker's id in etcd (refused when a live invoker
/// holds it). An etcd that does not answer does not keep the invoker from serving: the
/// registration is retried until it does.
async fn register(config: &Config, addr: SocketAddr) -> Result<Option<Registrar<Etcd>>, AppError> {
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
    let mut registrar = Registrar::new(Etcd::new(&cluster.etcd)?, cluster.clone(), identity)
        .with_drain_file(config.data_dir.join("operator-drain"));
    // A standby pod's invoker offers nothing: it claims its id when its pod is grown.
    let standing_by = config
        .factory
        .memory_limit()
        .is_some_and(|(file, own_mb)| invoker_process::memory_limit::read(file, own_mb).is_ok_and(|mb| mb == Some(0)));
    if standing_by {
        tracing::info!(
            "standing by: the pod's memory limit leaves nothing for actions; out of the cluster until it grows"
        );
        return Ok(Some(registrar));
    }
    match registrar.claim().await {
        Ok(()) => tracing::info!(etcd = cluster.etcd.join(","), "registered in the cluster"),
        Err(e @ ClaimError::IdTaken { .. }) => return Err(e.into()),
        Err(e) => tracing::warn!("not registered in the cluster yet: {e}; serving, and retrying"),
    }
    Ok(Some(registrar))
}

/// Removes records older than `retention`, every `every`; a failure is logged and tried again
/// at the next round.
async fn expire_records(store: Arc<dyn Store>, retention: Duration, every: Duration) {
    loop {
        let cutoff = invoker_wire::model::epoch_ms().saturating_sub(retention.as_millis() as u64);
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
