//! The scheduler's Prometheus metrics: placements by rule, reschedules, 503s by reason, how long
//! activations waited for an invoker with room, and (read at scrape time) activations in flight
//! per invoker.

use invoker_core::placement::{NoPlacement, Rule};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabel {
    pub rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InvokerLabel {
    pub invoker: String,
}

pub struct SchedulerMetrics {
    registry: Registry,
    placements: Family<RuleLabel, Counter>,
    pub reschedules: Counter,
    unavailable: Family<ReasonLabel, Counter>,
    pub lost: Counter,
    /// Records written as guesses (a restart, an invoker lost) replaced by the invoker's own.
    pub guesses_replaced: Counter,
    pub unheard: Counter,
    pub in_flight: Family<InvokerLabel, Gauge>,
    /// Each activation that found no invoker with room: how long it waited for one (until
    /// placed, or refused at `wait_for_room`). What a growing fleet costs its callers.
    pub room_wait_seconds: Histogram,
    /// Ranges of the cluster's prefix: one at the start, one per broken or compacted watch.
    pub etcd_ranges: Counter,
    /// The schedulers this one reads in etcd (an action's cap is shared between them).
    pub schedulers: Gauge,
    /// Activations that waited for their action's `max-concurrency` (this scheduler's share).
    pub capped_waits: Counter,
    /// Blocking calls that found no invoker with room within `wait_for_room`, kept in the
    /// durable queue (answered 202) rather than refused.
    pub kept_queued: Counter,
}

impl Default for SchedulerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("scheduler");
        let placements = Family::<RuleLabel, Counter>::default();
        let reschedules = Counter::default();
        let unavailable = Family::<ReasonLabel, Counter>::default();
        let lost = Counter::default();
        let guesses_replaced = Counter::default();
        let unheard = Counter::default();
        let in_flight = Family::<InvokerLabel, Gauge>::default();
        let room_wait_seconds = Histogram::new([0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0]);
        let etcd_ranges = Counter::default();
        let schedulers = Gauge::default();
        let capped_waits = Counter::default();
        let kept_queued = Counter::default();
        registry.register(
            "kept_queued",
            "Blocking calls that found no invoker with room within wait_for_room, kept in the durable queue and answered 202",
            kept_queued.clone(),
        );
        registry.register("schedulers", "The schedulers this one reads in etcd", schedulers.clone());
        registry.register(
            "capped_waits",
            "Activations that waited for their action's max-concurrency (this scheduler's share of it)",
            capped_waits.clone(),
        );
        registry.register(
            "placements",
            "Activations sent to an invoker, by the rule that chose it",
            placements.clone(),
        );
        registry.register("reschedules", "Activations sent to another invoker after one refused", reschedules.clone());
        registry.register("unavailable", "Activations answered 503 because no invoker took them", unavailable.clone());
        registry.register("lost", "Activations whose invoker was lost while they ran", lost.clone());
        registry.register(
            "guesses_replaced",
            "Records written as guesses (a restart, an invoker lost) replaced by the invoker's record of what ran",
            guesses_replaced.clone(),
        );
        registry.register(
            "unheard",
            "Hand-overs an invoker did not ask for in time (it never received them; sent elsewhere)",
            unheard.clone(),
        );
        registry.register("in_flight", "Activations sent to an invoker and not yet answered", in_flight.clone());
        registry.register(
            "room_wait_seconds",
            "How long activations that found no invoker with room waited for one",
            room_wait_seconds.clone(),
        );
        registry.register(
            "etcd_ranges",
            "Ranges of the cluster's prefix in etcd (one at the start, then one per broken or compacted watch)",
            etcd_ranges.clone(),
        );
        SchedulerMetrics {
            registry,
            placements,
            reschedules,
            unavailable,
            lost,
            guesses_replaced,
            unheard,
            in_flight,
            room_wait_seconds,
            etcd_ranges,
            schedulers,
            capped_waits,
            kept_queued,
        }
    }
}

impl SchedulerMetrics {
    pub fn placed(&self, rule: Rule) {
        let rule = match rule {
            Rule::Warm => "warm",
            Rule::Headroom => "headroom",
            Rule::Tag => "tag",
            Rule::Spill => "spill",
            Rule::Fallback => "fallback",
        };
        self.placements.get_or_create(&RuleLabel { rule }).inc();
    }

    pub fn unavailable(&self, why: Option<&NoPlacement>) {
        let reason = match why {
            Some(NoPlacement::NoHealthy) => "no_healthy",
            Some(NoPlacement::NoneFits(_)) => "none_fits",
            Some(NoPlacement::NoTags(_)) => "no_tags",
            None => "all_refused",
        };
        self.unavailable.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
