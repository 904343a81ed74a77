//! The pool, proxies and store end to end against the mock factory: real HTTP to in-process
//! runtimes, real store; counts asserted, never wall-clock times.

use invoker::activation::{ActivationService, InvokeRequest, Invoked};
use invoker::app::InvokerApp;
use invoker::config::{Config, PoolConfig, ProxyConfig};
use invoker::factory::mock::{MockCall, MockConfig, MockFactory};
use invoker::factory::Factory;
use invoker_factory::contract::Epoch;
use invoker_wire::model::{new_activation_id, Action, ActivationRecord, Exec, Limits, Outcome};
use invoker_wire::params::Params;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;
use support::{done, eventually};

struct Harness {
    app: InvokerApp,
    mock: MockFactory,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn service(&self) -> &ActivationService {
        self.app.service()
    }
}

async fn setup(mock: MockConfig, pool: PoolConfig) -> Harness {
    setup_with(mock, pool, ProxyConfig::default()).await
}

/// The invoker as `main` builds it (the production store included), on a mock factory whose
/// calls the tests count.
async fn setup_with(mock: MockConfig, pool: PoolConfig, proxy: ProxyConfig) -> Harness {
    setup_config(mock, |c| {
        c.pool = pool;
        c.proxy = proxy;
    })
    .await
}

/// As [`setup_with`], the config as `tweak` leaves it.
async fn setup_config(mock: MockConfig, tweak: impl FnOnce(&mut Config)) -> Harness {
    let (pool, proxy) = (PoolConfig::default(), ProxyConfig::default());
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("data"),
        pool,
        proxy,
        ..Config::default()
    };
    config.factory.kind = invoker::config::FactoryKind::Mock;
    config.limits.namespace_concurrent = 10_000;
    // The mock factory runs any kind in-process; naming `mock` in the config (as an OpenWhisk
    // kind, which initialises its containers) is what lets `[[pool.prewarm]]` entries name it.
    let openwhisk_kind = config.kinds["python:3"].clone();
    config.kinds.insert("mock".into(), openwhisk_kind);
    tweak(&mut config);
    let factory = MockFactory::new(mock, Epoch(Instant::now()));
    let app = InvokerApp::start_on(config, Some(Factory::Mock(factory.clone()))).await.unwrap();
    Harness { app, mock: factory, _dir: dir }
}

fn action(name: &str, memory: u32) -> Arc<Action> {
    Arc::new(Action {
        namespace: "guest".into(),
        name: name.into(),
        version: "0.0.1".into(),
        exec: Exec { kind: "mock".into(), code: Some("noop".into()), main: None, binary: false, image: None },
        limits: Limits { timeout: 10_000, memory, logs: 10, concurrency: 1, disk: 256 },
        parameters: vec![],
        annotations: vec![],
        publish: false,
        updated: 0,
        revision: 1,
    })
}

async fn invoke_with_id(h: &Harness, action: &Arc<Action>, params: Value, id: String) -> ActivationRecord {
    let Value::Object(params) = params else { panic!("params must be an object") };
    let params = Params::from_map(&params);
    let req = InvokeRequest {
        request: None,
        action: action.clone(),
        params,
        subject: "guest".into(),
        api_key: None,
        activation_id: Some(id),
        transaction_id: "tid".into(),
        wait: Some(Duration::from_secs(60)),
        traceparent: None,
        whole: None,
        start_notice: None,
        stream: None,
    };
    match h.service().invoke(req).await.unwrap() {
        Invoked::Done(encoded) => encoded.into_record(),
        Invoked::Accepted(id) => panic!("activation {id} did not finish within the blocking wait"),
        Invoked::Streaming { activation_id, .. } => panic!("activation {activation_id} streamed unasked"),
    }
}

async fn invoke(h: &Harness, action: &Arc<Action>, params: Value) -> ActivationRecord {
    invoke_with_id(h, action, params, new_activation_id()).await
}

fn creates(h: &Harness) -> usize {
    h.mock.count(|c| matches!(c, MockCall::Create(_)))
}

#[actix_rt::test]
async fn sequential_activations_of_one_action_use_one_container() {
    let h = setup(MockConfig::default(), PoolConfig::default()).await;
    let a = action("seq", 256);
    for i in 0..100 {
        let record = invoke(&h, &a, json!({ "i": i })).await;
        assert_eq!(record.outcome(), Outcome::Success, "{record:?}");
        assert_eq!(record.response.result.to_value()["echo"]["i"], json!(i));
    }
    assert_eq!(creates(&h), 1);
}

