//! Issue 60: provisioned containers (`provisioned-concurrency`) end to end, on the process
//! factory and the real binary. They are up, initialised, before any call; they outlast the
//! keep-alive's idle bound that removes an ordinary container; concurrent calls find them warm;
//! one killed is replaced; another action's need for room does not evict them; a restarted
//! invoker provisions them again; bad values are refused naming the field.

mod support;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::Duration;
use support::{eventually, python, Invoker};

/// Says which container ran it (its process group, on the process factory), and sleeps if
/// asked.
const PID: &str =
    "import os, time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'group': os.getpgrp()}\n";

/// A node of 768 MB, and a keep-alive that removes an ordinary idle container after 1 s.
const CONFIG: &str = "[factory.process]\nuser_memory_mb = 768\n[pool]\nkeep_alive = \"fixed\"\nidle_timeout = \"1s\"\n";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-provisioned-").tempdir().unwrap()
}

fn action(memory: u64, annotations: Value) -> Value {
    let mut action = python(PID);
    action["limits"] = json!({ "memory": memory });
    action["annotations"] = annotations;
    action
}

fn provisioned(count: Value) -> Value {
    action(128, json!([{ "key": "provisioned-concurrency", "value": count }]))
}

fn annotation<'a>(record: &'a Value, key: &str) -> Option<&'a Value> {
    record["annotations"].as_array()?.iter().find(|a| a["key"] == key).map(|a| &a["value"])
}

