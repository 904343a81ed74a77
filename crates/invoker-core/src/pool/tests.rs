//! The pool core driven event by event: placement, reuse, start caps, deadlines, prewarm and
//! eviction, each decision checked on its effects.

use super::*;
use invoker_ids::NodeStatsUpdate;
use std::time::Duration;

fn ms(n: u64) -> Time {
    Duration::from_millis(n)
}

fn job(id: u64, key: u32, memory_mb: u32) -> Job {
    Job {
        id: JobId(id),
        key: KeyId(key),
        memory_mb,
        concurrency: 1,
        deadline: ms(10_000),
        stem: None,
        idle_timeout: None,
        patient: false,
        max_running: None,
        tenant: TenantId::default(),
    }
}

fn stats(node: &str, capacity_mb: u64, free_mb: u64, at: u64) -> Event {
    Event::NodeStats(NodeStatsUpdate { node: NodeId::new(node), capacity_mb, free_mb, observed_at: ms(at) })
}

fn core_with(capacity_mb: u64) -> PoolCore {
    let mut core = PoolCore::new(CoreConfig::default());
    core.handle(stats("n1", capacity_mb, capacity_mb, 0), ms(0));
    core
}

fn created(fx: &Effects) -> Vec<ContainerId> {
    fx.iter().filter_map(|e| if let Effect::Create { container, .. } = e { Some(*container) } else { None }).collect()
}

fn dispatched(fx: &Effects) -> impl Iterator<Item = (ContainerId, JobId)> + '_ {
    fx.iter().filter_map(|e| if let Effect::Dispatch { job, container } = e { Some((*container, *job)) } else { None })
}

#[test]
fn a_cold_job_creates_one_container_then_runs_on_it() {
    let mut core = core_with(1024);
    let fx = core.handle(Event::Arrived(job(1, 1, 256)), ms(1));
    let c = created(&fx);
    assert_eq!(c.len(), 1);
    let fx = core.handle(Event::Started { container: c[0], failure: None, at: Time::ZERO }, ms(2));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(1), container: c[0] }]);
}

#[test]
fn a_warm_container_is_reused_and_the_most_recent_first() {
    let mut core = core_with(1024);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    let b = created(&core.handle(Event::Arrived(job(2, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Started { container: b, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Finished { container: a, job: JobId(1), reusable: true }, ms(3));
    core.handle(Event::Finished { container: b, job: JobId(2), reusable: true }, ms(4));
    let fx = core.handle(Event::Arrived(job(3, 1, 256)), ms(5));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(3), container: b }]);
}

#[test]
fn waiting_jobs_do_not_start_more_containers_than_they_need() {
    let mut core = core_with(4096);
    let mut creates = 0;
    for i in 0..3 {
        let mut j = job(i, 1, 128);
        j.concurrency = 2;
        creates += created(&core.handle(Event::Arrived(j), ms(1))).len();
    }
    assert_eq!(creates, 2, "three jobs at concurrency 2 need two containers");
}

#[test]
fn starts_in_flight_per_action_are_capped() {
    let mut core = core_with(100_000);
    let creates: usize = (0..50).map(|i| created(&core.handle(Event::Arrived(job(i, 1, 128)), ms(1))).len()).sum();
    assert_eq!(creates, 4);
}

/// An asynchronous call waits behind its key's blocking calls, and a queue of them does not
/// fill the buffer blocking calls are refused at.
#[test]
fn patient_jobs_yield_to_blocking_ones_and_are_not_bounded_by_the_buffer() {
    let mut core = PoolCore::new(CoreConfig { max_waiting: 2, ..CoreConfig::default() });
    core.handle(stats("n1", 256, 256, 0), ms(0));
    let a = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: ms(1) }, ms(1));
    for id in 2..12 {
        let fx = core.handle(Event::Arrived(Job { patient: true, ..job(id, 1, 256) }), ms(2));
        assert!(fx.iter().all(|e| !matches!(e, Effect::Reject { .. })), "{fx:?}");
    }
    assert!(core.handle(Event::Arrived(job(12, 1, 256)), ms(3)).is_empty());
    assert!(core.handle(Event::Arrived(job(13, 1, 256)), ms(3)).is_empty());
    let refused = core.handle(Event::Arrived(job(14, 1, 256)), ms(3));
    assert_eq!(refused.as_slice(), &[Effect::Reject { job: JobId(14), reason: RejectReason::QueueFull }]);
    let mut order = Vec::new();
    for (n, running) in [1, 12, 13, 2, 3].into_iter().enumerate() {
        let fx = core.handle(Event::Finished { container: a, job: JobId(running), reusable: true }, ms(4 + n as u64));
        order.extend(fx.iter().filter_map(|e| if let Effect::Dispatch { job, .. } = e { Some(job.0) } else { None }));
    }
    assert_eq!(order, [12, 13, 2, 3, 4], "the blocking calls first, then the queue in arrival order");
}

#[test]
fn a_job_too_large_for_any_node_is_refused_at_once() {
    let mut core = core_with(512);
    let fx = core.handle(Event::Arrived(job(1, 1, 1024)), ms(1));
    assert!(matches!(fx[0], Effect::Reject { reason: RejectReason::NeverFits { memory_mb: 1024, .. }, .. }));
}

#[test]
fn an_idle_container_of_another_action_is_evicted_to_make_room() {
    let mut core = core_with(512);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 512)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Finished { container: a, job: JobId(1), reusable: true }, ms(3));
    let fx = core.handle(Event::Arrived(job(2, 2, 256)), ms(4));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }]);
    let fx = core.handle(Event::Removed(a), ms(5));
    assert_eq!(created(&fx).len(), 1);
}

