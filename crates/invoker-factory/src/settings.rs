//! What each backend's section of the config says (`[factory.process]`, `[factory.docker]`, `[factory.kubernetes]`,
//! `[factory.mesos]`, and the capacity manager's `[capacity.kubernetes]`) and the network an action container has. These are here, beside the
//! contract, and not in a backend's crate, because the invoker reads every section in every
//! build (a config naming a backend this build lacks is refused by name, not by a parse error);
//! their checks stay with the rest of the config's, in the invoker.

use invoker_wire::runtime::{FDK_PYTHON_COMMAND, OPENWHISK_PORT};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// What network an action container has, on every factory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Its own network namespace with nothing but loopback.
    #[default]
    None,
    /// The host's network.
    Host,
    /// Its own network namespace with nothing but loopback, as `none`, the runtime listening
    /// on a TCP port there (OpenWhisk's runtimes serve on `:8080`); the invoker opens its
    /// connections inside that namespace. No bridge, no host port.
    Isolated,
}

/// The process factory (`[factory.process]`): each action container a process tree on this
/// host, in namespaces and cgroups of its own.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessFactoryConfig {
    /// Memory the node offers to action containers (the sum of their declared limits).
    pub user_memory_mb: u64,
    /// Offer instead what this memory limit (a cgroup's `memory.max`, in bytes) leaves beyond
    /// `own_memory_mb`, read again every 100 ms: an invoker whose pod Kubernetes resizes in
    /// place offers what the pod was given, and nothing while it stands by (`user_memory_mb`
    /// where the file sets no limit).
    pub memory_limit_file: Option<PathBuf>,
    /// The invoker's own share of that limit.
    pub own_memory_mb: u64,
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

impl Default for ProcessFactoryConfig {
    fn default() -> Self {
        ProcessFactoryConfig {
            user_memory_mb: 2048,
            memory_limit_file: None,
            own_memory_mb: 0,
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
    /// Which namespaces may run a function's own image that the engine holds but no registry
    /// gave it (one that `docker build` made, as `fn deploy --local` does).
    pub local_images: LocalImages,
}

/// Who may run a local image: one the engine holds with no registry digest, so that nothing
/// but the engine's cache stands for who made it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LocalImages {
    /// Only the namespace its repository starts with: `guest/f1:0.0.2` for `guest` (Fn's
    /// client names its images so with `fn update context registry guest`).
    #[default]
    Namespaced,
    /// Every namespace: one tenant could run another's image, and read the code in it. A
    /// relaxation for an engine with a single user; the invoker warns at start.
    Shared,
}

impl LocalImages {
    /// Whether `namespace` may run the local image `image`.
    pub fn allows(self, image: &str, namespace: &str) -> bool {
        match self {
            LocalImages::Shared => true,
            LocalImages::Namespaced => {
                image.split_once('/').is_some_and(|(owner, _)| !namespace.is_empty() && owner == namespace)
            }
        }
    }
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
        self.port.unwrap_or(OPENWHISK_PORT)
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
            command: FDK_PYTHON_COMMAND.map(String::from).to_vec(),
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
                // A function's own image (the function names it): its entry point, no network.
                (
                    "fn:image".to_string(),
                    DockerKindConfig {
                        image: String::new(),
                        command: Vec::new(),
                        network: Some(Network::None),
                        port: None,
                        code_file: None,
                    },
                ),
            ]),
            local_images: LocalImages::Namespaced,
        }
    }
}