#[actix_rt::test]
async fn a_herd_of_cold_activations_starts_fewer_containers_than_requests() {
    let mock = MockConfig {
        nodes: vec![("n".into(), 100_000)],
        start_latency: Duration::from_millis(200),
        run_latency: Duration::from_millis(50),
        ..MockConfig::default()
    };
    let pool = PoolConfig { max_starts_per_action: 4, ..PoolConfig::default() };
    let h = setup(mock, pool).await;
    let a = action("herd", 256);
    let calls = (0..50).map(|_| invoke(&h, &a, json!({})));
    let records = futures_util::future::join_all(calls).await;
    assert!(records.iter().all(|r| r.outcome() == Outcome::Success));
    let started = creates(&h);
    assert!(started < 50, "{started} containers for 50 requests");
    assert!(h.mock.max_alive() <= 50);
}

#[actix_rt::test]
async fn ten_actions_share_memory_for_four_containers_and_all_complete() {
    let mock = MockConfig {
        nodes: vec![("n".into(), 4 * 256)],
        start_latency: Duration::from_millis(100),
        run_latency: Duration::from_millis(50),
        ..MockConfig::default()
    };
    // Deadline well above 3 x (start + run).
    let pool = PoolConfig { wait_deadline: Duration::from_secs(20), ..PoolConfig::default() };
    let h = setup(mock, pool).await;
    let actions: Vec<_> = (0..10).map(|i| action(&format!("a{i}"), 256)).collect();
    let calls = actions.iter().flat_map(|a| (0..3).map(move |_| a)).map(|a| invoke(&h, a, json!({})));
    let records = futures_util::future::join_all(calls).await;
    assert_eq!(records.len(), 30);
    assert!(records.iter().all(|r| r.outcome() == Outcome::Success), "{records:?}");
    assert!(h.mock.max_alive() <= 4, "{} containers alive at once", h.mock.max_alive());
    assert_eq!(h.mock.count(|c| matches!(c, MockCall::Refused(_))), 0);
}

#[actix_rt::test]
async fn a_factory_that_fails_every_create_gives_status_3_records_without_hanging() {
    let mock = MockConfig { fail_creates: true, ..MockConfig::default() };
    let h = setup(mock, PoolConfig::default()).await;
    let a = action("broken", 256);
    let calls = (0..10).map(|_| invoke(&h, &a, json!({})));
    let records = futures_util::future::join_all(calls).await;
    for r in &records {
        assert_eq!(r.response.status_code, 3, "{r:?}");
        assert_eq!(r.annotation("rejected"), Some(&json!("create_failed")));
        let stored = h.service().store().get_activation(&r.activation_id).unwrap().unwrap();
        assert_eq!(stored.response.status_code, 3);
    }
}

/// A container whose create failed is gone from the pool: a drain afterwards ends at once
/// rather than waiting for a proxy that stopped (the bound here is far below any grace).
#[actix_rt::test]
async fn after_a_failed_create_a_drain_ends_without_waiting_for_the_failed_container() {
    let mock = MockConfig { fail_creates: true, ..MockConfig::default() };
    let h = setup(mock, PoolConfig::default()).await;
    let record = invoke(&h, &action("broken", 256), json!({})).await;
    assert_eq!(record.response.status_code, 3, "{record:?}");
    let pool = h.app.pool();
    let drained = tokio::time::timeout(Duration::from_secs(30), pool.drain()).await;
    assert!(drained.is_ok(), "the drain waited for a container whose create failed");
    let snapshot = pool.snapshot().await.unwrap();
    assert!(snapshot.containers.is_empty(), "{:?}", snapshot.containers);
}

#[actix_rt::test]
async fn a_repeated_activation_id_runs_once() {
    let h = setup(MockConfig::default(), PoolConfig::default()).await;
    let a = action("once", 256);
    let id = new_activation_id();
    let first = invoke_with_id(&h, &a, json!({ "n": 1 }), id.clone()).await;
    let second = invoke_with_id(&h, &a, json!({ "n": 2 }), id.clone()).await;
    assert_eq!(first, second);
    let runs = h.service().metrics().render();
    assert!(runs.contains("invoker_activations_total{status=\"success\"} 1"), "{runs}");
}

