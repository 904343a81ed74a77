//! Configuration: one TOML file per deployment shape (`config/default.toml` for the embedded
//! default), flags and a few environment variables on top. Every key is validated at start-up;
//! an error names the key and the reason.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// OpenWhisk's well-known key for the local `guest` namespace, so its tools work unchanged.
pub const GUEST_KEY: &str =
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";

#[derive(Debug, thiserror::Error)]
#[error("config {key}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError { key: key.to_string(), reason: reason.into() }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Labels every container and process this invoker creates; scopes clean-up after a crash.
    pub invoker_id: String,
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Namespace → API key (`uuid:secret`), checked with basic auth.
    pub namespaces: BTreeMap<String, String>,
    pub admin: AdminConfig,
    pub limits: LimitsConfig,
    pub pool: PoolConfig,
    pub proxy: ProxyConfig,
    pub factory: FactoryConfig,
    /// Action kind → the runtime command that serves it.
    pub kinds: BTreeMap<String, KindConfig>,
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Activation records are removed once they started this long ago (checked every
    /// `store.expire_every`).
    #[serde(with = "humantime_serde")]
    pub record_retention: Duration,
    pub store: StoreConfig,
    /// The file this was read from: hidden from action containers.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `[store]`: the embedded store's bounds.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Memory for the actions read on every invoke, kept whole (code included); the least
    /// recently used go first.
    pub action_cache_mb: u64,
    /// How often records older than `record_retention` are removed.
    #[serde(with = "humantime_serde")]
    pub expire_every: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            action_cache_mb: (crate::store::DEFAULT_ACTION_CACHE_BYTES / (1024 * 1024)) as u64,
            expire_every: Duration::from_secs(3600),
        }
    }
}

/// `[admin]`: the keys that are not a namespace's.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The key of the admin routes (`/v1/pool`, `/metrics`, `/health`'s details), `uuid:secret`.
    /// When unset, one is generated at first start and kept in the store.
    pub key: Option<String>,
    /// Keys that may submit an `ActivationMessage` for any namespace and subject through the
    /// shim (a controller, the cluster's scheduler). Every other key submits only for its own.
    pub controller_keys: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub memory_min_mb: u32,
    pub memory_max_mb: u32,
    pub memory_default_mb: u32,
    pub timeout_min_ms: u64,
    pub timeout_max_ms: u64,
    pub timeout_default_ms: u64,
    pub logs_max_mb: u32,
    pub logs_default_mb: u32,
    pub concurrency_max: u32,
    pub concurrency_default: u32,
    /// Largest request body (parameters, action code) accepted.
    pub payload_max_bytes: usize,
    pub code_max_bytes: usize,
    /// Activations one namespace may have in flight; more get 429.
    pub namespace_concurrent: u32,
    /// How long a blocking invoke waits before answering 202 (OpenWhisk: 60 s).
    #[serde(with = "humantime_serde")]
    pub blocking_wait: Duration,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    pub max_starts_per_action: u32,
    pub max_starts_per_node: u32,
    pub max_waiting: usize,
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// How long a job may wait for a container before it gets 503.
    #[serde(with = "humantime_serde")]
    pub wait_deadline: Duration,
    #[serde(with = "humantime_serde")]
    pub stats_ttl: Duration,
    pub buffer_mb: u64,
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// `capped` (ours); `one_each` and `first_up` are the rules of OpenWhisk and Fn, for
    /// comparisons in the simulator.
    pub start_rule: crate::pool::core::StartRule,
    /// Stem containers kept started per (kind, memory), adopted by actions that would start cold.
    pub prewarm: Vec<PrewarmConfig>,
    /// An action that waited this long for room claims a node (others make way for it).
    #[serde(with = "humantime_serde")]
    pub claim_after: Duration,
}

