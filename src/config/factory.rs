//! `[factory]`: which backend creates action containers, and each backend's section.

use super::error::{bad, ConfigError};
use super::limits::LimitsConfig;
use super::pool::PoolConfig;
use invoker_factory::settings::{
    DockerFactoryConfig, KubernetesFactoryConfig, MesosFactoryConfig, ProcessFactoryConfig,
};
use serde::Deserialize;
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

    /// Whether the backend runs a function's own image (`fn:image`): those with an image
    /// engine do; the process and Mesos factories run this machine's programs.
    pub fn runs_images(self) -> bool {
        match self {
            FactoryKind::Docker | FactoryKind::Kubernetes => true,
            FactoryKind::Process | FactoryKind::Mock | FactoryKind::Mesos => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FactoryKind::Process => "process",
            FactoryKind::Mock => "mock",
            FactoryKind::Docker => "docker",
            FactoryKind::Mesos => "mesos",
            FactoryKind::Kubernetes => "kubernetes",
        }
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
    pub kubernetes: KubernetesFactoryConfig,
}

/// The mock factory (for tests and benchmarks): in-process HTTP runtimes on simulated nodes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MockFactoryConfig {
    pub nodes: u32,
    pub node_memory_mb: u64,
    /// How long a container takes to start (a slow cluster manager, or work an invoker holds
    /// without having started it).
    #[serde(with = "humantime_serde")]
    pub start_latency: Duration,
    /// As the process factory's: each node offers what this memory limit leaves beyond
    /// `own_memory_mb` (the capacity manager's tests run the mock factory in resized pods).
    pub memory_limit_file: Option<PathBuf>,
    pub own_memory_mb: u64,
}

impl Default for MockFactoryConfig {
    fn default() -> Self {
        MockFactoryConfig {
            nodes: 1,
            node_memory_mb: 2048,
            start_latency: Duration::ZERO,
            memory_limit_file: None,
            own_memory_mb: 0,
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
            kubernetes: KubernetesFactoryConfig::default(),
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

    /// Offers what the memory limit in `file` leaves beyond `own_mb` (the process and mock
    /// factories, as `--memory-mb`): an invoker in a pod that is resized in place.
    pub fn follow_memory_limit(&mut self, file: PathBuf, own_mb: u64) -> Result<(), ConfigError> {
        let (limit, own) = match self.kind {
            FactoryKind::Process => (&mut self.process.memory_limit_file, &mut self.process.own_memory_mb),
            FactoryKind::Mock => (&mut self.mock.memory_limit_file, &mut self.mock.own_memory_mb),
            other => {
                let why = format!("only the process and mock factories take it, not {other:?}");
                return Err(bad("--memory-limit-file", why));
            }
        };
        *limit = Some(file);
        *own = own_mb;
        Ok(())
    }

    /// The memory limit the invoker follows and its own share of it, when it follows one.
    pub fn memory_limit(&self) -> Option<(&std::path::Path, u64)> {
        let (file, own) = match self.kind {
            FactoryKind::Process => (&self.process.memory_limit_file, self.process.own_memory_mb),
            FactoryKind::Mock => (&self.mock.memory_limit_file, self.mock.own_memory_mb),
            _ => return None,
        };
        Some((file.as_deref()?, own))
    }

    pub(super) fn validate(&self, pool: &PoolConfig, limits: &LimitsConfig) -> Result<(), ConfigError> {
        if let Some(missing) = self.kind.missing_feature() {
            return Err(bad("factory.kind", missing.to_string()));
        }
        self.validate_mesos()?;
        super::kubernetes::validate(&self.kubernetes)?;
        if self.mock.nodes == 0 || self.mock.nodes > 10_000 {
            return Err(bad("factory.mock.nodes", "must be 1 to 10000"));
        }
        if self.mock.start_latency > Duration::from_secs(600) {
            return Err(bad("factory.mock.start_latency", "must be at most 10m"));
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
        let followed = [
            ("process", &fp.memory_limit_file, fp.own_memory_mb),
            ("mock", &self.mock.memory_limit_file, self.mock.own_memory_mb),
        ];
        for (section, file, own_mb) in followed {
            let key = |k: &str| format!("factory.{section}.{k}");
            if own_mb > 1 << 20 {
                return Err(bad(&key("own_memory_mb"), "must be at most 1048576 (a TiB)"));
            }
            if own_mb > 0 && file.is_none() {
                return Err(bad(&key("own_memory_mb"), "is a share of memory_limit_file, which is not set"));
            }
            if file.as_ref().is_some_and(|f| f.as_os_str().is_empty()) {
                return Err(bad(&key("memory_limit_file"), "is empty"));
            }
        }
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
