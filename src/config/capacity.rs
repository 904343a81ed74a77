//! `[capacity]`: the groups of invokers `invoker capacity` keeps sized to demand, each read
//! into the decision core's own spec ([`invoker_core::capacity::GroupSpec`]) once validated.

use super::error::{bad, ConfigError};
use invoker_core::capacity::{ControlPlaneKind, GroupConfig};
use invoker_factory::settings::KubernetesPlaneConfig;
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
    /// Where the groups with `control_plane = "kubernetes"` run their invokers.
    pub kubernetes: KubernetesPlaneConfig,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            tick: Duration::from_secs(1),
            groups: BTreeMap::new(),
            kubernetes: KubernetesPlaneConfig::default(),
        }
    }
}

/// The checks of `[capacity.kubernetes]`.
fn validate_kubernetes(plane: &KubernetesPlaneConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("capacity.kubernetes.{k}");
    super::kubernetes::check_api_server(plane.api_server.as_deref(), &key("api_server"))?;
    if !super::kubernetes::dns_label(&plane.namespace) {
        return Err(bad(&key("namespace"), "must be a DNS-1123 label (a-z, 0-9, '-', at most 63)"));
    }
    if plane.image.trim().is_empty() {
        return Err(bad(&key("image"), "must name an image"));
    }
    if !["Always", "IfNotPresent", "Never"].contains(&plane.image_pull_policy.as_str()) {
        return Err(bad(&key("image_pull_policy"), "Always, IfNotPresent or Never"));
    }
    if !plane.command.iter().any(|a| a.contains("$(POD_NAME)")) {
        return Err(bad(&key("command"), "must pass $(POD_NAME) as the invoker's id (--invoker-id)"));
    }
    if plane.config_map.as_deref().is_some_and(|m| !super::kubernetes::dns_label(m)) {
        return Err(bad(&key("config_map"), "must be a DNS-1123 label"));
    }
    if plane.termination_grace < Duration::from_secs(1) || plane.termination_grace > Duration::from_secs(3600) {
        return Err(bad(&key("termination_grace"), "between 1s and 1h"));
    }
    if plane.call_timeout.is_zero() {
        return Err(bad(&key("call_timeout"), "must be positive"));
    }
    if plane.standby.is_some_and(|n| n > 64) {
        return Err(bad(&key("standby"), "at most 64 pods per group"));
    }
    // Unset, the plane may keep standby pods (the cluster decides): their size must hold.
    if plane.standby != Some(0) {
        if plane.standby.is_some() && !plane.follows_its_limit() {
            return Err(bad(
                &key("command"),
                "with standby pods the invoker must follow its pod's memory limit (--memory-limit-file)",
            ));
        }
        if plane.standby_mb == 0 || plane.standby_mb > plane.overhead_mb {
            return Err(bad(&key("standby_mb"), "above 0 and at most overhead_mb (a standby pod offers nothing)"));
        }
    }
    Ok(())
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
        // One manager drives one control plane.
        let mut planes = self.groups.iter().map(|(name, g)| (name, g.control_plane));
        if let Some((_, first)) = planes.next() {
            if let Some((name, other)) = planes.find(|(_, p)| *p != first) {
                let reason = format!("every group of a manager uses one control plane: {first:?} or {other:?}");
                return Err(bad(&format!("capacity.groups.{name}.control_plane"), reason));
            }
            if first == ControlPlaneKind::Kubernetes {
                if !cfg!(feature = "kubernetes") {
                    let (name, _) = self.groups.iter().next().expect("a group");
                    let reason = "this build has no Kubernetes control plane (cargo build --features kubernetes)";
                    return Err(bad(&format!("capacity.groups.{name}.control_plane"), reason));
                }
                validate_kubernetes(&self.kubernetes)?;
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
        assert_eq!(
            gpu.spec("gpu", std::time::Duration::from_secs(1), false).drain_deadline,
            std::time::Duration::from_secs(50)
        );
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
            error("[capacity.groups.default]\nmax = 2\nheadroom_mb = 4096\n"),
            "capacity.groups.default.headroom_mb"
        );
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

    #[test]
    fn one_control_plane_per_manager_and_the_kubernetes_keys_are_checked() {
        let mixed =
            "[capacity.groups.default]\n[capacity.groups.gpu]\ntags = [\"gpu\"]\ncontrol_plane = \"kubernetes\"\n";
        assert_eq!(error(mixed), "capacity.groups.gpu.control_plane");
        let k8s = |extra: &str| {
            format!("[capacity.groups.default]\ncontrol_plane = \"kubernetes\"\n[capacity.kubernetes]\n{extra}")
        };
        if !cfg!(feature = "kubernetes") {
            assert_eq!(error(&k8s("")), "capacity.groups.default.control_plane");
            return;
        }
        Config::from_toml(&k8s("")).unwrap().validate().unwrap();
        assert_eq!(error(&k8s("namespace = \"Invokers\"\n")), "capacity.kubernetes.namespace");
        assert_eq!(error(&k8s("image = \" \"\n")), "capacity.kubernetes.image");
        assert_eq!(error(&k8s("image_pull_policy = \"Sometimes\"\n")), "capacity.kubernetes.image_pull_policy");
        assert_eq!(error(&k8s("command = [\"/invoker\", \"serve\"]\n")), "capacity.kubernetes.command");
        assert_eq!(error(&k8s("termination_grace = \"0s\"\n")), "capacity.kubernetes.termination_grace");
        assert_eq!(error(&k8s("api_server = \"kube:6443\"\n")), "capacity.kubernetes.api_server");
        Config::from_toml(&k8s("standby = 2\n")).unwrap().validate().unwrap();
        assert_eq!(error(&k8s("standby = 65\n")), "capacity.kubernetes.standby");
        // A standby pod's invoker must follow its pod's limit, and its pod must hold no more
        // than the invoker's own share (or it would offer memory it was never given).
        let fixed =
            "standby = 2\ncommand = [\"/invoker\", \"serve\", \"--invoker-id\", \"$(POD_NAME)\", \"--memory-mb=1\"]\n";
        assert_eq!(error(&k8s(fixed)), "capacity.kubernetes.command");
        // Unset, such a command only keeps the plane from standing pods by.
        Config::from_toml(&k8s(&fixed["standby = 2\n".len()..])).unwrap().validate().unwrap();
        assert_eq!(error(&k8s("standby_mb = 512\n")), "capacity.kubernetes.standby_mb");
        Config::from_toml(&k8s("standby = 0\nstandby_mb = 512\n")).unwrap().validate().unwrap();
        assert_eq!(error(&k8s("standby = 2\nstandby_mb = 512\n")), "capacity.kubernetes.standby_mb");
        assert_eq!(error(&k8s("standby = 2\nstandby_mb = 0\n")), "capacity.kubernetes.standby_mb");
        // The section is read only for a manager on Kubernetes.
        let local = "[capacity.groups.default]\n[capacity.kubernetes]\nnamespace = \"Invokers\"\n";
        Config::from_toml(local).unwrap().validate().unwrap();
    }
}
