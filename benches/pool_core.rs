//! The cost of one activation's decision in the pure pool core (arrival → dispatch, then
//! completion), as the pool grows from 10 to 100,000 warm containers over 10 to 10,000 action
//! keys on 10 nodes, keys drawn at random. Upstream OpenWhisk scans its pools per activation;
//! this must stay flat.
//!
//! `cargo bench --bench pool_core`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use invoker_core::pool::*;
use invoker_ids::{JobId, NodeId, NodeStatsUpdate};
use std::hint::black_box;
use std::time::Duration;

const NODES: usize = 10;
const MEMORY_MB: u32 = 128;

/// A core holding `containers` idle warm containers spread evenly over `keys` keys.
fn warm_core(containers: usize, keys: u32) -> PoolCore {
    let config = CoreConfig {
        max_starts_per_action: u32::MAX,
        max_starts_per_node: u32::MAX,
        max_waiting: usize::MAX,
        idle_timeout: Duration::from_secs(3600 * 24),
        stats_ttl: Duration::from_secs(3600 * 24),
        buffer_mb: 0,
        start_rule: StartRule::Capped,
        prewarm: Vec::new(),
        claim_after: Duration::from_secs(1),
        ..CoreConfig::default()
    };
    let mut core = PoolCore::new(config);
    let per_node = (containers / NODES + 1) as u64 * u64::from(MEMORY_MB);
    let t0 = Duration::ZERO;
    for n in 0..NODES {
        let node = NodeId::new(&format!("node{n}"));
        core.handle(
            Event::NodeStats(NodeStatsUpdate { node, capacity_mb: per_node, free_mb: per_node, observed_at: t0 }),
            t0,
        );
    }
    let deadline = Duration::from_secs(3600 * 24);
    let mut created = Vec::with_capacity(containers);
    for i in 0..containers {
        let job = Job {
            id: JobId(i as u64),
            key: KeyId(i as u32 % keys),
            memory_mb: MEMORY_MB,
            concurrency: 1,
            deadline,
            stem: None,
            idle_timeout: None,
            patient: false,
            max_running: None,
            tenant: TenantId::default(),
        };
        for effect in core.handle(Event::Arrived(job), t0) {
            if let Effect::Create { container, .. } = effect {
                created.push(container);
            }
        }
    }
    assert_eq!(created.len(), containers, "every waiting job got its own container");
    let mut dispatched = Vec::with_capacity(containers);
    for &container in &created {
        for effect in core.handle(Event::Started { container, failure: None, at: t0 }, t0) {
            if let Effect::Dispatch { job, container } = effect {
                dispatched.push((job, container));
            }
        }
    }
    for (job, container) in dispatched {
        core.handle(Event::Finished { container, job, reusable: true }, t0);
    }
    assert_eq!(core.counts().idle, containers);
    core
}

/// A deterministic stream of random keys (xorshift), so every size sees the same spread.
struct Keys(u64, u32);

impl Keys {
    fn next(&mut self) -> KeyId {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        KeyId((self.0 % u64::from(self.1)) as u32)
    }
}

fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("warm_activation_decision");
    for (containers, keys) in [(10, 10), (1_000, 100), (10_000, 1_000), (100_000, 10_000)] {
        let mut core = warm_core(containers, keys);
        let mut keys = Keys(0x9E37_79B9_7F4A_7C15, keys);
        let mut next_job = 10_000_000u64;
        let now = Duration::from_secs(1);
        let deadline = Duration::from_secs(3600 * 24);
        group.bench_function(BenchmarkId::new("containers", containers), |b| {
            b.iter(|| {
                next_job += 1;
                let job = Job {
                    id: JobId(next_job),
                    key: keys.next(),
                    memory_mb: MEMORY_MB,
                    concurrency: 1,
                    deadline,
                    stem: None,
                    idle_timeout: None,
                    patient: false,
                    max_running: None,
                    tenant: TenantId::default(),
                };
                let effects = core.handle(Event::Arrived(job), now);
                let Some(Effect::Dispatch { job, container }) = effects.first().cloned() else {
                    panic!("a warm container was free: {effects:?}");
                };
                black_box(core.handle(Event::Finished { container, job, reusable: true }, now));
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decision);
criterion_main!(benches);
