//! `[limits]`: what an action may ask for, and what a request may carry.

use super::error::{bad, ConfigError};
use serde::Deserialize;
use std::time::Duration;

/// The largest payload limit the invoker may be set to: what our runtime reads of a call and of
/// a result at most (`invoker-runtime`'s `MAX_BODY` and `MAX_RESULT_BYTES` leave room for the
/// envelope of each).
pub const PAYLOAD_MAX_BYTES_LIMIT: usize = 256 * 1024 * 1024;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub memory_min_mb: u32,
    pub memory_max_mb: u32,
    pub memory_default_mb: u32,
    pub timeout_min_ms: u64,
    pub timeout_max_ms: u64,
    pub timeout_default_ms: u64,
    pub logs_max_mb: u32,
    pub logs_default_mb: u32,
    pub concurrency_max: u32,
    pub concurrency_default: u32,
    /// What one container may write (`limits.disk`), in MB.
    pub disk_min_mb: u32,
    pub disk_max_mb: u32,
    pub disk_default_mb: u32,
    /// Largest call (its parameters, an Fn call's body) and largest result, in bytes: up to
    /// [`PAYLOAD_MAX_BYTES_LIMIT`].
    pub payload_max_bytes: usize,
    pub code_max_bytes: usize,
    /// The most a zip action's entries may hold unpacked (checked at `PUT`).
    pub archive_unpacked_max_mb: u32,
    /// Activations one namespace may have in flight; more get 429.
    pub namespace_concurrent: u32,
    /// Provisioned containers one namespace's actions may keep in all (their
    /// `provisioned-concurrency`); 0 allows none.
    pub namespace_provisioned: u32,
    /// How long a blocking invoke waits before answering 202 (OpenWhisk: 60 s).
    #[serde(with = "humantime_serde")]
    pub blocking_wait: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            memory_min_mb: 128,
            memory_max_mb: 512,
            memory_default_mb: 256,
            timeout_min_ms: 100,
            timeout_max_ms: 300_000,
            timeout_default_ms: 60_000,
            logs_max_mb: 10,
            logs_default_mb: 10,
            concurrency_max: 100,
            concurrency_default: 1,
            disk_min_mb: 16,
            disk_max_mb: 2048,
            disk_default_mb: invoker_wire::model::Limits::DEFAULT_DISK_MB,
            payload_max_bytes: 1024 * 1024,
            code_max_bytes: 48 * 1024 * 1024,
            archive_unpacked_max_mb: 256,
            namespace_concurrent: 100,
            namespace_provisioned: 10,
            blocking_wait: Duration::from_secs(60),
        }
    }
}

/// What a disk keeps of a file of `bytes`: whole 4 KiB pages.
pub fn disk_bytes_of(bytes: u64) -> u64 {
    bytes.div_ceil(4096).saturating_mul(4096)
}

/// Files the container itself makes on its disk besides the action's (its directories, the
/// runtime's socket, an interpreter's caches): kept free of the action's code.
pub const DISK_INODES_RESERVED: u64 = 64;

impl LimitsConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
        if l.payload_max_bytes == 0 || l.payload_max_bytes > PAYLOAD_MAX_BYTES_LIMIT {
            return Err(bad("limits.payload_max_bytes", "must be from 1 to 268435456 (256 MiB)"));
        }
        if !(l.memory_min_mb <= l.memory_default_mb && l.memory_default_mb <= l.memory_max_mb) || l.memory_min_mb == 0 {
            return Err(bad("limits.memory_*", "need 0 < memory_min_mb <= memory_default_mb <= memory_max_mb"));
        }
        if !(l.timeout_min_ms <= l.timeout_default_ms && l.timeout_default_ms <= l.timeout_max_ms)
            || l.timeout_min_ms == 0
        {
            return Err(bad("limits.timeout_*", "need 0 < timeout_min_ms <= timeout_default_ms <= timeout_max_ms"));
        }
        if !(l.disk_min_mb <= l.disk_default_mb && l.disk_default_mb <= l.disk_max_mb) || l.disk_min_mb == 0 {
            return Err(bad("limits.disk_*", "need 0 < disk_min_mb <= disk_default_mb <= disk_max_mb"));
        }
        if l.logs_default_mb > l.logs_max_mb {
            return Err(bad("limits.logs_default_mb", "must not exceed logs_max_mb"));
        }
        if l.concurrency_default == 0 || l.concurrency_default > l.concurrency_max {
            return Err(bad("limits.concurrency_default", "must be between 1 and concurrency_max"));
        }
        if l.archive_unpacked_max_mb == 0 {
            return Err(bad("limits.archive_unpacked_max_mb", "must be at least 1"));
        }
        if l.namespace_concurrent == 0 {
            return Err(bad("limits.namespace_concurrent", "must be at least 1"));
        }
        if l.blocking_wait.is_zero() {
            return Err(bad("limits.blocking_wait", "must be positive"));
        }
        Ok(())
    }
}
