//! A full disk never turns a finished result into a failure, and never stops a start: the
//! invoker's `data_dir` on a small filesystem is filled while activations run, the invoker is
//! stopped (SIGTERM) and started again while the disk is still full, then the disk is freed.
//! Every activation whose caller was told it succeeded has a success record throughout; every
//! asynchronous call accepted (202) ends with a record; on the full disk a new one is refused
//! with a 503 naming the disk, never accepted and dropped.

mod support;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::Duration;
use support::{python, Invoker, SmallDisk};

const SLOW: &str = "import time\ndef main(a):\n    time.sleep(1)\n    return {'data': 'x' * 100000, 'n': a.get('n')}\n";

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: a tmpfs (run by .ci/run)")]
async fn results_finished_on_a_full_disk_stay_successes_across_a_restart_on_it() {
    let dir = tempfile::Builder::new().prefix("invoker-full-").tempdir().unwrap();
    let data = dir.path().join("data");
    let Some(disk) = SmallDisk::mount(&data, 32) else { return };
    let id = format!("full-{}", std::process::id());
    // The journal keeps 8 MB for endings: the records of twenty calls, whatever the disk does.
    let config = "[store]\nend_reserve_mb = 8\n";
    let mut inv = Invoker::start(dir.path(), &id, config);
    inv.put_action("slow", python(SLOW)).await;
    let (status, body) = inv.invoke("slow", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{body}");

    // Twenty calls under way, then the disk fills while they run.
    let http = reqwest::Client::new();
    let (user, pass) = support::GUEST.split_once(':').unwrap();
    let url = format!("{}?blocking=true", inv.url("actions/slow"));
    let calls: Vec<_> = (0..20)
        .map(|n| {
            let request = http.post(&url).basic_auth(user, Some(pass)).json(&json!({"n": n}));
            tokio::spawn(async move { request.send().await })
        })
        .collect();
    // And asynchronous calls, on disk before their 202.
    let mut queued = Vec::new();
    for n in 0..5 {
        let (status, body) = inv.invoke("slow", "blocking=false", json!({"n": n})).await;
        assert_eq!(status, 202, "{body}");
        queued.push(body["activationId"].as_str().unwrap().to_string());
    }
    // A load window: the queued calls are under way when the disk fills.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ballast = disk.fill(64 << 10);
    let mut succeeded = Vec::new();
    for call in calls {
        let response = call.await.unwrap().unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status == 200 && body["response"]["success"] == true {
            succeeded.push(body["activationId"].as_str().unwrap().to_string());
        }
    }
    assert!(!succeeded.is_empty(), "no call succeeded");

    // Stopped and started again on the disk filled to the last byte: it starts, serves the
    // records, and refuses new work.
    inv.signal(Signal::SIGTERM);
    inv.wait_exit(Duration::from_secs(60));
    let more = disk.fill(0);
    let inv = Invoker::start(dir.path(), &id, config);
    let (status, refused) = inv.try_invoke("slow", json!({})).await;
    assert_eq!(status, 503, "new work on a full disk: {refused}");
    let path = "/api/v1/namespaces/_/actions/slow?blocking=false";
    let (status, _, refused) = inv.send("POST", path, support::GUEST, &[], b"{}".to_vec()).await;
    let refused = String::from_utf8_lossy(&refused);
    assert!(
        status == 503 && refused.contains("No space left on device"),
        "an asynchronous call on a full disk: {status} {refused}"
    );
    for id in &succeeded {
        let record = inv.record(id).await;
        assert_eq!(record["response"]["success"], true, "told success, recorded otherwise: {record}");
    }

    // The disk freed: the same invoker takes work, and every record is still a success.
    std::fs::remove_file(&ballast).unwrap();
    std::fs::remove_file(&more).unwrap();
    let mut healthy = false;
    for _ in 0..300 {
        let (_, health) = inv.get_url("/health").await;
        if health["status"] == "healthy" {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(healthy, "the invoker never took work again");
    let (status, body) = inv.invoke("slow", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{body}");
    for id in &succeeded {
        let record = inv.record(id).await;
        assert_eq!(record["response"]["success"], true, "{record}");
    }
    for id in &queued {
        let record = inv.record(id).await;
        assert!(record["response"]["statusCode"].is_u64(), "an accepted asynchronous call ends: {record}");
    }
}