/// A removal the cluster's stats already show (they were observed after it was decided, as
/// the Kubernetes factory's are: it publishes at every change of its watch, before it reports
/// the pod gone) is not counted free a second time when the core hears of it. Counted twice,
/// two 256 MB containers went where one fitted, and the kubelet refused one (found by
/// `kubernetes_pods::a_burst_past_what_the_nodes_hold_waits_for_room_and_the_kubelet_refuses_nothing`).
#[test]
fn a_removal_the_stats_already_show_is_not_counted_free_twice() {
    // 1 GiB, another tenant holds 512: the stats show 512 free.
    let mut core = PoolCore::new(CoreConfig::default());
    core.handle(stats("n1", 1024, 512, 0), ms(0));
    let a = created(&core.handle(Event::Arrived(job(1, 1, 512)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: ms(2) }, ms(2));
    core.handle(stats("n1", 1024, 0, 3), ms(3));
    core.handle(Event::Finished { container: a, job: JobId(1), reusable: true }, ms(4));
    // Room for another action: its idle container goes...
    let fx = core.handle(Event::Arrived(job(2, 2, 512)), ms(5));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }]);
    // ...the stats show it gone first, then the core hears it is removed.
    let mut creates = created(&core.handle(stats("n1", 1024, 512, 6), ms(6)));
    creates.extend(created(&core.handle(Event::Removed(a), ms(7))));
    assert_eq!(creates.len(), 1, "one 512 MB container where the other went");
    let fx = core.handle(Event::Arrived(job(3, 3, 256)), ms(8));
    assert!(fx.is_empty(), "nothing is left, and nothing is evicted for it: {fx:?}");
}

/// The other side: a removal whose memory the stats did not show free yet is room coming.
/// The waiting job takes it at the next stats, and no other idle container is evicted for it.
#[test]
fn a_removal_the_stats_may_not_show_yet_is_room_coming_not_a_reason_to_evict() {
    let mut core = core_with(1024);
    let mut ids = Vec::new();
    for (i, key) in [(1, 1), (2, 2)] {
        let c = created(&core.handle(Event::Arrived(job(i, key, 512)), ms(1)))[0];
        core.handle(Event::Started { container: c, failure: None, at: ms(2) }, ms(2));
        core.handle(Event::Finished { container: c, job: JobId(i), reusable: true }, ms(3));
        ids.push(c);
    }
    core.handle(stats("n1", 1024, 0, 4), ms(4));
    let fx = core.handle(Event::Arrived(job(3, 3, 512)), ms(5));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: ids[0] }], "one container's room");
    // Stats observed after the decision, not showing the room yet; then the removal.
    core.handle(stats("n1", 1024, 0, 6), ms(6));
    let fx = core.handle(Event::Removed(ids[0]), ms(7));
    assert!(fx.is_empty(), "not placed on room the stats may show twice, and no second eviction: {fx:?}");
    let fx = core.handle(Event::Tick, ms(8));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Remove { .. })), "{fx:?}");
    // The next stats show it free: the job's container starts.
    assert_eq!(created(&core.handle(stats("n1", 1024, 512, 9), ms(9))).len(), 1);
}

#[test]
fn a_busy_container_is_never_evicted_and_the_job_waits_until_its_deadline() {
    let mut core = core_with(512);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 512)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    let fx = core.handle(Event::Arrived(job(2, 2, 256)), ms(3));
    assert!(fx.is_empty());
    let fx = core.handle(Event::Tick, ms(10_000));
    assert_eq!(fx.as_slice(), &[Effect::Reject { job: JobId(2), reason: RejectReason::DeadlineExceeded }]);
}

#[test]
fn a_failed_create_answers_its_job_at_once_saying_why() {
    for why in [CreateFailure::Failed, CreateFailure::Image, CreateFailure::NotReady, CreateFailure::Refused] {
        let mut core = core_with(1024);
        let a = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
        let fx = core.handle(Event::Started { container: a, failure: Some(why), at: Time::ZERO }, ms(2));
        assert_eq!(fx.as_slice(), &[Effect::Reject { job: JobId(1), reason: RejectReason::CreateFailed(why) }]);
    }
}

#[test]
fn a_container_that_failed_is_removed_not_reused() {
    let mut core = core_with(1024);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    let fx = core.handle(Event::Finished { container: a, job: JobId(1), reusable: false }, ms(3));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }]);
    let fx = core.handle(Event::Arrived(job(2, 1, 256)), ms(4));
    assert_eq!(created(&fx).len(), 1);
}

#[test]
fn a_key_with_its_own_idle_bound_loses_its_idle_containers_then_and_the_others_keep_the_pools() {
    let mut core = core_with(1024);
    let own = |id: u64| Job { idle_timeout: Some(Duration::from_secs(30)), ..job(id, 1, 256) };
    let a = created(&core.handle(Event::Arrived(own(1)), ms(1)))[0];
    let b = created(&core.handle(Event::Arrived(job(2, 2, 256)), ms(1)))[0];
    for (c, j) in [(a, 1), (b, 2)] {
        core.handle(Event::Started { container: c, failure: None, at: Time::ZERO }, ms(2));
        core.handle(Event::Finished { container: c, job: JobId(j), reusable: true }, ms(3));
    }
    // A call at 20 s makes a fresh idle spell: the bound counts from its end.
    core.handle(Event::Arrived(own(3)), ms(20_000));
    core.handle(Event::Finished { container: a, job: JobId(3), reusable: true }, ms(20_001));
    assert!(core.handle(Event::Tick, ms(40_000)).is_empty(), "30 s from the first spell's start is not the bound");
    let fx = core.handle(Event::Tick, ms(50_001));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }], "30 s after its last call");
    assert!(core.handle(Event::Tick, ms(3) + Duration::from_secs(599)).is_empty(), "the other key keeps the pool's");
    let fx = core.handle(Event::Tick, ms(3) + Duration::from_secs(600));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: b }]);
}