/// `[[pool.prewarm]]`: keep `count` containers of `kind` with `memory_mb` started and
/// uninitialised; with `reactive`, the count follows recent cold starts within min..=max.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PrewarmConfig {
    pub kind: String,
    pub memory_mb: u32,
    #[serde(default)]
    pub count: u32,
    #[serde(default)]
    pub reactive: Option<ReactivePrewarmConfig>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReactivePrewarmConfig {
    pub min: u32,
    pub max: u32,
    /// Cold starts in one window that add `increment` containers.
    #[serde(default = "one")]
    pub threshold: u32,
    #[serde(default = "one")]
    pub increment: u32,
    #[serde(with = "humantime_serde", default = "one_minute")]
    pub window: Duration,
}

fn one() -> u32 {
    1
}

fn one_minute() -> Duration {
    Duration::from_secs(60)
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Bound on `/init` (code download, compilation, imports).
    #[serde(with = "humantime_serde")]
    pub init_timeout: Duration,
    /// Bound on waiting for the log sentinels after a run.
    #[serde(with = "humantime_serde")]
    pub log_sentinel_wait: Duration,
    /// An idle container is paused (frozen) after this long without a run, and resumed on the
    /// next; "0s" never pauses.
    #[serde(with = "humantime_serde")]
    pub pause_grace: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FactoryKind {
    Process,
    Mock,
    Docker,
    Mesos,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FactoryConfig {
    pub kind: FactoryKind,
    pub process: ProcessFactoryConfig,
    pub mock: MockFactoryConfig,
    pub docker: DockerFactoryConfig,
    pub mesos: MesosFactoryConfig,
}

/// The Mesos factory: action containers as tasks of a framework, through the v1 scheduler
/// HTTP API; resource offers are the node stats.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MesosFactoryConfig {
    /// A master's address, `http://host:port`; a master that is not the leader redirects.
    pub master: String,
    pub framework_name: String,
    /// The user tasks run as on the agents.
    pub user: String,
    /// How long the master keeps the framework's tasks after the invoker disconnects; a
    /// restarted invoker re-subscribes as the same framework within it.
    #[serde(with = "humantime_serde")]
    pub failover_timeout: Duration,
    /// Declined resources are not offered to the framework again for this long.
    #[serde(with = "humantime_serde")]
    pub refuse: Duration,
    /// An unused offer is held (as free memory of its agent) this long, then declined.
    #[serde(with = "humantime_serde")]
    pub offer_hold: Duration,
    /// With nothing to launch and no work waiting for this long, the framework suppresses offers.
    #[serde(with = "humantime_serde")]
    pub suppress_after: Duration,
    /// A task must be running within this (waiting for an offer included).
    #[serde(with = "humantime_serde")]
    pub launch_timeout: Duration,
    /// A killed task counts as gone after this even without TASK_KILLED.
    #[serde(with = "humantime_serde")]
    pub kill_timeout: Duration,
    /// Bound on one call to the master (the event stream has none).
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// Heartbeats missed before the invoker subscribes again.
    pub heartbeat_misses: u32,
    /// CPUs a task gets per GB of its memory.
    pub cpus_per_gb: f64,
    /// The memory each agent has for actions, where offers do not show it whole (an agent's
    /// resources split over several offers, or other frameworks holding part). Without it an
    /// agent's capacity is the most it was seen to offer plus the invoker's own tasks there, and
    /// an action larger than that is rejected as never fitting.
    pub agent_capacity_mb: Option<u64>,
    /// The address the runtime of a task listens on, on its agent (with the port the offer gave).
    pub listen_host: String,
    /// The invoker binary on the agents, for the runtime command of `[kinds]`; by default the
    /// path of this binary.
    pub agent_invoker: Option<PathBuf>,
    /// Kinds run through the Docker containerizer, with their image (the others run the
    /// `[kinds]` command with the Mesos containerizer).
    pub images: BTreeMap<String, String>,
}

impl Default for MesosFactoryConfig {
    fn default() -> Self {
        MesosFactoryConfig {
            master: "http://127.0.0.1:5050".into(),
            framework_name: "invoker".into(),
            user: "nobody".into(),
            failover_timeout: Duration::from_secs(7 * 24 * 3600),
            refuse: Duration::from_secs(5),
            offer_hold: Duration::from_secs(10),
            suppress_after: Duration::from_secs(60),
            launch_timeout: Duration::from_secs(60),
            kill_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(10),
            heartbeat_misses: 5,
            cpus_per_gb: 1.0,
            agent_capacity_mb: None,
            listen_host: "0.0.0.0".into(),
            agent_invoker: None,
            images: BTreeMap::new(),
        }
    }
}

/// The Docker factory: one container per action container, on one Docker Engine.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DockerFactoryConfig {
    /// The engine's unix socket (what `scripts/dockerd.sh` prints).
    pub socket: PathBuf,
    /// `none`: no network; the runtime listens on a unix socket in a directory bind-mounted
    /// from `data_dir` (Fn's design). `host`: the host's network; the runtime listens on a free
    /// 127.0.0.1 port.
    pub network: Network,
    /// Memory of the host kept for everything but action containers.
    pub reserve_mb: u64,
    /// The user action containers run as (never root).
    pub user: String,
    pub pids_limit: i64,
    /// Size of the writable tmpfs at /tmp (the root filesystem is read-only).
    pub tmpfs_mb: u32,
    /// Container creations in flight on the engine at most (engines fall over under many).
    pub max_concurrent_creates: usize,
    /// Bound on a created container's runtime answering.
    #[serde(with = "humantime_serde")]
    pub ready_timeout: Duration,
    /// Action kind → the image and command that serve it.
    pub kinds: BTreeMap<String, DockerKindConfig>,
}