#[actix_rt::test]
async fn application_errors_keep_the_container_and_crashes_replace_it() {
    let h = setup(MockConfig::default(), PoolConfig::default()).await;
    let a = action("errs", 256);
    let r = invoke(&h, &a, json!({ "error": "bad input" })).await;
    assert_eq!(r.outcome(), Outcome::ApplicationError);
    let r = invoke(&h, &a, json!({})).await;
    assert_eq!(r.outcome(), Outcome::Success);
    assert_eq!(creates(&h), 1);
    let r = invoke(&h, &a, json!({ "crash": true })).await;
    assert_eq!(r.outcome(), Outcome::DeveloperError, "{r:?}");
    let r = invoke(&h, &a, json!({})).await;
    assert_eq!(r.outcome(), Outcome::Success);
    assert_eq!(creates(&h), 2, "a crashed container is replaced, never reused");
}

#[actix_rt::test]
async fn a_run_past_its_timeout_is_a_developer_error_and_the_container_is_replaced() {
    let h = setup(MockConfig::default(), PoolConfig::default()).await;
    let mut a = (*action("slow", 256)).clone();
    a.limits.timeout = 200;
    let a = Arc::new(a);
    let r = invoke(&h, &a, json!({ "sleep_ms": 2_000 })).await;
    assert_eq!(r.outcome(), Outcome::DeveloperError);
    assert_eq!(r.annotation("timeout"), Some(&json!(true)));
    let r = invoke(&h, &a, json!({})).await;
    assert_eq!(r.outcome(), Outcome::Success);
    assert_eq!(creates(&h), 2);
}

#[actix_rt::test]
async fn an_idle_container_is_paused_and_resumed_for_the_next_run() {
    let proxy = ProxyConfig { pause_grace: Duration::from_millis(20), ..ProxyConfig::default() };
    let h = setup_with(MockConfig::default(), PoolConfig::default(), proxy).await;
    let a = action("pausing", 256);
    assert_eq!(invoke(&h, &a, json!({})).await.outcome(), Outcome::Success);
    wait_for("the idle container to be paused", || h.mock.count(|c| matches!(c, MockCall::Paused(_))) > 0).await;
    // The mock's paused runtime answers 503 to a run, so success proves the resume came first.
    let record = invoke(&h, &a, json!({ "after": "pause" })).await;
    assert_eq!(record.outcome(), Outcome::Success, "{record:?}");
    assert_eq!(h.mock.count(|c| matches!(c, MockCall::Resumed(_))), 1);
    assert_eq!(creates(&h), 1, "the paused container was reused, not replaced");
}

#[actix_rt::test]
async fn lagging_stats_never_over_provision_two_nodes() {
    let mock = MockConfig {
        nodes: vec![("n1".into(), 1024), ("n2".into(), 1024)],
        start_latency: Duration::from_millis(50),
        run_latency: Duration::from_millis(30),
        stats_lag: Duration::from_millis(300),
        ..MockConfig::default()
    };
    let pool = PoolConfig { wait_deadline: Duration::from_secs(30), ..PoolConfig::default() };
    let h = setup(mock, pool).await;
    let actions: Vec<_> = (0..16).map(|i| action(&format!("lag{i}"), 256)).collect();
    let calls = actions.iter().flat_map(|a| (0..2).map(move |_| a)).map(|a| invoke(&h, a, json!({})));
    let records = futures_util::future::join_all(calls).await;
    assert!(records.iter().all(|r| r.outcome() == Outcome::Success), "{records:?}");
    assert_eq!(h.mock.count(|c| matches!(c, MockCall::Refused(_))), 0, "the cluster refused a launch");
    assert!(h.mock.max_alive() <= 8, "{} containers of 256 MB on 2 GB", h.mock.max_alive());
}

