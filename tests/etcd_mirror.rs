//! `cluster::mirror` against a real etcd (one per test, on loopback ports): a prefix kept by
//! one range and the gateway's watch, through puts, deletes, a lease's end, etcd stopped and
//! started again, frozen, a history compacted past a watch's revision, and, with three members,
//! the watch's own member frozen while the others serve.

mod support;

use invoker_etcd::kv::ClusterKv;
use invoker_etcd::mirror::{mirror, Snapshot, Source, Watch, WatchEnd, WatchNews};
use std::time::Duration;
use support::etcd::EtcdServer;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Waits (bounded) until the snapshot satisfies `check`; returns it.
async fn until(snapshots: &mut watch::Receiver<Snapshot>, what: &str, check: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let waited = tokio::time::timeout(Duration::from_secs(30), snapshots.wait_for(|s| check(s))).await;
    let seen = waited.ok().and_then(|r| r.ok()).map(|s| s.clone());
    seen.unwrap_or_else(|| panic!("{what}: {:?}", *snapshots.borrow()))
}

fn has(s: &Snapshot, key: &str, value: &str) -> bool {
    s.entries.get(key).map(String::as_str) == Some(value)
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_mirror_follows_puts_deletes_and_leases_with_one_range_and_ranges_again_after_etcd_restarts() {
    let Some(mut etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    kv.put("/m/before", "1", None).await.unwrap();
    kv.put("/other/x", "not ours", None).await.unwrap();
    let stop = CancellationToken::new();
    let mut snapshots = mirror(kv.clone(), "/m/".into(), stop.clone());
    let first = until(&mut snapshots, "the first range", |s| s.current).await;
    assert_eq!(first.entries.keys().collect::<Vec<_>>(), vec!["/m/before"], "only the prefix");

    for i in 0..50 {
        kv.put(&format!("/m/k{i}"), &i.to_string(), None).await.unwrap();
    }
    kv.put("/m/k7", "changed", None).await.unwrap();
    kv.delete("/m/before").await.unwrap();
    let lease = kv.grant(Duration::from_secs(30)).await.unwrap();
    kv.put("/m/leased", "x", Some(lease)).await.unwrap();
    let seen = until(&mut snapshots, "every change", |s| {
        s.entries.len() == 51 && has(s, "/m/k7", "changed") && has(s, "/m/leased", "x")
    })
    .await;
    assert!(!seen.entries.contains_key("/m/before"));
    kv.revoke(lease).await.unwrap();
    let seen = until(&mut snapshots, "the lease's key gone", |s| !s.entries.contains_key("/m/leased")).await;
    assert_eq!(seen.ranges, 1, "53 changes, one range");

    // Stopped: the entries stay as last seen, not current. Started again: one more range.
    etcd.stop();
    let away = until(&mut snapshots, "etcd away", |s| !s.current).await;
    assert_eq!(away.entries.len(), 50, "the picture as last seen");
    etcd.resume();
    kv.put("/m/after", "1", None).await.unwrap();
    let back = until(&mut snapshots, "etcd back", |s| s.current && has(s, "/m/after", "1")).await;
    assert!(back.ranges >= 2, "ranged again after the restart: {back:?}");
    stop.cancel();
}

/// A member that hangs with its connections open (SIGSTOP) sends nothing: the quiet watch is
/// checked, found unanswered, and the snapshot stops being current until etcd answers again.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_frozen_etcd_is_noticed_by_a_quiet_watch_and_followed_again_once_thawed() {
    let Some(etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    let stop = CancellationToken::new();
    let mut snapshots = mirror(kv.clone(), "/m/".into(), stop.clone());
    until(&mut snapshots, "the first range", |s| s.current).await;
    etcd.freeze();
    until(&mut snapshots, "the frozen member noticed", |s| !s.current).await;
    etcd.thaw();
    kv.put("/m/thawed", "1", None).await.unwrap();
    until(&mut snapshots, "followed again", |s| s.current && has(s, "/m/thawed", "1")).await;
    stop.cancel();
}

/// A watch from a revision etcd compacted away ends at once, saying so; the mirror ranges
/// again instead of missing what was compacted.
/// Three members; the mirror's watch is on the first. Frozen, that member says nothing while the
/// other two serve every call, including the old quiet check: the watch must be replaced on a
/// member that serves, or the mirror never sees another change until the member thaws.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_watch_on_a_frozen_member_of_three_is_replaced_on_a_member_that_serves() {
    let Some(members) = EtcdServer::start_cluster(3) else { return };
    let urls: Vec<String> = members.iter().map(EtcdServer::url).collect();
    let kv = invoker_etcd::client::Etcd::new(&urls).unwrap();
    put_until_done(&kv, "/m/before", "1").await;
    // The mirror's own client, made once the first member serves reads: it starts there (a
    // client that found the first member slow while the cluster elected its leader would start
    // at another, and the freeze below would not be of the watch's member).
    put_until_done(&members[0].kv(), "/m/first-serves", "1").await;
    let watching = invoker_etcd::client::Etcd::new(&urls).unwrap();
    let stop = CancellationToken::new();
    let mut snapshots = mirror(watching, "/m/".into(), stop.clone());
    until(&mut snapshots, "the first range", |s| s.current && has(s, "/m/before", "1")).await;
    put_until_done(&kv, "/m/watched", "1").await;
    let seen = until(&mut snapshots, "a change by the watch", |s| has(s, "/m/watched", "1")).await;
    assert_eq!(seen.ranges, 1, "the first member serves the watch");

    members[0].freeze();
    let second = members[1].kv();
    put_until_done(&second, "/m/during", "1").await;
    let seen =
        until(&mut snapshots, "a change made while the watch's member is frozen", |s| has(s, "/m/during", "1")).await;
    assert!(seen.ranges >= 2, "the watch was replaced: {seen:?}");
    second.delete("/m/before").await.unwrap();
    until(&mut snapshots, "a delete through the new watch", |s| !s.entries.contains_key("/m/before")).await;
    members[0].thaw();
    stop.cancel();
}

/// A put retried while the cluster elects a leader (a frozen leader's followers take a second).
async fn put_until_done(kv: &invoker_etcd::client::Etcd, key: &str, value: &str) {
    for _ in 0..40 {
        if kv.put(key, value, None).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("etcd took no put of {key}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_watch_from_a_compacted_revision_ends_with_the_compaction_named() {
    let Some(etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    kv.put("/m/a", "1", None).await.unwrap();
    let (_, old) = kv.get_prefix_at("/m/").await.unwrap();
    for i in 0..5 {
        kv.put("/m/a", &i.to_string(), None).await.unwrap();
    }
    let (_, now) = kv.get_prefix_at("/m/").await.unwrap();
    compact(&etcd, now).await;
    let mut stream = kv.watch_prefix("/m/", old).await.unwrap();
    let mut ended = None;
    for _ in 0..3 {
        let news = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap();
        if let WatchNews::Ended(why) = news {
            ended = Some(why);
            break;
        }
    }
    assert_eq!(ended, Some(WatchEnd::Compacted(now)), "the watch ended with the compaction named");
}

/// A lease revoked twice (a registrar giving back an id whose lease already lapsed): etcd says
/// NOT_FOUND by its gRPC code, which the client reads as done.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_lease_revoked_twice_is_gone_not_an_error() {
    let Some(etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    let lease = kv.grant(Duration::from_secs(30)).await.unwrap();
    kv.revoke(lease).await.unwrap();
    kv.revoke(lease).await.expect("a lease already gone is revoked");
    let refused = kv.keep_alive(lease).await;
    assert!(matches!(refused, Ok(None)), "{refused:?}");
}

/// Compacts etcd's history up to `revision` (the gateway's `/v3/kv/compaction`).
async fn compact(etcd: &EtcdServer, revision: i64) {
    let answer = reqwest::Client::new()
        .post(format!("{}/v3/kv/compaction", etcd.url()))
        .json(&serde_json::json!({ "revision": revision.to_string(), "physical": true }))
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{:?}", answer.text().await);
}
