//! `[api]`: what one client, and all of them together, may hold of the API server.

use super::error::{bad, ConfigError};
use serde::Deserialize;
use std::time::Duration;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// A connection whose client takes none of an answer's bytes for this long is closed (a
    /// client that never reads would otherwise hold its answer's memory for ever).
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Answers sent and not yet taken by their clients, over every connection, in MB: past it,
    /// a new answer is a 503 with Retry-After (its work done; a record says so where one ran).
    pub unread_answers_mb: u32,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig { write_timeout: Duration::from_secs(15), unread_answers_mb: 256 }
    }
}

impl ApiConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.write_timeout.is_zero() {
            return Err(bad("api.write_timeout", "must be positive"));
        }
        if !(1..=1_048_576).contains(&self.unread_answers_mb) {
            return Err(bad("api.unread_answers_mb", "must be 1 to 1048576 (1 TB)"));
        }
        Ok(())
    }
}
