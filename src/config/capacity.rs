//! `[capacity]`: the groups of invokers `invoker capacity` keeps sized to demand, each read
//! into the decision core's own spec ([`crate::capacity::core::GroupSpec`]) once validated.

use super::{bad, ConfigError};
use crate::capacity::core::GroupSpec;
use crate::capacity::predictor::PredictorKind;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CapacityConfig {
    /// How often each group decides (Fn's loop: 1 s).
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// Group name → its bounds and pace. The untagged invokers are the group `default`.
    pub groups: BTreeMap<String, GroupConfig>,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig { tick: Duration::from_secs(1), groups: BTreeMap::new() }
    }
}

/// Where a group's invokers run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlPlaneKind {
    /// Processes of the manager's machine.
    #[default]
    Local,
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
    /// How long demand must stay an invoker below what is active before one is drained.
    #[serde(with = "humantime_serde")]
    pub scale_down_after: Duration,
    /// A draining invoker is removed at the latest this long after its drain began (Fn: 50 s).
    #[serde(with = "humantime_serde")]
    pub drain_deadline: Duration,
    /// An invoker asked for that has not registered by then is given up and replaced.
    #[serde(with = "humantime_serde")]
    pub provision_timeout: Duration,
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
            scale_down_after: Duration::from_secs(60),
            drain_deadline: Duration::from_secs(50),
            provision_timeout: Duration::from_secs(60),
            predictor: PredictorKind::default(),
            control_plane: ControlPlaneKind::default(),
        }
    }
}

impl GroupConfig {
    pub fn spec(&self, name: &str) -> GroupSpec {
        GroupSpec {
            name: name.to_string(),
            min: self.min,
            max: self.max,
            invoker_memory_mb: self.invoker_memory_mb,
            max_step: self.max_step,
            scale_down_after: self.scale_down_after,
            drain_deadline: self.drain_deadline,
            provision_timeout: self.provision_timeout,
        }
    }
}

impl CapacityConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.tick < Duration::from_millis(100) || self.tick > Duration::from_secs(60) {
            return Err(bad("capacity.tick", "between 100ms and 60s"));
        }
        let mut tag_sets: BTreeMap<Vec<String>, &str> = BTreeMap::new();
        for (name, g) in &self.groups {
            let key = |field: &str| format!("capacity.groups.{name}.{field}");
            // Its invokers are `<name>-<n>` (an invoker id, a StatefulSet's pod name).
            let name_ok = name.len() <= 24
                && name.starts_with(|c: char| c.is_ascii_lowercase())
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !name.ends_with('-');
            if !name_ok {
                return Err(bad(
                    &format!("capacity.groups.{name}"),
                    "a group's name is 1 to 24 lowercase letters, digits or '-', a letter first",
                ));
            }
            let mut tags = g.tags.clone();
            tags.sort();
            tags.dedup();
            match (name.as_str(), tags.is_empty()) {
                ("default", false) => return Err(bad(&key("tags"), "the default group is the untagged invokers")),
                (_, true) if name != "default" => {
                    return Err(bad(&key("tags"), "only the group 'default' has no tags"));
                }
                _ => {}
            }
            if let Some(other) = tag_sets.insert(tags, name) {
                return Err(bad(&key("tags"), format!("the same tags as the group '{other}'")));
            }
            g.validate(name)?;
        }
        Ok(())
    }
}

impl GroupConfig {
    /// The checks of one group's own keys (`capacity.groups.<name>.*`).
    pub fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let key = |field: &str| format!("capacity.groups.{name}.{field}");
        if self.max == 0 || self.max > 1000 {
            return Err(bad(&key("max"), "between 1 and 1000"));
        }
        if self.min > self.max {
            return Err(bad(&key("min"), format!("at most max ({})", self.max)));
        }
        if self.invoker_memory_mb < 128 {
            return Err(bad(&key("invoker_memory_mb"), "at least 128"));
        }
        if self.max_step == 0 {
            return Err(bad(&key("max_step"), "at least 1"));
        }
        for (field, d) in [
            ("scale_down_after", self.scale_down_after),
            ("drain_deadline", self.drain_deadline),
            ("provision_timeout", self.provision_timeout),
        ] {
            if d < Duration::from_secs(1) || d > Duration::from_secs(24 * 3600) {
                return Err(bad(&key(field), "between 1s and 24h"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    fn error(toml: &str) -> String {
        let config = Config::from_toml(toml).unwrap();
        config.validate().unwrap_err().key
    }

    #[test]
    fn each_key_is_checked_by_name() {
        let ok = Config::from_toml(
            "[capacity.groups.default]\nmax = 4\n[capacity.groups.gpu]\ntags = [\"gpu\"]\nmin = 0\npredictor = \"windowed\"\n",
        )
        .unwrap();
        ok.validate().unwrap();
        let gpu = &ok.capacity.groups["gpu"];
        assert_eq!((gpu.min, gpu.max, gpu.max_step), (0, 10, 20));
        assert_eq!(gpu.spec("gpu").drain_deadline, std::time::Duration::from_secs(50));
        assert_eq!(error("[capacity.groups.Big]\n"), "capacity.groups.Big");
        assert_eq!(error("[capacity.groups.default]\ntags = [\"a\"]\n"), "capacity.groups.default.tags");
        assert_eq!(error("[capacity.groups.web]\n"), "capacity.groups.web.tags");
        assert_eq!(
            error("[capacity.groups.a]\ntags = [\"x\"]\n[capacity.groups.b]\ntags = [\"x\", \"x\"]\n"),
            "capacity.groups.b.tags"
        );
        assert_eq!(error("[capacity.groups.default]\nmin = 5\nmax = 4\n"), "capacity.groups.default.min");
        assert_eq!(error("[capacity.groups.default]\nmax = 0\n"), "capacity.groups.default.max");
        assert_eq!(
            error("[capacity.groups.default]\ninvoker_memory_mb = 64\n"),
            "capacity.groups.default.invoker_memory_mb"
        );
        assert_eq!(error("[capacity.groups.default]\nmax_step = 0\n"), "capacity.groups.default.max_step");
        assert_eq!(
            error("[capacity.groups.default]\nscale_down_after = \"10ms\"\n"),
            "capacity.groups.default.scale_down_after"
        );
        assert_eq!(error("[capacity]\ntick = \"1ms\"\n"), "capacity.tick");
        let unknown = Config::from_toml("[capacity.groups.default]\npredicter = \"x\"\n").unwrap_err();
        assert!(unknown.reason.contains("predicter"), "{unknown}");
        let bad_predictor = Config::from_toml("[capacity.groups.default]\npredictor = \"psychic\"\n").unwrap_err();
        assert!(bad_predictor.reason.contains("psychic"), "{bad_predictor}");
    }
}
