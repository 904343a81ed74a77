//! `[cluster]`: the etcd an invoker registers in, and what it says of itself there. Without
//! `etcd` endpoints the invoker is standalone and needs no etcd.

use super::error::{bad, ConfigError};
use serde::Deserialize;
use std::time::Duration;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// etcd's client URLs (`http://host:port`); empty: standalone.
    pub etcd: Vec<String>,
    /// The root of every key the cluster layer writes.
    pub prefix: String,
    /// The registration's lease: an invoker that stops renewing it (killed, cut off) vanishes
    /// from the cluster this long after.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// The registration is updated at most this often (never per activation).
    #[serde(with = "humantime_serde")]
    pub publish_interval: Duration,
    /// What this invoker offers (`gpu`, `ssd`...), matched against actions'
    /// `invoker-resources` annotation.
    pub tags: Vec<String>,
    /// The URL schedulers reach this invoker's API on; by default `http://` and the address it
    /// listens on.
    pub advertise: Option<String>,
    /// The key a scheduler presents to invokers (which list it in `[admin] controller_keys`),
    /// and an invoker presents to a scheduler's internal route when it fetches an action.
    pub controller_key: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            etcd: Vec::new(),
            prefix: "/invoker".into(),
            lease_ttl: Duration::from_secs(10),
            publish_interval: Duration::from_millis(500),
            tags: Vec::new(),
            advertise: None,
            controller_key: None,
        }
    }
}

impl ClusterConfig {
    pub fn enabled(&self) -> bool {
        !self.etcd.is_empty()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (i, e) in self.etcd.iter().enumerate() {
            if invoker_wire::cluster::authority(e).is_none() {
                return Err(bad(&format!("cluster.etcd[{i}]"), "must be http://host:port"));
            }
        }
        if self.prefix.is_empty() || self.prefix.ends_with('/') || !self.prefix.starts_with('/') {
            return Err(bad("cluster.prefix", "must start with '/' and not end with one"));
        }
        if self.lease_ttl < Duration::from_secs(2) {
            return Err(bad("cluster.lease_ttl", "must be at least 2s"));
        }
        if self.publish_interval < Duration::from_millis(50) || self.publish_interval * 3 > self.lease_ttl {
            return Err(bad("cluster.publish_interval", "must be at least 50ms and at most a third of lease_ttl"));
        }
        for (i, tag) in self.tags.iter().enumerate() {
            let ok = !tag.is_empty()
                && tag.len() <= 64
                && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
            if !ok {
                return Err(bad(&format!("cluster.tags[{i}]"), "1 to 64 letters, digits, '-', '_' or '.'"));
            }
        }
        if let Some(key) = &self.controller_key {
            if !key.split_once(':').is_some_and(|(u, s)| !u.is_empty() && !s.is_empty()) {
                return Err(bad("cluster.controller_key", "an API key is 'uuid:secret'"));
            }
        }
        if let Some(a) = &self.advertise {
            if !a.starts_with("http://") {
                return Err(bad("cluster.advertise", "must be an http:// URL"));
            }
        }
        Ok(())
    }
}

/// `[scheduler]`: what `invoker scheduler` needs beyond `[cluster]`. An invoker ignores it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Unique among the schedulers of one etcd: invokers find this scheduler's address under
    /// it when they fetch an action they do not hold.
    pub id: String,
    /// The untagged invokers in id order: the first fraction takes managed actions...
    pub managed_fraction: f64,
    /// ...and the last fraction blackbox (Docker image) ones (OpenWhisk: 0.9 and 0.1).
    pub blackbox_fraction: f64,
    /// Invokers tried for one activation after the first refused it or could not be reached.
    pub max_reschedules: u32,
    /// The invokers, their containers and drains come from a watch of etcd: a change is taken
    /// at once after a quiet spell, then at most once per this interval.
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
    /// Activations on their way to or running on invokers at most; past it a new one gets
    /// 503 (a record says so).
    pub max_in_flight: u32,
    /// How long an invoker last read healthy is still placed on after its registration went
    /// from etcd (its lease expired while etcd was away: an invoker that answers is not dead).
    /// Unset: the cluster's `lease_ttl`, in which a live invoker registers again.
    #[serde(default, with = "humantime_serde")]
    pub registration_grace: Option<Duration>,
    /// How long an invoker has to ask for an activation's message (`100 Continue`) once the
    /// request's head reached it. One that does not is stalled (frozen, or its process is not
    /// scheduled): the message was never sent, so the activation goes elsewhere, and nothing
    /// new goes there until it answers a ping. Apart from the activation's own duration.
    #[serde(with = "humantime_serde")]
    pub handover_timeout: Duration,
    /// How long an activation no invoker has room for waits for one (a capacity manager adding
    /// invokers, others finishing). Past it, a blocking call is kept in the durable queue and
    /// answered 202 (unless no invoker could ever hold it: 503). 0: refused at once (a fleet
    /// that does not grow).
    #[serde(with = "humantime_serde")]
    pub wait_for_room: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            id: "scheduler0".into(),
            managed_fraction: 0.9,
            blackbox_fraction: 0.1,
            max_reschedules: 3,
            refresh_interval: Duration::from_millis(50),
            max_in_flight: 10_000,
            registration_grace: None,
            handover_timeout: Duration::from_secs(1),
            wait_for_room: Duration::ZERO,
        }
    }
}

impl SchedulerConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        invoker_wire::model::validate_entity_name("scheduler.id", &self.id).map_err(|r| bad("scheduler.id", r))?;
        for (key, f) in [
            ("scheduler.managed_fraction", self.managed_fraction),
            ("scheduler.blackbox_fraction", self.blackbox_fraction),
        ] {
            if !(0.0..=1.0).contains(&f) || f.is_nan() {
                return Err(bad(key, "must be between 0 and 1"));
            }
        }
        if self.max_reschedules > 16 {
            return Err(bad("scheduler.max_reschedules", "at most 16"));
        }
        if self.refresh_interval < Duration::from_millis(20) || self.refresh_interval > Duration::from_secs(10) {
            return Err(bad("scheduler.refresh_interval", "between 20ms and 10s"));
        }
        if self.max_in_flight == 0 {
            return Err(bad("scheduler.max_in_flight", "must be at least 1"));
        }
        if self.wait_for_room > Duration::from_secs(600) {
            return Err(bad("scheduler.wait_for_room", "at most 10m"));
        }
        if self.handover_timeout < Duration::from_millis(50) || self.handover_timeout > Duration::from_secs(60) {
            return Err(bad("scheduler.handover_timeout", "between 50ms and 60s"));
        }
        Ok(())
    }
}
