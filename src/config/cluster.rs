//! `[cluster]`: the etcd an invoker registers in, and what it says of itself there. Without
//! `etcd` endpoints the invoker is standalone and needs no etcd.

use super::{bad, ConfigError};
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
        }
    }
}

impl ClusterConfig {
    pub fn enabled(&self) -> bool {
        !self.etcd.is_empty()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (i, e) in self.etcd.iter().enumerate() {
            if crate::cluster::etcd::authority(e).is_none() {
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
        if let Some(a) = &self.advertise {
            if !a.starts_with("http://") {
                return Err(bad("cluster.advertise", "must be an http:// URL"));
            }
        }
        Ok(())
    }
}