#[actix_rt::test]
async fn an_idle_container_of_another_action_is_evicted_to_make_room() {
    let mock = MockConfig { nodes: vec![("n".into(), 512)], ..MockConfig::default() };
    let h = setup(mock, PoolConfig::default()).await;
    let (a, b, c) = (action("ea", 256), action("eb", 256), action("ec", 256));
    for x in [&a, &b] {
        assert_eq!(invoke(&h, x, json!({})).await.outcome(), Outcome::Success);
    }
    assert_eq!(invoke(&h, &c, json!({})).await.outcome(), Outcome::Success);
    assert_eq!(
        h.mock.count(|c| matches!(c, MockCall::Destroy(_))),
        1,
        "one idle container made room: {:?}",
        h.mock.calls()
    );
    assert!(h.mock.max_alive() <= 2);
    assert_eq!(invoke(&h, &b, json!({})).await.outcome(), Outcome::Success);
    assert_eq!(creates(&h), 3, "the most recently used (b) stayed warm; the least (a) went");
}

#[actix_rt::test]
async fn a_job_that_cannot_get_a_container_by_its_deadline_gets_a_status_3_record() {
    let mock = MockConfig { nodes: vec![("n".into(), 256)], ..MockConfig::default() };
    let pool = PoolConfig { wait_deadline: Duration::from_millis(300), ..PoolConfig::default() };
    let h = setup(mock, pool).await;
    let (busy, waiting) = (action("busy", 256), action("waits", 256));
    let long = invoke(&h, &busy, json!({ "sleep_ms": 2000 }));
    let late = async {
        // A window: the second call comes once the first holds the node.
        tokio::time::sleep(Duration::from_millis(100)).await;
        invoke(&h, &waiting, json!({})).await
    };
    let (long, late) = tokio::join!(long, late);
    assert_eq!(long.outcome(), Outcome::Success);
    assert_eq!(late.response.status_code, 3, "{late:?}");
    assert_eq!(late.annotation("rejected"), Some(&json!("deadline")));
}

#[actix_rt::test]
async fn an_action_larger_than_every_node_fails_at_once() {
    let h = setup(MockConfig { nodes: vec![("n".into(), 1024)], ..MockConfig::default() }, PoolConfig::default()).await;
    let record = invoke(&h, &action("huge", 2048), json!({})).await;
    assert_eq!(record.response.status_code, 3);
    assert_eq!(record.annotation("rejected"), Some(&json!("never_fits")));
    assert_eq!(creates(&h), 0);
}

async fn wait_for(what: &str, mut holds: impl FnMut() -> bool) {
    eventually(Duration::from_secs(10), what, || std::future::ready(done(holds()))).await
}

#[actix_rt::test]
async fn a_prewarmed_container_is_adopted_without_a_create_and_replaced() {
    let prewarm = vec![invoker::config::PrewarmConfig {
        kind: "mock".into(),
        memory_mb: 256,
        disk_mb: 256,
        count: 1,
        reactive: None,
    }];
    let pool = PoolConfig { prewarm, ..PoolConfig::default() };
    let h = setup(MockConfig::default(), pool).await;
    let started = |h: &Harness| h.mock.count(|c| matches!(c, MockCall::Created(_)));
    wait_for("the prewarm container", || started(&h) == 1).await;
    let record = invoke(&h, &action("pw", 256), json!({ "x": 1 })).await;
    assert_eq!(record.outcome(), Outcome::Success, "{record:?}");
    assert_eq!(record.annotation("startKind"), Some(&json!("prewarm")));
    assert!(record.annotation("initTime").is_some(), "the prewarm container was initialised for the action");
    // The taken container is replaced, so the next action of that kind and memory is not cold.
    wait_for("the replacement prewarm container", || started(&h) == 2).await;
    let other = invoke(&h, &action("pw2", 256), json!({})).await;
    assert_eq!(other.annotation("startKind"), Some(&json!("prewarm")));
    // An action of another memory size starts cold.
    let cold = invoke(&h, &action("big", 512), json!({})).await;
    assert_eq!(cold.annotation("startKind"), Some(&json!("cold")));
    assert_eq!(h.mock.count(|c| matches!(c, MockCall::Refused(_))), 0);
    let snapshot = h.app.pool().snapshot().await.unwrap();
    assert_eq!(snapshot.status.prewarm, 1, "{snapshot:?}");
}

