//! Configuration: one TOML file per deployment shape (`config/default.toml` for the embedded
//! default), flags and a few environment variables on top. Every key is validated at start-up;
//! an error names the key and the reason. One file per section, its validation beside it;
//! `[pool]` is the pure core's own config type.

mod admin;
mod api;
mod capacity;
mod cluster;
mod error;
mod factory;
mod kinds;
mod kubernetes;
mod limits;
mod pool;
mod proxy;
mod queue;
mod store;
mod tracing;

pub use admin::AdminConfig;
pub use api::ApiConfig;
pub use capacity::CapacityConfig;
pub use cluster::{ClusterConfig, SchedulerConfig};
use error::bad;
pub use error::ConfigError;
pub use factory::{FactoryConfig, FactoryKind, MockFactoryConfig};
use invoker_factory::kinds::{default_kinds, launcher_in, runs_at_once, KindConfig};
use invoker_factory::settings::{DockerFactoryConfig, KubernetesFactoryConfig};
pub use limits::{disk_bytes_of, LimitsConfig, DISK_INODES_RESERVED};
pub use pool::{PoolConfig, PrewarmConfig};
pub use proxy::ProxyConfig;
pub use queue::{QueueConfig, EVENT_AGE_MAX, EVENT_AGE_MIN, RETRY_ATTEMPTS_MAX};
pub use store::StoreConfig;
pub use tracing::TracingConfig;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// OpenWhisk's well-known key for the local `guest` namespace, so its tools work unchanged.
pub const GUEST_KEY: &str =
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";

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
    pub api: ApiConfig,
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
    /// The durable queue of asynchronous calls.
    pub queue: QueueConfig,
    pub cluster: ClusterConfig,
    pub scheduler: SchedulerConfig,
    /// `invoker capacity` only: the groups it sizes.
    pub capacity: CapacityConfig,
    /// Spans of every activation, exported over OTLP; off by default.
    pub tracing: TracingConfig,
    /// The file this was read from: hidden from action containers.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            invoker_id: "invoker0".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 3233)),
            data_dir: PathBuf::from("data"),
            namespaces: BTreeMap::from([("guest".to_string(), GUEST_KEY.to_string())]),
            admin: AdminConfig::default(),
            api: ApiConfig::default(),
            limits: LimitsConfig::default(),
            pool: PoolConfig::default(),
            proxy: ProxyConfig::default(),
            factory: FactoryConfig::default(),
            kinds: default_kinds(),
            shutdown_grace: Duration::from_secs(30),
            record_retention: Duration::from_secs(7 * 24 * 3600),
            store: StoreConfig::default(),
            queue: QueueConfig::default(),
            cluster: ClusterConfig::default(),
            scheduler: SchedulerConfig::default(),
            capacity: CapacityConfig::default(),
            tracing: TracingConfig::default(),
            source: None,
        }
    }
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
        for (kind, cfg) in KubernetesFactoryConfig::default().kinds {
            config.factory.kubernetes.kinds.entry(kind).or_insert(cfg);
        }
        let disk = config.limits.disk_default_mb;
        config.pool.fill_prewarm_disk(disk);
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let id_ok = !self.invoker_id.is_empty()
            && self.invoker_id.len() <= 32
            && self.invoker_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !id_ok {
            return Err(bad("invoker_id", "must be 1 to 32 letters, digits, '-' or '_'"));
        }
        admin::validate_keys(&self.namespaces, &self.admin)?;
        self.api.validate()?;
        self.limits.validate()?;
        pool::validate(&self.pool, &self.kinds, &self.limits)?;
        self.proxy.validate()?;
        self.store.validate()?;
        self.queue.validate()?;
        self.cluster.validate()?;
        self.scheduler.validate()?;
        self.capacity.validate()?;
        self.tracing.validate()?;
        self.factory.validate(&self.pool, &self.limits)?;
        kinds::validate(&self.kinds)
    }
}