/// A taint the action pods tolerate, written as a pod spec's toleration is (`key`, `operator`,
/// `value`, `effect`, `tolerationSeconds`). The config's own type, so that reading a config
/// needs no Kubernetes crate in a build without the backend.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Toleration {
    pub key: Option<String>,
    pub operator: Option<String>,
    pub value: Option<String>,
    pub effect: Option<String>,
    pub toleration_seconds: Option<i64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesFactoryConfig {
    /// The API server (`https://host:port`, or `http://` for a local proxy such as `kubectl
    /// proxy`). Unset: `kubeconfig`, else `$KUBECONFIG` or `~/.kube/config`, else the pod's
    /// own service account (the invoker running in the cluster).
    pub api_server: Option<String>,
    /// A kubeconfig file (its current context).
    pub kubeconfig: Option<PathBuf>,
    /// Where the action pods go (the invoker creates, lists and deletes pods there only).
    pub namespace: String,
    /// A pod must be Ready within this (scheduling, image pull and the runtime's start).
    #[serde(with = "humantime_serde")]
    pub create_timeout: Duration,
    /// A deleted pod counts as gone after this even if the watch never shows it go.
    #[serde(with = "humantime_serde")]
    pub delete_timeout: Duration,
    /// Bound on one call to the API server (watches have none: they resume).
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// CPU a pod gets (request = limit) per GB of its memory.
    pub cpus_per_gb: f64,
    pub image_pull_policy: String,
    /// Taints of nodes the action pods tolerate (their pods get these tolerations); a node
    /// tainted `NoSchedule` or `NoExecute` otherwise offers nothing.
    pub tolerations: Vec<Toleration>,
    /// Keep action pods off the network with a NetworkPolicy (no egress; ingress on the
    /// runtime's port only). Off is a relaxation: the invoker warns at start.
    pub network_policy: bool,
    /// Action kind → the image and command that serve it.
    pub kinds: BTreeMap<String, KubernetesKindConfig>,
    /// What offers an Fn function's socket on the pod's network (`invoker fn-bridge`).
    pub fn_bridge: FnBridgeConfig,
}

/// The container beside an Fn function in its pod: the project's binary, `fn-bridge`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct FnBridgeConfig {
    /// An image with the invoker's binary.
    pub image: String,
    /// The binary and its subcommand; `--dir`, `--listen` and `--start-timeout` are added.
    pub command: Vec<String>,
    /// The bridge's memory, taken from the function's (the pod holds the action's memory).
    pub memory_mb: u32,
}

