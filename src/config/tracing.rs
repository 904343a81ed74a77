//! `[tracing]`: where spans go. Off unless an OTLP endpoint is named here or by the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables.

use super::error::{bad, ConfigError};
use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// An OTLP/HTTP collector's base address (`http://127.0.0.1:4318`); spans are posted to
    /// its `/v1/traces` in protobuf. Empty: the standard variables decide.
    pub otlp_endpoint: String,
    /// The share of traces that start here which are kept (head sampling, by trace id). A
    /// caller's `traceparent` decides for its own trace. Unset: `OTEL_TRACES_SAMPLER` and
    /// `OTEL_TRACES_SAMPLER_ARG` decide, else every trace is kept.
    pub sample_ratio: Option<f64>,
    /// The `service.name` on every span. Unset: `OTEL_SERVICE_NAME`, else the subcommand
    /// (`invoker`, `invoker-scheduler`, `invoker-capacity`).
    pub service_name: Option<String>,
}

impl TracingConfig {
    /// What the tracing module is given.
    pub fn settings(&self) -> invoker_telemetry::TracingSettings {
        invoker_telemetry::TracingSettings {
            otlp_endpoint: self.otlp_endpoint.clone(),
            sample_ratio: self.sample_ratio,
            service_name: self.service_name.clone(),
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.otlp_endpoint.is_empty() {
            let scheme = self.otlp_endpoint.split_once("://").map(|(scheme, _)| scheme);
            if !matches!(scheme, Some("http")) {
                return Err(bad(
                    "tracing.otlp_endpoint",
                    "an http:// address (OTLP over HTTP; no TLS client is built in)",
                ));
            }
            if self.otlp_endpoint.parse::<hyper::Uri>().is_err() {
                return Err(bad("tracing.otlp_endpoint", "not a valid address"));
            }
        }
        if let Some(ratio) = self.sample_ratio {
            if !(0.0..=1.0).contains(&ratio) {
                return Err(bad("tracing.sample_ratio", "a share between 0 and 1"));
            }
        }
        if self.service_name.as_deref().is_some_and(|n| n.trim().is_empty() || n.len() > 255) {
            return Err(bad("tracing.service_name", "a name of 1 to 255 characters"));
        }
        Ok(())
    }
}