#[test]
fn idle_containers_are_removed_after_the_idle_timeout() {
    let mut core = core_with(1024);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Finished { container: a, job: JobId(1), reusable: true }, ms(3));
    assert!(core.handle(Event::Tick, ms(3) + Duration::from_secs(599)).is_empty());
    let fx = core.handle(Event::Tick, ms(3) + Duration::from_secs(600));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }]);
}

#[test]
fn stale_stats_count_as_nothing_free() {
    let mut core = core_with(1024);
    let fx = core.handle(Event::Arrived(job(1, 1, 256)), Duration::from_secs(61));
    assert!(fx.is_empty());
    let fx = core.handle(stats("n1", 1024, 1024, 61_000), Duration::from_secs(61));
    assert_eq!(created(&fx).len(), 1);
}

#[test]
fn reservations_hold_until_stats_observed_after_the_start() {
    let mut core = core_with(1024);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 512)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: ms(10) }, ms(10));
    // The cluster still reports everything free (observed before the start): the reservation holds.
    core.handle(stats("n1", 1024, 1024, 5), ms(11));
    let _ = core.handle(Event::Arrived(job(2, 2, 512)), ms(12));
    let view = &core.nodes(ms(12))[0];
    assert_eq!(view.reserved_mb, 1024);
    assert_eq!(view.launchable_mb, 0);
}

/// Issue 61: a one-host factory publishes as a container becomes ready, stamped at its ready
/// time, and that snapshot may reach the pool before the container's report does. Kept
/// reserved until the next snapshot, the container counted twice meanwhile.
#[test]
fn a_start_whose_stats_came_first_is_not_counted_twice() {
    let mut core = core_with(1024);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 512)), ms(1)))[0];
    core.handle(stats("n1", 1024, 512, 10), ms(10));
    assert_eq!(core.nodes(ms(10))[0].launchable_mb, 0, "ready since 10 ms: the pool cannot know yet");
    core.handle(Event::Started { container: a, failure: None, at: ms(10) }, ms(11));
    let view = &core.nodes(ms(11))[0];
    assert_eq!((view.reserved_mb, view.launchable_mb), (0, 512));
    let fx = core.handle(Event::Arrived(job(2, 2, 512)), ms(12));
    assert_eq!(created(&fx).len(), 1, "the other half of the node is free");
}

#[test]
fn concurrent_jobs_pack_onto_the_busiest_container() {
    let mut core = core_with(4096);
    let j = |id| Job { concurrency: 3, ..job(id, 1, 256) };
    let a = created(&core.handle(Event::Arrived(j(1)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    let fx = core.handle(Event::Arrived(j(2)), ms(3));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(2), container: a }]);
    let fx = core.handle(Event::Arrived(j(3)), ms(3));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(3), container: a }]);
    let fx = core.handle(Event::Arrived(j(4)), ms(3));
    assert_eq!(created(&fx).len(), 1);
}

#[test]
fn drain_rejects_waiting_jobs_and_removes_idle_containers() {
    let mut core = core_with(256);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    core.handle(Event::Arrived(job(2, 2, 256)), ms(1));
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    let fx = core.handle(Event::Drain, ms(3));
    assert_eq!(fx.as_slice(), &[Effect::Reject { job: JobId(2), reason: RejectReason::Draining }]);
    let fx = core.handle(Event::Finished { container: a, job: JobId(1), reusable: true }, ms(4));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }]);
    let fx = core.handle(Event::Arrived(job(3, 1, 256)), ms(5));
    assert_eq!(fx.as_slice(), &[Effect::Reject { job: JobId(3), reason: RejectReason::Draining }]);
}

#[test]
fn a_blocked_job_evicts_a_container_as_soon_as_it_goes_idle() {
    let mut core = core_with(512);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 512)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    assert!(core.handle(Event::Arrived(job(2, 2, 512)), ms(3)).is_empty());
    let fx = core.handle(Event::Finished { container: a, job: JobId(1), reusable: true }, ms(4));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }]);
    let fx = core.handle(Event::Removed(a), ms(5));
    assert_eq!(created(&fx).len(), 1);
}

fn prewarm_core(count: u32, reactive: Option<ReactivePrewarm>) -> (PoolCore, Vec<ContainerId>) {
    let prewarm = vec![PrewarmSpec { kind: "k".into(), memory_mb: 256, disk_mb: 256, count, reactive }];
    let mut core = PoolCore::new(CoreConfig { prewarm, ..CoreConfig::default() });
    let fx = core.handle(stats("n1", 8192, 8192, 0), ms(0));
    let stems = created(&fx);
    for &c in &stems {
        core.handle(Event::Started { container: c, failure: None, at: ms(1) }, ms(1));
    }
    (core, stems)
}

fn stem_job(id: u64, key: u32) -> Job {
    Job { stem: Some(StemId(0)), ..job(id, key, 256) }
}

