//! The durable queue of asynchronous calls end to end, on the process factory and the real
//! binary: a burst far past what the pool holds all runs, and a SIGKILL with calls queued and
//! running loses none of them.

mod support;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::Duration;
use support::{eventually, python, Invoker};

/// Room for two 128 MB containers, a blocking wait far shorter than the burst's work, and
/// retries a tenth of a second apart.
const TWO_CONTAINERS: &str = "[factory.process]\nuser_memory_mb = 256\n[pool]\nwait_deadline = \"2s\"\n\
                              [queue]\nretry_backoff = \"100ms\"\n";

const SLEEPER: &str = "import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'n': a['n']}\n";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-queue-").tempdir().unwrap()
}

/// Fires `count` non-blocking calls at once; their activation ids, in the order of `n`.
async fn burst(inv: &Invoker, count: usize, sleep: f64) -> Vec<String> {
    let calls = (0..count).map(|n| inv.invoke("sleeper", "blocking=false", json!({"n": n, "sleep": sleep})));
    let answers = futures_util::future::join_all(calls).await;
    answers
        .into_iter()
        .map(|(status, body)| {
            assert_eq!(status, 202, "{body}");
            body["activationId"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Every call's record, once each has one (bounded).
async fn records(inv: &Invoker, ids: &[String], bound: Duration) -> Vec<Value> {
    eventually(bound, "a record for every call", || async {
        let mut found = Vec::new();
        for id in ids {
            let (status, record) = inv.get(&format!("activations/{id}")).await;
            if status != 200 {
                return Err(format!("{id}: {status}"));
            }
            found.push(record);
        }
        Ok(found)
    })
    .await
}

/// Ten times what the pool can run at once, each call longer than the blocking wait lets a
/// call wait: none fails for waiting, each ran with its own parameters, and a blocking call
/// sent in the middle of the backlog is served before it.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_ten_times_the_pool_all_runs() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &format!("burst-{}", std::process::id()), TWO_CONTAINERS);
    let mut action = python(SLEEPER);
    action["limits"] = json!({"memory": 128});
    inv.put_action("sleeper", action).await;
    let (user, pass) = inv.admin.split_once(':').unwrap();
    let live = reqwest::Client::new().get(format!("{}/v1/live", inv.base)).basic_auth(user, Some(pass));
    let mut live = live.send().await.unwrap();
    let ids = burst(&inv, 20, 0.4).await;
    // The backlog is seen in the live view, each call marked as queued.
    support::events_until(&mut live, Duration::from_secs(20), |events| {
        let queued = |(kind, v): &(String, Value)| kind == "pool" && v["queue"][0]["queued"] == json!(true);
        events.iter().any(queued)
    })
    .await;
    // And in /metrics, by namespace, with the oldest's age.
    let (status, _, metrics) = inv.send("GET", "/metrics", &inv.admin, &[], Vec::new()).await;
    let metrics = String::from_utf8(metrics).unwrap();
    let waiting = metrics.lines().find_map(|l| l.strip_prefix("invoker_queued_calls{namespace=\"guest\"} "));
    assert!(status == 200 && waiting.is_some_and(|n| n.parse::<u32>().unwrap() > 0), "{metrics}");
    assert!(metrics.contains("invoker_queued_oldest_seconds{namespace=\"guest\"}"), "{metrics}");
    let (status, body) = inv.invoke("sleeper", "blocking=true&result=true", json!({"n": "now"})).await;
    assert_eq!((status, &body), (200, &json!({"n": "now"})), "a blocking call goes before the queue");
    let records = records(&inv, &ids, Duration::from_secs(120)).await;
    for (n, record) in records.iter().enumerate() {
        assert_eq!(record["response"]["statusCode"], 0, "{record}");
        assert_eq!(record["response"]["result"], json!({"n": n}), "{record}");
    }
}

/// SIGKILL with calls queued and running, then a start on the same data: every accepted call
/// ends; those that never started ran after the restart, with their parameters; those that
/// may have started end as a guess (at most what was running) and are tried again by the
/// default policy, as an attempt of their own that succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_sigkill_with_calls_queued_loses_none_and_runs_those_never_started() {
    let dir = tempdir();
    let id = format!("killed-{}", std::process::id());
    let mut inv = Invoker::start(dir.path(), &id, TWO_CONTAINERS);
    let mut action = python(SLEEPER);
    action["limits"] = json!({"memory": 128});
    inv.put_action("sleeper", action).await;
    let ids = burst(&inv, 24, 0.5).await;
    tokio::time::sleep(Duration::from_millis(700)).await; // a load window: some run, most wait
    inv.signal(Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    let inv = Invoker::start(dir.path(), &id, TWO_CONTAINERS);
    assert!(inv.stderr().contains("queued calls an earlier run did not start are run now"), "{}", inv.stderr());
    let records = records(&inv, &ids, Duration::from_secs(120)).await;
    let mut retried = Vec::new();
    for (n, record) in records.iter().enumerate() {
        match record["response"]["statusCode"].as_u64() {
            Some(0) => assert_eq!(record["response"]["result"], json!({"n": n}), "{record}"),
            _ => {
                let said = |key: &str| record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == key);
                assert!(said("guess").is_some(), "only a call that started may fail: {record}");
                let next = said("retriedAs").unwrap_or_else(|| panic!("tried again: {record}"));
                retried.push((n, next["value"].as_str().unwrap().to_string()));
            }
        }
    }
    assert!(retried.len() <= 2, "{retried:?}: more than the two that could be running");
    for (n, next) in retried {
        let record = inv.record(&next).await;
        assert_eq!((&record["response"]["statusCode"], &record["response"]["result"]), (&json!(0), &json!({"n": n})));
    }
}

/// SIGTERM with calls queued: the drain lets the running ones finish and leaves the queued ones
/// in the queue (not failed); the next start runs them. Every call succeeds, none is a guess.
#[tokio::test(flavor = "multi_thread")]
async fn a_sigterm_leaves_queued_calls_for_the_next_start() {
    let dir = tempdir();
    let id = format!("drained-{}", std::process::id());
    let mut inv = Invoker::start(dir.path(), &id, TWO_CONTAINERS);
    let mut action = python(SLEEPER);
    action["limits"] = json!({"memory": 128});
    inv.put_action("sleeper", action).await;
    let ids = burst(&inv, 16, 0.3).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // a load window: some run, most wait
    inv.signal(Signal::SIGTERM);
    assert!(inv.wait_exit(Duration::from_secs(60)).success());
    assert!(inv.stderr().contains("queued calls not started are kept for the next start"), "{}", inv.stderr());
    let inv = Invoker::start(dir.path(), &id, TWO_CONTAINERS);
    let records = records(&inv, &ids, Duration::from_secs(120)).await;
    for (n, record) in records.iter().enumerate() {
        assert_eq!(record["response"]["statusCode"], 0, "{record}");
        assert_eq!(record["response"]["result"], json!({"n": n}), "{record}");
    }
}