/// What network an action container has, on every factory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Its own network namespace with nothing but loopback.
    #[default]
    None,
    /// The host's network.
    Host,
}

/// The protocol a kind's runtime speaks; one file per protocol in `proxy::protocol`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeProtocol {
    /// OpenWhisk's action runtime protocol: `POST /init` once, `POST /run` per activation.
    #[default]
    OpenWhisk,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DockerKindConfig {
    pub image: String,
    /// The runtime's command inside the image, `{listen}` substituted (`unix:PATH` or
    /// `ADDR:PORT`); empty runs the image's own entry point.
    #[serde(default)]
    pub command: Vec<String>,
}

impl Default for DockerFactoryConfig {
    fn default() -> Self {
        let kind = |image: &str, launcher: &str| DockerKindConfig {
            image: image.into(),
            command: ["/invoker", "action-runtime", "--listen", "{listen}", "--launcher", launcher]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        DockerFactoryConfig {
            socket: PathBuf::from("/run/invoker-docker/docker.sock"),
            network: Network::None,
            reserve_mb: 1024,
            user: "65534:65534".into(),
            pids_limit: 256,
            tmpfs_mb: 64,
            max_concurrent_creates: 4,
            ready_timeout: Duration::from_secs(30),
            kinds: BTreeMap::from([
                ("python:3".to_string(), kind("invoker-python:latest", "python")),
                ("native".to_string(), kind("invoker-native:latest", "native")),
            ]),
        }
    }
}

/// The mock factory (for tests and benchmarks): in-process HTTP runtimes on simulated nodes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MockFactoryConfig {
    pub nodes: u32,
    pub node_memory_mb: u64,
}

