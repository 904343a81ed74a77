//! The invoker's registration in a real etcd (started here, one per test, on loopback ports):
//! its record and container keys, a duplicate id refused, keys gone with the lease of a killed
//! invoker, a restart taking its id over, and etcd going away and coming back. Skipped with a
//! message when no `etcd` binary is installed (`scripts/etcd.sh` installs it); under `CI=true`
//! a missing etcd fails instead.

mod support;

use invoker_etcd::client::Etcd;
use invoker_etcd::kv::ClusterKv;
use invoker_wire::cluster::Health;
use invoker_wire::cluster::{DrainMark, InvokerRecord};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};
use support::etcd::EtcdServer;
use support::{python, Invoker, SmallDisk};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-cl-").tempdir().unwrap()
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

fn cluster_config(etcd: &EtcdServer, tags: &[&str]) -> String {
    format!(
        "[cluster]\netcd = [\"{}\"]\nlease_ttl = \"3s\"\npublish_interval = \"200ms\"\ntags = {}\n",
        etcd.url(),
        json!(tags)
    )
}

/// The invoker's record, once etcd has one (bounded wait).
async fn record(kv: &Etcd, invoker_id: &str, until: impl Fn(&InvokerRecord) -> bool) -> InvokerRecord {
    // Generous: an etcd member restarted on a loaded 2-core CI machine once took longer than
    // 20 s to answer and take the invoker's registration.
    let until = &until;
    support::eventually(
        Duration::from_secs(45),
        &format!("a record of {invoker_id} as expected in etcd"),
        || async move {
            match kv.get(&format!("/invoker/invokers/{invoker_id}")).await {
                Ok(Some((value, _))) => {
                    let record: InvokerRecord = serde_json::from_str(&value).unwrap();
                    if until(&record) {
                        Ok(record)
                    } else {
                        Err(value)
                    }
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

async fn keys(kv: &Etcd, prefix: &str) -> Vec<String> {
    kv.get_prefix(prefix).await.unwrap().into_iter().map(|(k, _)| k).collect()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_registers_its_tags_headroom_and_containers() {
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = id("reg");
    // Idle containers go after 2 s, so that their keys are seen to go with them.
    let config = format!("{}[pool]\nidle_timeout = \"2s\"\n", cluster_config(&etcd, &["gpu", "ssd"]));
    let inv = Invoker::start(dir.path(), &invoker_id, &config);
    let kv = etcd.kv();
    let r = record(&kv, &invoker_id, |r| !r.nodes.is_empty()).await;
    assert_eq!(r.api, inv.base);
    assert_eq!(r.tags, ["gpu", "ssd"]);
    assert_eq!(r.health, Health::Healthy);
    assert_eq!((r.nodes[0].capacity_mb, r.launchable_mb()), (2048, 2048), "{r:?}");

    inv.put_action("warm", python("def main(a):\n    return {}")).await;
    let (status, _) = inv.invoke("warm", "blocking=true", json!({})).await;
    assert_eq!(status, 200);
    let prefix = "/invoker/containers/guest/warm/";
    let held = keys_until(&kv, prefix, |held| !held.is_empty()).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].starts_with(&format!("{prefix}1/invoker/{invoker_id}/container/")), "{held:?}");
    // Less headroom while the container holds its 256 MB.
    let r = record(&kv, &invoker_id, |r| !r.nodes.is_empty() && r.launchable_mb() < 2048).await;
    assert_eq!(r.launchable_mb(), 2048 - 256);
    // The idle container goes, and its key with it.
    keys_until(&kv, prefix, |held| held.is_empty()).await;
    record(&kv, &invoker_id, |r| !r.nodes.is_empty() && r.launchable_mb() == 2048).await;
}

/// An invoker publishes its headroom as soon as it serves, not one `publish_interval` later:
/// until then no scheduler or capacity manager counts it as serving. (With an interval of
/// 100 s, the record the bounded wait reads would have had no nodes for 100 s.)
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_publishes_its_headroom_at_once() {
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = id("first");
    let config = format!("[cluster]\netcd = [\"{}\"]\nlease_ttl = \"300s\"\npublish_interval = \"100s\"\n", etcd.url());
    let _inv = Invoker::start(dir.path(), &invoker_id, &config);
    let r = record(&etcd.kv(), &invoker_id, |r| !r.nodes.is_empty()).await;
    assert_eq!(r.nodes[0].capacity_mb, 2048, "{r:?}");
}

/// An operator's drain, and its end, are published as they come: the invoker watches its
/// drain key instead of reading it at each publish. (With a publish interval of 100 s, the
/// bounded wait would see neither before the next publish.)
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_publishes_a_drain_and_its_end_as_they_come() {
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = id("drained");
    let config = format!("[cluster]\netcd = [\"{}\"]\nlease_ttl = \"300s\"\npublish_interval = \"100s\"\n", etcd.url());
    let _inv = Invoker::start(dir.path(), &invoker_id, &config);
    let kv = etcd.kv();
    record(&kv, &invoker_id, |r| r.health == Health::Healthy && !r.nodes.is_empty()).await;
    let drain = invoker_wire::cluster::drain_key("/invoker", &invoker_id);
    kv.put(&drain, &DrainMark::operator(true, 1).to_value(), None).await.unwrap();
    record(&kv, &invoker_id, |r| r.health == Health::Drained).await;
    kv.put(&drain, &DrainMark::operator(false, 2).to_value(), None).await.unwrap();
    record(&kv, &invoker_id, |r| r.health == Health::Healthy).await;
    // The capacity manager's drain, and its end: its key deleted (it keeps its own drains).
    kv.put(&drain, &DrainMark::capacity(3).to_value(), None).await.unwrap();
    record(&kv, &invoker_id, |r| r.health == Health::Drained).await;
    kv.delete(&drain).await.unwrap();
    record(&kv, &invoker_id, |r| r.health == Health::Healthy).await;
}

/// An invoker that follows its pod's memory limit (`memory_limit_file`, which Kubernetes
/// changes when it resizes a pod in place): out of the cluster while the limit leaves nothing
/// beyond its own share (a standby pod), in it with what the limit leaves as soon as the pod
/// grows, and out again once it shrinks back; drained by the capacity manager first, it sheds
/// its idle containers. (With a publish interval of 100 s, neither change would show within the
/// bounded waits; without the shedding, the warm container idled on.)
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_following_its_pods_memory_limit_stands_by_grows_and_shrinks_with_it() {
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = id("standby");
    let limit = dir.path().join("memory.max");
    std::fs::write(&limit, (32u64 << 20).to_string()).unwrap();
    let config = format!(
        "[cluster]\netcd = [\"{}\"]\nlease_ttl = \"300s\"\npublish_interval = \"100s\"\n\
         [factory.process]\nmemory_limit_file = \"{}\"\nown_memory_mb = 32\n",
        etcd.url(),
        limit.display()
    );
    let inv = Invoker::start(dir.path(), &invoker_id, &config);
    let kv = etcd.kv();
    // Serving, and nothing of it in etcd: not its record, not its id's claim.
    let (status, health) = inv.get_url("/health").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(keys(&kv, "/invoker/").await, Vec::<String>::new());
    // Grown to 1 GiB beyond its own share: in the cluster with it.
    std::fs::write(&limit, ((1024u64 + 32) << 20).to_string()).unwrap();
    let r = record(&kv, &invoker_id, |r| !r.nodes.is_empty()).await;
    assert_eq!((r.nodes[0].capacity_mb, r.launchable_mb(), r.health), (1024, 1024, Health::Healthy), "{r:?}");
    // It runs what it is sent on what it was given; the container stays warm.
    inv.put_action("grown", python("def main(a):\n    return {'ok': True}")).await;
    let (status, body) = inv.invoke("grown", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let containers = || async { inv.get_url("/v1/pool").await.1["containers"].as_array().map_or(0, Vec::len) };
    assert_eq!(containers().await, 1);
    // Given back by the capacity manager (its drain): the idle container goes at once, so that
    // a kubelet can shrink the pod (it waits for what the pod uses to fit).
    let drain = invoker_wire::cluster::drain_key("/invoker", &invoker_id);
    kv.put(&drain, &DrainMark::capacity(1).to_value(), None).await.unwrap();
    record(&kv, &invoker_id, |r| r.health == Health::Drained).await;
    support::eventually(Duration::from_secs(20), "the idle container gone", || async {
        support::done(containers().await == 0)
    })
    .await;
    // Back to standby: its keys go with its lease.
    std::fs::write(&limit, (32u64 << 20).to_string()).unwrap();
    keys_until(&kv, "/invoker/invokers/", |held| held.is_empty()).await;
    // Its drain is the capacity manager's to take back.
    keys_until(&kv, "/invoker/", |held| held.iter().all(|k| !k.contains(&invoker_id) || k.contains("/drain/"))).await;
}

/// The keys under `prefix` once `until` holds of them (bounded wait).
async fn keys_until(kv: &Etcd, prefix: &str, until: impl Fn(&[String]) -> bool) -> Vec<String> {
    let until = &until;
    support::eventually(Duration::from_secs(20), &format!("the keys under {prefix} as expected"), || async move {
        let held = keys(kv, prefix).await;
        if until(&held) {
            Ok(held)
        } else {
            Err(format!("{held:?}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_second_invoker_with_a_live_ones_id_refuses_to_start_and_touches_nothing() {
    let Some(etcd) = EtcdServer::start() else { return };
    let (dir, other) = (tempdir(), tempdir());
    let invoker_id = id("dup");
    let config = cluster_config(&etcd, &[]);
    let inv = Invoker::start(dir.path(), &invoker_id, &config);
    inv.put_action("pid", python("import os\ndef main(a):\n    return {'pid': os.getpid()}")).await;
    let (_, first) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;

    let config_file = other.path().join("invoker.toml");
    std::fs::write(&config_file, format!("invoker_id = \"{invoker_id}\"\n{config}")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_invoker"))
        .arg("--config")
        .arg(&config_file)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(other.path().join("data"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the duplicate started: {stderr}");
    assert!(stderr.contains(&format!("invoker id '{invoker_id}' is held by a live invoker")), "{stderr}");
    assert!(stderr.contains(&inv.base.replace("http://", "")), "names the live one: {stderr}");

    // The first one's container was not cleaned up by the duplicate's start.
    let (status, again) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, &again["pid"]), (200, &first["pid"]));
}

/// Starts a second invoker with `invoker_id` and `config` in `dir`; how it exited (`None`: it
/// was still serving after a bounded wait, and was killed) and what it wrote to stderr.
async fn start_duplicate(
    dir: &std::path::Path,
    invoker_id: &str,
    config: &str,
) -> (Option<std::process::ExitStatus>, String) {
    let config_file = dir.join("invoker.toml");
    std::fs::write(&config_file, format!("invoker_id = \"{invoker_id}\"\n{config}")).unwrap();
    let log = dir.join("stderr.log");
    let mut duplicate = Command::new(env!("CARGO_BIN_EXE_invoker"))
        .arg("--config")
        .arg(&config_file)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Bounded: a duplicate that starts serves until it is stopped.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = duplicate.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = duplicate.kill();
            let _ = duplicate.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

/// The first invoker cut from etcd past its lease (its key gone), a second one with its id
/// reaches etcd and finds the id free there: it still refuses to start, touches nothing of the
/// first's, and leaves no key of its own behind; healed, the first registers again.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups (run by .ci/run)")]
async fn after_a_lease_lapsed_a_second_invoker_with_the_id_refuses_to_start_and_kills_nothing() {
    let Some(etcd) = EtcdServer::start() else { return };
    let (dir, other) = (tempdir(), tempdir());
    let invoker_id = id("dup-lapsed");
    let partition = support::partition::Partition::to(etcd.url().trim_start_matches("http://")).await;
    let config =
        |url: &str| format!("[cluster]\netcd = [\"{url}\"]\nlease_ttl = \"2s\"\npublish_interval = \"200ms\"\n");
    let inv = Invoker::start(dir.path(), &invoker_id, &config(&partition.url()));
    inv.put_action("pid", python("import os\ndef main(a):\n    return {'pid': os.getpid()}")).await;
    let (_, first) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    let kv = etcd.kv();
    record(&kv, &invoker_id, |r| r.pid == inv.child.id()).await;

    partition.cut();
    let key = format!("/invoker/invokers/{invoker_id}");
    support::eventually(Duration::from_secs(30), "the cut invoker's lease lapsed", || async {
        support::done(kv.get(&key).await.unwrap().is_none())
    })
    .await;
    let (status, stderr) = start_duplicate(other.path(), &invoker_id, &config(&etcd.url())).await;
    assert!(status.is_some_and(|s| !s.success()), "the duplicate started: {stderr}");
    assert!(stderr.contains("is held by a live invoker on this machine"), "{stderr}");
    assert!(kv.get(&key).await.unwrap().is_none(), "the refused duplicate left its registration");

    partition.heal();
    record(&kv, &invoker_id, |r| r.pid == inv.child.id()).await;
    let (status, again) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, &again["pid"]), (200, &first["pid"]), "the first one's container is the same process");
}

/// The same with etcd unreachable, so that no claim there can refuse the second one: the id is
/// held on the machine, and the second start stops before it touches anything of the first's.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups (run by .ci/run)")]
async fn with_etcd_unreachable_a_second_invoker_with_a_live_ones_id_refuses_to_start_and_kills_nothing() {
    let (dir, other) = (tempdir(), tempdir());
    let invoker_id = id("dup-away");
    let nowhere = support::etcd::free_port();
    let config = format!("[cluster]\netcd = [\"http://127.0.0.1:{nowhere}\"]\nlease_ttl = \"3s\"\n");
    let inv = Invoker::start(dir.path(), &invoker_id, &config);
    inv.put_action("pid", python("import os\ndef main(a):\n    return {'pid': os.getpid()}")).await;
    let (_, first) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;

    let (status, stderr) = start_duplicate(other.path(), &invoker_id, &config).await;
    assert!(status.is_some_and(|s| !s.success()), "the duplicate started: {stderr}");
    assert!(
        stderr.contains(&format!("invoker id '{invoker_id}' is held by a live invoker on this machine")),
        "{stderr}"
    );
    assert!(stderr.contains(&inv.child.id().to_string()), "names the live one's pid: {stderr}");
    // The first one's container is the same process: nothing of it was killed.
    let (status, again) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, &again["pid"]), (200, &first["pid"]));
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_killed_invokers_keys_go_with_its_lease_and_a_restart_takes_its_id_over() {
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = id("kill");
    let config = cluster_config(&etcd, &[]);
    let kv = etcd.kv();

    let mut inv = Invoker::start(dir.path(), &invoker_id, &config);
    inv.put_action("a", python("def main(a):\n    return {}")).await;
    assert_eq!(inv.invoke("a", "blocking=true", json!({})).await.0, 200);
    record(&kv, &invoker_id, |_| true).await;
    inv.signal(nix::sys::signal::Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    // A restart on the same machine does not wait for the dead run's lease.
    let inv = Invoker::start(dir.path(), &invoker_id, &config);
    let r = record(&kv, &invoker_id, |r| r.api == inv.base).await;
    assert_eq!(r.pid, inv.child.id());

    let mut inv = inv;
    inv.signal(nix::sys::signal::Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    keys_until(&kv, "/invoker/", <[String]>::is_empty).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn without_etcd_activations_go_on_and_the_registration_comes_back_with_it() {
    let Some(mut etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = id("away");
    let inv = Invoker::start(dir.path(), &invoker_id, &cluster_config(&etcd, &[]));
    inv.put_action("a", python("def main(a):\n    return {'ok': True}")).await;
    record(&etcd.kv(), &invoker_id, |_| true).await;
    assert_eq!(inv.invoke("a", "blocking=true", json!({})).await.0, 200);
    keys_until(&etcd.kv(), "/invoker/containers/guest/a/", |held| held.len() == 1).await;
    let key = format!("/invoker/invokers/{invoker_id}");
    let (_, lease) = etcd.kv().get(&key).await.unwrap().unwrap();

    etcd.stop();
    for _ in 0..10 {
        let (status, body) = inv.invoke("a", "blocking=true&result=true", json!({})).await;
        assert_eq!((status, body), (200, json!({"ok": true})));
    }
    tokio::time::sleep(Duration::from_secs(4)).await; // past the lease's TTL
    assert_eq!(inv.invoke("a", "blocking=true&result=true", json!({})).await.0, 200);

    etcd.resume();
    let r = record(&etcd.kv(), &invoker_id, |r| r.api == inv.base && !r.nodes.is_empty()).await;
    assert_eq!(r.health, Health::Healthy);
    // The warm container's key goes with the lost lease; the new lease puts it again.
    support::eventually(Duration::from_secs(45), "the invoker under a new lease", || async {
        support::done(etcd.kv().get(&key).await.ok().flatten().is_some_and(|(_, l)| l != lease))
    })
    .await;
    keys_until(&etcd.kv(), "/invoker/containers/guest/a/", |held| held.len() == 1).await;
    assert!(inv.stderr().contains("cluster registration"), "the outage was logged: {}", inv.stderr());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_started_while_etcd_is_away_serves_and_registers_once_it_answers() {
    let Some(mut etcd) = EtcdServer::start() else { return };
    etcd.stop();
    let dir = tempdir();
    let invoker_id = id("late");
    let inv = Invoker::start(dir.path(), &invoker_id, &cluster_config(&etcd, &["late"]));
    inv.put_action("a", python("def main(a):\n    return {}")).await;
    assert_eq!(inv.invoke("a", "blocking=true", json!({})).await.0, 200);
    etcd.resume();
    let r = record(&etcd.kv(), &invoker_id, |_| true).await;
    assert_eq!(r.tags, ["late"]);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_scheduler_reads_every_invoker_and_places_an_action_on_the_warm_one() {
    use invoker_core::placement::{place, ActionNeeds, PlacementConfig, Rule};
    use invoker_scheduler::view::ClusterView;
    let Some(etcd) = EtcdServer::start() else { return };
    let (d1, d2) = (tempdir(), tempdir());
    let (id1, id2) = (id("dir1"), id("dir2"));
    let config = cluster_config(&etcd, &[]);
    let _one = Invoker::start(d1.path(), &id1, &config);
    let two = Invoker::start(d2.path(), &id2, &config);
    two.put_action("hot", python("def main(a):\n    return {}")).await;
    assert_eq!(two.invoke("hot", "blocking=true", json!({})).await.0, 200);
    let kv = etcd.kv();
    record(&kv, &id1, |r| !r.nodes.is_empty()).await;
    record(&kv, &id2, |r| !r.nodes.is_empty() && r.launchable_mb() < 2048).await;
    // The record counts the container from its start; its key is put once it is warm, at the
    // registration's next round.
    keys_until(&kv, "/invoker/containers/guest/hot/", |held| !held.is_empty()).await;

    let view = ClusterView::read(&kv, "/invoker").await.unwrap();
    let mut ids = vec![id1.clone(), id2.clone()];
    ids.sort();
    assert_eq!(view.invokers.keys().cloned().collect::<Vec<_>>(), ids);
    let revision = ("guest".to_string(), "hot".to_string(), 1);
    assert_eq!(view.warm[&revision].get(&id2), Some(&1), "{:?}", keys(&kv, "/invoker/containers/").await);
    let views = view.views(&revision, &Default::default(), &Default::default(), &Default::default());
    let needs = ActionNeeds { memory_mb: 256, strict: true, ..Default::default() };
    let config = PlacementConfig { managed_fraction: 1.0, blackbox_fraction: 0.1 };
    let p = place(&views, &needs, &config, &Default::default(), &mut |_| 0).unwrap();
    assert_eq!((p.invoker.as_str(), p.rule), (id2.as_str(), Rule::Warm), "{views:?}");
}

/// An invoker whose disk is full registers as unhealthy, so that no scheduler places anything
/// on it, and healthy again once space is freed.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_with_a_full_disk_is_unhealthy_in_etcd_and_no_placement_chooses_it() {
    use invoker_core::placement::{place, ActionNeeds, NoPlacement, PlacementConfig};
    use invoker_scheduler::view::ClusterView;
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let Some(disk) = SmallDisk::mount(&dir.path().join("data"), 16) else { return };
    let invoker_id = id("full");
    // A reserve for endings that fits the small disk (the default is 32 MB).
    let config = format!("{}\n[store]\nend_reserve_mb = 2\n", cluster_config(&etcd, &[]));
    let inv = Invoker::start(dir.path(), &invoker_id, &config);
    inv.put_action("big", python("def main(a):\n    return {'data': 'x' * 100000}\n")).await;
    let kv = etcd.kv();
    record(&kv, &invoker_id, |r| r.health == Health::Healthy).await;
    let ballast = disk.fill(0);
    for _ in 0..3 {
        let (status, body) = inv.try_invoke("big", json!({})).await;
        assert!(status == 200 || status == 503, "{status} {body}");
    }
    record(&kv, &invoker_id, |r| r.health == Health::Unhealthy).await;
    let view = ClusterView::read(&kv, "/invoker").await.unwrap();
    let revision = ("guest".to_string(), "big".to_string(), 1);
    let views = view.views(&revision, &Default::default(), &Default::default(), &Default::default());
    let needs = ActionNeeds { memory_mb: 256, ..Default::default() };
    let config = PlacementConfig { managed_fraction: 1.0, blackbox_fraction: 0.1 };
    let placed = place(&views, &needs, &config, &Default::default(), &mut |_| 0);
    assert!(matches!(placed, Err(NoPlacement::NoHealthy)), "{placed:?}");
    std::fs::remove_file(ballast).unwrap();
    record(&kv, &invoker_id, |r| r.health == Health::Healthy).await;
    assert_eq!(inv.invoke("big", "blocking=true", json!({})).await.0, 200);
}
