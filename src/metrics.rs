//! Prometheus metrics: counters kept as activations end; pool gauges read at scrape time.

use crate::model::{ActivationRecord, StartKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartLabel {
    pub start: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

pub struct Metrics {
    registry: Registry,
    activations: Family<StatusLabel, Counter>,
    starts: Family<StartLabel, Counter>,
    /// Seconds from acceptance to the end of the run.
    latency: Histogram,
    pub containers: Family<StateLabel, Gauge>,
    pub waiting: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("invoker");
        let activations = Family::<StatusLabel, Counter>::default();
        let starts = Family::<StartLabel, Counter>::default();
        let latency = Histogram::new(exponential_buckets(0.0005, 2.0, 20));
        let containers = Family::<StateLabel, Gauge>::default();
        let waiting = Gauge::default();
        registry.register("activations", "Activations ended, by status", activations.clone());
        registry.register("container_starts", "Activations by how their container started", starts.clone());
        registry.register("activation_duration_seconds", "Run time of activations", latency.clone());
        registry.register("containers", "Containers by state", containers.clone());
        registry.register("waiting_jobs", "Activations waiting for a container", waiting.clone());
        Metrics { registry, activations, starts, latency, containers, waiting }
    }
}

impl Metrics {
    pub fn activation_finished(&self, record: &ActivationRecord) {
        let status = record.response.status.replace(' ', "_");
        self.activations.get_or_create(&StatusLabel { status }).inc();
        if let Some(start) =
            record.annotation("startKind").and_then(|v| serde_json::from_value::<StartKind>(v.clone()).ok())
        {
            let start = format!("{start:?}").to_lowercase();
            self.starts.get_or_create(&StartLabel { start }).inc();
        }
        self.latency.observe(record.duration as f64 / 1000.0);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