impl Default for MockFactoryConfig {
    fn default() -> Self {
        MockFactoryConfig { nodes: 1, node_memory_mb: 2048 }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessFactoryConfig {
    /// Memory the node offers to action containers (the sum of their declared limits).
    pub user_memory_mb: u64,
    /// Bound on a runtime process answering on its address after it was spawned.
    #[serde(with = "humantime_serde")]
    pub ready_timeout: Duration,
    /// Where the cgroup memory controller is mounted; found automatically when unset.
    pub cgroup_root: Option<PathBuf>,
    /// Refuse to start when no memory limit can be enforced.
    pub require_memory_limit: bool,
    /// How the invoker reaches the runtime of a kind with `network = "host"`: a unix socket in
    /// the container's directory (no port to race for), or a free 127.0.0.1 port. A kind with
    /// its own network namespace (`network = "none"`) is always reached on its unix socket.
    pub transport: TransportKind,
    /// Each container under a uid of its own, in its own root, mount, IPC and network
    /// namespaces (`invoker sandbox`). Needs root; `false` runs actions as the invoker's own
    /// user, without isolation (a warning at start says so).
    pub unprivileged: bool,
    /// Containers get uids from `uid_base` on, one per live container (its gid the same).
    pub uid_base: u32,
    pub uid_count: u32,
    /// Processes a container may have at once (its pids cgroup).
    pub pids_max: u32,
    /// Size of a container's private `/tmp` (and `/dev/shm`); it counts against its memory.
    pub tmp_mb: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    Unix,
    Tcp,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KindConfig {
    /// The runtime's command line. `{invoker}` is this executable, `{listen}` the address the
    /// runtime must serve the OpenWhisk runtime protocol on.
    pub command: Vec<String>,
    /// `none`: a network namespace of the container's own, with only loopback. `host`: the
    /// host's network, an explicit opt-in.
    #[serde(default)]
    pub network: Network,
    /// What the runtime speaks (`openwhisk`), whichever factory runs it.
    #[serde(default)]
    pub protocol: RuntimeProtocol,
}

impl KindConfig {
    /// The command line with `{invoker}` and `{listen}` filled in.
    pub fn command_for(&self, invoker: &Path, listen: &str) -> Vec<String> {
        let invoker = invoker.to_string_lossy();
        self.command.iter().map(|a| a.replace("{invoker}", &invoker).replace("{listen}", listen)).collect()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            invoker_id: "invoker0".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 3233)),
            data_dir: PathBuf::from("data"),
            namespaces: BTreeMap::from([("guest".to_string(), GUEST_KEY.to_string())]),
            admin: AdminConfig::default(),
            limits: LimitsConfig::default(),
            pool: PoolConfig::default(),
            proxy: ProxyConfig::default(),
            factory: FactoryConfig::default(),
            kinds: default_kinds(),
            shutdown_grace: Duration::from_secs(30),
            record_retention: Duration::from_secs(7 * 24 * 3600),
            store: StoreConfig::default(),
            source: None,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            memory_min_mb: 128,
            memory_max_mb: 512,
            memory_default_mb: 256,
            timeout_min_ms: 100,
            timeout_max_ms: 300_000,
            timeout_default_ms: 60_000,
            logs_max_mb: 10,
            logs_default_mb: 10,
            concurrency_max: 100,
            concurrency_default: 1,
            payload_max_bytes: 1024 * 1024,
            code_max_bytes: 48 * 1024 * 1024,
            namespace_concurrent: 100,
            blocking_wait: Duration::from_secs(60),
        }
    }
}

impl PoolConfig {
    /// The pure core's part of these settings.
    pub fn core_config(&self) -> crate::pool::core::CoreConfig {
        crate::pool::core::CoreConfig {
            max_starts_per_action: self.max_starts_per_action,
            max_starts_per_node: self.max_starts_per_node,
            max_waiting: self.max_waiting,
            idle_timeout: self.idle_timeout,
            stats_ttl: self.stats_ttl,
            buffer_mb: self.buffer_mb,
            start_rule: self.start_rule,
            prewarm: self
                .prewarm
                .iter()
                .map(|p| crate::pool::core::PrewarmSpec {
                    memory_mb: p.memory_mb,
                    count: p.count,
                    reactive: p.reactive.as_ref().map(|r| crate::pool::core::ReactivePrewarm {
                        min: r.min,
                        max: r.max,
                        threshold: r.threshold,
                        increment: r.increment,
                        window: r.window,
                    }),
                })
                .collect(),
            claim_after: self.claim_after,
        }
    }

    /// The prewarm class a job of this kind and memory may adopt.
    pub fn stem_for(&self, kind: &str, memory_mb: u32) -> Option<crate::pool::core::StemId> {
        let index = self.prewarm.iter().position(|p| p.kind == kind && p.memory_mb == memory_mb)?;
        Some(crate::pool::core::StemId(index as u32))
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_starts_per_action: 4,
            max_starts_per_node: 8,
            max_waiting: 10_000,
            idle_timeout: Duration::from_secs(600),
            wait_deadline: Duration::from_secs(60),
            stats_ttl: Duration::from_secs(60),
            buffer_mb: 0,
            tick: Duration::from_millis(100),
            start_rule: crate::pool::core::StartRule::Capped,
            prewarm: Vec::new(),
            claim_after: Duration::from_secs(1),
        }
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            init_timeout: Duration::from_secs(60),
            log_sentinel_wait: Duration::from_secs(2),
            pause_grace: Duration::from_secs(1),
        }
    }
}

