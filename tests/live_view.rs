//! The live view's events (`/v1/live`) from the real binary: a snapshot first, then each
//! container's states as the pool moves it, and the activations as they end; the admin's
//! alone. The page itself (`/ui`) needs no key.

mod support;

use serde_json::json;
use std::time::Duration;
use support::{Invoker, GUEST};

#[tokio::test(flavor = "multi_thread")]
async fn the_live_view_sees_a_container_start_run_idle_and_its_activation_end() {
    let dir = tempfile::Builder::new().prefix("invoker-live-").tempdir().unwrap();
    let invoker = Invoker::start(dir.path(), &format!("live-{}", std::process::id()), "");
    let http = reqwest::Client::new();
    let live = format!("{}/v1/live", invoker.base);

    // The page: no key, no secret, its own files only.
    let page = http.get(format!("{}/ui", invoker.base)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'self'"));
    assert!(!page.text().await.unwrap().contains(&invoker.admin));
    // The events: the admin's only.
    assert_eq!(http.get(&live).send().await.unwrap().status(), 401);
    let (user, pass) = GUEST.split_once(':').unwrap();
    assert_eq!(http.get(&live).basic_auth(user, Some(pass)).send().await.unwrap().status(), 403);

    let (user, pass) = invoker.admin.split_once(':').unwrap();
    let mut stream = http.get(&live).basic_auth(user, Some(pass)).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let first = support::events_until(&mut stream, Duration::from_secs(10), |e| !e.is_empty()).await;
    assert_eq!(first[0].0, "snapshot");
    assert_eq!(first[0].1["containers"], json!([]));
    assert!(first[0].1["pool"]["nodes"][0]["capacity_mb"].as_u64() > Some(0), "{first:?}");

    invoker.put_action("seen", json!({"exec": {"kind": "python:3", "code": "def main(a):\n    return a"}})).await;
    let (status, record) = invoker.invoke("seen", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    let events = support::events_until(&mut stream, Duration::from_secs(20), |events| {
        let idle = events.iter().any(|(k, v)| k == "container" && v["state"] == "idle");
        idle && events.iter().any(|(k, _)| k == "activation")
    })
    .await;
    let states: Vec<&str> = events
        .iter()
        .filter(|(k, v)| k == "container" && v["action"] == "guest/seen")
        .map(|(_, v)| v["state"].as_str().unwrap())
        .collect();
    assert_eq!(states.first(), Some(&"starting"), "{events:#?}");
    assert!(states.contains(&"busy") && states.last() == Some(&"idle"), "{states:?}");
    let idle = events.iter().rev().find(|(k, _)| k == "container").unwrap();
    let (since, until) = (idle.1["idle_since_ms"].as_u64().unwrap(), idle.1["keep_until_ms"].as_u64());
    assert!(until.is_some_and(|u| u >= since), "an idle container says until when it is kept: {idle:?}");
    let ended = events.iter().find(|(k, _)| k == "activation").unwrap();
    assert_eq!(ended.1["id"], record["activationId"]);
    assert_eq!((ended.1["action"].as_str(), ended.1["start"].as_str()), (Some("guest/seen"), Some("cold")));
}

const CONTROLLER: &str = "c0ffee00-0000-4000-8000-00000000a11e:the-live-view-tests-controller-secret";

/// A scheduler's live view: the invokers it sees, sent again when they change (a drain here).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_schedulers_live_view_shows_its_invokers_and_their_drain() {
    let Some(etcd) = support::etcd::EtcdServer::start() else { return };
    let dir = tempfile::Builder::new().prefix("invoker-live-").tempdir().unwrap();
    let invoker_id = format!("live-seen-{}", std::process::id());
    let (_invoker, scheduler) = Invoker::invoker_and_scheduler(dir.path(), &etcd.url(), CONTROLLER, &invoker_id).await;
    let http = reqwest::Client::new();
    let (user, pass) = scheduler.admin.split_once(':').unwrap();
    let mut stream = http.get(format!("{}/v1/live", scheduler.base)).basic_auth(user, Some(pass)).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let first = support::events_until(&mut stream, Duration::from_secs(10), |e| !e.is_empty()).await;
    assert_eq!(first[0].0, "invokers", "{first:?}");
    assert_eq!(first[0].1["scheduler"], "s1");
    assert_eq!(first[0].1["invokers"][0]["id"], invoker_id.as_str());
    assert_eq!(first[0].1["invokers"][0]["drained"], false);

    let (status, _) = scheduler.post_url(&format!("/v1/invokers/{invoker_id}/drain")).await;
    assert_eq!(status, 200);
    support::events_until(&mut stream, Duration::from_secs(20), |events| {
        events.iter().any(|(k, v)| k == "invokers" && v["invokers"][0]["drained"] == true)
    })
    .await;
}
