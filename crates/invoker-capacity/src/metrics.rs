//! The capacity manager's Prometheus metrics: invokers by group and state, demand and target
//! in MB, decisions by kind, and how long an invoker asked for took to register.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupState {
    pub group: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    pub group: String,
    pub kind: &'static str,
}

pub struct CapacityMetrics {
    registry: Registry,
    pub invokers: Family<GroupState, Gauge>,
    pub demand_mb: Family<GroupLabel, Gauge>,
    pub target_mb: Family<GroupLabel, Gauge>,
    pub decisions: Family<DecisionLabel, Counter>,
    pub provisioning_seconds: Histogram,
}

impl Default for CapacityMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("capacity");
        let invokers = Family::<GroupState, Gauge>::default();
        let demand_mb = Family::<GroupLabel, Gauge>::default();
        let target_mb = Family::<GroupLabel, Gauge>::default();
        let decisions = Family::<DecisionLabel, Counter>::default();
        // From a standby pod's resize or a local process (tenths of a second) to a new pod's.
        let buckets = [0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];
        let provisioning_seconds = Histogram::new(buckets);
        registry.register("invokers", "Invokers by group and state", invokers.clone());
        registry.register("demand_mb", "Memory the schedulers need, per group", demand_mb.clone());
        registry.register("target_mb", "The predictor's target, per group", target_mb.clone());
        registry.register("decisions", "Decisions by group and kind", decisions.clone());
        registry.register(
            "provisioning_seconds",
            "From asking for an invoker to its registration",
            provisioning_seconds.clone(),
        );
        CapacityMetrics { registry, invokers, demand_mb, target_mb, decisions, provisioning_seconds }
    }
}

impl CapacityMetrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