#[test]
fn prewarms_start_when_nodes_are_known_and_are_adopted_then_replaced() {
    let (mut core, stems) = prewarm_core(2, None);
    assert_eq!(stems.len(), 2);
    assert_eq!(core.counts().prewarm, 2);
    let fx = core.handle(Event::Arrived(stem_job(1, 7)), ms(5));
    let dispatched: Vec<_> = fx
        .iter()
        .filter_map(|e| if let Effect::Dispatch { container, .. } = e { Some(*container) } else { None })
        .collect();
    assert_eq!(dispatched.len(), 1);
    assert!(stems.contains(&dispatched[0]), "the job took a stem container");
    let replacement = created(&fx);
    assert_eq!(replacement.len(), 1, "the taken stem container is replaced at once");
    assert!(matches!(
        fx.iter().find(|e| matches!(e, Effect::Create { .. })),
        Some(Effect::Create { owner: Owner::Stem(StemId(0)), .. })
    ));
    // A job of another memory size does not take a stem container.
    let fx = core.handle(Event::Arrived(job(2, 8, 512)), ms(6));
    assert_eq!(created(&fx).len(), 1);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Dispatch { .. })));
}

#[test]
fn prewarms_never_take_room_a_blocked_job_waits_for() {
    let prewarm = vec![PrewarmSpec { kind: "k".into(), memory_mb: 256, disk_mb: 256, count: 2, reactive: None }];
    let mut core = PoolCore::new(CoreConfig { prewarm, ..CoreConfig::default() });
    let stems = created(&core.handle(stats("n1", 512, 512, 0), ms(0)));
    for &c in &stems {
        core.handle(Event::Started { container: c, failure: None, at: ms(1) }, ms(1));
    }
    let fx = core.handle(Event::Arrived(job(1, 1, 512)), ms(2));
    assert!(created(&fx).is_empty(), "the stem containers hold the node");
    // The 512 MB job evicts both stem containers to make room...
    let counts = core.counts();
    assert_eq!((counts.removing, counts.waiting), (2, 1));
    // ...and gets the room once they are gone: no stem container is started before it.
    core.handle(Event::Removed(stems[0]), ms(3));
    let fx = core.handle(Event::Removed(stems[1]), ms(3));
    let c = created(&fx);
    assert_eq!(c.len(), 1);
    assert!(matches!(fx[0], Effect::Create { owner: Owner::Key(KeyId(1)), .. }));
    assert!(created(&core.handle(Event::Tick, ms(4))).is_empty(), "no room left for stem containers");
}

#[test]
fn reactive_prewarms_follow_cold_starts_within_bounds() {
    let reactive = ReactivePrewarm { min: 0, max: 3, threshold: 2, increment: 1, window: ms(1_000) };
    let (mut core, stems) = prewarm_core(1, Some(reactive));
    assert_eq!(stems.len(), 1);
    // Seven jobs of one class arrive together: one adopts the stem container, six start cold.
    let mut starts = Vec::new();
    for id in 1..=7 {
        starts.extend(created(&core.handle(Event::Arrived(stem_job(id, id as u32)), ms(10))));
    }
    assert_eq!(starts.len(), 7, "six cold starts and one replacement stem container");
    for c in starts {
        core.handle(Event::Started { container: c, failure: None, at: ms(20) }, ms(20));
    }
    let fx = core.handle(Event::Tick, ms(1_001));
    // 6 misses / threshold 2 = 3 increments, capped at max 3; the replacement is ready, so
    // two more start.
    let more = created(&fx);
    assert_eq!(more.len(), 2);
    assert_eq!(core.counts().prewarm, 3);
    for c in more {
        core.handle(Event::Started { container: c, failure: None, at: ms(1_010) }, ms(1_010));
    }
    // A window without cold starts brings the class back to its minimum.
    let fx = core.handle(Event::Tick, ms(2_002));
    assert!(created(&fx).is_empty());
    assert_eq!(fx.iter().filter(|e| matches!(e, Effect::Remove { .. })).count(), 3);
    assert_eq!(core.counts().prewarm, 0);
}

/// Four small actions keep a 1 GiB node busy, each job followed at once by the next; a 1 GiB
/// action arrives. Returns when (in ms) the large action got a container, if it did within 5 s.
fn large_action_behind_small_ones(claim_after: Duration) -> Option<u64> {
    let mut core = PoolCore::new(CoreConfig { claim_after, ..CoreConfig::default() });
    core.handle(stats("n1", 1024, 1024, 0), ms(0));
    let mut next_job = 1;
    let mut running: Vec<(ContainerId, JobId)> = Vec::new();
    let mut starting: Vec<ContainerId> = Vec::new();
    let mut removing: Vec<ContainerId> = Vec::new();
    let mut large = None;
    let mut key_of = std::collections::HashMap::new();
    let apply = |fx: Effects,
                 running: &mut Vec<(ContainerId, JobId)>,
                 starting: &mut Vec<ContainerId>,
                 removing: &mut Vec<ContainerId>| {
        for e in fx {
            match e {
                Effect::Create { container, owner: Owner::Key(KeyId(9)), .. } => return Some(container),
                Effect::Create { container, .. } => starting.push(container),
                Effect::Dispatch { job, container } => running.push((container, job)),
                Effect::Remove { container } => removing.push(container),
                Effect::Reject { .. } | Effect::Pause { .. } | Effect::Resume { .. } => {}
            }
        }
        None
    };
    for key in 1..=4 {
        key_of.insert(JobId(next_job), key);
        let fx = core.handle(Event::Arrived(job(next_job, key, 256)), ms(0));
        next_job += 1;
        apply(fx, &mut running, &mut starting, &mut removing);
    }
    for c in std::mem::take(&mut starting) {
        let fx = core.handle(Event::Started { container: c, failure: None, at: ms(1) }, ms(1));
        apply(fx, &mut running, &mut starting, &mut removing);
    }
    let big = Job { deadline: ms(60_000), ..job(1000, 9, 1024) };
    assert!(created(&core.handle(Event::Arrived(big), ms(2))).is_empty());
    for step in 1..=50u64 {
        let now = ms(step * 100);
        for (container, job) in std::mem::take(&mut running) {
            let key = key_of[&job];
            let fx = core.handle(Event::Finished { container, job, reusable: true }, now);
            large = large.or(apply(fx, &mut running, &mut starting, &mut removing));
            key_of.insert(JobId(next_job), key);
            let fx = core.handle(Event::Arrived(job_at(next_job, key, now)), now);
            next_job += 1;
            large = large.or(apply(fx, &mut running, &mut starting, &mut removing));
        }
        for c in std::mem::take(&mut removing).into_iter().chain(std::mem::take(&mut starting)) {
            let event = if core.containers().iter().any(|v| v.id == c && v.state == ContainerState::Starting) {
                Event::Started { container: c, failure: None, at: now }
            } else {
                Event::Removed(c)
            };
            let fx = core.handle(event, now);
            large = large.or(apply(fx, &mut running, &mut starting, &mut removing));
        }
        let fx = core.handle(Event::Tick, now);
        large = large.or(apply(fx, &mut running, &mut starting, &mut removing));
        if large.is_some() {
            return Some(step * 100);
        }
    }
    None
}

