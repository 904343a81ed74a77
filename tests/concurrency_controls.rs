//! An action's concurrency controls end to end, on the process factory and the real binary:
//! `max-concurrency` held under bursts of blocking and of asynchronous calls, counted from
//! inside the action (each run says when it began and ended), and a blocking call that waits
//! past its bound for the cap answered 429 with a record saying why.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::{eventually, python, Invoker};

/// Each run says when it began and ended, by its own clock.
const TIMED: &str =
    "import time\ndef main(a):\n    t0 = time.time()\n    time.sleep(a.get('sleep', 0.5))\n    return {'t0': t0, 't1': time.time()}\n";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-cap-").tempdir().unwrap()
}

fn capped_action(cap: u64) -> Value {
    let mut action = python(TIMED);
    action["limits"] = json!({ "memory": 128 });
    action["annotations"] = json!([{ "key": "max-concurrency", "value": cap }]);
    action
}

/// The most runs that overlapped, from their own times.
fn most_at_once(results: &[Value]) -> usize {
    support::most_at_once(results.iter().map(|r| (r["t0"].as_f64().unwrap(), r["t1"].as_f64().unwrap())))
}

/// A cap of 3 on a node with room for sixteen: twelve blocking calls at once all succeed, and
/// no more than three ever run together; then twelve asynchronous ones, the same. A cap out of
/// bounds is refused naming the field.
#[tokio::test(flavor = "multi_thread")]
async fn max_concurrency_holds_under_a_burst_of_blocking_and_of_asynchronous_calls() {
    let dir = tempdir();
    let inv = Invoker::start(
        dir.path(),
        &format!("cap-{}", std::process::id()),
        "[factory.process]\nuser_memory_mb = 2048\n",
    );
    for bad in [json!(0), json!(10_001), json!("3")] {
        let mut action = capped_action(3);
        action["annotations"][0]["value"] = bad.clone();
        let (status, _, body) = inv
            .send(
                "PUT",
                "/api/v1/namespaces/_/actions/bad",
                support::GUEST,
                &[("content-type", "application/json")],
                action.to_string().into_bytes(),
            )
            .await;
        let body = String::from_utf8_lossy(&body);
        assert!(status == 400 && body.contains("annotations.max-concurrency"), "{bad}: {status} {body}");
    }
    inv.put_action("capped", capped_action(3)).await;

    let calls = (0..12).map(|_| inv.invoke("capped", "blocking=true&result=true", json!({ "sleep": 0.5 })));
    let answers = futures_util::future::join_all(calls).await;
    let results: Vec<Value> = answers
        .into_iter()
        .map(|(status, result)| {
            assert_eq!(status, 200, "{result}");
            result
        })
        .collect();
    assert!(most_at_once(&results) <= 3, "blocking: {} at once", most_at_once(&results));

    let calls = (0..12).map(|_| inv.invoke("capped", "blocking=false", json!({ "sleep": 0.5 })));
    let ids: Vec<String> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|(status, body)| {
            assert_eq!(status, 202, "{body}");
            body["activationId"].as_str().unwrap().to_string()
        })
        .collect();
    let results = eventually(Duration::from_secs(60), "every asynchronous call's record", || async {
        let mut results = Vec::new();
        for id in &ids {
            let (status, record) = inv.get(&format!("activations/{id}")).await;
            if status != 200 {
                return Err(format!("{id}: {status}"));
            }
            assert_eq!(record["response"]["statusCode"], 0, "{record}");
            results.push(record["response"]["result"].clone());
        }
        Ok(results)
    })
    .await;
    assert!(most_at_once(&results) <= 3, "asynchronous: {} at once", most_at_once(&results));
}

