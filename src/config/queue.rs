//! `[queue]`: the durable queue of asynchronous calls (non-blocking invokes, Fn's detached
//! calls): how much it holds, and how long a call may wait in it.

use super::error::{bad, ConfigError};
use serde::Deserialize;
use std::time::Duration;

/// The least and the most a call may wait in the queue (AWS Lambda's bounds on an event's age).
pub const EVENT_AGE_MIN: Duration = Duration::from_secs(60);
pub const EVENT_AGE_MAX: Duration = Duration::from_secs(6 * 3600);
/// The most retries a call may have (Lambda's bound).
pub const RETRY_ATTEMPTS_MAX: u32 = 2;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Calls waiting to start, all namespaces together; past it a new one is refused (429).
    pub max_calls: usize,
    /// Calls one namespace may have waiting: one tenant's flood leaves room for the others.
    pub max_calls_per_namespace: usize,
    /// What the waiting calls hold (their parameters and requests, as kept on disk), in MB.
    pub max_mb: u64,
    /// How long a call may wait to start; past it, it ends unrun with a record saying so.
    /// An action's `max-event-age` annotation (seconds) sets its own.
    #[serde(with = "humantime_serde")]
    pub max_event_age: Duration,
    /// How many times a call that failed is tried again (0 to 2, as Lambda's default of 2); an
    /// action's `max-retry-attempts` annotation sets its own.
    pub max_retry_attempts: u32,
    /// The wait before the first retry; each later one waits twice the one before.
    #[serde(with = "humantime_serde")]
    pub retry_backoff: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_calls: 100_000,
            max_calls_per_namespace: 10_000,
            max_mb: 1024,
            max_event_age: EVENT_AGE_MAX,
            max_retry_attempts: RETRY_ATTEMPTS_MAX,
            retry_backoff: Duration::from_secs(60),
        }
    }
}

impl QueueConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_calls == 0 || self.max_calls > 10_000_000 {
            return Err(bad("queue.max_calls", "must be from 1 to 10000000"));
        }
        if self.max_calls_per_namespace == 0 || self.max_calls_per_namespace > self.max_calls {
            return Err(bad("queue.max_calls_per_namespace", "must be from 1 to queue.max_calls"));
        }
        if self.max_mb == 0 || self.max_mb > 1024 * 1024 {
            return Err(bad("queue.max_mb", "must be from 1 to 1048576 (1 TiB)"));
        }
        if !(EVENT_AGE_MIN..=EVENT_AGE_MAX).contains(&self.max_event_age) {
            return Err(bad("queue.max_event_age", "must be from 1m to 6h"));
        }
        if self.max_retry_attempts > RETRY_ATTEMPTS_MAX {
            return Err(bad("queue.max_retry_attempts", "must be from 0 to 2"));
        }
        if self.retry_backoff < Duration::from_millis(10) || self.retry_backoff > Duration::from_secs(3600) {
            return Err(bad("queue.retry_backoff", "must be from 10ms to 1h"));
        }
        Ok(())
    }
}
