//! Durations come from the monotonic clock: an activation across a wall clock set an hour
//! forward or back records the time it ran, ends after it starts, and the list of records keeps
//! the newest at its head. The invoker's wall clock is moved with libfaketime (Debian's
//! `libfaketime`, which `scripts/test.sh` installs), its monotonic clock left alone.

mod support;

use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use support::{python, Invoker};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

const SLEEPER: &str = "import time\ndef main(a):\n    time.sleep(a.get('s', 2))\n    return {'slept': a.get('s', 2)}\n";

/// Starts `name` without waiting, moves the invoker's wall clock by `offset` (libfaketime's
/// syntax) while it runs, and returns its record once it ended.
async fn across_a_jump(inv: &Invoker, clock: &Path, name: &str, offset: &str) -> Value {
    let (status, accepted) = inv.invoke(name, "", json!({"s": 2})).await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["activationId"].as_str().unwrap().to_string();
    // While it runs: its container busy.
    support::eventually(Duration::from_secs(20), &format!("{name} running"), || async {
        support::done(inv.get_url("/v1/pool").await.1["busy"] == 1)
    })
    .await;
    std::fs::write(clock, offset).unwrap();
    support::eventually(Duration::from_secs(20), &format!("{name}'s record"), || async {
        match inv.get(&format!("activations/{id}")).await {
            (200, record) => Ok(record),
            (status, body) => Err(format!("{status} {body}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wall_clock_set_forward_or_back_changes_no_duration_and_no_order() {
    if !Path::new(LIBFAKETIME).exists() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "libfaketime is needed under CI");
        eprintln!("skipped: {LIBFAKETIME} is not installed");
        return;
    }
    let dir = tempfile::Builder::new().prefix("invoker-clock-").tempdir().unwrap();
    let clock = dir.path().join("faketime");
    std::fs::write(&clock, "+0").unwrap();
    let env = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME_TIMESTAMP_FILE", clock.to_str().unwrap()),
        ("FAKETIME_NO_CACHE", "1"),
        ("DONT_FAKE_MONOTONIC", "1"),
    ];
    let inv = Invoker::start_with_env(dir.path(), &format!("clock-{}", std::process::id()), "", &[], &env);
    inv.put_action("sleeper", python(SLEEPER)).await;
    inv.invoke("sleeper", "blocking=true", json!({"s": 0})).await;

    let forward = across_a_jump(&inv, &clock, "sleeper", "+1h").await;
    let back = across_a_jump(&inv, &clock, "sleeper", "+0").await;
    for (what, record) in [("forward", &forward), ("back", &back)] {
        let (start, end, duration) =
            (record["start"].as_u64().unwrap(), record["end"].as_u64().unwrap(), record["duration"].as_u64().unwrap());
        assert!((1900..3000).contains(&duration), "{what}: the duration is the time it ran: {record}");
        assert!(end >= start, "{what}: it ended before it started: {record}");
        assert_eq!(end - start, duration, "{what}: {record}");
    }
    // Started after the clock went back an hour: still the newest.
    let (status, after) = inv.invoke("sleeper", "blocking=true", json!({"s": 0})).await;
    assert_eq!(status, 200, "{after}");
    let (status, listed) = inv.get("activations?limit=3").await;
    assert_eq!(status, 200);
    let ids: Vec<&Value> = listed.as_array().unwrap().iter().map(|r| &r["activationId"]).collect();
    assert_eq!(
        ids,
        [&after["activationId"], &back["activationId"], &forward["activationId"]],
        "newest first: {listed}"
    );
}