/// A cap of one and a blocking wait of 2 s: while one call runs 4 s, another is answered 429
/// with Retry-After once its wait is over, and its record says the cap held it (nothing ran).
#[tokio::test(flavor = "multi_thread")]
async fn a_blocking_call_held_by_the_cap_past_its_wait_is_429_saying_why() {
    let dir = tempdir();
    let extra = "[factory.process]\nuser_memory_mb = 2048\n[pool]\nwait_deadline = \"2s\"\n";
    let inv = Invoker::start(dir.path(), &format!("cap429-{}", std::process::id()), extra);
    inv.put_action("one", capped_action(1)).await;
    let first = inv.invoke("one", "blocking=true", json!({ "sleep": 4 }));
    let second = async {
        // After the first took the one place.
        eventually(Duration::from_secs(10), "the first running", || async {
            let (_, pool) = inv.get_url("/v1/pool").await;
            support::done(pool["busy"] == 1)
        })
        .await;
        let headers = [("content-type", "application/json")];
        let body = json!({ "sleep": 0 }).to_string().into_bytes();
        let answer =
            inv.send("POST", "/api/v1/namespaces/_/actions/one?blocking=true", support::GUEST, &headers, body).await;
        // Shown while the first still runs: the pool's view of the cap, and the count of 429s.
        let (_, pool) = inv.get_url("/v1/pool").await;
        let capped = pool["capped"].as_array().cloned().unwrap_or_default();
        assert_eq!(capped.len(), 1, "{pool}");
        assert_eq!(
            (&capped[0]["action"], &capped[0]["cap"], &capped[0]["running"]),
            (&json!("guest/one"), &json!(1), &json!(1))
        );
        let (_, _, metrics) = inv.send("GET", "/metrics", &inv.admin, &[], Vec::new()).await;
        assert!(String::from_utf8_lossy(&metrics).contains("invoker_capped_total 1"), "the 429 counted");
        answer
    };
    let ((status, first), (status2, headers, body)) = tokio::join!(first, second);
    assert_eq!(status, 200, "{first}");
    let record: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status2, 429, "{record}");
    assert_eq!(headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    let rejected = record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == "rejected");
    assert_eq!(rejected.map(|a| &a["value"]), Some(&json!("capped")), "{record}");
    assert!(record["response"]["result"]["error"].as_str().unwrap().contains("max-concurrency"), "{record}");
}

const FLOODER: &str = "11111111-2222-3333-4444-555555555555:the-flooding-tenants-key";

/// Issue 60's noisy neighbour: tenant `flood` fills the node (room for four) with forty
/// asynchronous calls of a 2 s action, a backlog of about twenty seconds; the guest tenant's
/// blocking calls meanwhile all succeed, each while the flood's backlog still waits: none waits
/// behind it, and none fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_flooding_the_node_does_not_hold_another_behind_its_backlog() {
    let dir = tempdir();
    let extra = format!(
        "[namespaces]\nguest = \"{}\"\nflood = \"{FLOODER}\"\n[factory.process]\nuser_memory_mb = 512\n",
        support::GUEST
    );
    let inv = Invoker::start(dir.path(), &format!("fair-{}", std::process::id()), &extra);
    let json_headers = [("content-type", "application/json")];
    let mut slow = python("import time\ndef main(a):\n    time.sleep(2)\n    return {}\n");
    slow["limits"] = json!({ "memory": 128 });
    let (status, _, body) = inv
        .send("PUT", "/api/v1/namespaces/flood/actions/slow", FLOODER, &json_headers, slow.to_string().into_bytes())
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let mut quick = python("def main(a):\n    return {'ok': True}\n");
    quick["limits"] = json!({ "memory": 128 });
    inv.put_action("quick", quick).await;

    let mut flood = Vec::new();
    for _ in 0..40 {
        let (status, _, body) =
            inv.send("POST", "/api/v1/namespaces/flood/actions/slow", FLOODER, &json_headers, b"{}".to_vec()).await;
        assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
        let accepted: Value = serde_json::from_slice(&body).unwrap();
        flood.push(accepted["activationId"].as_str().unwrap().to_string());
    }
    // The flood holds the node.
    eventually(Duration::from_secs(20), "the flood on every container", || async {
        let (_, pool) = inv.get_url("/v1/pool").await;
        support::done(pool["busy"] == 4)
    })
    .await;
    for _ in 0..3 {
        let (status, record) = inv.invoke("quick", "blocking=true", json!({})).await;
        assert_eq!(status, 200, "{record}");
        // Served while the flood's backlog still waits.
        let mut flood_ended = 0;
        for id in &flood {
            let (status, _, _) =
                inv.send("GET", &format!("/api/v1/namespaces/flood/activations/{id}"), FLOODER, &[], Vec::new()).await;
            flood_ended += usize::from(status == 200);
        }
        assert!(flood_ended < 30, "the guest's call waited behind the flood: {flood_ended} of its 40 ended first");
    }
}
