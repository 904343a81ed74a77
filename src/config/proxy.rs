//! `[proxy]`: what every container proxy waits for, and when it pauses an idle container.

use super::error::{bad, ConfigError};
use serde::Deserialize;
use std::time::Duration;

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

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            init_timeout: Duration::from_secs(60),
            log_sentinel_wait: Duration::from_secs(2),
            pause_grace: Duration::from_secs(1),
        }
    }
}

impl ProxyConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.init_timeout.is_zero() {
            return Err(bad("proxy.init_timeout", "must be positive"));
        }
        Ok(())
    }
}