impl Config {
    /// The kinds an action may be created with, each with the most runs one container of it
    /// takes at once: `[kinds]`; on Docker and Kubernetes, the kinds with an image (an image's
    /// own entry point is another's runtime, one run at a time unless `[kinds]` says otherwise).
    pub fn action_kinds(&self) -> BTreeMap<&str, u32> {
        let max = self.limits.concurrency_max;
        let set = |name: &str| self.kinds.get(name).and_then(|k| k.max_concurrency);
        // The protocol's own bound, on every factory.
        let protocol_max = |name: &str| self.kinds.get(name).and_then(|k| k.protocol.max_runs_at_once());
        let capped = |name: &str, n: u32| protocol_max(name).map_or(n, |p| n.min(p));
        match self.factory.kind {
            FactoryKind::Docker => self
                .factory
                .docker
                .kinds
                .iter()
                .map(|(name, d)| (name.as_str(), capped(name, runs_at_once(set(name), d.is_own_runtime(), max))))
                .collect(),
            FactoryKind::Kubernetes => self
                .factory
                .kubernetes
                .kinds
                .iter()
                .map(|(name, k)| (name.as_str(), capped(name, runs_at_once(set(name), k.is_own_runtime(), max))))
                .collect(),
            _ => self.kinds.iter().map(|(name, k)| (name.as_str(), k.max_concurrency(max))).collect(),
        }
    }
}

/// The language an action of a kind is written in, as far as naming its `main` goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindLanguage {
    Python,
    Nodejs,
    /// An executable (our native launcher), or a runtime whose language the config does not say.
    Other,
}

impl Config {
    /// Our runtime's `--launcher` in the kind's command on the configured factory, when the
    /// command runs our runtime; `None` when it runs another (or the kind is unknown).
    fn own_launcher(&self, kind: &str) -> Option<Option<&str>> {
        let (own, command) = match self.factory.kind {
            FactoryKind::Docker => self.factory.docker.kinds.get(kind).map(|d| (d.is_own_runtime(), &d.command))?,
            FactoryKind::Kubernetes => {
                self.factory.kubernetes.kinds.get(kind).map(|k| (k.is_own_runtime(), &k.command))?
            }
            _ => self.kinds.get(kind).map(|k| (k.is_own_runtime(), &k.command))?,
        };
        own.then(|| launcher_in(command))
    }

    /// Whether a kind's containers can run a zip (`binary`) action: every runtime can but our
    /// own with the nodejs launcher, which takes code as text only.
    pub fn takes_zips(&self, kind: &str) -> bool {
        // A kind whose code is written to one file (Fn's) takes text only.
        let one_file = self.kinds.get(kind).is_some_and(|k| k.code_file.is_some());
        !one_file && self.own_launcher(kind) != Some(Some("nodejs"))
    }

    /// The language of a kind: our runtime's launcher, else what the kind's name begins with
    /// (OpenWhisk's names: `python:3.11`, `nodejs:20`).
    pub fn kind_language(&self, kind: &str) -> KindLanguage {
        match self.own_launcher(kind) {
            Some(Some("python")) => KindLanguage::Python,
            Some(Some("nodejs")) => KindLanguage::Nodejs,
            Some(_) => KindLanguage::Other,
            None if kind.starts_with("python") => KindLanguage::Python,
            None if kind.starts_with("nodejs") => KindLanguage::Nodejs,
            None => KindLanguage::Other,
        }
    }
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
    use invoker_factory::kinds::RuntimeProtocol;
    use invoker_factory::settings::Network;
    use invoker_wire::runtime::OPENWHISK_PORT;

    #[test]
    fn the_default_keep_alive_is_the_priced_hybrid_and_a_bad_worth_is_named() {
        use invoker_core::pool::{HybridWindow, KeepAliveKind};
        let config = Config::default();
        assert_eq!(config.pool.keep_alive, KeepAliveKind::Hybrid);
        assert_eq!(config.pool.keep_alive_params.window, HybridWindow::Priced);
        assert_eq!(config.pool.keep_alive_params.start_second_worth_gb_s, 300.0);
        let paper = Config::from_toml("[pool.keep_alive_params]\nwindow = \"percentiles\"\n").unwrap();
        assert_eq!(paper.pool.keep_alive_params.window, HybridWindow::Percentiles);
        for worth in ["-1.0", "nan", "inf"] {
            let text = format!("[pool.keep_alive_params]\nstart_second_worth_gb_s = {worth}\n");
            let err = Config::from_toml(&text).unwrap().validate().unwrap_err();
            assert_eq!(err.key, "pool.keep_alive_params.start_second_worth_gb_s", "{worth}");
        }
        assert!(Config::from_toml("[pool.keep_alive_params]\nwindow = \"tail\"\n").is_err());
    }