fn job_at(id: u64, key: u32, now: Time) -> Job {
    Job { deadline: now + ms(60_000), ..job(id, key, 256) }
}

#[test]
fn a_large_action_is_not_overtaken_forever_by_small_ones() {
    assert_eq!(large_action_behind_small_ones(Duration::from_secs(3600)), None, "without a claim it starves");
    let started = large_action_behind_small_ones(Duration::from_secs(1));
    assert!(started.is_some_and(|at| at <= 1_500), "with a claim after 1 s it starts soon after: {started:?}");
}

#[test]
fn a_job_waits_for_a_busy_container_that_frees_sooner_than_a_start_unless_it_is_overdue() {
    let mut core = core_with(4096);
    // Learn: a start takes 500 ms, a run 10 ms.
    let c = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(0)))[0];
    core.handle(Event::Started { container: c, failure: None, at: ms(500) }, ms(500));
    core.handle(Event::Finished { container: c, job: JobId(1), reusable: true }, ms(510));
    core.handle(Event::Arrived(job(2, 1, 256)), ms(600));
    // The container is busy; a second job would wait 10 ms for it, not 500 ms for a new one.
    let fx = core.handle(Event::Arrived(job(3, 1, 256)), ms(601));
    assert!(created(&fx).is_empty(), "{fx:?}");
    // The run hangs: once the waiting job has waited a start's time, a container starts.
    assert!(created(&core.handle(Event::Tick, ms(1_000))).is_empty());
    let fx = core.handle(Event::Tick, ms(1_101));
    assert_eq!(created(&fx).len(), 1, "{fx:?}");
}

/// Eight callers, each calling again as soon as it is answered, on one warm container of an
/// action whose runs are short beside a start: each job waits only a few runs, never a start's
/// time, yet the queue never empties. Once it has stayed full for a start's time, the busy
/// container is shown not to keep up and containers start (before, the eight were served one at
/// a time for as long as they kept calling).
#[test]
fn callers_that_keep_a_busy_containers_queue_full_for_a_starts_time_get_containers_of_their_own() {
    let mut core = core_with(4096);
    // Learn: a start takes 60 ms, a run 1 ms.
    let c = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(0)))[0];
    core.handle(Event::Started { container: c, failure: None, at: ms(60) }, ms(60));
    core.handle(Event::Finished { container: c, job: JobId(1), reusable: true }, ms(61));
    let mut next = 2;
    let mut running = Vec::new();
    let mut started: Vec<(ContainerId, u64)> = Vec::new();
    for _ in 0..8 {
        let fx = core.handle(Event::Arrived(job(next, 1, 256)), ms(100));
        running.extend(dispatched(&fx));
        started.extend(created(&fx).into_iter().map(|c| (c, 100)));
        next += 1;
    }
    assert!(started.is_empty(), "a burst of eight waits a few runs for the busy container: {started:?}");
    // Each millisecond the running job ends and its caller calls again.
    for t in 101..400u64 {
        let mut fx = Effects::new();
        for (container, job) in std::mem::take(&mut running) {
            fx.extend(core.handle(Event::Finished { container, job, reusable: true }, ms(t)));
        }
        fx.extend(core.handle(Event::Arrived(job(next, 1, 256)), ms(t)));
        next += 1;
        fx.extend(core.handle(Event::Tick, ms(t)));
        running.extend(dispatched(&fx));
        started.extend(created(&fx).into_iter().map(|c| (c, t)));
        if !started.is_empty() {
            break;
        }
    }
    let at = started.first().map(|(_, t)| *t);
    assert!(at.is_some_and(|t| t <= 100 + 61), "containers start once the queue stayed full a start's time: {at:?}");
    let capped = 7.min(CoreConfig::default().max_starts_per_action as usize);
    assert_eq!(started.len(), capped, "one for each waiting caller, within the starts' cap: {started:?}");
}

#[test]
fn a_job_does_not_wait_for_a_busy_container_whose_runs_outlast_a_start() {
    let mut core = core_with(4096);
    let c = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(0)))[0];
    core.handle(Event::Started { container: c, failure: None, at: ms(100) }, ms(100));
    core.handle(Event::Finished { container: c, job: JobId(1), reusable: true }, ms(2_100));
    core.handle(Event::Arrived(job(2, 1, 256)), ms(2_200));
    assert_eq!(created(&core.handle(Event::Arrived(job(3, 1, 256)), ms(2_201))).len(), 1);
}

