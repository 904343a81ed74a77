//! Traces, OpenTelemetry's way: `tracing` spans bridged by `tracing-opentelemetry` and exported
//! over OTLP/HTTP (protobuf) by the SDK's batch processor, on its own thread.
//!
//! Off by default, and then free: no layer takes the spans, so every span's callsite is
//! disabled once and `info_span!` costs an atomic load. The log lines keep their own filter
//! (`RUST_LOG`) and see events only, so turning traces on changes no log line.
//!
//! Why a span and not a timestamp in the record: a trace crosses processes (scheduler,
//! invoker, the action), and a collector already knows how to draw it.
//!
//! A crate below everything that makes spans (the intake, the proxies, the scheduler, the
//! etcd client), so that each names the same target and shapes.

#![forbid(unsafe_code)]

mod activation;
mod sampling;

pub use activation::{failed, ActivationTrace, TraceParent, HEADER};
pub use sampling::{exporting, head_sampled, TARGET};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{filter_fn, EnvFilter, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The share kept: the config's, else `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` as
/// the specification reads them (a caller's flag always decides for its own trace), else all.
fn keep_ratio(config: &TracingSettings) -> f64 {
    if let Some(ratio) = config.sample_ratio {
        return ratio;
    }
    let arg = || std::env::var("OTEL_TRACES_SAMPLER_ARG").ok().and_then(|a| a.trim().parse::<f64>().ok());
    match std::env::var("OTEL_TRACES_SAMPLER").unwrap_or_default().trim() {
        "always_off" | "parentbased_always_off" => 0.0,
        "traceidratio" | "parentbased_traceidratio" => arg().filter(|r| (0.0..=1.0).contains(r)).unwrap_or(1.0),
        _ => 1.0,
    }
}

/// A span of one of an activation's stages (`trace` an [`ActivationTrace`]), under the
/// activation's span, from now; none when the activation records none (tracing off, or its
/// trace sampled out), never a root of its own.
#[macro_export]
macro_rules! stage_span {
    ($trace:expr, $name:literal $(, $($fields:tt)*)?) => {{
        let parent: &tracing::Span = $trace.span();
        if parent.is_disabled() {
            tracing::Span::none()
        } else {
            tracing::info_span!(target: $crate::TARGET, parent: parent, $name $(, $($fields)*)?)
        }
    }};
}

/// A moment of the cluster worth a trace of its own (an etcd watch that broke, a lease lost or
/// taken): a root span named `name` that ends at once, failed when `failure` says why.
pub fn moment(name: &'static str, subject: &str, failure: Option<&str>) {
    let span = tracing::info_span!(
        target: TARGET,
        parent: None,
        "moment",
        "otel.name" = name,
        subject,
        "otel.status_code" = tracing::field::Empty,
        "otel.status_description" = tracing::field::Empty,
    );
    if let Some(why) = failure {
        failed(&span, why);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("tracing: the OTLP exporter could not be built: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("tracing: a subscriber is already set: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// The process's tracing, set once at start. Dropping it flushes what is left to export.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// What `[tracing]` says (the invoker's `config::TracingConfig`), handed over by `main`: this
/// crate depends on no config (the cluster's files it traces import it).
#[derive(Clone, Debug, Default)]
pub struct TracingSettings {
    pub otlp_endpoint: String,
    pub sample_ratio: Option<f64>,
    pub service_name: Option<String>,
}

/// Where spans go: the config's endpoint, else the standard variables; `None`: nowhere.
fn endpoint(config: &TracingSettings) -> Option<Option<String>> {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let off = |name: &str, value: &str| std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value));
    if off("OTEL_SDK_DISABLED", "true") || off("OTEL_TRACES_EXPORTER", "none") {
        return None;
    }
    if !config.otlp_endpoint.is_empty() {
        // The exporter posts to a configured address as it is; the variables' convention (the
        // signal's path appended) is kept for ours too.
        return Some(Some(format!("{}/v1/traces", config.otlp_endpoint.trim_end_matches('/'))));
    }
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")).then_some(None)
}

impl Telemetry {
    /// Log lines to stderr (`RUST_LOG`, default `info`), and spans to OTLP when an endpoint is
    /// set. `service` names the process when neither the config nor `OTEL_SERVICE_NAME` does.
    pub fn init(config: &TracingSettings, service: &str) -> Result<Telemetry, TelemetryError> {
        let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()).and(filter_fn(|m| m.is_event())),
        );
        let Some(endpoint) = endpoint(config) else {
            tracing_subscriber::registry().with(logs).try_init()?;
            return Ok(Telemetry { provider: None });
        };
        let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_http().with_protocol(Protocol::HttpBinary);
        if let Some(endpoint) = &endpoint {
            exporter = exporter.with_endpoint(endpoint);
        }
        let mut resource = Resource::builder();
        match &config.service_name {
            Some(name) => resource = resource.with_service_name(name.clone()),
            None if std::env::var_os("OTEL_SERVICE_NAME").is_none() => {
                resource = resource.with_service_name(service.to_string())
            }
            None => {}
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter.build()?)
            .with_resource(resource.build())
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
            .build();
        let ratio = keep_ratio(config);
        sampling::keep(ratio);
        let spans = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("invoker"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(filter_fn(|m| m.is_span() && m.target() == TARGET));
        tracing_subscriber::registry().with(logs).with(spans).try_init()?;
        tracing::info!(endpoint = endpoint.as_deref().unwrap_or("from OTEL_EXPORTER_OTLP_*"), "traces are exported");
        Ok(Telemetry { provider: Some(provider) })
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown_with_timeout(std::time::Duration::from_secs(5)) {
                eprintln!("tracing: the last spans were not exported: {e}");
            }
        }
    }
}
