//! `[factory.kubernetes]`: action containers as pods, bound to the node the pool chose.

use super::error::{bad, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

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
        self.port.unwrap_or(super::kinds::OPENWHISK_PORT)
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
            command: super::kinds::FDK_PYTHON_COMMAND.map(String::from).to_vec(),
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
            ]),
            fn_bridge: FnBridgeConfig::default(),
        }
    }
}

/// An API server's URL as the config gives it: `https://host:port` or `http://host:port`.
pub(super) fn check_api_server(url: Option<&str>, key: &str) -> Result<(), ConfigError> {
    let Some(url) = url else { return Ok(()) };
    let authority = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")).unwrap_or_default();
    if authority.is_empty() || authority.contains(' ') {
        return Err(bad(key, "must be https://host:port or http://host:port"));
    }
    Ok(())
}

/// A DNS-1123 label (what a namespace's name must be).
pub(super) fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl KubernetesFactoryConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let key = |k: &str| format!("factory.kubernetes.{k}");
        check_api_server(self.api_server.as_deref(), &key("api_server"))?;
        if !dns_label(&self.namespace) {
            return Err(bad(&key("namespace"), "must be a DNS-1123 label (a-z, 0-9, '-', at most 63)"));
        }
        if !(self.cpus_per_gb > 0.0 && self.cpus_per_gb <= 64.0) {
            return Err(bad(&key("cpus_per_gb"), "must be above 0 and at most 64"));
        }
        for (k, d) in [
            ("create_timeout", self.create_timeout),
            ("delete_timeout", self.delete_timeout),
            ("call_timeout", self.call_timeout),
        ] {
            if d.is_zero() {
                return Err(bad(&key(k), "must be positive"));
            }
        }
        if !["Always", "IfNotPresent", "Never"].contains(&self.image_pull_policy.as_str()) {
            return Err(bad(&key("image_pull_policy"), "must be Always, IfNotPresent or Never"));
        }
        for (name, kind) in &self.kinds {
            if kind.image.is_empty() {
                return Err(bad(&key(&format!("kinds.\"{name}\".image")), "must be set"));
            }
            if kind.port == Some(0) {
                return Err(bad(&key(&format!("kinds.\"{name}\".port")), "must be 1 to 65535"));
            }
            let plain = |f: &str| !f.is_empty() && !f.contains('/') && f != "." && f != "..";
            if kind.code_file.as_deref().is_some_and(|f| !plain(f)) {
                return Err(bad(&key(&format!("kinds.\"{name}\".code_file")), "must be a plain file name"));
            }
        }
        let bridge = &self.fn_bridge;
        if bridge.image.is_empty() || bridge.command.is_empty() {
            return Err(bad(&key("fn_bridge"), "image and command must be set"));
        }
        if !(4..=1024).contains(&bridge.memory_mb) {
            return Err(bad(&key("fn_bridge.memory_mb"), "must be 4 to 1024"));
        }
        Ok(())
    }
}