#[actix_rt::test]
async fn the_pool_forgets_actions_it_no_longer_holds() {
    let mock = MockConfig { nodes: vec![("n0".into(), 1_000_000)], ..MockConfig::default() };
    // The fixed keep-alive: the hybrid one holds an action known for its histogram's range.
    let pool = PoolConfig {
        idle_timeout: Duration::from_millis(200),
        keep_alive: invoker_core::pool::KeepAliveKind::Fixed,
        ..PoolConfig::default()
    };
    let h = setup(mock, pool).await;
    let actions: Vec<_> = (0..80).map(|i| action(&format!("a{i}"), 128)).collect();
    for a in &actions {
        assert_eq!(invoke(&h, a, json!({})).await.response.status_code, 0);
    }
    // Every container idles out; then the pool keeps no trace of the 80 actions.
    eventually(Duration::from_secs(10), "every container and key gone", || async {
        let snapshot = h.app.pool().snapshot().await.unwrap();
        let (containers, keys) = (snapshot.containers.len(), snapshot.status.action_keys);
        if containers == 0 && keys == 0 {
            Ok(())
        } else {
            Err(format!("{containers} containers, {keys} keys"))
        }
    })
    .await;
    // An action answered at once (larger than any node) leaves nothing behind either.
    let huge = action("huge", 2_000_000);
    assert_ne!(invoke(&h, &huge, json!({})).await.response.status_code, 0);
    assert_eq!(h.app.pool().status().await.unwrap().action_keys, 0);
    // An action seen again is tracked again, under a new key, and runs.
    assert_eq!(invoke(&h, &actions[0], json!({})).await.response.status_code, 0);
}

fn flood_request(a: &Arc<Action>, wait: Option<Duration>) -> InvokeRequest {
    InvokeRequest {
        request: None,
        action: a.clone(),
        params: Default::default(),
        subject: "guest".into(),
        api_key: None,
        activation_id: None,
        transaction_id: "tid".into(),
        wait,
        traceparent: None,
        whole: None,
        start_notice: None,
        stream: None,
    }
}

#[actix_rt::test]
async fn a_full_pool_mailbox_answers_a_blocking_call_at_once_and_every_activation_still_gets_its_record() {
    let h = setup(MockConfig::default(), PoolConfig::default()).await;
    let a = action("flood", 256);
    // One call first, to its end: the intake reads the namespace's reservations from the store
    // at its first call (a blocking read, which yields when the read is not done by the first
    // poll, as on a busy machine), and every later call finds them read.
    assert!(h.service().invoke(flood_request(&a, Some(Duration::from_secs(300)))).await.is_ok());
    // Each call is polled once, here, without yielding: it hands its job over (or is answered)
    // before the pool actor (on this thread) takes a message, so its mailbox fills, and what
    // follows is answered at once.
    let mut calls = Vec::new();
    for _ in 0..1200 {
        let mut call = Box::pin(h.service().invoke(flood_request(&a, Some(Duration::from_secs(300)))));
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(std::future::Future::poll(call.as_mut(), cx))).await;
        calls.push((call, first));
    }
    let (mut ran, mut answered) = (0, 0);
    for (call, first) in calls {
        let invoked = match first {
            std::task::Poll::Ready(invoked) => invoked,
            std::task::Poll::Pending => call.await,
        };
        let Invoked::Done(encoded) = invoked.unwrap() else {
            panic!("a blocking call within its wait is answered with its record")
        };
        let record = encoded.record();
        if record.response.status_code == 0 {
            ran += 1;
            continue;
        }
        assert_eq!(record.annotation("rejected"), Some(&json!("queue_full")), "{record:?}");
        assert_eq!(record.rejection, Some(invoker_wire::model::Rejection::QueueFull));
        assert!(h.service().store().get_activation(&record.activation_id).unwrap().is_some());
        answered += 1;
    }
    assert!(answered > 0 && ran > 0, "{answered} answered at once, {ran} ran");
}

/// The same flood of asynchronous calls: each waits for room in the mailbox rather than being
/// refused (it is durable already), and every one runs.
#[actix_rt::test]
async fn a_flood_of_asynchronous_calls_past_the_pool_mailbox_all_runs() {
    let h = setup(MockConfig::default(), PoolConfig::default()).await;
    let a = action("flood", 256);
    let mut accepted = Vec::new();
    for _ in 0..1200 {
        match h.service().invoke(flood_request(&a, None)).await.unwrap() {
            Invoked::Accepted(id) => accepted.push(id),
            Invoked::Done(done) => panic!("an asynchronous call answered at once: {:?}", done.record()),
            Invoked::Streaming { activation_id, .. } => panic!("{activation_id} streamed unasked"),
        }
    }
    // The accepted ones run (slowly in a debug build: a bound, not a measure).
    let store = h.service().store().clone();
    eventually(Duration::from_secs(120), "a successful record for every accepted activation", || {
        let records: Vec<_> = accepted.iter().map(|id| store.get_activation(id).ok().flatten()).collect();
        let missing = records.iter().filter(|r| r.is_none()).count();
        let failed: Vec<_> = records.iter().flatten().filter(|r| r.response.status_code != 0).collect();
        assert!(failed.is_empty(), "{:?}", failed[0]);
        std::future::ready(if missing == 0 { Ok(()) } else { Err(format!("{missing} without one")) })
    })
    .await;
}

