//! Issue 60: provisioned containers, event by event: created and kept through an hour idle,
//! found warm by the first calls, never evicted for another action's room, replaced when they
//! go, backed off when their start fails, and let go when the count is lowered.

use super::*;
use invoker_ids::NodeStatsUpdate;
use std::time::Duration;

fn ms(n: u64) -> Time {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Time {
    Duration::from_secs(n)
}

fn job(id: u64, key: u32, memory_mb: u32, at: Time) -> Job {
    Job {
        id: JobId(id),
        key: KeyId(key),
        memory_mb,
        concurrency: 1,
        deadline: at + secs(60),
        stem: None,
        idle_timeout: None,
        patient: false,
        max_running: None,
        tenant: TenantId::default(),
    }
}

fn provision(key: u32, count: u32, memory_mb: u32) -> Event {
    Event::Provision(Provision {
        key: KeyId(key),
        count,
        memory_mb,
        concurrency: 1,
        max_running: None,
        tenant: TenantId::default(),
    })
}

fn stats(capacity_mb: u64, free_mb: u64, at: Time) -> Event {
    Event::NodeStats(NodeStatsUpdate { node: NodeId::new("n1"), capacity_mb, free_mb, observed_at: at })
}

/// Creates, each with whether it is provisioned.
fn creates(fx: &Effects) -> Vec<(ContainerId, bool)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Create { container, provisioned, .. } => Some((*container, *provisioned)),
            _ => None,
        })
        .collect()
}

fn removed(fx: &Effects) -> Vec<ContainerId> {
    fx.iter().filter_map(|e| if let Effect::Remove { container } = e { Some(*container) } else { None }).collect()
}

/// A core on one node of `capacity_mb` under `keep_alive`, and the provisioned containers of
/// key 1 (256 MB) it started, all ready.
fn provisioned_core(keep_alive: KeepAliveKind, capacity_mb: u64, count: u32) -> (PoolCore, Vec<ContainerId>) {
    let mut core = PoolCore::new(CoreConfig { keep_alive, ..CoreConfig::default() });
    core.handle(stats(capacity_mb, capacity_mb, ms(0)), ms(0));
    let fx = core.handle(provision(1, count, 256), ms(1));
    let ids: Vec<ContainerId> = creates(&fx)
        .into_iter()
        .map(|(id, provisioned)| {
            assert!(provisioned);
            id
        })
        .collect();
    assert_eq!(ids.len(), count as usize, "{fx:?}");
    for &id in &ids {
        core.handle(Event::Started { container: id, failure: None, at: ms(2) }, ms(2));
    }
    (core, ids)
}

/// Ticks through `span` at the core's tick, with fresh stats every minute.
fn idle_for(core: &mut PoolCore, from: Time, span: Time, capacity_mb: u64, free_mb: u64) -> Effects {
    let mut all = Effects::new();
    let (mut now, mut observed) = (from, from);
    while now < from + span {
        now += ms(100);
        if now >= observed + secs(30) {
            observed = now;
            all.extend(core.handle(stats(capacity_mb, free_mb, now), now));
        }
        all.extend(core.handle(Event::Tick, now));
    }
    all
}

/// The goal, by counts: with N provisioned, the first N concurrent calls after an
/// hour idle are all warm (no container created for them), under every keep-alive policy.
#[test]
fn after_an_hour_idle_the_first_n_concurrent_calls_are_all_warm() {
    for keep_alive in [KeepAliveKind::Fixed, KeepAliveKind::GreedyDual, KeepAliveKind::Hybrid] {
        let (mut core, ids) = provisioned_core(keep_alive, 4096, 5);
        let fx = idle_for(&mut core, ms(2), secs(3600), 4096, 4096 - 5 * 256);
        assert!(removed(&fx).is_empty(), "{keep_alive:?}: a provisioned container went while idle: {fx:?}");
        let at = secs(3601);
        let mut warm = Vec::new();
        for id in 0..5 {
            let fx = core.handle(Event::Arrived(job(id, 1, 256, at)), at);
            assert!(creates(&fx).is_empty(), "{keep_alive:?}: call {id} started cold: {fx:?}");
            warm.extend(fx.iter().filter_map(|e| match e {
                Effect::Dispatch { container, .. } => Some(*container),
                _ => None,
            }));
        }
        warm.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(warm, expected, "{keep_alive:?}: each call on a provisioned container");
        // The sixth is past what is provisioned: it starts one, an ordinary container.
        let fx = core.handle(Event::Arrived(job(5, 1, 256, at)), at);
        assert_eq!(creates(&fx).iter().map(|&(_, p)| p).collect::<Vec<_>>(), [false], "{fx:?}");
    }
}