impl Default for FactoryConfig {
    fn default() -> Self {
        FactoryConfig {
            kind: FactoryKind::Process,
            process: ProcessFactoryConfig::default(),
            mock: MockFactoryConfig::default(),
            docker: DockerFactoryConfig::default(),
            mesos: MesosFactoryConfig::default(),
        }
    }
}

impl Default for ProcessFactoryConfig {
    fn default() -> Self {
        ProcessFactoryConfig {
            user_memory_mb: 2048,
            ready_timeout: Duration::from_secs(10),
            cgroup_root: None,
            require_memory_limit: false,
            transport: TransportKind::Unix,
            unprivileged: true,
            uid_base: 100_000,
            uid_count: 60_000,
            pids_max: 256,
            tmp_mb: 64,
        }
    }
}

fn builtin_runtime(launcher: &str) -> KindConfig {
    let command = ["{invoker}", "action-runtime", "--listen", "{listen}", "--launcher", launcher];
    KindConfig {
        command: command.iter().map(|s| s.to_string()).collect(),
        network: Network::None,
        protocol: RuntimeProtocol::OpenWhisk,
    }
}

/// The project's own runtime serves every built-in kind; the launcher picks the language.
pub fn default_kinds() -> BTreeMap<String, KindConfig> {
    BTreeMap::from([
        ("python:3".to_string(), builtin_runtime("python")),
        ("nodejs:20".to_string(), builtin_runtime("nodejs")),
        ("native".to_string(), builtin_runtime("native")),
    ])
}

