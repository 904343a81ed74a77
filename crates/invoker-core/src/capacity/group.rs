//! `[capacity.groups.<name>]`: one invoker group's bounds and pace as an operator writes them,
//! and their checks. It lives beside the decision core because the capacity manager and the
//! fleet simulator both read it into the core's `GroupSpec`, so that they cannot disagree.

use crate::predictor::PredictorKind;
use serde::Deserialize;
use std::time::Duration;

/// A setting that does not hold: its key (`capacity.groups.<name>.<field>`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct BadSetting {
    pub key: String,
    pub reason: String,
}

impl BadSetting {
    fn new(key: String, reason: impl Into<String>) -> Self {
        BadSetting { key, reason: reason.into() }
    }
}

/// Where a group's invokers run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlPlaneKind {
    /// Processes of the manager's machine.
    #[default]
    Local,
    /// A StatefulSet per group (`[capacity.kubernetes]`; built with `--features kubernetes`).
    Kubernetes,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupConfig {
    /// The tags its invokers carry (none for `default`, some for every other group).
    pub tags: Vec<String>,
    pub min: u32,
    pub max: u32,
    /// Each invoker's memory for actions.
    pub invoker_memory_mb: u64,
    /// Invokers asked for at once at most (Fn: 20).
    pub max_step: u32,
    /// How long demand must stay an invoker below what is active before one is drained; unset,
    /// the control plane's own ([`crate::capacity::default_hold`]).
    #[serde(with = "humantime_serde")]
    pub scale_down_after: Option<Duration>,
    /// A draining invoker is removed at the latest this long after its drain began (Fn: 50 s).
    #[serde(with = "humantime_serde")]
    pub drain_deadline: Duration,
    /// An invoker asked for that has not registered by then is given up and replaced.
    #[serde(with = "humantime_serde")]
    pub provision_timeout: Duration,
    /// Memory kept beyond the predictor's target whenever it is above zero: calls that need
    /// more than is up wait for an invoker to start, and this trades invoker-seconds for fewer
    /// of them (`scenarios/fleet-*.toml` measure it).
    pub headroom_mb: u64,
    pub predictor: PredictorKind,
    pub control_plane: ControlPlaneKind,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            tags: Vec::new(),
            min: 1,
            max: 10,
            invoker_memory_mb: 1024,
            max_step: 20,
            scale_down_after: None,
            drain_deadline: Duration::from_secs(50),
            provision_timeout: Duration::from_secs(60),
            headroom_mb: 0,
            predictor: PredictorKind::default(),
            control_plane: ControlPlaneKind::default(),
        }
    }
}

impl GroupConfig {
    /// The checks of one group's own keys (`capacity.groups.<name>.*`).
    pub fn validate(&self, name: &str) -> Result<(), BadSetting> {
        let key = |field: &str| format!("capacity.groups.{name}.{field}");
        if self.max == 0 || self.max > 1000 {
            return Err(BadSetting::new(key("max"), "between 1 and 1000"));
        }
        if self.min > self.max {
            return Err(BadSetting::new(key("min"), format!("at most max ({})", self.max)));
        }
        if self.headroom_mb > self.invoker_memory_mb.saturating_mul(u64::from(self.max)) {
            return Err(BadSetting::new(key("headroom_mb"), "at most what max invokers hold"));
        }
        if self.invoker_memory_mb < 128 {
            return Err(BadSetting::new(key("invoker_memory_mb"), "at least 128"));
        }
        if self.max_step == 0 {
            return Err(BadSetting::new(key("max_step"), "at least 1"));
        }
        for (field, d) in [
            ("scale_down_after", self.scale_down_after),
            ("drain_deadline", Some(self.drain_deadline)),
            ("provision_timeout", Some(self.provision_timeout)),
        ] {
            if d.is_some_and(|d| d < Duration::from_secs(1) || d > Duration::from_secs(24 * 3600)) {
                return Err(BadSetting::new(key(field), "between 1s and 24h"));
            }
        }
        Ok(())
    }
}