/// Memory pressure: another action that needs room evicts an ordinary idle container, never
/// a provisioned one; with only provisioned ones idle, it waits rather than evicting them.
#[test]
fn another_actions_start_never_evicts_a_provisioned_container() {
    let (mut core, provisioned) = provisioned_core(KeepAliveKind::GreedyDual, 1024, 2);
    // An ordinary idle container of key 1 beside them: its burst's third call.
    let mut extra = Vec::new();
    for id in 0..3 {
        extra.extend(creates(&core.handle(Event::Arrived(job(id, 1, 256, ms(10))), ms(10))));
    }
    let (ordinary, _) = extra[0];
    core.handle(Event::Started { container: ordinary, failure: None, at: ms(11) }, ms(11));
    for (container, id) in [(provisioned[0], 0), (provisioned[1], 1), (ordinary, 2)] {
        core.handle(Event::Finished { container, job: JobId(id), reusable: true }, ms(12));
    }
    core.handle(stats(1024, 256, ms(13)), ms(13));
    // Another action needs 512 MB: the node has 256 free, so one container must go.
    let fx = core.handle(Event::Arrived(job(10, 2, 512, ms(14))), ms(14));
    assert_eq!(removed(&fx), [ordinary], "only the ordinary idle container: {fx:?}");
    core.handle(Event::Removed(ordinary), ms(15));
    // A third action needs 512 MB more, with only the provisioned two idle: nothing goes.
    let fx = core.handle(Event::Arrived(job(11, 3, 512, ms(16))), ms(16));
    assert!(removed(&fx).is_empty(), "{fx:?}");
    let fx = idle_for(&mut core, ms(16), secs(30), 1024, 0);
    assert!(!removed(&fx).iter().any(|c| provisioned.contains(c)), "{fx:?}");
}

/// One that crashes is replaced at once; one whose start fails is tried again after a
/// backoff that doubles, not at every tick.
#[test]
fn a_provisioned_container_that_goes_is_replaced_and_failed_starts_back_off() {
    let (mut core, ids) = provisioned_core(KeepAliveKind::Hybrid, 4096, 1);
    let fx = core.handle(Event::Removed(ids[0]), secs(10));
    let fx = if fx.is_empty() { core.handle(Event::Tick, secs(10) + ms(100)) } else { fx };
    let replacement = creates(&fx);
    assert_eq!(replacement.len(), 1, "{fx:?}");
    let (replacement, provisioned) = replacement[0];
    assert!(provisioned);
    // Its start fails: the next try waits a second, then two.
    core.handle(
        Event::Started { container: replacement, failure: Some(CreateFailure::Failed), at: secs(11) },
        secs(11),
    );
    let mut tries = Vec::new();
    let mut now = secs(11);
    while now < secs(15) {
        now += ms(100);
        for (id, _) in creates(&core.handle(Event::Tick, now)) {
            tries.push(now);
            core.handle(Event::Started { container: id, failure: Some(CreateFailure::Failed), at: now }, now);
        }
    }
    assert_eq!(tries, [secs(12), secs(14)], "tries after 1 s, then 2 s");
}

/// Lowering the count lets the surplus go (idle ones at once); retiring the key lets all go.
#[test]
fn a_lowered_count_or_a_retired_key_lets_them_go() {
    let (mut core, ids) = provisioned_core(KeepAliveKind::Fixed, 4096, 3);
    let fx = core.handle(provision(1, 1, 256), secs(1));
    assert_eq!(removed(&fx).len(), 2, "{fx:?}");
    assert!(creates(&fx).is_empty());
    let kept: Vec<_> = ids.iter().filter(|id| !removed(&fx).contains(id)).copied().collect();
    let fx = core.handle(Event::Retire(KeyId(1)), secs(2));
    assert_eq!(removed(&fx), kept, "{fx:?}");
    let fx = idle_for(&mut core, secs(2), secs(5), 4096, 4096);
    assert!(creates(&fx).is_empty(), "a retired key keeps nothing: {fx:?}");
}

/// Provisioned before any stats: started as soon as a node is known.
#[test]
fn provisioned_before_the_nodes_are_known_starts_when_they_are() {
    let mut core = PoolCore::new(CoreConfig::default());
    assert!(creates(&core.handle(provision(1, 2, 256), ms(1))).is_empty());
    let fx = core.handle(stats(1024, 1024, ms(2)), ms(2));
    assert_eq!(creates(&fx).len(), 2, "{fx:?}");
}