impl Config {
    /// Reads a TOML file; keys it does not set keep their defaults.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| bad(&path.display().to_string(), e.to_string()))?;
        let mut config = Self::from_toml(&text)?;
        config.source = std::path::absolute(path).ok();
        Ok(config)
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let key = e.span().map_or_else(|| "file".to_string(), |s| locate_key(text, s.start));
            bad(&key, e.message().to_string())
        })?;
        // Kinds the file names replace the defaults; the others stay (in both maps).
        for (kind, cfg) in default_kinds() {
            config.kinds.entry(kind).or_insert(cfg);
        }
        for (kind, cfg) in DockerFactoryConfig::default().kinds {
            config.factory.docker.kinds.entry(kind).or_insert(cfg);
        }
        Ok(config)
    }

    fn validate_mesos(&self) -> Result<(), ConfigError> {
        let m = &self.factory.mesos;
        let authority = m.master.strip_prefix("http://").unwrap_or_default();
        if authority.is_empty() || authority.contains(['/', ' ']) {
            return Err(bad("factory.mesos.master", "must be http://host:port"));
        }
        if !(m.cpus_per_gb > 0.0 && m.cpus_per_gb <= 64.0) {
            return Err(bad("factory.mesos.cpus_per_gb", "must be above 0 and at most 64"));
        }
        if m.heartbeat_misses == 0 {
            return Err(bad("factory.mesos.heartbeat_misses", "must be at least 1"));
        }
        for (key, d) in [
            ("factory.mesos.offer_hold", m.offer_hold),
            ("factory.mesos.launch_timeout", m.launch_timeout),
            ("factory.mesos.kill_timeout", m.kill_timeout),
            ("factory.mesos.call_timeout", m.call_timeout),
        ] {
            if d.is_zero() {
                return Err(bad(key, "must be positive"));
            }
        }
        if m.framework_name.is_empty() || m.user.is_empty() || m.listen_host.is_empty() {
            return Err(bad("factory.mesos", "framework_name, user and listen_host must be set"));
        }
        Ok(())
    }

    fn validate_prewarm(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        for (i, p) in self.pool.prewarm.iter().enumerate() {
            let at = |field: &str| format!("pool.prewarm[{i}].{field}");
            if !self.kinds.contains_key(&p.kind) {
                return Err(bad(&at("kind"), format!("'{}' is not a configured kind", p.kind)));
            }
            if p.memory_mb < l.memory_min_mb || p.memory_mb > l.memory_max_mb {
                return Err(bad(&at("memory_mb"), "must be within limits.memory_min_mb..=memory_max_mb"));
            }
            if self.pool.prewarm[..i].iter().any(|q| q.kind == p.kind && q.memory_mb == p.memory_mb) {
                return Err(bad(&at("kind"), "this kind and memory_mb already have a prewarm entry"));
            }
            if let Some(r) = &p.reactive {
                if r.min > r.max || r.max > 1000 {
                    return Err(bad(&at("reactive"), "need min <= max <= 1000"));
                }
                if r.threshold == 0 || r.window.is_zero() {
                    return Err(bad(&at("reactive"), "threshold and window must be positive"));
                }
            } else if p.count > 1000 {
                return Err(bad(&at("count"), "must be at most 1000"));
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let id_ok = !self.invoker_id.is_empty()
            && self.invoker_id.len() <= 32
            && self.invoker_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !id_ok {
            return Err(bad("invoker_id", "must be 1 to 32 letters, digits, '-' or '_'"));
        }
        self.validate_mesos()?;
        if self.factory.mock.nodes == 0 || self.factory.mock.nodes > 10_000 {
            return Err(bad("factory.mock.nodes", "must be 1 to 10000"));
        }
        let mut seen = std::collections::HashSet::new();
        for (ns, key) in &self.namespaces {
            crate::model::validate_entity_name("namespaces", ns).map_err(|r| bad(&format!("namespaces.{ns}"), r))?;
            check_key(&format!("namespaces.{ns}"), key, &mut seen)?;
        }
        if let Some(key) = &self.admin.key {
            check_key("admin.key", key, &mut seen)?;
        }
        for (i, key) in self.admin.controller_keys.iter().enumerate() {
            check_key(&format!("admin.controller_keys[{i}]"), key, &mut seen)?;
        }
        let l = &self.limits;
        if !(l.memory_min_mb <= l.memory_default_mb && l.memory_default_mb <= l.memory_max_mb) || l.memory_min_mb == 0 {
            return Err(bad("limits.memory_*", "need 0 < memory_min_mb <= memory_default_mb <= memory_max_mb"));
        }
        if !(l.timeout_min_ms <= l.timeout_default_ms && l.timeout_default_ms <= l.timeout_max_ms)
            || l.timeout_min_ms == 0
        {
            return Err(bad("limits.timeout_*", "need 0 < timeout_min_ms <= timeout_default_ms <= timeout_max_ms"));
        }
        if l.logs_default_mb > l.logs_max_mb {
            return Err(bad("limits.logs_default_mb", "must not exceed logs_max_mb"));
        }
        if l.concurrency_default == 0 || l.concurrency_default > l.concurrency_max {
            return Err(bad("limits.concurrency_default", "must be between 1 and concurrency_max"));
        }
        if l.namespace_concurrent == 0 {
            return Err(bad("limits.namespace_concurrent", "must be at least 1"));
        }
        if l.blocking_wait.is_zero() {
            return Err(bad("limits.blocking_wait", "must be positive"));
        }
        let p = &self.pool;
        if p.max_starts_per_action == 0 || p.max_starts_per_node == 0 {
            return Err(bad("pool.max_starts_per_*", "must be at least 1"));
        }
        for (key, d) in
            [("pool.idle_timeout", p.idle_timeout), ("pool.wait_deadline", p.wait_deadline)].into_iter().chain([
                ("pool.stats_ttl", p.stats_ttl),
                ("pool.tick", p.tick),
                ("pool.claim_after", p.claim_after),
                ("proxy.init_timeout", self.proxy.init_timeout),
            ])
        {
            if d.is_zero() {
                return Err(bad(key, "must be positive"));
            }
        }
        self.validate_prewarm()?;
        if self.store.action_cache_mb > 1024 * 1024 {
            return Err(bad("store.action_cache_mb", "must be at most 1048576 (1 TiB)"));
        }
        if self.store.expire_every < Duration::from_secs(1) {
            return Err(bad("store.expire_every", "must be at least 1s"));
        }
        let d = &self.factory.docker;
        if d.max_concurrent_creates == 0 || d.tmpfs_mb == 0 || d.pids_limit <= 0 {
            return Err(bad("factory.docker", "max_concurrent_creates, tmpfs_mb and pids_limit must be positive"));
        }
        if self.factory.kind == FactoryKind::Docker {
            for (i, p) in self.pool.prewarm.iter().enumerate() {
                if !d.kinds.contains_key(&p.kind) {
                    return Err(bad(&format!("pool.prewarm[{i}].kind"), "has no image in factory.docker.kinds"));
                }
            }
        }
        if self.factory.process.user_memory_mb < u64::from(l.memory_min_mb) {
            return Err(bad(
                "factory.process.user_memory_mb",
                "is smaller than the smallest action (limits.memory_min_mb)",
            ));
        }
        let fp = &self.factory.process;
        let uid_end = u64::from(fp.uid_base) + u64::from(fp.uid_count);
        if fp.uid_base < 1000 || fp.uid_count == 0 || uid_end > u64::from(u32::MAX) {
            return Err(bad("factory.process.uid_base", "need uid_base >= 1000 and 0 < uid_count, within 32 bits"));
        }
        if fp.pids_max < 8 || fp.tmp_mb == 0 {
            return Err(bad("factory.process.pids_max", "pids_max must be at least 8 and tmp_mb positive"));
        }
        for (kind, k) in &self.kinds {
            if k.command.is_empty() || !k.command.iter().any(|a| a.contains("{listen}")) {
                return Err(bad(&format!("kinds.\"{kind}\".command"), "must be non-empty and pass '{listen}'"));
            }
        }
        Ok(())
    }
}

/// An API key is `uuid:secret`, and belongs to one principal only: a key shared by two
/// namespaces (or a namespace and the admin) would make one of them the other.
fn check_key<'a>(at: &str, key: &'a str, seen: &mut std::collections::HashSet<&'a str>) -> Result<(), ConfigError> {
    match key.split_once(':') {
        Some((uuid, secret)) if !uuid.is_empty() && !secret.is_empty() => {}
        _ => return Err(bad(at, "an API key is 'uuid:secret'")),
    }
    if !seen.insert(key) {
        return Err(bad(at, "this key is already another namespace's or the admin's"));
    }
    Ok(())
}

