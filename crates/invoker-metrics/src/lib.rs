//! Prometheus metrics: counters kept as activations end; pool gauges read at scrape time. A
//! leaf below the job (whose completion counts), the pool, the proxies and the API (`/metrics`).

#![forbid(unsafe_code)]

use invoker_wire::model::{EncodedRecord, StartKind};
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

pub struct Metrics {
    registry: Registry,
    /// What the live view (`/ui`) is sent, when somebody watches.
    pub live: invoker_live::LiveFeed,
    /// Seconds from acceptance to the end of the run.
    latency: Histogram,
    pub containers: Family<StateLabel, Gauge>,
    /// The memory stem containers hold, not yet taken by an action.
    pub prewarm_memory_mb: Gauge,
    pub waiting: Gauge,
    /// The counters an ending activation bumps, looked up once (no label allocation per call).
    by_outcome: [Counter; 4],
    cold: Counter,
    warm: Counter,
    prewarm: Counter,
    /// The durable queue: calls waiting and the oldest's age, by namespace (set at scrape).
    pub queued: Family<NamespaceLabel, Gauge>,
    pub queued_oldest_seconds: Family<NamespaceLabel, Gauge>,
    /// Attempts queued again by their policy, and calls given up to a dead-letter list.
    pub retries: Counter,
    pub dead_letters: Counter,
    /// Blocking calls held by their action's cap (`max-concurrency`, `reserved-concurrency`)
    /// past their wait: answered 429.
    capped: Counter,
    /// Calls waiting for their action's cap now, and the actions' provisioned containers
    /// (`wanted`, `up`); set at scrape.
    pub capped_waiting: Gauge,
    pub provisioned: Family<StateLabel, Gauge>,
    /// From the pool's asking a container to go to its being gone (the factory's destroy and
    /// the actors' hops): what a cold start that must first make room waits for.
    remove_seconds: Histogram,
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
        let status = |s: &str| activations.get_or_create(&StatusLabel { status: s.into() }).clone();
        let by_outcome = [
            status("success"),
            status("application_error"),
            status("action_developer_error"),
            status("whisk_internal_error"),
        ];
        let cold = starts.get_or_create(&StartLabel { start: "cold".into() }).clone();
        let warm = starts.get_or_create(&StartLabel { start: "warm".into() }).clone();
        let prewarm = starts.get_or_create(&StartLabel { start: "prewarm".into() }).clone();
        let queued = Family::<NamespaceLabel, Gauge>::default();
        let queued_oldest_seconds = Family::<NamespaceLabel, Gauge>::default();
        let (retries, dead_letters) = (Counter::default(), Counter::default());
        registry.register("queued_calls", "Asynchronous calls waiting in the durable queue", queued.clone());
        registry.register(
            "queued_oldest_seconds",
            "Age of the oldest asynchronous call waiting in the durable queue",
            queued_oldest_seconds.clone(),
        );
        registry.register("retries", "Asynchronous calls queued again by their retry policy", retries.clone());
        registry.register("dead_letters", "Asynchronous calls given up to a dead-letter list", dead_letters.clone());
        let capped = Counter::default();
        registry.register(
            "capped",
            "Blocking calls their action's max-concurrency held past their wait (answered 429)",
            capped.clone(),
        );
        let capped_waiting = Gauge::default();
        registry.register(
            "capped_waiting",
            "Activations waiting for their action's max-concurrency now",
            capped_waiting.clone(),
        );
        let provisioned = Family::<StateLabel, Gauge>::default();
        registry.register(
            "provisioned_containers",
            "Provisioned containers of actions' provisioned-concurrency: wanted, and up",
            provisioned.clone(),
        );
        let remove_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "container_remove_seconds",
            "From the pool asking a container to go to its being gone",
            remove_seconds.clone(),
        );
        let prewarm_memory_mb = Gauge::default();
        registry.register(
            "prewarm_memory_mb",
            "Memory held by stem containers ([[pool.prewarm]]) no action has taken yet, ready or starting",
            prewarm_memory_mb.clone(),
        );
        let live = invoker_live::LiveFeed::default();
        Metrics {
            registry,
            live,
            latency,
            containers,
            prewarm_memory_mb,
            waiting,
            by_outcome,
            cold,
            warm,
            prewarm,
            queued,
            queued_oldest_seconds,
            retries,
            dead_letters,
            capped,
            capped_waiting,
            provisioned,
            remove_seconds,
        }
    }
}

impl Metrics {
    /// A container the pool asked to go is gone, `took` after it asked.
    pub fn container_removed(&self, took: std::time::Duration) {
        self.remove_seconds.observe(took.as_secs_f64());
    }

    pub fn activation_finished(&self, record: &EncodedRecord) {
        if self.live.watched() {
            self.live.activation(&invoker_live::ActivationRow::of(record.record()));
        }
        let head = record.head();
        self.by_outcome[head.outcome.status_code() as usize % 4].inc();
        match head.start_kind {
            Some(StartKind::Cold) => {
                self.cold.inc();
            }
            Some(StartKind::Warm) => {
                self.warm.inc();
            }
            Some(StartKind::Prewarm) => {
                self.prewarm.inc();
            }
            None => {}
        }
        if head.rejection_kind == Some(invoker_wire::model::RejectionKind::Capped) {
            self.capped.inc();
        }
        self.latency.observe(head.duration as f64 / 1000.0);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
