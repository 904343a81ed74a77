//! `[factory]`: which backend creates action containers, and each backend's section.

use super::error::{bad, ConfigError};
use super::kinds::Network;
use super::limits::LimitsConfig;
use super::pool::PoolConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FactoryKind {
    Process,
    Mock,
    Docker,
    Mesos,
    Kubernetes,
}

/// A backend this binary was built without (`factory.kind` names it): the cargo feature that
/// builds it in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{kind}' is not built into this invoker; build it with `cargo build --release --features {feature}`{note}")]
pub struct MissingFeature {
    pub kind: &'static str,
    pub feature: &'static str,
    pub note: &'static str,
}

impl FactoryKind {
    /// `Some` when this binary lacks the backend.
    pub fn missing_feature(self) -> Option<MissingFeature> {
        let (kind, feature, built, note) = match self {
            FactoryKind::Process => return None,
            FactoryKind::Docker => ("docker", "docker", cfg!(feature = "docker"), ""),
            FactoryKind::Mesos => ("mesos", "mesos", cfg!(feature = "mesos"), ""),
            FactoryKind::Kubernetes => ("kubernetes", "kubernetes", cfg!(feature = "kubernetes"), ""),
            FactoryKind::Mock => (
                "mock",
                "test-util",
                cfg!(feature = "test-util"),
                " (in-process runtimes, for tests and benchmarks only)",
            ),
        };
        (!built).then_some(MissingFeature { kind, feature, note })
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FactoryConfig {
    pub kind: FactoryKind,
    pub process: ProcessFactoryConfig,
    pub mock: MockFactoryConfig,
    pub docker: DockerFactoryConfig,
    pub mesos: MesosFactoryConfig,
    pub kubernetes: super::kubernetes::KubernetesFactoryConfig,
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
    /// For the kinds that run the project's runtime (a `command` of their own): `none`, no
    /// network, the runtime on a unix socket in a directory bind-mounted from `data_dir` (Fn's
    /// design); `isolated`, no network but loopback, the runtime on the kind's port there;
    /// `host`, the host's network, the runtime on a free 127.0.0.1 port. A kind that runs its
    /// image's own entry point is `isolated` unless it says otherwise.
    pub network: Network,
    /// Memory of the host kept for everything but action containers.
    pub reserve_mb: u64,
    /// The user action containers run as (never root).
    pub user: String,
    pub pids_limit: i64,
    /// Container creations in flight on the engine at most (engines fall over under many).
    pub max_concurrent_creates: usize,
    /// Bound on a created container's runtime answering.
    #[serde(with = "humantime_serde")]
    pub ready_timeout: Duration,
    /// Action kind → the image and command that serve it.
    pub kinds: BTreeMap<String, DockerKindConfig>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DockerKindConfig {
    pub image: String,
    /// The runtime's command inside the image, `{listen}` substituted (`unix:PATH` or
    /// `ADDR:PORT`); empty runs the image's own entry point.
    #[serde(default)]
    pub command: Vec<String>,
    /// The kind's network (see `factory.docker.network`); unset: `isolated` for an image's own
    /// entry point (OpenWhisk's images serve on `:8080`), `factory.docker.network` otherwise.
    #[serde(default)]
    pub network: Option<Network>,
    /// The port the runtime serves on inside its own namespace (`isolated`).
    #[serde(default)]
    pub port: Option<u16>,
    /// For an `fn` kind that takes its code as text: the file it is written to, shown
    /// read-only at `/function` (the container's working directory); unset, the image holds
    /// the function.
    #[serde(default)]
    pub code_file: Option<String>,
}

impl DockerKindConfig {
    /// Whether the image runs the project's own runtime (which takes overlapping runs).
    pub fn is_own_runtime(&self) -> bool {
        self.command.iter().any(|a| a == "action-runtime")
    }

    pub fn network(&self, factory_default: Network) -> Network {
        match self.network {
            Some(network) => network,
            None if self.command.is_empty() => Network::Isolated,
            None => factory_default,
        }
    }

    pub fn port(&self) -> u16 {
        self.port.unwrap_or(super::kinds::OPENWHISK_PORT)
    }
}

impl Default for DockerFactoryConfig {
    fn default() -> Self {
        let kind = |image: &str, launcher: &str| DockerKindConfig {
            image: image.into(),
            command: ["/invoker", "action-runtime", "--listen", "{listen}", "--launcher", launcher]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            network: None,
            port: None,
            code_file: None,
        };
        // Fn's python FDK on the python image (`scripts/build-images.sh`), the action's code in
        // /function.
        let fn_python = DockerKindConfig {
            image: "invoker-fn-python:latest".into(),
            command: super::kinds::FDK_PYTHON_COMMAND.map(String::from).to_vec(),
            network: Some(Network::None),
            port: None,
            code_file: Some("func.py".into()),
        };
        // Fn's node FDK with this machine's node (`scripts/build-images.sh`).
        let fn_node = DockerKindConfig {
            image: "invoker-fn-node:latest".into(),
            command: vec!["/usr/bin/node".into(), "func.js".into()],
            network: Some(Network::None),
            port: None,
            code_file: Some("func.js".into()),
        };
        DockerFactoryConfig {
            socket: PathBuf::from("/run/invoker-docker/docker.sock"),
            network: Network::None,
            reserve_mb: 1024,
            user: "65534:65534".into(),
            pids_limit: 256,
            max_concurrent_creates: 4,
            ready_timeout: Duration::from_secs(30),
            kinds: BTreeMap::from([
                ("python:3".to_string(), kind("invoker-python:latest", "python")),
                ("native".to_string(), kind("invoker-native:latest", "native")),
                ("fn:python".to_string(), fn_python),
                ("fn:node".to_string(), fn_node),
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    Unix,
    Tcp,
}

impl Default for FactoryConfig {
    fn default() -> Self {
        FactoryConfig {
            kind: FactoryKind::Process,
            process: ProcessFactoryConfig::default(),
            mock: MockFactoryConfig::default(),
            docker: DockerFactoryConfig::default(),
            mesos: MesosFactoryConfig::default(),
            kubernetes: super::kubernetes::KubernetesFactoryConfig::default(),
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
        }
    }
}

impl FactoryConfig {
    /// The memory the invoker offers to actions, for the factories where this file sets it
    /// (the process factory's `user_memory_mb`, the mock factory's node); the others learn it
    /// from their cluster manager.
    pub fn set_memory_mb(&mut self, mb: u64) -> Result<(), ConfigError> {
        match self.kind {
            FactoryKind::Process => self.process.user_memory_mb = mb,
            FactoryKind::Mock => self.mock.node_memory_mb = mb,
            other => {
                return Err(bad(
                    "--memory-mb",
                    format!("only the process and mock factories take it, not {other:?} (its cluster says)"),
                ))
            }
        }
        Ok(())
    }

    pub(super) fn validate(&self, pool: &PoolConfig, limits: &LimitsConfig) -> Result<(), ConfigError> {
        if let Some(missing) = self.kind.missing_feature() {
            return Err(bad("factory.kind", missing.to_string()));
        }
        self.validate_mesos()?;
        self.kubernetes.validate()?;
        if self.mock.nodes == 0 || self.mock.nodes > 10_000 {
            return Err(bad("factory.mock.nodes", "must be 1 to 10000"));
        }
        let d = &self.docker;
        if d.max_concurrent_creates == 0 || d.pids_limit <= 0 {
            return Err(bad("factory.docker", "max_concurrent_creates and pids_limit must be positive"));
        }
        if let Some((name, _)) = d.kinds.iter().find(|(_, k)| k.port == Some(0)) {
            return Err(bad(&format!("factory.docker.kinds.\"{name}\".port"), "must be 1 to 65535"));
        }
        let imaged = match self.kind {
            FactoryKind::Docker => Some(("factory.docker.kinds", d.kinds.keys().collect::<Vec<_>>())),
            FactoryKind::Kubernetes => Some(("factory.kubernetes.kinds", self.kubernetes.kinds.keys().collect())),
            _ => None,
        };
        if let Some((section, kinds)) = imaged {
            for (i, p) in pool.prewarm.iter().enumerate() {
                if !kinds.contains(&&p.kind) {
                    return Err(bad(&format!("pool.prewarm[{i}].kind"), format!("has no image in {section}")));
                }
            }
        }
        let fp = &self.process;
        if fp.user_memory_mb < u64::from(limits.memory_min_mb) {
            return Err(bad(
                "factory.process.user_memory_mb",
                "is smaller than the smallest action (limits.memory_min_mb)",
            ));
        }
        let uid_end = u64::from(fp.uid_base) + u64::from(fp.uid_count);
        if fp.uid_base < 1000 || fp.uid_count == 0 || uid_end > u64::from(u32::MAX) {
            return Err(bad("factory.process.uid_base", "need uid_base >= 1000 and 0 < uid_count, within 32 bits"));
        }
        if fp.pids_max < 8 {
            return Err(bad("factory.process.pids_max", "must be at least 8"));
        }
        Ok(())
    }

    fn validate_mesos(&self) -> Result<(), ConfigError> {
        let m = &self.mesos;
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
}