#[test]
fn an_idle_container_is_paused_after_the_grace_and_resumed_before_its_next_job() {
    let mut core = PoolCore::new(CoreConfig { pause_grace: ms(100), ..CoreConfig::default() });
    core.handle(stats("n1", 1024, 1024, 0), ms(0));
    let c = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: c, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Finished { container: c, job: JobId(1), reusable: true }, ms(10));
    // A job within the grace: no pause, no resume.
    let fx = core.handle(Event::Arrived(job(2, 1, 256)), ms(60));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(2), container: c }]);
    core.handle(Event::Finished { container: c, job: JobId(2), reusable: true }, ms(70));
    assert!(core.handle(Event::Tick, ms(150)).is_empty(), "the first idle spell ended with job 2");
    assert_eq!(core.handle(Event::Tick, ms(170)).as_slice(), &[Effect::Pause { container: c }]);
    assert!(core.handle(Event::Tick, ms(300)).is_empty(), "paused once");
    let fx = core.handle(Event::Arrived(job(3, 1, 256)), ms(400));
    assert_eq!(
        fx.as_slice(),
        &[Effect::Resume { container: c }, Effect::Dispatch { job: JobId(3), container: c }],
        "the job waits for the resume"
    );
    core.handle(Event::Finished { container: c, job: JobId(3), reusable: true }, ms(410));
    let fx = core.handle(Event::Arrived(job(4, 1, 256)), ms(420));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(4), container: c }], "resumed: no second resume");
}

#[test]
fn without_a_pause_grace_nothing_is_ever_paused() {
    let mut core = core_with(1024);
    let c = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: c, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Finished { container: c, job: JobId(1), reusable: true }, ms(10));
    assert!(core.handle(Event::Tick, ms(500_000)).is_empty());
}

/// Two containers of key 1 on a roomy node: `a` idle since 3 ms, `b` running job 2.
fn one_idle_one_busy() -> (PoolCore, ContainerId, ContainerId) {
    let mut core = core_with(4096);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    let b = created(&core.handle(Event::Arrived(job(2, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Started { container: b, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Finished { container: a, job: JobId(1), reusable: true }, ms(3));
    (core, a, b)
}

#[test]
fn a_retired_key_loses_its_idle_containers_at_once_and_its_busy_ones_after_their_runs() {
    let (mut core, a, b) = one_idle_one_busy();
    let fx = core.handle(Event::Retire(KeyId(1)), ms(4));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }], "the idle one at once, the busy one runs on");
    let fx = core.handle(Event::Finished { container: b, job: JobId(2), reusable: true }, ms(5));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: b }], "then goes instead of idling");
}

#[test]
fn shedding_removes_the_idle_containers_and_keeps_the_busy_ones_and_the_key() {
    let (mut core, a, b) = one_idle_one_busy();
    let fx = core.handle(Event::ShedIdle, ms(4));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }], "the idle one at once, the busy one runs on");
    // Unlike a retired key's, the busy one idles after its run, and takes the next job.
    let fx = core.handle(Event::Finished { container: b, job: JobId(2), reusable: true }, ms(5));
    assert!(fx.is_empty(), "{fx:?}");
    let fx = core.handle(Event::Arrived(job(3, 1, 256)), ms(6));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(3), container: b }]);
}

#[test]
fn a_job_waiting_for_a_retired_key_still_runs_and_its_container_then_goes() {
    // Room for two containers: the third job waits.
    let mut core = core_with(512 + CoreConfig::default().buffer_mb);
    let a = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    let b = created(&core.handle(Event::Arrived(job(2, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: Time::ZERO }, ms(2));
    core.handle(Event::Started { container: b, failure: None, at: Time::ZERO }, ms(2));
    let mut waiting = job(3, 1, 256);
    waiting.deadline = ms(60_000);
    assert!(created(&core.handle(Event::Arrived(waiting), ms(3))).is_empty(), "no room for a third");
    core.handle(Event::Retire(KeyId(1)), ms(4));
    let fx = core.handle(Event::Finished { container: a, job: JobId(1), reusable: true }, ms(5));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: a }], "a retired container takes no waiting job");
    let fx = core.handle(Event::Removed(a), ms(6));
    let c = created(&fx);
    assert_eq!(c.len(), 1, "the waiting job gets a container of its own: {fx:?}");
    let fx = core.handle(Event::Started { container: c[0], failure: None, at: Time::ZERO }, ms(7));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(3), container: c[0] }]);
    let fx = core.handle(Event::Finished { container: c[0], job: JobId(3), reusable: true }, ms(8));
    assert_eq!(fx.as_slice(), &[Effect::Remove { container: c[0] }], "and goes after it");
}

#[test]
fn the_view_of_an_idle_container_says_since_when_and_until_when_it_is_kept() {
    let config = CoreConfig { keep_alive: KeepAliveKind::Fixed, idle_timeout: ms(60_000), ..CoreConfig::default() };
    let mut core = PoolCore::new(config);
    core.handle(stats("n1", 1024, 1024, 0), ms(0));
    let c = created(&core.handle(Event::Arrived(job(1, 1, 256)), ms(1)))[0];
    core.handle(Event::Started { container: c, failure: None, at: Time::ZERO }, ms(2));
    let busy = core.container(c).unwrap();
    assert_eq!((busy.state, busy.running, busy.created_at, busy.idle), (ContainerState::Busy, 1, ms(1), None));
    core.handle(Event::Finished { container: c, job: JobId(1), reusable: true }, ms(500));
    let idle = core.container(c).unwrap();
    assert_eq!((idle.state, idle.idle), (ContainerState::Idle, Some((ms(500), Some(ms(60_500))))));
    // Busy again, then idle again: the new spell's times.
    core.handle(Event::Arrived(job(2, 1, 256)), ms(700));
    assert_eq!(core.container(c).unwrap().idle, None);
    core.handle(Event::Finished { container: c, job: JobId(2), reusable: true }, ms(900));
    assert_eq!(core.container(c).unwrap().idle, Some((ms(900), Some(ms(60_900)))));
}