/// Every keep-alive policy in the live pool: six actions taking turns on a node that holds four
/// of them, then one action called at a steady pace. Everything succeeds and the node is never
/// over-committed; the hybrid policy (on a seconds scale here) unloads and pre-warms.
#[actix_rt::test]
async fn every_keep_alive_policy_runs_in_the_live_pool() {
    use invoker_core::pool::{KeepAliveKind, KeepAliveParams};
    for kind in [KeepAliveKind::Fixed, KeepAliveKind::GreedyDual, KeepAliveKind::Hybrid] {
        // Starts that take time: the priced window weighs a cold start by its start time, and
        // one that costs nothing is never worth keeping a container for.
        let mock = MockConfig {
            nodes: vec![("n".into(), 1024)],
            start_latency: Duration::from_millis(50),
            ..MockConfig::default()
        };
        let params = KeepAliveParams {
            bin: Duration::from_millis(100),
            range: Duration::from_secs(10),
            min_samples: 3,
            cv_threshold: 0.0,
            ..KeepAliveParams::default()
        };
        let pool = PoolConfig {
            keep_alive: kind,
            keep_alive_params: params,
            tick: Duration::from_millis(20),
            ..PoolConfig::default()
        };
        let h = setup(mock, pool).await;
        let actions: Vec<_> = (0..6).map(|i| action(&format!("a{i}"), 256)).collect();
        for round in 0..3 {
            for a in &actions {
                let record = invoke(&h, a, json!({ "round": round })).await;
                assert_eq!(record.outcome(), Outcome::Success, "{kind:?}: {record:?}");
            }
        }
        let steady = action("steady", 256);
        let mut start_kinds = Vec::new();
        for _ in 0..12 {
            let record = invoke(&h, &steady, json!({})).await;
            assert_eq!(record.outcome(), Outcome::Success, "{kind:?}: {record:?}");
            start_kinds.push(record.annotation("startKind").and_then(|v| v.as_str()).unwrap_or("").to_string());
            // Idle time between calls: the steady gap the keep-alive policy learns.
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let snapshot = h.app.pool().snapshot().await.unwrap();
        let committed: u64 = snapshot.containers.iter().map(|c| u64::from(c.memory_mb)).sum();
        assert!(committed <= 1024, "{kind:?}: {committed} MB on a 1024 MB node");
        if kind == KeepAliveKind::Hybrid {
            assert!(start_kinds.iter().any(|k| k == "prewarm"), "the hybrid policy pre-warmed: {start_kinds:?}");
        } else {
            assert_eq!(start_kinds.iter().filter(|k| *k == "cold").count(), 1, "{kind:?}: kept warm: {start_kinds:?}");
        }
    }
}

/// Stores `action` (a retry reads the action as it is stored when it runs).
fn stored(h: &Harness, action: Arc<Action>) -> Arc<Action> {
    let saved = h.service().store().put_action(Arc::unwrap_or_clone(action), true).unwrap();
    Arc::new(saved)
}

async fn invoke_async(h: &Harness, action: &Arc<Action>, params: Value) -> String {
    let Value::Object(params) = params else { panic!("params must be an object") };
    let req = InvokeRequest { params: Params::from_map(&params), ..flood_request(action, None) };
    match h.service().invoke(req).await.unwrap() {
        Invoked::Accepted(id) => id,
        Invoked::Done(done) => panic!("an asynchronous call answered at once: {:?}", done.record()),
        Invoked::Streaming { activation_id, .. } => panic!("{activation_id} streamed unasked"),
    }
}

async fn record_of(h: &Harness, id: &str) -> ActivationRecord {
    let store = h.service().store().clone();
    eventually(Duration::from_secs(30), &format!("a record for {id}"), || {
        let found = store.get_activation(id).ok().flatten();
        std::future::ready(found.ok_or_else(|| "none yet".to_string()))
    })
    .await
}

fn said<'a>(record: &'a ActivationRecord, key: &str) -> Option<&'a Value> {
    record.annotation(key)
}