impl Default for FnBridgeConfig {
    fn default() -> Self {
        FnBridgeConfig {
            image: "invoker-native:latest".into(),
            command: vec!["/invoker".into(), "fn-bridge".into()],
            memory_mb: 16,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KubernetesKindConfig {
    pub image: String,
    /// The runtime's command inside the image, `{listen}` substituted with `$(POD_IP):$(PORT)`
    /// (which Kubernetes expands from the pod's environment); empty runs the image's own entry
    /// point (OpenWhisk's images serve on `:8080`).
    #[serde(default)]
    pub command: Vec<String>,
    /// The port the runtime serves on, on the pod's IP.
    #[serde(default)]
    pub port: Option<u16>,
    /// For an `fn` kind that takes its code as text: the file it is written to, shown
    /// read-only at `/function` (the function's working directory); unset, the image holds
    /// the function.
    #[serde(default)]
    pub code_file: Option<String>,
}

impl KubernetesKindConfig {
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(OPENWHISK_PORT)
    }

    /// Whether the kind runs the project's own runtime (which takes overlapping runs).
    pub fn is_own_runtime(&self) -> bool {
        self.command.iter().any(|a| a == "action-runtime")
    }
}

impl Default for KubernetesFactoryConfig {
    fn default() -> Self {
        let kind = |image: &str, launcher: &str| KubernetesKindConfig {
            image: image.into(),
            command: ["/invoker", "action-runtime", "--listen", "{listen}", "--launcher", launcher]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            port: None,
            code_file: None,
        };
        // Fn's python FDK on the python image, as on Docker (`scripts/build-images.sh`).
        let fn_python = KubernetesKindConfig {
            image: "invoker-fn-python:latest".into(),
            command: FDK_PYTHON_COMMAND.map(String::from).to_vec(),
            port: None,
            code_file: Some("func.py".into()),
        };
        KubernetesFactoryConfig {
            api_server: None,
            kubeconfig: None,
            namespace: "invoker-actions".into(),
            create_timeout: Duration::from_secs(60),
            delete_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(10),
            cpus_per_gb: 1.0,
            image_pull_policy: "IfNotPresent".into(),
            tolerations: Vec::new(),
            network_policy: true,
            kinds: BTreeMap::from([
                ("python:3".to_string(), kind("invoker-python:latest", "python")),
                ("native".to_string(), kind("invoker-native:latest", "native")),
                ("fn:python".to_string(), fn_python),
                // A function's own image (the function names it): its entry point.
                (
                    "fn:image".to_string(),
                    KubernetesKindConfig { image: String::new(), command: Vec::new(), port: None, code_file: None },
                ),
            ]),
            fn_bridge: FnBridgeConfig::default(),
        }
    }
}

/// `[capacity.kubernetes]`: each group is a StatefulSet named after it (its pods, and so its
/// invokers, are `<group>-<ordinal>`), scaled through its `scale` subresource.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesPlaneConfig {
    /// The API server, as `[factory.kubernetes] api_server` says it; unset: `kubeconfig`, else
    /// `$KUBECONFIG` or `~/.kube/config`, else the pod's service account.
    pub api_server: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    /// Where the StatefulSets are.
    pub namespace: String,
    pub image: String,
    pub image_pull_policy: String,
    /// The invoker's command in the image. `{etcd}`, `{tags}`, `{memory_mb}` and `{overhead_mb}`
    /// are the group's; `$(POD_NAME)` (the invoker's id) and `$(POD_IP)` Kubernetes fills in for
    /// each pod. The default follows the pod's memory limit (`--memory-limit-file`), which a
    /// resize changes.
    pub command: Vec<String>,
    /// A ConfigMap with the invokers' config file, mounted read-only at `/etc/invoker`.
    pub config_map: Option<String>,
    /// Memory a pod asks for beyond its invoker's memory for actions (the invoker itself).
    pub overhead_mb: u64,
    /// Pods per group kept started at `standby_mb` (their invoker offers nothing and stays out
    /// of the cluster), each grown to its group's size by an in-place resize (Kubernetes 1.33 or
    /// later) when the group asks for an invoker, within a fraction of a second where a new pod
    /// takes seconds; one taken is replaced. 0: every invoker is a new pod. Unset: the cluster
    /// decides (`invoker_kubernetes::standby::AUTO`: two where the API server serves pods'
    /// `resize` and `command` follows the pod's memory limit, none elsewhere).
    pub standby: Option<u32>,
    /// What a standby pod asks for: its idle invoker (14 MB resident), not more than `overhead_mb`.
    pub standby_mb: u64,
    /// A removed invoker's pod has this long to drain and exit (`terminationGracePeriodSeconds`).
    #[serde(with = "humantime_serde")]
    pub termination_grace: Duration,
    /// Bound on one call to the API server.
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
}

impl KubernetesPlaneConfig {
    /// Whether the invoker `command` runs follows its pod's memory limit (as a standby pod's
    /// must, to offer what a resize gives it).
    pub fn follows_its_limit(&self) -> bool {
        self.command.iter().any(|a| a.starts_with("--memory-limit-file"))
    }
}

impl Default for KubernetesPlaneConfig {
    fn default() -> Self {
        let command = [
            "/invoker",
            "serve",
            "--config",
            "/etc/invoker/invoker.toml",
            "--etcd",
            "{etcd}",
            "--invoker-id",
            "$(POD_NAME)",
            "--tags={tags}",
            "--memory-limit-file=/sys/fs/cgroup/memory.max",
            "--own-memory-mb={overhead_mb}",
            "--listen",
            "$(POD_IP):3233",
            "--data-dir",
            "/data",
        ];
        KubernetesPlaneConfig {
            api_server: None,
            kubeconfig: None,
            namespace: "invoker".into(),
            image: "invoker:latest".into(),
            image_pull_policy: "IfNotPresent".into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            config_map: Some("invoker-config".into()),
            overhead_mb: 256,
            standby: None,
            standby_mb: 32,
            termination_grace: Duration::from_secs(60),
            call_timeout: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LocalImages;

    #[test]
    fn a_local_image_runs_only_for_the_namespace_it_is_named_after_unless_shared() {
        let namespaced = LocalImages::Namespaced;
        assert!(namespaced.allows("guest/f1:0.0.2", "guest"));
        for (image, namespace) in
            [("other/f1:0.0.2", "guest"), ("f1:0.0.2", "guest"), ("guestx/f1", "guest"), ("guest/f1", "")]
        {
            assert!(!namespaced.allows(image, namespace), "{image} for {namespace:?}");
            assert!(LocalImages::Shared.allows(image, namespace));
        }
    }
}
