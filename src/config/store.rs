//! `[store]`: the bounds of the embedded store.

use super::error::{bad, ConfigError};
use serde::Deserialize;
use std::time::Duration;

/// The embedded store's bounds.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Memory for the actions read on every invoke, kept whole (code included); the least
    /// recently used go first.
    pub action_cache_mb: u64,
    /// How often records older than `record_retention` are removed.
    #[serde(with = "humantime_serde")]
    pub expire_every: Duration,
    /// Disk the journal keeps allocated for the records of accepted work, given back when the
    /// disk is full so that work that ran always gets its record written.
    pub end_reserve_mb: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            action_cache_mb: (invoker_store::DEFAULT_ACTION_CACHE_BYTES / (1024 * 1024)) as u64,
            expire_every: Duration::from_secs(3600),
            end_reserve_mb: invoker_store::DEFAULT_END_RESERVE_BYTES >> 20,
        }
    }
}

impl StoreConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.action_cache_mb > 1024 * 1024 {
            return Err(bad("store.action_cache_mb", "must be at most 1048576 (1 TiB)"));
        }
        if self.end_reserve_mb > 1024 * 1024 {
            return Err(bad("store.end_reserve_mb", "must be at most 1048576 (1 TiB)"));
        }
        if self.expire_every < Duration::from_secs(1) {
            return Err(bad("store.expire_every", "must be at least 1s"));
        }
        Ok(())
    }
}