/// The ids of the pool's containers of `action` that are idle (or paused), and its
/// provisioned row, once it keeps `count` up.
async fn provisioned_up(inv: &Invoker, action: &str, count: u64) -> Vec<u64> {
    eventually(Duration::from_secs(30), "the provisioned containers up and idle", || async {
        let (_, pool) = inv.get_url("/v1/pool").await;
        let row = pool["provisioned"].as_array().and_then(|rows| rows.iter().find(|r| r["action"] == action).cloned());
        let idle: Vec<u64> = pool["containers"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .filter(|c| c["action"] == action && (c["state"] == "idle" || c["state"] == "paused"))
                    .map(|c| c["id"].as_u64().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        match row {
            Some(row) if row["count"] == count && row["up"] == count && idle.len() as u64 == count => Ok(idle),
            _ => Err(pool.to_string()),
        }
    })
    .await
}

/// `n` calls at once, each of which must be warm: their containers' process groups.
async fn warm_calls(inv: &Invoker, name: &str, n: usize) -> Vec<u64> {
    let calls = (0..n).map(|_| inv.invoke(name, "blocking=true", json!({ "sleep": 0.3 })));
    let mut pids = Vec::new();
    for (status, record) in futures_util::future::join_all(calls).await {
        assert_eq!(status, 200, "{record}");
        assert_eq!(annotation(&record, "startKind"), Some(&json!("warm")), "{record}");
        assert!(annotation(&record, "initTime").is_none(), "a warm call paid no init: {record}");
        pids.push(record["response"]["result"]["group"].as_u64().unwrap());
    }
    pids
}

#[tokio::test(flavor = "multi_thread")]
async fn provisioned_containers_are_warm_kept_replaced_and_never_evicted() {
    let dir = tempdir();
    let id = format!("prov-{}", std::process::id());
    let mut inv = Invoker::start(dir.path(), &id, CONFIG);

    // Bad values, each refused naming the field.
    let refused = [
        (provisioned(json!(0)), "annotations.provisioned-concurrency"),
        (provisioned(json!("2")), "annotations.provisioned-concurrency"),
        (provisioned(json!(11)), "limits.namespace_provisioned"),
        (
            action(
                128,
                json!([{ "key": "provisioned-concurrency", "value": 3 }, { "key": "max-concurrency", "value": 2 }]),
            ),
            "max-concurrency",
        ),
    ];
    for (body, says) in refused {
        let (status, answer) = inv.try_put_action("bad", body.clone()).await;
        assert!(status == 400 && answer.contains(says), "{body}: {status} {answer}");
    }

    // Up and initialised before any call.
    inv.put_action("hot", provisioned(json!(2))).await;
    let first = provisioned_up(&inv, "guest/hot", 2).await;

    // Shown: the live view's actions and containers, and the metrics.
    let (user, pass) = inv.admin.split_once(':').unwrap();
    let live = reqwest::Client::new().get(format!("{}/v1/live", inv.base)).basic_auth(user, Some(pass));
    let mut live = live.send().await.unwrap();
    let events = support::events_until(&mut live, Duration::from_secs(10), |events| !events.is_empty()).await;
    let (kind, snapshot) = &events[0];
    assert_eq!(kind, "snapshot");
    let row = &snapshot["pool"]["actions"][0];
    assert_eq!(
        (&row["action"], &row["provisioned"], &row["provisioned_up"]),
        (&json!("guest/hot"), &json!(2), &json!(2))
    );
    let outlined = snapshot["containers"].as_array().unwrap().iter().filter(|c| c["provisioned"] == true).count();
    assert_eq!(outlined, 2, "{snapshot}");
    drop(live);
    let (_, _, metrics) = inv.send("GET", "/metrics", &inv.admin, &[], Vec::new()).await;
    let metrics = String::from_utf8_lossy(&metrics);
    for line in ["invoker_provisioned_containers{state=\"wanted\"} 2", "invoker_provisioned_containers{state=\"up\"} 2"]
    {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }

    // An ordinary action's idle container goes after the keep-alive's 1 s; the provisioned stay.
    inv.put_action("plain", action(128, json!([]))).await;
    let (status, _) = inv.invoke("plain", "blocking=true", json!({})).await;
    assert_eq!(status, 200);
    eventually(Duration::from_secs(30), "the ordinary container removed by the keep-alive", || async {
        let (_, pool) = inv.get_url("/v1/pool").await;
        let plain = pool["containers"].as_array().unwrap().iter().any(|c| c["action"] == "guest/plain");
        support::done(!plain)
    })
    .await;
    assert_eq!(provisioned_up(&inv, "guest/hot", 2).await, first, "the same two, kept through the idle bound");

    // Two calls at once: both warm, one on each.
    let mut pids = warm_calls(&inv, "hot", 2).await;
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 2, "one call on each provisioned container");

    // One killed: replaced, and the next two calls are warm again.
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pids[0] as i32), Signal::SIGKILL).unwrap();
    let replaced = eventually(Duration::from_secs(30), "the killed container replaced", || async {
        let up = provisioned_up(&inv, "guest/hot", 2).await;
        match up != first {
            true => Ok(up),
            false => Err(format!("{up:?}")),
        }
    })
    .await;
    let after_kill = warm_calls(&inv, "hot", 2).await;
    assert!(!after_kill.contains(&pids[0]), "the killed process ran nothing more");

    // Room: the node holds 768 MB, the provisioned two 256. A 512 MB action fits beside them;
    // another 512 MB action evicts that one's idle container, never a provisioned one.
    for name in ["big1", "big2"] {
        inv.put_action(name, action(512, json!([]))).await;
        let (status, record) = inv.invoke(name, "blocking=true", json!({})).await;
        assert_eq!(status, 200, "{record}");
    }
    assert_eq!(provisioned_up(&inv, "guest/hot", 2).await, replaced, "the provisioned two were not evicted");
    warm_calls(&inv, "hot", 2).await;

    // A restart provisions them again, warm for the first calls.
    inv.signal(Signal::SIGTERM);
    inv.wait_exit(Duration::from_secs(30));
    let inv = Invoker::start(dir.path(), &id, CONFIG);
    provisioned_up(&inv, "guest/hot", 2).await;
    warm_calls(&inv, "hot", 2).await;

    // Lowered to none: they go.
    let (status, body) =
        inv.send_json("PUT", "/api/v1/namespaces/_/actions/hot?overwrite=true", action(128, json!([]))).await;
    assert_eq!(status, 200, "{body}");
    eventually(Duration::from_secs(30), "the provisioned containers gone", || async {
        let (_, pool) = inv.get_url("/v1/pool").await;
        let none = pool["provisioned"].as_array().is_some_and(Vec::is_empty);
        let kept = pool["containers"].as_array().unwrap().iter().filter(|c| c["action"] == "guest/hot").count();
        support::done(none && kept == 0)
    })
    .await;
}