/// An asynchronous call that fails twice then succeeds, under the default policy (two
/// retries): three activations, each with its own record, linked both ways.
#[actix_rt::test]
async fn an_asynchronous_call_that_fails_twice_then_succeeds_has_three_linked_records() {
    let h = setup_config(MockConfig::default(), |c| c.queue.retry_backoff = Duration::from_millis(20)).await;
    let a = stored(&h, action("flaky", 256));
    let first = invoke_async(&h, &a, json!({"fail_times": 2, "fail_key": "flaky"})).await;
    let one = record_of(&h, &first).await;
    assert_eq!(one.response.status_code, 1, "{one:?}");
    assert_eq!((said(&one, "retryOf"), said(&one, "attempt")), (None, None));
    let second = said(&one, "retriedAs").and_then(Value::as_str).expect("the next attempt named").to_string();
    let two = record_of(&h, &second).await;
    assert_eq!(two.response.status_code, 1, "{two:?}");
    assert_eq!((said(&two, "retryOf"), said(&two, "attempt")), (Some(&json!(first)), Some(&json!(2))));
    let third = said(&two, "retriedAs").and_then(Value::as_str).expect("the third attempt named").to_string();
    let three = record_of(&h, &third).await;
    assert_eq!(three.response.status_code, 0, "{three:?}");
    assert_eq!((said(&three, "retryOf"), said(&three, "attempt")), (Some(&json!(first)), Some(&json!(3))));
    assert_eq!(said(&three, "retriedAs"), None);
}

/// `max-retry-attempts: 0` (the action's own policy): one attempt, its failure final; and the
/// config's `max_retry_attempts` bounds an action that says nothing.
#[actix_rt::test]
async fn a_policy_of_no_retries_ends_with_the_first_failure() {
    let h = setup_config(MockConfig::default(), |c| {
        c.queue.retry_backoff = Duration::from_millis(20);
        c.queue.max_retry_attempts = 1;
    })
    .await;
    let mut never = Arc::unwrap_or_clone(action("never", 256));
    never.annotations.push(invoker_wire::model::KeyValue { key: "max-retry-attempts".into(), value: json!(0) });
    let never = stored(&h, Arc::new(never));
    let id = invoke_async(&h, &never, json!({"error": "always"})).await;
    let record = record_of(&h, &id).await;
    assert_eq!((record.response.status_code, said(&record, "retriedAs")), (1, None), "{record:?}");
    let once = stored(&h, action("once", 256));
    let id = invoke_async(&h, &once, json!({"error": "always"})).await;
    let first = record_of(&h, &id).await;
    let next = said(&first, "retriedAs").and_then(Value::as_str).expect("one retry").to_string();
    let second = record_of(&h, &next).await;
    assert_eq!((second.response.status_code, said(&second, "retriedAs")), (1, None), "{second:?}");
}

/// One action flooding the queue does not starve another: on a node that holds two containers,
/// a call of a second action queued behind 120 of the first's gets a container of its own (the
/// pool's claim after `claim_after`) and ends before most of the flood has run.
#[actix_rt::test]
async fn a_flooding_action_does_not_starve_another_actions_queued_call() {
    let h = setup_config(MockConfig { nodes: vec![("n".into(), 512)], ..MockConfig::default() }, |_| {}).await;
    let (flood, other) = (stored(&h, action("flood", 256)), stored(&h, action("other", 256)));
    let mut flooded = Vec::new();
    for _ in 0..120 {
        flooded.push(invoke_async(&h, &flood, json!({"sleep_ms": 100})).await);
    }
    let alone = invoke_async(&h, &other, json!({})).await;
    let alone = record_of(&h, &alone).await;
    assert_eq!(alone.response.status_code, 0, "{alone:?}");
    let store = h.service().store().clone();
    let ended_before = flooded.iter().filter(|id| store.get_activation(id).ok().flatten().is_some()).count();
    assert!(ended_before < 60, "{ended_before} of the flood's 120 ended before the other action's call: {alone:?}");
    for id in &flooded {
        assert_eq!(record_of(&h, id).await.response.status_code, 0);
    }
}