    #[test]
    fn the_payload_limit_goes_up_to_256_mib() {
        let with = |n: u64| Config::from_toml(&format!("[limits]\npayload_max_bytes = {n}\n")).unwrap().validate();
        assert!(with(256 * 1024 * 1024).is_ok());
        assert_eq!(with(256 * 1024 * 1024 + 1).unwrap_err().key, "limits.payload_max_bytes");
        assert_eq!(with(0).unwrap_err().key, "limits.payload_max_bytes");
    }

    #[test]
    fn a_kind_names_its_runtime_protocol_and_an_unknown_one_is_refused() {
        let config = Config::from_toml("[kinds.x]\ncommand = [\"{listen}\"]\nprotocol = \"openwhisk\"\n").unwrap();
        assert_eq!(config.kinds["x"].protocol, RuntimeProtocol::OpenWhisk);
        let err = Config::from_toml("[kinds.x]\ncommand = [\"{listen}\"]\nprotocol = \"grpc\"\n").unwrap_err();
        assert!(err.to_string().contains("protocol") || err.to_string().contains("grpc"), "{err}");
    }

    #[test]
    fn a_kinds_max_concurrency_defaults_by_whose_runtime_it_is_and_zero_is_refused() {
        let config = Config::from_toml("[kinds.x]\ncommand = [\"/opt/proxy\", \"{listen}\"]\n").unwrap();
        assert_eq!(config.kinds["x"].max_concurrency(100), 1, "not our runtime: one run at a time");
        assert_eq!(config.kinds["python:3"].max_concurrency(100), 100, "ours: up to limits.concurrency_max");
        let text = "[kinds.x]\ncommand = [\"/opt/proxy\", \"{listen}\"]\nmax_concurrency = 0\n";
        let err = Config::from_toml(text).unwrap().validate().unwrap_err();
        assert_eq!(err.key, "kinds.\"x\".max_concurrency");
    }

    #[test]
    fn only_an_isolated_kind_may_listen_on_a_port_of_its_own_choosing() {
        let kind = |body: &str| Config::from_toml(&format!("[kinds.\"python:ow\"]\n{body}")).unwrap().validate();
        let own_port = "command = [\"/opt/proxy\"]\n";
        assert_eq!(kind(own_port).unwrap_err().key, "kinds.\"python:ow\".command", "a unix socket needs {{listen}}");
        kind(&format!("{own_port}network = \"isolated\"\nenv = {{ OW_COMPILER = \"/bin/compile\" }}\n")).unwrap();
        let zero = format!("{own_port}network = \"isolated\"\nport = 0\n");
        assert_eq!(kind(&zero).unwrap_err().key, "kinds.\"python:ow\".port");
        let bad_env = format!("{own_port}network = \"isolated\"\nenv = {{ \"A=B\" = \"x\" }}\n");
        assert_eq!(kind(&bad_env).unwrap_err().key, "kinds.\"python:ow\".env");
        let relative = format!("{own_port}network = \"isolated\"\npaths = [\"opt/ow\"]\n");
        assert_eq!(kind(&relative).unwrap_err().key, "kinds.\"python:ow\".paths");
        for entry in
            ["{ host = \"/usr/bin/python3\", at = \"/proc/x\" }", "{ host = \"bin\", at = \"/x\" }", "\"/dev/x\""]
        {
            let text = format!("{own_port}network = \"isolated\"\npaths = [{entry}]\n");
            assert_eq!(kind(&text).unwrap_err().key, "kinds.\"python:ow\".paths", "{entry}");
        }
        let unknown =
            format!("{own_port}network = \"isolated\"\npaths = [{{ host = \"/a\", at = \"/b\", mode = 1 }}]\n");
        let unknown = Config::from_toml(&format!("[kinds.z]\n{unknown}")).unwrap_err();
        assert!(unknown.key.ends_with(".paths") && unknown.reason.contains("mode"), "{unknown:?}");
        let both = format!("{own_port}network = \"isolated\"\npaths = [\"/tmp/x\", {{ host = \"/usr/bin/python3\", at = \"/usr/local/bin/python\" }}]\n");
        let both = Config::from_toml(&format!("[kinds.y]\n{both}")).unwrap();
        assert!(both.validate().is_ok());
        let paths: Vec<(&Path, &Path)> = both.kinds["y"].paths.iter().map(|p| (p.host(), p.at())).collect();
        assert_eq!(
            paths,
            [
                (Path::new("/tmp/x"), Path::new("/tmp/x")),
                (Path::new("/usr/bin/python3"), Path::new("/usr/local/bin/python"))
            ]
        );
        let config = Config::from_toml(&format!(
            "[kinds.x]\n{own_port}network = \"isolated\"\nenv = {{ A = \"{{port}}:{{work_dir}}\" }}"
        ))
        .unwrap();
        assert_eq!(config.kinds["x"].port, OPENWHISK_PORT);
        assert_eq!(config.kinds["x"].env_for(Path::new("/w")), vec![("A".to_string(), "8080:/w".to_string())]);
    }