/// The dotted key around a byte offset of the TOML text, for error messages.
fn locate_key(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let table =
        before.lines().rev().find(|l| l.trim_start().starts_with('[')).map(|l| l.trim().trim_matches(['[', ']']));
    let line = before.rsplit('\n').next().unwrap_or("");
    let key = line.split('=').next().unwrap_or("").trim();
    match (table, key.is_empty()) {
        (Some(t), false) => format!("{t}.{key}"),
        (Some(t), true) => t.to_string(),
        (None, false) => key.to_string(),
        (None, true) => "file".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_names_its_runtime_protocol_and_an_unknown_one_is_refused() {
        let config = Config::from_toml("[kinds.x]\ncommand = [\"{listen}\"]\nprotocol = \"openwhisk\"\n").unwrap();
        assert_eq!(config.kinds["x"].protocol, RuntimeProtocol::OpenWhisk);
        let err = Config::from_toml("[kinds.x]\ncommand = [\"{listen}\"]\nprotocol = \"grpc\"\n").unwrap_err();
        assert!(err.to_string().contains("protocol") || err.to_string().contains("grpc"), "{err}");
    }

    #[test]
    fn the_docker_config_file_is_valid() {
        let config = Config::from_file(Path::new("config/docker.toml")).unwrap();
        config.validate().unwrap();
        assert_eq!(config.factory.kind, FactoryKind::Docker);
        assert_eq!(config.factory.docker.kinds["python:3"].image, "invoker-python:latest");
    }

    #[test]
    fn a_docker_kind_in_a_file_adds_to_the_defaults_or_replaces_one() {
        let text = "[factory.docker.kinds.\"nodejs:20\"]\nimage = \"openwhisk/action-nodejs-v20\"\n\
                    [factory.docker.kinds.native]\nimage = \"my-native:1\"\n";
        let kinds = Config::from_toml(text).unwrap().factory.docker.kinds;
        assert_eq!(kinds["nodejs:20"].image, "openwhisk/action-nodejs-v20");
        assert!(kinds["nodejs:20"].command.is_empty(), "the image's own entry point");
        assert_eq!(kinds["native"].image, "my-native:1");
        assert_eq!(kinds["python:3"].image, "invoker-python:latest", "a default the file does not name stays");
    }

    #[test]
    fn the_mesos_config_file_is_valid_and_a_bad_master_is_named() {
        let config = Config::from_file(Path::new("config/mesos.toml")).unwrap();
        config.validate().unwrap();
        assert_eq!(config.factory.kind, FactoryKind::Mesos);
        assert_eq!(config.factory.mesos.failover_timeout, Duration::from_secs(7 * 24 * 3600));
        let err = Config::from_toml("[factory.mesos]\nmaster = \"mesos:5050\"\n").unwrap().validate().unwrap_err();
        assert_eq!(err.key, "factory.mesos.master");
        let err = Config::from_toml("[factory.mesos]\ncpus_per_gb = 0.0\n").unwrap().validate().unwrap_err();
        assert_eq!(err.key, "factory.mesos.cpus_per_gb");
    }

    #[test]
    fn the_default_config_file_is_valid() {
        let config = Config::from_file(Path::new("config/default.toml")).unwrap();
        config.validate().unwrap();
        assert_eq!(config.namespaces["guest"], GUEST_KEY);
        assert!(config.kinds.contains_key("python:3"));
    }

    #[test]
    fn errors_name_the_key() {
        let err = Config::from_toml("[pool]\nidle_timeout = \"soon\"\n").unwrap_err();
        assert_eq!(err.key, "pool.idle_timeout");
        let err = Config::from_toml("[pool]\nno_such_key = 1\n").unwrap_err();
        assert!(err.to_string().contains("no_such_key"), "{err}");
        let err = Config::from_toml("[limits]\nmemory_min_mb = 600\n").unwrap().validate().unwrap_err();
        assert_eq!(err.key, "limits.memory_*");
        let err = Config::from_toml("invoker_id = \"a b\"\n").unwrap().validate().unwrap_err();
        assert_eq!(err.key, "invoker_id");
    }

    #[test]
    fn prewarm_entries_are_checked_and_matched_by_kind_and_memory() {
        let entry = |body: &str| format!("[[pool.prewarm]]\nkind = \"python:3\"\nmemory_mb = 256\n{body}");
        let ok = Config::from_toml(&entry("count = 2\nreactive = { min = 1, max = 3 }\n")).unwrap();
        ok.validate().unwrap();
        assert_eq!(ok.pool.stem_for("python:3", 256), Some(crate::pool::core::StemId(0)));
        assert_eq!(ok.pool.stem_for("python:3", 512), None);
        assert_eq!(ok.pool.core_config().prewarm[0].reactive.as_ref().unwrap().window, Duration::from_secs(60));
        let bad_kind = "[[pool.prewarm]]\nkind = \"cobol\"\nmemory_mb = 256\n";
        assert_eq!(Config::from_toml(bad_kind).unwrap().validate().unwrap_err().key, "pool.prewarm[0].kind");
        let bad_range = entry("reactive = { min = 4, max = 3 }\n");
        assert_eq!(Config::from_toml(&bad_range).unwrap().validate().unwrap_err().key, "pool.prewarm[0].reactive");
        let twice = format!("{}{}", entry(""), entry(""));
        assert_eq!(Config::from_toml(&twice).unwrap().validate().unwrap_err().key, "pool.prewarm[1].kind");
    }
}
