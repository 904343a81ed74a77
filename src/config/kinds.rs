//! `[kinds]`: each action kind's runtime: the command that serves it, its network, and the
//! protocol it speaks.

use super::{bad, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

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
    /// The most runs one container of the kind takes at once (an action's
    /// `limits.concurrency` above it is refused). Unset: `limits.concurrency_max` for the
    /// project's own runtime, 1 for any other (OpenWhisk's actionloop proxy loses answers to
    /// overlapping runs).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
}

impl KindConfig {
    /// Whether the kind runs the project's own runtime (`invoker action-runtime`).
    pub fn is_own_runtime(&self) -> bool {
        self.command.first().is_some_and(|c| c == "{invoker}")
            && self.command.get(1).is_some_and(|c| c == "action-runtime")
    }

    /// The most runs at once one container of the kind takes, `concurrency_max` the config's.
    pub fn max_concurrency(&self, concurrency_max: u32) -> u32 {
        match self.max_concurrency {
            Some(n) => n.min(concurrency_max),
            None if self.is_own_runtime() => concurrency_max,
            None => 1,
        }
    }

    /// The command line with `{invoker}` and `{listen}` filled in.
    pub fn command_for(&self, invoker: &Path, listen: &str) -> Vec<String> {
        let invoker = invoker.to_string_lossy();
        self.command.iter().map(|a| a.replace("{invoker}", &invoker).replace("{listen}", listen)).collect()
    }
}

fn builtin_runtime(launcher: &str) -> KindConfig {
    let command = ["{invoker}", "action-runtime", "--listen", "{listen}", "--launcher", launcher];
    KindConfig {
        command: command.iter().map(|s| s.to_string()).collect(),
        network: Network::None,
        protocol: RuntimeProtocol::OpenWhisk,
        max_concurrency: None,
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

pub(super) fn validate(kinds: &BTreeMap<String, KindConfig>) -> Result<(), ConfigError> {
    for (kind, k) in kinds {
        if k.command.is_empty() || !k.command.iter().any(|a| a.contains("{listen}")) {
            return Err(bad(&format!("kinds.\"{kind}\".command"), "must be non-empty and pass '{listen}'"));
        }
        if k.max_concurrency == Some(0) {
            return Err(bad(&format!("kinds.\"{kind}\".max_concurrency"), "must be at least 1"));
        }
    }
    Ok(())
}