    #[test]
    fn fn_kinds_serve_on_a_socket_of_their_own_and_may_be_an_images_alone() {
        let config = Config::default();
        assert!(config.kinds["fn:python"].protocol == RuntimeProtocol::Fn && config.validate().is_ok());
        let image_only = Config::from_toml("[kinds.\"fn:x\"]\nprotocol = \"fn\"\n").unwrap();
        assert!(image_only.validate().is_ok(), "an fn kind needs no command");
        let plain = Config::from_toml("[kinds.x]\nprotocol = \"openwhisk\"\n").unwrap();
        assert_eq!(plain.validate().unwrap_err().key, "kinds.\"x\".command");
        let networked = Config::from_toml("[kinds.\"fn:y\"]\nprotocol = \"fn\"\nnetwork = \"host\"\n").unwrap();
        assert_eq!(networked.validate().unwrap_err().key, "kinds.\"fn:y\".network");
        let code_file = Config::from_toml("[kinds.z]\ncommand = [\"{listen}\"]\ncode_file = \"f.py\"\n").unwrap();
        assert_eq!(code_file.validate().unwrap_err().key, "kinds.\"z\".code_file", "only an fn kind has one");
        let prewarm = "[[pool.prewarm]]\nkind = \"fn:python\"\nmemory_mb = 256\ncount = 1\n";
        assert_eq!(Config::from_toml(prewarm).unwrap().validate().unwrap_err().key, "pool.prewarm[0].kind");
    }

    #[test]
    fn only_our_nodejs_runtime_may_start_from_a_snapshot_and_none_does_unless_set() {
        let config = Config::from_toml("").unwrap();
        assert!(config.kinds.values().all(|k| !k.snapshot));
        let on = "[kinds.\"nodejs:20\"]\ncommand = [\"{invoker}\", \"action-runtime\", \"--listen\", \"{listen}\", \"--launcher\", \"nodejs\"]\nsnapshot = true\n";
        let on = Config::from_toml(on).unwrap();
        assert!(on.validate().is_ok() && on.kinds["nodejs:20"].snapshot);
        let python = "[kinds.\"python:3\"]\ncommand = [\"{invoker}\", \"action-runtime\", \"--listen\", \"{listen}\", \"--launcher\", \"python\"]\nsnapshot = true\n";
        assert_eq!(Config::from_toml(python).unwrap().validate().unwrap_err().key, "kinds.\"python:3\".snapshot");
        let foreign = "[kinds.x]\ncommand = [\"/usr/bin/node\", \"proxy.js\", \"{listen}\"]\nsnapshot = true\n";
        assert_eq!(Config::from_toml(foreign).unwrap().validate().unwrap_err().key, "kinds.\"x\".snapshot");
    }

    #[test]
    fn the_zygote_is_on_for_our_python_runtime_only_and_may_be_turned_off() {
        let config = Config::from_toml("").unwrap();
        assert!(config.kinds["python:3"].uses_zygote());
        assert!(!config.kinds["nodejs:20"].uses_zygote() && !config.kinds["native"].uses_zygote());
        let off = "[kinds.\"python:3\"]\ncommand = [\"{invoker}\", \"action-runtime\", \"--listen\", \"{listen}\", \"--launcher\", \"python\"]\nzygote = false\n";
        assert!(!Config::from_toml(off).unwrap().kinds["python:3"].uses_zygote());
        let foreign = "[kinds.x]\ncommand = [\"/opt/proxy\", \"{listen}\"]\nzygote = true\n";
        assert_eq!(Config::from_toml(foreign).unwrap().validate().unwrap_err().key, "kinds.\"x\".zygote");
    }