/// A key flooding the pool with queued jobs does not starve another key's job: once it has
/// waited `claim_after` for room, one of the flood's containers makes way for it, even though
/// the flood's own key, waiting for more room since before, claimed first.
#[test]
fn a_flooding_keys_queue_does_not_starve_another_key() {
    let mut core = core_with(512);
    let patient = |id, key| Job { patient: true, deadline: ms(1_000_000), ..job(id, key, 256) };
    let mut running: Vec<(ContainerId, u64)> = Vec::new();
    let mut next = 1;
    for _ in 0..2 {
        let fx = core.handle(Event::Arrived(patient(next, 1)), ms(1));
        let c = created(&fx)[0];
        let fx = core.handle(Event::Started { container: c, failure: None, at: ms(2) }, ms(2));
        assert!(matches!(fx[0], Effect::Dispatch { .. }));
        running.push((c, next));
        next += 1;
    }
    for _ in 0..40 {
        core.handle(Event::Arrived(patient(next, 1)), ms(3));
        next += 1;
    }
    let mut now = 10;
    for round in 0..30 {
        now += 300;
        if round == 5 {
            // The flood's key has claimed the node by now (it waits for room since ms 3).
            core.handle(Event::Arrived(patient(1000, 2)), ms(now));
        }
        core.handle(stats("n1", 512, 0, now), ms(now));
        core.handle(Event::Tick, ms(now));
        let (c, job) = running.remove(0);
        let fx = core.handle(Event::Finished { container: c, job: JobId(job), reusable: true }, ms(now));
        for effect in fx {
            match effect {
                Effect::Dispatch { job: JobId(1000), .. } => {
                    assert!(round < 15, "the other key waited {} rounds", round - 5);
                    return;
                }
                Effect::Dispatch { job, container } => running.push((container, job.0)),
                Effect::Remove { container } => {
                    let mut fx = core.handle(Event::Removed(container), ms(now));
                    fx.extend(core.handle(stats("n1", 512, 256, now + 1), ms(now + 1)));
                    for effect in fx {
                        if let Effect::Create { container, .. } = effect {
                            let fx = core.handle(Event::Started { container, failure: None, at: ms(now) }, ms(now));
                            for effect in fx {
                                if let Effect::Dispatch { job, container } = effect {
                                    if job == JobId(1000) {
                                        return;
                                    }
                                    running.push((container, job.0));
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    panic!("the other key's job never ran");
}

/// Issue 60: an action's `max-concurrency`. Past its cap a job waits, no container is started
/// for it, and it runs on the first container one of its key's runs frees; one that waits past
/// its deadline is told it was the cap, not the lack of a container.
#[test]
fn a_capped_key_runs_at_most_its_cap_and_a_job_past_its_deadline_is_told_why() {
    let mut core = core_with(100_000);
    let capped = |id| Job { max_running: Some(2), ..job(id, 1, 128) };
    let mut containers = Vec::new();
    for id in 0..5 {
        containers.extend(created(&core.handle(Event::Arrived(capped(id)), ms(1))));
    }
    assert_eq!(containers.len(), 2, "no container for what the cap holds back");
    let mut dispatched = Vec::new();
    for &c in &containers {
        let fx = core.handle(Event::Started { container: c, failure: None, at: ms(2) }, ms(2));
        dispatched.extend(fx.iter().filter(|e| matches!(e, Effect::Dispatch { .. })).cloned());
    }
    assert_eq!(dispatched.len(), 2);
    // The first run ends: the next job takes its container, and only it.
    let Effect::Dispatch { job, container } = dispatched[0] else { unreachable!() };
    let fx = core.handle(Event::Finished { container, job, reusable: true }, ms(3));
    assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(2), container }]);
    // The two still waiting pass their deadline while the key runs at its cap.
    let fx = core.handle(Event::Tick, ms(10_001));
    let capped_rejections =
        fx.iter().filter(|e| matches!(e, Effect::Reject { reason: RejectReason::Capped { cap: 2 }, .. }));
    assert_eq!(capped_rejections.count(), 2, "{fx:?}");
}

/// A capped key's container that retires (not reusable) leaves its waiting job to another
/// container of the key that the cap had kept idle.
#[test]
fn below_its_cap_again_a_key_uses_the_container_the_cap_kept_idle() {
    let mut core = core_with(100_000);
    let capped = |id| Job { max_running: Some(1), ..job(id, 1, 128) };
    let free = |id| Job { max_running: None, ..job(id, 1, 128) };
    // Two containers of the key, both idle, before the cap is set.
    let a = created(&core.handle(Event::Arrived(free(0)), ms(1)))[0];
    let b = created(&core.handle(Event::Arrived(free(1)), ms(1)))[0];
    core.handle(Event::Started { container: a, failure: None, at: ms(2) }, ms(2));
    core.handle(Event::Started { container: b, failure: None, at: ms(2) }, ms(2));
    core.handle(Event::Finished { container: a, job: JobId(0), reusable: true }, ms(3));
    core.handle(Event::Finished { container: b, job: JobId(1), reusable: true }, ms(3));
    let fx = core.handle(Event::Arrived(capped(2)), ms(4));
    let Some(&Effect::Dispatch { container: running, .. }) = fx.first() else { panic!("{fx:?}") };
    let fx = core.handle(Event::Arrived(capped(3)), ms(4));
    assert!(fx.is_empty(), "at its cap of one, beside an idle container: {fx:?}");
    let fx = core.handle(Event::Finished { container: running, job: JobId(2), reusable: false }, ms(5));
    let other = if running == a { b } else { a };
    assert!(fx.contains(&Effect::Dispatch { job: JobId(3), container: other }), "{fx:?}");
}

/// Issue 60: tenants share the pool fairly. One tenant's action fills the node with long runs
/// and a backlog; another tenant's call, with nothing on the node, claims room at once (not
/// after `claim_after`): the first of the flood's runs to end makes way for it rather than
/// taking the flood's next job. Within one tenant the old rule stands (a claim only after
/// `claim_after`).
#[test]
fn a_tenant_below_its_share_claims_room_from_one_above_it_at_once() {
    for (other_tenant, made_way) in [(TenantId(1), true), (TenantId(0), false)] {
        let mut core = core_with(1024);
        let flood = |id| Job { tenant: TenantId(0), deadline: ms(600_000), ..job(id, 1, 128) };
        let mut containers = Vec::new();
        for id in 0..12 {
            containers.extend(created(&core.handle(Event::Arrived(flood(id)), ms(1))));
        }
        let mut started = 0;
        while started < containers.len() {
            let fx = core.handle(Event::Started { container: containers[started], failure: None, at: ms(2) }, ms(2));
            containers.extend(created(&fx));
            started += 1;
        }
        assert_eq!(containers.len(), 8, "the node full of the flood's containers, four jobs behind them");
        let fx = core.handle(Event::Arrived(Job { tenant: other_tenant, ..job(100, 2, 128) }), ms(100));
        assert!(created(&fx).is_empty(), "no room yet: {fx:?}");
        core.handle(Event::Tick, ms(200));
        // The flood's first run ends, well before `claim_after` (1 s).
        let fx = core.handle(Event::Finished { container: containers[0], job: JobId(0), reusable: true }, ms(300));
        let removed = fx.contains(&Effect::Remove { container: containers[0] });
        assert_eq!(removed, made_way, "{other_tenant:?}: {fx:?}");
        if made_way {
            let fx = core.handle(Event::Removed(containers[0]), ms(310));
            assert_eq!(created(&fx).len(), 1, "the other tenant's container, in the room made: {fx:?}");
        } else {
            assert!(fx.iter().any(|e| matches!(e, Effect::Dispatch { job: JobId(8), .. })), "the flood's next: {fx:?}");
        }
    }
}

/// A tenant over its share of the pool does not evict another tenant's idle container to make
/// room for its own backlog: the other's next call finds it warm. One tenant evicts its own
/// action's idle containers as before.
#[test]
fn a_flooding_tenant_does_not_evict_another_tenants_warm_container() {
    for (other_tenant, kept) in [(TenantId(1), true), (TenantId(0), false)] {
        let mut core = core_with(1024);
        // The other tenant's call runs once and leaves its container idle.
        let mine = |id| Job { tenant: other_tenant, ..job(id, 2, 128) };
        let warm = created(&core.handle(Event::Arrived(mine(100)), ms(1)))[0];
        core.handle(Event::Started { container: warm, failure: None, at: ms(2) }, ms(2));
        core.handle(Event::Finished { container: warm, job: JobId(100), reusable: true }, ms(3));
        // The flood fills the other seven places and waits for more.
        let flood = |id| Job { tenant: TenantId(0), deadline: ms(600_000), ..job(id, 1, 128) };
        let mut evicted = false;
        let mut pending: Vec<ContainerId> = Vec::new();
        for id in 0..10 {
            let fx = core.handle(Event::Arrived(flood(id)), ms(10));
            evicted |= fx.contains(&Effect::Remove { container: warm });
            pending.extend(created(&fx));
        }
        while let Some(c) = pending.pop() {
            let fx = core.handle(Event::Started { container: c, failure: None, at: ms(20) }, ms(20));
            evicted |= fx.contains(&Effect::Remove { container: warm });
            pending.extend(created(&fx));
        }
        assert_eq!(evicted, !kept, "{other_tenant:?}");
        if kept {
            let fx = core.handle(Event::Arrived(mine(101)), ms(30));
            assert_eq!(fx.as_slice(), &[Effect::Dispatch { job: JobId(101), container: warm }], "warm");
        }
    }
}

/// A tenant over its share that has waited `claim_after` for more room claims nothing while
/// another tenant is below its share: its claim would retire that tenant's container after its
/// next run. Alone, it claims as before.
#[test]
fn a_tenant_over_its_share_does_not_claim_from_one_below_it() {
    for (other_tenant, claims) in [(TenantId(1), false), (TenantId(0), true)] {
        let mut core = core_with(1024);
        let mine = |id| Job { tenant: other_tenant, deadline: ms(600_000), ..job(id, 2, 128) };
        let warm = created(&core.handle(Event::Arrived(mine(100)), ms(1)))[0];
        core.handle(Event::Started { container: warm, failure: None, at: ms(2) }, ms(2));
        let flood = |id| Job { tenant: TenantId(0), deadline: ms(600_000), ..job(id, 1, 128) };
        let mut pending: Vec<ContainerId> = Vec::new();
        for id in 0..10 {
            pending.extend(created(&core.handle(Event::Arrived(flood(id)), ms(10))));
        }
        while let Some(c) = pending.pop() {
            pending.extend(created(&core.handle(Event::Started { container: c, failure: None, at: ms(20) }, ms(20))));
        }
        // Long past `claim_after`, the other tenant's run ends on the full node.
        core.handle(Event::Tick, ms(5_000));
        let fx = core.handle(Event::Finished { container: warm, job: JobId(100), reusable: true }, ms(5_100));
        let retired = fx.contains(&Effect::Remove { container: warm });
        assert_eq!(retired, claims, "{other_tenant:?}: {fx:?}");
    }
}
