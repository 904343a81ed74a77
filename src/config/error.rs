//! A config's one kind of error: the key, and why its value does not hold.

#[derive(Debug, thiserror::Error)]
#[error("config {key}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

pub(super) fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError { key: key.to_string(), reason: reason.into() }
}

impl From<invoker_core::capacity::BadSetting> for ConfigError {
    fn from(e: invoker_core::capacity::BadSetting) -> Self {
        ConfigError { key: e.key, reason: e.reason }
    }
}