    #[test]
    fn on_docker_the_kinds_with_an_image_are_the_action_kinds_and_an_images_own_entry_point_is_isolated() {
        let text = "[factory]\nkind = \"docker\"\n[factory.docker.kinds.\"nodejs:ow\"]\nimage = \"openwhisk/action-nodejs-v20\"\n";
        let config = Config::from_toml(text).unwrap();
        let kinds = config.action_kinds();
        assert_eq!(kinds.get("nodejs:ow"), Some(&1), "another's runtime: one run at a time");
        assert_eq!(kinds.get("python:3"), Some(&config.limits.concurrency_max), "ours");
        assert_eq!(kinds.get("nodejs:20"), None, "no image for it");
        let docker = &config.factory.docker;
        assert_eq!(docker.kinds["nodejs:ow"].network(docker.network), Network::Isolated);
        assert_eq!(docker.kinds["python:3"].network(docker.network), Network::None);
        assert_eq!(docker.kinds["nodejs:ow"].port(), OPENWHISK_PORT);
    }

    #[test]
    #[cfg(feature = "docker")]
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
    #[cfg(feature = "kubernetes")]
    fn the_kubernetes_config_file_is_valid_and_bad_keys_are_named() {
        let config = Config::from_file(Path::new("config/kubernetes.toml")).unwrap();
        config.validate().unwrap();
        assert_eq!(config.factory.kind, FactoryKind::Kubernetes);
        assert_eq!(config.factory.kubernetes.namespace, "invoker-actions");
        let kinds: Vec<&str> = config.action_kinds().into_keys().collect();
        assert_eq!(kinds, ["fn:image", "fn:python", "native", "python:3"], "the kinds with an image");
        assert_eq!(config.factory.kubernetes.fn_bridge, invoker_factory::settings::FnBridgeConfig::default());
        for (text, key) in [
            (
                "[factory.kubernetes.kinds.x]\nimage = \"i\"\ncode_file = \"../f.py\"\n",
                "factory.kubernetes.kinds.\"x\".code_file",
            ),
            ("[factory.kubernetes.fn_bridge]\nmemory_mb = 2\n", "factory.kubernetes.fn_bridge.memory_mb"),
            ("[factory.kubernetes.fn_bridge]\ncommand = []\n", "factory.kubernetes.fn_bridge"),
            ("[factory.kubernetes]\nnamespace = \"Actions\"\n", "factory.kubernetes.namespace"),
            ("[factory.kubernetes]\napi_server = \"k8s:6443\"\n", "factory.kubernetes.api_server"),
            ("[factory.kubernetes]\ncpus_per_gb = 0.0\n", "factory.kubernetes.cpus_per_gb"),
            ("[factory.kubernetes]\nimage_pull_policy = \"Sometimes\"\n", "factory.kubernetes.image_pull_policy"),
            ("[factory.kubernetes.kinds.x]\nimage = \"\"\n", "factory.kubernetes.kinds.\"x\".image"),
        ] {
            assert_eq!(Config::from_toml(text).unwrap().validate().unwrap_err().key, key, "{text}");
        }
        let tolerations =
            "[factory.kubernetes]\ntolerations = [{ key = \"a\", operator = \"Exists\", effect = \"NoSchedule\" }]\n";
        assert_eq!(Config::from_toml(tolerations).unwrap().factory.kubernetes.tolerations[0].key.as_deref(), Some("a"));
    }

    #[test]
    #[cfg(feature = "mesos")]
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
    fn the_cluster_config_file_is_valid_and_its_controller_key_is_listed() {
        let config = Config::from_file(Path::new("config/cluster.toml")).unwrap();
        config.validate().unwrap();
        let key = config.cluster.controller_key.as_ref().expect("a controller key for local use");
        assert!(config.admin.controller_keys.contains(key), "its invokers take the scheduler's key");
        assert_eq!(config.scheduler.max_reschedules, 3);
        let err = Config::from_toml("[scheduler]\nmanaged_fraction = 1.5\n").unwrap().validate().unwrap_err();
        assert_eq!(err.key, "scheduler.managed_fraction");
        let err = Config::from_toml("[scheduler]\nhandover_timeout = \"5ms\"\n").unwrap().validate().unwrap_err();
        assert_eq!(err.key, "scheduler.handover_timeout");
    }

    #[test]
    fn the_default_config_file_is_valid() {
        let config = Config::from_file(Path::new("config/default.toml")).unwrap();
        config.validate().unwrap();
        assert_eq!(config.namespaces["guest"], GUEST_KEY);
        assert!(config.kinds.contains_key("python:3"));
    }

    #[test]
    fn tracing_is_off_by_default_and_its_keys_are_checked() {
        let config = Config::from_toml("").unwrap();
        assert!(config.tracing.otlp_endpoint.is_empty() && config.tracing.sample_ratio.is_none());
        let ok = "[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\nsample_ratio = 0.01\n";
        Config::from_toml(ok).unwrap().validate().unwrap();
        for (bad, key) in [
            ("otlp_endpoint = \"https://collector:4318\"", "tracing.otlp_endpoint"),
            ("otlp_endpoint = \"http://a b\"", "tracing.otlp_endpoint"),
            ("sample_ratio = 1.5", "tracing.sample_ratio"),
            ("sample_ratio = nan", "tracing.sample_ratio"),
            ("service_name = \" \"", "tracing.service_name"),
        ] {
            let err = Config::from_toml(&format!("[tracing]\n{bad}\n")).unwrap().validate().unwrap_err();
            assert_eq!(err.key, key, "{bad}");
        }
    }

    #[test]
    fn a_followed_memory_limit_is_checked() {
        let ok = "[factory.process]\nmemory_limit_file = \"/sys/fs/cgroup/memory.max\"\nown_memory_mb = 256\n";
        Config::from_toml(ok).unwrap().validate().unwrap();
        for (bad, key) in [
            ("[factory.process]\nown_memory_mb = 256", "factory.process.own_memory_mb"),
            ("[factory.process]\nmemory_limit_file = \"/m\"\nown_memory_mb = 2000000", "factory.process.own_memory_mb"),
            ("[factory.process]\nmemory_limit_file = \"\"", "factory.process.memory_limit_file"),
            ("[factory.mock]\nown_memory_mb = 1", "factory.mock.own_memory_mb"),
        ] {
            let err = Config::from_toml(&format!("{bad}\n")).unwrap().validate().unwrap_err();
            assert_eq!(err.key, key, "{bad}");
        }
        let mut docker = Config::from_toml("[factory]\nkind = \"docker\"\n").unwrap().factory;
        let err = docker.follow_memory_limit("/sys/fs/cgroup/memory.max".into(), 0).unwrap_err();
        assert_eq!(err.key, "--memory-limit-file");
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
        assert_eq!(ok.pool.stem_for("python:3", 256, 256), Some(invoker_core::pool::StemId(0)));
        assert_eq!(ok.pool.stem_for("python:3", 512, 256), None);
        assert_eq!(ok.pool.stem_for("python:3", 256, 64), None, "a stem has the default disk");
        assert_eq!(ok.pool.prewarm[0].reactive.as_ref().unwrap().window, Duration::from_secs(60));
        let bad_kind = "[[pool.prewarm]]\nkind = \"cobol\"\nmemory_mb = 256\n";
        assert_eq!(Config::from_toml(bad_kind).unwrap().validate().unwrap_err().key, "pool.prewarm[0].kind");
        let bad_range = entry("reactive = { min = 4, max = 3 }\n");
        assert_eq!(Config::from_toml(&bad_range).unwrap().validate().unwrap_err().key, "pool.prewarm[0].reactive");
        let twice = format!("{}{}", entry(""), entry(""));
        assert_eq!(Config::from_toml(&twice).unwrap().validate().unwrap_err().key, "pool.prewarm[1].kind");
    }

    /// A backend the binary was built without is refused at start, naming the feature.
    #[test]
    fn a_factory_this_build_lacks_is_refused_with_the_feature_to_build_it_with() {
        for (kind, feature, built) in [
            ("docker", "docker", cfg!(feature = "docker")),
            ("mesos", "mesos", cfg!(feature = "mesos")),
            ("kubernetes", "kubernetes", cfg!(feature = "kubernetes")),
            ("mock", "test-util", cfg!(feature = "test-util")),
        ] {
            let config = Config::from_toml(&format!("[factory]\nkind = \"{kind}\"\n")).unwrap();
            match config.validate() {
                Err(e) if !built => {
                    assert_eq!(e.key, "factory.kind");
                    assert!(e.to_string().contains(&format!("--features {feature}")), "{e}");
                }
                Ok(()) if built => {}
                other => panic!("{kind} (built: {built}): {other:?}"),
            }
        }
        assert_eq!(crate::config::FactoryKind::Process.missing_feature(), None);
    }
}
