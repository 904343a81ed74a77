//! The scheduler in front of invokers, against a real etcd (one per test, on loopback ports):
//! placement by tags (strict and not), the managed/blackbox split, warm affinity and a burst
//! that spreads, memory-exact placement, an invoker killed mid-activation, drain and activate,
//! etcd going away and coming back, and a scheduler restart; and the faults of a cluster: etcd
//! frozen, one invoker frozen, one invoker cut from etcd alone. The invokers run the mock factory
//! (real HTTP containers in the invoker's process), so node sizes are set per invoker. Skipped
//! with a message when no `etcd` binary is installed; under `CI=true` that fails instead.

mod support;

use invoker_etcd::kv::ClusterKv;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::etcd::EtcdServer;
use support::Invoker;

const CONTROLLER: &str = "c0ffee00-0000-4000-8000-00000000c0de:the-cluster-tests-controller-secret";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-sched-").tempdir().unwrap()
}

fn cluster_keys(etcd: &EtcdServer, tags: &[&str]) -> String {
    cluster_keys_at(&etcd.url(), tags)
}

fn cluster_keys_at(etcd_url: &str, tags: &[&str]) -> String {
    format!(
        "[cluster]\netcd = [\"{etcd_url}\"]\nlease_ttl = \"3s\"\npublish_interval = \"100ms\"\ntags = {}\n\
         controller_key = \"{CONTROLLER}\"\n[admin]\ncontroller_keys = [\"{CONTROLLER}\"]\n",
        json!(tags)
    )
}

/// One invoker of the platform: the mock factory, one node of `memory_mb`.
fn invoker_config(etcd: &EtcdServer, tags: &[&str], memory_mb: u64) -> String {
    invoker_config_at(&etcd.url(), tags, memory_mb)
}

/// The same, reaching etcd at `etcd_url` (a [`Partition`] in front of it).
fn invoker_config_at(etcd_url: &str, tags: &[&str], memory_mb: u64) -> String {
    format!(
        "{}[factory]\nkind = \"mock\"\n[factory.mock]\nnode_memory_mb = {memory_mb}\n",
        cluster_keys_at(etcd_url, tags)
    )
}

struct Platform {
    etcd: EtcdServer,
    scheduler: Invoker,
    scheduler_dir: tempfile::TempDir,
    invokers: Vec<Invoker>,
    _dirs: Vec<tempfile::TempDir>,
}

/// Invokers named by `(id, tags, memory_mb)` and a scheduler with `scheduler` in its
/// `[scheduler]` section; returns once the scheduler sees every invoker with its headroom.
async fn platform(etcd: EtcdServer, invokers: &[(&str, &[&str], u64)], scheduler: &str) -> Platform {
    let mut dirs = Vec::new();
    let mut started = Vec::new();
    for (id, tags, memory) in invokers {
        let dir = tempdir();
        started.push(Invoker::start(dir.path(), id, &invoker_config(&etcd, tags, *memory)));
        dirs.push(dir);
    }
    let scheduler_dir = tempdir();
    let config = scheduler_config(&etcd, scheduler);
    let scheduler = Invoker::start_scheduler(scheduler_dir.path(), &config);
    let platform = Platform { etcd, scheduler, scheduler_dir, invokers: started, _dirs: dirs };
    platform
        .wait_for(|list| {
            list.len() == invokers.len() && list.iter().all(|i| i["nodes"][0]["capacity_mb"].as_u64() > Some(0))
        })
        .await;
    platform
}

fn scheduler_config(etcd: &EtcdServer, scheduler: &str) -> String {
    format!("{}[scheduler]\nid = \"s1\"\nrefresh_interval = \"50ms\"\n{scheduler}", cluster_keys(etcd, &[]))
}

impl Platform {
    /// Polls `GET /v1/invokers` until `until` holds of the list (bounded).
    async fn wait_for(&self, until: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let until = &until;
        support::eventually(Duration::from_secs(20), "the scheduler's invokers as wanted", || async move {
            let (status, list) = self.scheduler.get_url("/v1/invokers").await;
            assert_eq!(status, 200, "{list}");
            let list = list.as_array().cloned().unwrap_or_default();
            if until(&list) {
                Ok(list)
            } else {
                Err(format!("{list:?}"))
            }
        })
        .await
    }

    fn invoker(&mut self, id: &str) -> &mut Invoker {
        self.invokers.iter_mut().find(|i| i.invoker_id == id).unwrap()
    }
}

/// A mock action (the mock factory runs any kind; `sleep_ms` steers it) with `annotations`.
fn action(memory_mb: u32, annotations: Value) -> Value {
    json!({
        "exec": { "kind": "python:3", "code": "def main(a):\n    return a" },
        "limits": { "memory": memory_mb },
        "annotations": annotations,
    })
}

fn ran_on(record: &Value) -> String {
    let annotations = record["annotations"].as_array().cloned().unwrap_or_default();
    let invoker = annotations.iter().find(|a| a["key"] == "invoker");
    invoker.and_then(|a| a["value"].as_str()).unwrap_or_else(|| panic!("no invoker annotation: {record}")).to_string()
}

fn annotation<'a>(record: &'a Value, key: &str) -> &'a Value {
    let found = record["annotations"].as_array().and_then(|a| a.iter().find(|x| x["key"] == key));
    found.map_or(&Value::Null, |a| &a["value"])
}

/// Two actions, `paced1` preferring the invoker tagged `one` and `paced2` the one tagged `two`
/// (not strictly): a load of both surely reaches both invokers.
async fn each_prefers_one(scheduler: &Invoker) {
    for (name, tag) in [("paced1", "one"), ("paced2", "two")] {
        let prefers = json!([
            { "key": "invoker-resources", "value": [tag] },
            { "key": "invoker-resources-strict-policy", "value": false }
        ]);
        scheduler.put_action(name, action(128, prefers)).await;
    }
}

/// Callers invoking 50 ms activations one after another until stopped, each its own action of
/// `names` in turn: every answer, with when it came.
struct PacedLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<(u16, Value, Instant)>>>,
}

impl PacedLoad {
    fn start(scheduler: &Arc<Invoker>, names: &[&'static str], callers: usize) -> PacedLoad {
        use std::sync::atomic::Ordering;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers = (0..callers)
            .map(|n| {
                let (scheduler, stop, name) = (scheduler.clone(), stop.clone(), names[n % names.len()]);
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let (status, body) = scheduler.try_invoke(name, json!({ "sleep_ms": 50 })).await;
                        answers.push((status, body, Instant::now()));
                    }
                    answers
                })
            })
            .collect();
        PacedLoad { stop, workers }
    }

    async fn stop(self) -> Vec<(u16, Value, Instant)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut answers = Vec::new();
        for worker in self.workers {
            answers.extend(worker.await.unwrap());
        }
        answers
    }
}

/// A counter of the scheduler's `/metrics` (0 when it is not there).
async fn counter(scheduler: &Invoker, name: &str) -> u64 {
    let (user, pass) = scheduler.admin.split_once(':').unwrap();
    let metrics = reqwest::Client::new().get(format!("{}/metrics", scheduler.base)).basic_auth(user, Some(pass));
    let metrics = metrics.send().await.unwrap().text().await.unwrap();
    let prefix = format!("{name} ");
    metrics.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// `n` blocking invokes of `name` at once; their statuses and records.
async fn burst(scheduler: &Invoker, name: &str, n: usize, params: Value) -> Vec<(u16, Value)> {
    let calls = (0..n).map(|_| scheduler.invoke(name, "blocking=true", params.clone()));
    futures_util::future::join_all(calls).await
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn through_the_scheduler_actions_run_on_invokers_by_tags_and_warmth_and_every_record_is_served() {
    let Some(etcd) = EtcdServer::start() else { return };
    let p = platform(etcd, &[("inv-a", &[], 2048), ("inv-b", &["gpu"], 2048), ("inv-c", &[], 2048)], "").await;
    let s = &p.scheduler;

    // Created, invoked, and read back through the scheduler: record, logs, result.
    s.put_action("hello", action(256, json!([]))).await;
    let (status, record) = s.invoke("hello", "blocking=true", json!({ "name": "ann" })).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["response"]["result"]["echo"], json!({ "name": "ann" }));
    let on = ran_on(&record);
    assert!(on == "inv-a" || on == "inv-c", "an untagged action on an untagged invoker: {on}");
    let id = record["activationId"].as_str().unwrap();
    assert_eq!(s.get(&format!("activations/{id}")).await.1["activationId"], id);
    assert_eq!(s.get(&format!("activations/{id}/result")).await.1["result"]["echo"], json!({ "name": "ann" }));
    assert_eq!(s.get(&format!("activations/{id}/logs")).await.0, 200);
    let (status, accepted) = s.invoke("hello", "", json!({})).await;
    assert_eq!(status, 202);
    let later = s.record(accepted["activationId"].as_str().unwrap()).await;
    assert_eq!(later["response"]["statusCode"], 0, "{later}");
    // The action lives in the scheduler's store only: the invoker that ran it lists nothing.
    let ran_there = p.invokers.iter().find(|i| i.invoker_id == on).unwrap();
    let (_, listed) = ran_there.get("actions").await;
    assert_eq!(listed, json!([]), "an invoker's REST routes never show what a scheduler sent it");

    // Tags: strict goes only where they are; missing ones are a 503 that names them, unless
    // the policy is not strict.
    s.put_action("gpu", action(256, json!([{ "key": "invoker-resources", "value": ["gpu"] }]))).await;
    for _ in 0..5 {
        let (status, record) = s.invoke("gpu", "blocking=true", json!({})).await;
        assert_eq!((status, ran_on(&record).as_str()), (200, "inv-b"), "{record}");
    }
    s.put_action("tpu", action(256, json!([{ "key": "invoker-resources", "value": ["tpu"] }]))).await;
    let (status, record) = s.invoke("tpu", "blocking=true", json!({})).await;
    assert_eq!(status, 503, "{record}");
    assert!(record["response"]["result"]["error"].as_str().unwrap().contains("no invoker has tags [tpu]"), "{record}");
    assert_eq!(annotation(&record, "rejected"), "no_invoker");
    let loose = json!([
        { "key": "invoker-resources", "value": ["tpu"] },
        { "key": "invoker-resources-strict-policy", "value": false },
    ]);
    s.put_action("tpu-loose", action(256, loose)).await;
    assert_eq!(s.invoke("tpu-loose", "blocking=true", json!({})).await.0, 200);

    // Warm affinity: once its container is registered, the calls that follow go to it.
    s.put_action("warm", action(256, json!([]))).await;
    let first = ran_on(&s.invoke("warm", "blocking=true", json!({})).await.1);
    p.wait_for(|list| list.iter().any(|i| i["id"] == first.as_str() && i["containers"].as_u64() >= Some(1))).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // this action's key, with the others'
    for _ in 0..8 {
        let (status, record) = s.invoke("warm", "blocking=true", json!({})).await;
        assert_eq!((status, ran_on(&record)), (200, first.clone()), "{record}");
        assert_eq!(annotation(&record, "startKind"), "warm", "{record}");
    }

    // A burst of a new action spreads over the managed invokers instead of piling on one.
    s.put_action("burst", action(256, json!([]))).await;
    let ran = burst(s, "burst", 12, json!({ "sleep_ms": 1000 })).await;
    let places: BTreeSet<String> = ran
        .iter()
        .map(|(status, r)| {
            assert_eq!(*status, 200, "{r}");
            ran_on(r)
        })
        .collect();
    assert!(places.len() >= 2 && !places.contains("inv-b"), "12 at once on {places:?}");

    let (_, metrics) = {
        let (user, pass) = s.admin.split_once(':').unwrap();
        let r = reqwest::Client::new()
            .get(format!("{}/metrics", s.base))
            .basic_auth(user, Some(pass))
            .send()
            .await
            .unwrap();
        (r.status(), r.text().await.unwrap())
    };
    for family in [
        "scheduler_placements_total{rule=\"warm\"}",
        "scheduler_placements_total{rule=\"tag\"}",
        "scheduler_unavailable_total{reason=\"no_tags\"}",
    ] {
        assert!(metrics.contains(family), "{family} in {metrics}");
    }
    // Every registration, container and drain the run saw came through one range and a watch.
    assert_eq!(counter(s, "scheduler_etcd_ranges_total").await, 1, "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_512_mb_action_never_goes_to_an_invoker_with_less_headroom() {
    let Some(etcd) = EtcdServer::start() else { return };
    let p = platform(etcd, &[("small", &[], 384), ("big", &[], 1024)], "").await;
    let s = &p.scheduler;
    s.put_action("large", action(512, json!([]))).await;
    let mut ran = 0;
    // Rounds of three at once on a 1024 MB invoker: two fit, and the third finds no invoker
    // (503, saying so: the scheduler counts what it sent that the record does not show yet);
    // none runs on the 384 MB one.
    for _ in 0..6 {
        // The invoker's record shows the round before ended (published every 100 ms).
        tokio::time::sleep(Duration::from_millis(400)).await;
        for (status, record) in burst(s, "large", 3, json!({ "sleep_ms": 200 })).await {
            match status {
                200 => {
                    assert_eq!(ran_on(&record), "big", "{record}");
                    ran += 1;
                }
                503 => {
                    let error = record["response"]["result"]["error"].as_str().unwrap_or_default().to_string();
                    assert!(error.contains("no invoker fits 512 MB") || error.contains("big"), "{record}");
                    assert_ne!(annotation(&record, "invoker"), "small", "{record}");
                }
                other => panic!("{other}: {record}"),
            }
        }
    }
    assert!(ran >= 6, "{ran} of 18 ran");
    // The small one is healthy and takes what fits it.
    s.put_action("fits", action(256, json!([]))).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let answers = burst(s, "fits", 6, json!({ "sleep_ms": 300 })).await;
    let ran: BTreeSet<String> = answers.iter().filter(|(status, _)| *status == 200).map(|(_, r)| ran_on(r)).collect();
    assert!(ran.contains("small"), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn blackbox_actions_go_to_the_blackbox_part_and_managed_ones_only_when_their_part_is_full() {
    let Some(etcd) = EtcdServer::start() else { return };
    // Three untagged invokers in id order: x0 and x1 managed (60 %), x2 blackbox (30 %).
    let split = "managed_fraction = 0.6\nblackbox_fraction = 0.3\n";
    let p = platform(etcd, &[("x0", &[], 2048), ("x1", &[], 2048), ("x2", &[], 2048)], split).await;
    let s = &p.scheduler;
    let mut image = action(256, json!([]));
    image["exec"]["image"] = json!("example/blackbox:1");
    s.put_action("box", image).await;
    for (status, record) in burst(s, "box", 6, json!({ "sleep_ms": 100 })).await {
        assert_eq!((status, ran_on(&record).as_str()), (200, "x2"), "{record}");
    }
    s.put_action("managed", action(256, json!([]))).await;
    let places: BTreeSet<String> =
        burst(s, "managed", 9, json!({ "sleep_ms": 300 })).await.iter().map(|(_, r)| ran_on(r)).collect();
    assert!(!places.contains("x2") && !places.is_empty(), "{places:?}");
    // Nine calls of 512 MB at once: eight fill the managed invokers, and the ninth takes the
    // blackbox invoker's room rather than a 503 beside it (before, "no invoker fits 512 MB").
    s.put_action("large", action(512, json!([]))).await;
    let answers = burst(s, "large", 9, json!({ "sleep_ms": 3000 })).await;
    for (status, record) in &answers {
        assert_eq!(*status, 200, "{record}");
    }
    let places: BTreeSet<String> = answers.iter().map(|(_, r)| ran_on(r)).collect();
    assert_eq!(places, BTreeSet::from(["x0".into(), "x1".into(), "x2".into()]));
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_killed_mid_activation_ends_it_with_status_3_and_new_work_goes_elsewhere() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("victim", &["v"], 2048), ("other", &[], 2048)], "").await;
    p.scheduler.put_action("slow", action(256, json!([{ "key": "invoker-resources", "value": ["v"] }]))).await;
    p.scheduler.put_action("any", action(256, json!([]))).await;
    let (status, accepted) = p.scheduler.invoke("slow", "", json!({ "sleep_ms": 30000 })).await;
    assert_eq!(status, 202);
    let id = accepted["activationId"].as_str().unwrap().to_string();
    // A second one, blocking: its caller is waiting when the invoker dies.
    let victim_pid = nix::unistd::Pid::from_raw(p.invoker("victim").child.id() as i32);
    let body = json!({ "sleep_ms": 30000 }).to_string().into_bytes();
    let headers = [("content-type", "application/json")];
    let blocking =
        p.scheduler.send("POST", "/api/v1/namespaces/_/actions/slow?blocking=true", support::GUEST, &headers, body);
    let kill = async {
        p.wait_for(|list| list.iter().any(|i| i["id"] == "victim" && i["in_flight"] == 2)).await;
        let victim = p.invokers.iter().find(|i| i.invoker_id == "victim").unwrap();
        support::eventually(Duration::from_secs(10), "both running on the victim", || async {
            support::done(victim.get_url("/v1/pool").await.1["busy"] == 2)
        })
        .await;
        nix::sys::signal::kill(victim_pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        Instant::now()
    };
    let ((status, _, answer), killed) = tokio::join!(blocking, kill);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    // It may have started: never "nothing ran, retry" (a retry would run it twice).
    assert_eq!(status, 502, "{answer}");
    assert_eq!(answer["response"]["statusCode"], 3, "{answer}");
    assert!(answer["response"]["result"]["error"].as_str().unwrap().contains("may have started"), "{answer}");
    p.invoker("victim").wait_exit(Duration::from_secs(10));

    let record = p.scheduler.record(&id).await;
    assert!(killed.elapsed() < Duration::from_secs(3 + 10), "ended within the lease TTL and a margin");
    assert_eq!(record["response"]["statusCode"], 3, "{record}");
    assert_eq!(ran_on(&record), "victim");
    // Asynchronous: it may have run, so its retry policy (not the scheduler) decides.
    let error = record["response"]["result"]["error"].as_str().unwrap();
    assert!(error.contains("may have run") && error.contains("retry policy"), "{record}");

    let (status, record) = p.scheduler.invoke("any", "blocking=true", json!({})).await;
    assert_eq!((status, ran_on(&record).as_str()), (200, "other"), "{record}");
    // Its keys go with its lease, and the scheduler forgets it.
    let kv = p.etcd.kv();
    support::eventually(Duration::from_secs(15), "its keys gone with its lease", || async {
        let keys = kv.get_prefix("/invoker/").await.unwrap().into_iter().map(|(k, _)| k);
        let left: Vec<String> = keys.filter(|k| k.contains("victim")).collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    p.wait_for(|list| list.iter().all(|i| i["id"] != "victim")).await;
    let (status, record) = p.scheduler.invoke("slow", "blocking=true", json!({})).await;
    assert_eq!(status, 503, "{record}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_drained_invoker_gets_no_new_work_until_it_is_activated() {
    let Some(etcd) = EtcdServer::start() else { return };
    let p = platform(etcd, &[("d", &["t"], 2048), ("e", &[], 2048)], "").await;
    let s = &p.scheduler;
    s.put_action("on-d", action(256, json!([{ "key": "invoker-resources", "value": ["t"] }]))).await;
    assert_eq!(ran_on(&s.invoke("on-d", "blocking=true", json!({})).await.1), "d");

    // Admin key only, and only a known invoker.
    let (status, _) = {
        let r = reqwest::Client::new().post(format!("{}/v1/invokers/d/drain", s.base));
        let (user, pass) = support::GUEST.split_once(':').unwrap();
        let r = r.basic_auth(user, Some(pass)).send().await.unwrap();
        (r.status().as_u16(), ())
    };
    assert_eq!(status, 403);
    assert_eq!(s.post_url("/v1/invokers/nobody/drain").await.0, 404);

    let (status, body) = s.post_url("/v1/invokers/d/drain").await;
    assert_eq!(status, 200, "{body}");
    p.wait_for(|list| list.iter().any(|i| i["id"] == "d" && i["drained"] == true && i["health"] == "drained")).await;
    let (status, record) = s.invoke("on-d", "blocking=true", json!({})).await;
    assert_eq!(status, 503, "{record}");

    assert_eq!(s.post_url("/v1/invokers/d/activate").await.0, 200);
    p.wait_for(|list| list.iter().any(|i| i["id"] == "d" && i["drained"] == false && i["health"] == "healthy")).await;
    let (status, record) = s.invoke("on-d", "blocking=true", json!({})).await;
    assert_eq!((status, ran_on(&record).as_str()), (200, "d"), "{record}");
}

/// An operator's drain is the platform's state, not only an etcd key: etcd restarted empty, the
/// drained invoker puts its drain back, and no work reaches it; taken back through the API, a
/// second empty etcd leaves it active.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_operators_drain_outlives_an_etcd_that_restarts_empty() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("d", &["t"], 2048), ("e", &[], 2048)], "").await;
    let s = &p.scheduler;
    s.put_action("on-d", action(256, json!([{ "key": "invoker-resources", "value": ["t"] }]))).await;
    assert_eq!(s.post_url("/v1/invokers/d/drain").await.0, 200);
    p.wait_for(|list| list.iter().any(|i| i["id"] == "d" && i["health"] == "drained")).await;

    p.etcd.wipe();
    let kv = p.etcd.kv();
    let drain = invoker_wire::cluster::drain_key("/invoker", "d");
    support::eventually(Duration::from_secs(30), "the drain back in the empty etcd", || async {
        support::done(matches!(kv.get(&drain).await, Ok(Some(_))))
    })
    .await;
    p.wait_for(|list| list.len() == 2 && list.iter().any(|i| i["id"] == "d" && i["drained"] == true)).await;
    let (status, record) = p.scheduler.invoke("on-d", "blocking=true", json!({})).await;
    assert_eq!(status, 503, "the drained invoker took work: {record}");

    assert_eq!(p.scheduler.post_url("/v1/invokers/d/activate").await.0, 200);
    p.wait_for(|list| list.iter().any(|i| i["id"] == "d" && i["drained"] == false && i["health"] == "healthy")).await;
    p.etcd.wipe();
    p.wait_for(|list| {
        list.len() == 2 && list.iter().any(|i| i["id"] == "d" && i["drained"] == false && i["health"] == "healthy")
    })
    .await;
    // The invoker takes work from a scheduler it finds registered again.
    let kv = p.etcd.kv();
    support::eventually(Duration::from_secs(30), "the scheduler registered again", || async {
        support::done(matches!(kv.get("/invoker/schedulers/s1").await, Ok(Some(_))))
    })
    .await;
    let (status, record) = p.scheduler.invoke("on-d", "blocking=true", json!({})).await;
    assert_eq!((status, ran_on(&record).as_str()), (200, "d"), "{record}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn with_etcd_away_activations_go_on_and_registrations_come_back() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("steady", &[], 2048)], "").await;
    p.scheduler.put_action("a", action(256, json!([]))).await;
    assert_eq!(p.scheduler.invoke("a", "blocking=true", json!({})).await.0, 200);

    p.etcd.stop();
    for _ in 0..5 {
        let (status, record) = p.scheduler.invoke("a", "blocking=true", json!({})).await;
        assert_eq!((status, ran_on(&record).as_str()), (200, "steady"), "{record}");
    }
    // A new action too: the invoker fetches it from the scheduler it already knows.
    p.scheduler.put_action("new", action(256, json!([]))).await;
    let (status, record) = p.scheduler.invoke("new", "blocking=true", json!({})).await;
    assert_eq!((status, ran_on(&record).as_str()), (200, "steady"), "{record}");
    tokio::time::sleep(Duration::from_secs(4)).await; // past the lease's TTL
    assert_eq!(p.scheduler.invoke("a", "blocking=true", json!({})).await.0, 200);

    p.etcd.resume();
    let kv = p.etcd.kv();
    support::eventually(Duration::from_secs(20), "the registrations back", || async {
        let invoker = kv.get("/invoker/invokers/steady").await.ok().flatten();
        let scheduler = kv.get("/invoker/schedulers/s1").await.ok().flatten();
        support::done(invoker.is_some() && scheduler.is_some())
    })
    .await;
    p.wait_for(|list| list.len() == 1 && list[0]["health"] == "healthy").await;
    assert_eq!(p.scheduler.invoke("a", "blocking=true", json!({})).await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_restarted_scheduler_recovers_the_invokers_from_etcd_and_replaces_its_guesses_with_the_invokers_records() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("one", &[], 2048)], "").await;
    p.scheduler.put_action("a", action(256, json!([]))).await;
    let (_, record) = p.scheduler.invoke("a", "blocking=true", json!({})).await;
    let id = record["activationId"].as_str().unwrap().to_string();

    // A second scheduler with a live one's id refuses to start.
    let other = tempdir();
    let config = other.path().join("scheduler.toml");
    std::fs::write(&config, scheduler_config(&p.etcd, "")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_invoker"))
        .args(["scheduler", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(other.path().join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("scheduler id 's1' is held by a live scheduler"), "{stderr}");

    // Killed with an activation accepted and running on the invoker: it gets a record anyway.
    let (status, accepted) = p.scheduler.invoke("a", "", json!({ "sleep_ms": 5000 })).await;
    assert_eq!(status, 202, "{accepted}");
    let running = accepted["activationId"].as_str().unwrap().to_string();
    let holder = p.invoker("one");
    support::eventually(Duration::from_secs(10), "the invoker running it", || async {
        support::done(holder.get_url("/v1/pool").await.1["busy"] == 1)
    })
    .await;
    p.scheduler.signal(nix::sys::signal::Signal::SIGKILL);
    p.scheduler.wait_exit(Duration::from_secs(10));
    let config = scheduler_config(&p.etcd, "");
    p.scheduler = Invoker::start_scheduler(p.scheduler_dir.path(), &config);
    p.wait_for(|list| list.len() == 1 && list[0]["id"] == "one").await;
    assert_eq!(p.scheduler.get(&format!("activations/{id}")).await.1["activationId"], id.as_str());
    // At first a guess that says so (the scheduler had journaled its start), or nothing yet (it
    // was killed between the invoker's started line and its journal: it hands the call over
    // again, and the invoker, which has that activation id running, answers with its record
    // rather than run it twice); in the end the invoker's record, which says the activation
    // succeeded there.
    let (status, record) = p.scheduler.get(&format!("activations/{running}")).await;
    if status == 200 && record["response"]["statusCode"] != 0 {
        assert_eq!(record["response"]["statusCode"], 3, "{record}");
        assert!(annotation(&record, "guess").is_string(), "a guess says so: {record}");
    }
    let record = support::eventually(Duration::from_secs(30), "the guess replaced by the invoker's record", || async {
        let (_, record) = p.scheduler.get(&format!("activations/{running}")).await;
        if record["response"]["statusCode"] == 0 {
            Ok(record)
        } else {
            Err(record.to_string())
        }
    })
    .await;
    assert_eq!((ran_on(&record).as_str(), annotation(&record, "guess")), ("one", &Value::Null), "{record}");
    let (_, listed) = p.scheduler.get("activations?name=a&limit=50").await;
    let listed: Vec<&Value> =
        listed.as_array().unwrap().iter().filter(|r| r["activationId"] == running.as_str()).collect();
    assert_eq!(listed.len(), 1, "one record per activation in the list: {listed:?}");
    assert_eq!(listed[0]["response"]["statusCode"], 0);
    let (status, record) = p.scheduler.invoke("a", "blocking=true", json!({})).await;
    assert_eq!((status, ran_on(&record).as_str()), (200, "one"), "{record}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn two_schedulers_share_the_invokers_and_nothing_else() {
    let Some(etcd) = EtcdServer::start() else { return };
    let p = platform(etcd, &[("shared", &[], 2048)], "").await;
    let second_dir = tempdir();
    let config = cluster_keys(&p.etcd, &[]) + "[scheduler]\nid = \"s2\"\nrefresh_interval = \"50ms\"\n";
    let second = Invoker::start_scheduler(second_dir.path(), &config);
    // The same namespace and name in both, each with its own parameters: on the one invoker
    // they are two actions, never one's container serving the other's.
    for (s, who) in [(&p.scheduler, "s1"), (&second, "s2")] {
        let mut body = action(256, json!([]));
        body["parameters"] = json!([{ "key": "who", "value": who }]);
        s.put_action("same", body).await;
    }
    let mut containers = [BTreeSet::new(), BTreeSet::new()];
    for _ in 0..3 {
        for (i, (s, who)) in [(&p.scheduler, "s1"), (&second, "s2")].into_iter().enumerate() {
            let (status, record) = s.invoke("same", "blocking=true", json!({})).await;
            assert_eq!((status, ran_on(&record).as_str()), (200, "shared"), "{record}");
            assert_eq!(record["response"]["result"]["echo"]["who"], who, "{record}");
            containers[i].insert(record["response"]["result"]["container"].as_u64().unwrap());
        }
    }
    assert!(containers[0].is_disjoint(&containers[1]), "one container ran both schedulers' actions: {containers:?}");
    // Records stay with the scheduler that took them.
    let (_, record) = second.invoke("same", "blocking=true", json!({})).await;
    let id = record["activationId"].as_str().unwrap();
    assert_eq!(p.scheduler.get(&format!("activations/{id}")).await.0, 404);
    assert_eq!(second.get(&format!("activations/{id}")).await.0, 200);

    // The internal route: the controller key only, and only the revision it holds.
    let http = reqwest::Client::new();
    let url = |rev: &str| format!("{}/v1/internal/actions/guest/same?revision={rev}", second.base);
    let (user, pass) = support::GUEST.split_once(':').unwrap();
    let as_guest = http.get(url("1")).basic_auth(user, Some(pass)).send().await.unwrap();
    assert_eq!(as_guest.status(), 403);
    let (user, pass) = CONTROLLER.split_once(':').unwrap();
    let stale = http.get(url("1")).basic_auth(user, Some(pass)).send().await.unwrap();
    assert_eq!(stale.status(), 404, "revision 1 is not a cluster revision of s2's action");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn sigterm_drains_an_invoker_its_work_finishes_and_new_work_goes_elsewhere() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("leaving", &["l"], 2048), ("staying", &[], 2048)], "").await;
    p.scheduler.put_action("there", action(256, json!([{ "key": "invoker-resources", "value": ["l"] }]))).await;
    p.scheduler.put_action("any", action(256, json!([]))).await;
    let (status, accepted) = p.scheduler.invoke("there", "", json!({ "sleep_ms": 1500 })).await;
    assert_eq!(status, 202);
    let leaving = p.invoker("leaving");
    support::eventually(Duration::from_secs(20), "it runs", || async {
        support::done(leaving.get_url("/v1/pool").await.1["busy"] == 1)
    })
    .await;
    leaving.signal(nix::sys::signal::Signal::SIGTERM);
    let record = p.scheduler.record(accepted["activationId"].as_str().unwrap()).await;
    assert_eq!((record["response"]["statusCode"].as_u64(), ran_on(&record).as_str()), (Some(0), "leaving"), "{record}");
    assert!(p.invoker("leaving").wait_exit(Duration::from_secs(20)).success());
    for _ in 0..3 {
        let (status, record) = p.scheduler.invoke("any", "blocking=true", json!({})).await;
        assert_eq!((status, ran_on(&record).as_str()), (200, "staying"), "{record}");
    }
    p.wait_for(|list| list.iter().all(|i| i["id"] != "leaving")).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_that_refuses_before_running_anything_is_skipped_for_the_next() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("good", &[], 2048)], "max_reschedules = 1\n").await;
    // An invoker that does not take this cluster's controller key: every message gets 401.
    let dir = tempdir();
    let stranger = invoker_config(&p.etcd, &[], 2048).replace(&format!("controller_keys = [\"{CONTROLLER}\"]"), "");
    p.invokers.push(Invoker::start(dir.path(), "stranger", &stranger));
    p._dirs.push(dir);
    // Healthy, and with its headroom published: the record an invoker claims its key with has
    // none, and one without room is never chosen.
    p.wait_for(|list| {
        list.len() == 2
            && list.iter().all(|i| i["health"] == "healthy" && i["nodes"][0]["capacity_mb"].as_u64() > Some(0))
    })
    .await;
    // New actions (no warm container to prefer): each goes to either invoker at random.
    for i in 0..20 {
        let name = format!("a{i}");
        p.scheduler.put_action(&name, action(256, json!([]))).await;
        let (status, record) = p.scheduler.invoke(&name, "blocking=true", json!({})).await;
        assert_eq!((status, ran_on(&record).as_str()), (200, "good"), "{record}");
    }
    let reschedules = counter(&p.scheduler, "scheduler_reschedules_total").await;
    assert!(reschedules >= 1, "the stranger was never chosen for 20 actions, or never skipped");
}

/// etcd frozen past the invokers' leases under a paced load (a long fsync stall or a partition
/// looks the same): what ran ends with the invokers' answers, and at resume the scheduler keeps
/// placing on the invokers it last saw, while they register again.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_etcd_frozen_past_the_leases_fails_nothing_that_ran_and_refuses_almost_nothing_at_resume() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(etcd) = EtcdServer::start() else { return };
    let p = platform(etcd, &[("fz1", &[], 4096), ("fz2", &[], 4096)], "").await;
    p.scheduler.put_action("paced", action(128, json!([]))).await;
    let stop = Arc::new(AtomicBool::new(false));
    let scheduler = Arc::new(p.scheduler);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (scheduler, stop) = (scheduler.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    answers.push(scheduler.try_invoke("paced", json!({ "sleep_ms": 50 })).await);
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await; // load window: the paced load runs steadily before the freeze
    p.etcd.freeze();
    tokio::time::sleep(Duration::from_secs(20)).await; // past the 3 s lease, many times
    p.etcd.thaw();
    tokio::time::sleep(Duration::from_secs(6)).await; // load window: the load runs on after the thaw, what it measures
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for worker in workers {
        answers.extend(worker.await.unwrap());
    }
    let lost: Vec<&Value> = answers
        .iter()
        .map(|(_, body)| body)
        .filter(|body| body["response"]["result"]["error"].as_str().is_some_and(|e| e.contains("was lost")))
        .collect();
    assert!(lost.is_empty(), "{} activations that ran ended as lost: {:?}", lost.len(), lost.first());
    let refused = answers.iter().filter(|(status, _)| *status == 503).count();
    let ok = answers.iter().filter(|(status, _)| *status == 200).count();
    let why: BTreeSet<String> = answers
        .iter()
        .filter(|(status, _)| *status == 503)
        .map(|(_, body)| {
            let said = body["response"]["result"]["error"].as_str().or(body["error"].as_str()).unwrap_or_default();
            said.chars().take(160).collect()
        })
        .collect();
    eprintln!("etcd frozen 20 s: {} requests, {ok} ran, {refused} refused {why:?}, none lost", answers.len());
    assert!(refused * 100 <= answers.len(), "{refused} of {} refused (503), {ok} ran: {why:?}", answers.len());
    assert_eq!(ok + refused, answers.len(), "every answer ran or was refused");
}

/// One invoker frozen (SIGSTOP: a GC pause, a stalled disk, a partition between it and the
/// scheduler) under a paced load while the other has room: no request is refused, the other
/// serves meanwhile (new work that prefers the frozen one too, within the hand-over timeout,
/// while the frozen one is still registered), the frozen one is stalled until it answers again,
/// and what it had taken ends once, with its answer after SIGCONT.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn one_frozen_invoker_never_blocks_the_other_and_its_taken_work_ends_once() {
    let Some(etcd) = EtcdServer::start() else { return };
    let p = platform(etcd, &[("cold1", &["one"], 4096), ("cold2", &["two"], 4096)], "").await;
    each_prefers_one(&p.scheduler).await;
    let Platform { etcd: _etcd, scheduler, scheduler_dir: _scheduler_dir, invokers, _dirs } = p;
    let frozen = invokers.iter().find(|i| i.invoker_id == "cold1").unwrap();
    let scheduler = Arc::new(scheduler);
    let load = PacedLoad::start(&scheduler, &["paced1", "paced2"], 4);
    tokio::time::sleep(Duration::from_secs(2)).await; // load window: the paced load runs steadily on both invokers first
    frozen.signal(nix::sys::signal::Signal::SIGSTOP);
    let froze = Instant::now();
    // New work that prefers the frozen invoker, while it is still registered (its lease is
    // 3 s): it never asks for the message, so each goes to the other within the hand-over
    // timeout (1 s), and the frozen one is marked stalled.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fresh = futures_util::future::join_all((0..3).map(|_| scheduler.try_invoke("paced1", json!({})))).await;
    let fresh_answered = Instant::now();
    eprintln!("3 new requests preferring the frozen invoker answered {:?} after the freeze", froze.elapsed());
    let (status, list) = scheduler.get_url("/v1/invokers").await;
    assert_eq!(status, 200);
    let stalled = |list: &Value, id: &str| {
        list.as_array().unwrap().iter().find(|i| i["id"] == id).map(|i| i["stalled"].clone()).unwrap_or(Value::Null)
    };
    assert_eq!(stalled(&list, "cold1"), json!(true), "{list}");
    assert_eq!(stalled(&list, "cold2"), json!(false), "{list}");
    // The freeze lasts 15 s in all, past the frozen invoker's 3 s lease many times.
    tokio::time::sleep(Duration::from_secs(15).saturating_sub(froze.elapsed())).await;
    frozen.signal(nix::sys::signal::Signal::SIGCONT);
    let thawed = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await; // load window: the thawed invoker's late answers come in meanwhile
    let (_, list) = scheduler.get_url("/v1/invokers").await;
    assert_eq!(stalled(&list, "cold1"), json!(false), "it answers again: taken back {list}");
    assert!(counter(&scheduler, "scheduler_unheard_total").await >= 1, "no hand-over went unheard");
    let timed = load.stop().await;
    // Answered while it was frozen, after the scheduler had a few seconds to notice.
    let served_meanwhile =
        timed.iter().filter(|(s, _, at)| *s == 200 && *at > froze + Duration::from_secs(3) && *at < thawed).count();
    let answers: Vec<(u16, Value)> = timed.into_iter().map(|(s, b, _)| (s, b)).collect();
    let refused = answers.iter().filter(|(status, _)| *status == 503).count();
    let ok = answers.iter().filter(|(status, _)| *status == 200).count();
    eprintln!(
        "one invoker frozen 15 s: {} requests, {ok} ran, {refused} refused, {served_meanwhile} answered in the 12 s \
         it stayed frozen after the first 3",
        answers.len()
    );
    assert!(served_meanwhile > 100, "the other invoker served only {served_meanwhile} while one was frozen");
    assert_eq!(refused, 0, "refused while the other invoker had room: {:?}", answers.iter().find(|(s, _)| *s == 503));
    assert_eq!(ok, answers.len(), "every request ran: {:?}", answers.iter().find(|(s, _)| *s != 200));
    let ids: BTreeSet<&str> = answers.iter().filter_map(|(_, r)| r["activationId"].as_str()).collect();
    assert_eq!(ids.len(), answers.len(), "one answer per activation");
    let on_frozen = answers.iter().filter(|(_, r)| ran_on(r) == "cold1").count();
    assert!(on_frozen > 0, "the frozen invoker ran some before and after");
    assert!(fresh_answered < thawed, "new work waited for the frozen invoker");
    for (status, record) in &fresh {
        assert_eq!(*status, 200, "{record}");
        assert_eq!(ran_on(record), "cold2", "{record}");
    }
}

/// An invoker whose path to etcd alone is cut (the scheduler and the other invoker still reach
/// etcd, and the scheduler still reaches it): its lease expires and its registration goes, but
/// it keeps serving what it is sent, in the grace and after (what it holds ends with its
/// answer), new work goes to the other once the grace is over, and when the path heals it
/// registers again and takes work again. Nothing is refused, lost or run twice.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_cut_from_etcd_alone_keeps_serving_what_it_is_sent_and_registers_again() {
    let Some(etcd) = EtcdServer::start() else { return };
    let partition = support::partition::Partition::to(etcd.url().trim_start_matches("http://")).await;
    let (cut_dir, other_dir, scheduler_dir) = (tempdir(), tempdir(), tempdir());
    let cut = Invoker::start(cut_dir.path(), "cut1", &invoker_config_at(&partition.url(), &["one"], 4096));
    let other = Invoker::start(other_dir.path(), "cut2", &invoker_config(&etcd, &["two"], 4096));
    let scheduler = Invoker::start_scheduler(scheduler_dir.path(), &scheduler_config(&etcd, ""));
    let p = Platform { etcd, scheduler, scheduler_dir, invokers: vec![cut, other], _dirs: vec![cut_dir, other_dir] };
    let listed = |list: &[Value], id: &str| list.iter().any(|i| i["id"] == id);
    p.wait_for(|list| list.len() == 2 && list.iter().all(|i| i["nodes"][0]["capacity_mb"].as_u64() > Some(0))).await;
    each_prefers_one(&p.scheduler).await;
    let Platform { etcd: _etcd, scheduler, scheduler_dir: _scheduler_dir, invokers: _invokers, _dirs } = p;
    let scheduler = Arc::new(scheduler);
    let load = PacedLoad::start(&scheduler, &["paced1", "paced2"], 4);
    tokio::time::sleep(Duration::from_secs(2)).await; // load window: the paced load runs steadily before the cut
    partition.cut();
    let cut_at = Instant::now();
    // The lease (3 s) and the scheduler's grace (one lease TTL) go by.
    let gone = support::eventually(Duration::from_secs(20), "the cut invoker out of the scheduler's view", || async {
        let (_, list) = scheduler.get_url("/v1/invokers").await;
        match listed(list.as_array().map_or(&[][..], Vec::as_slice), "cut1") {
            false => Ok(Instant::now()),
            true => Err(list.to_string()),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // load window: the cut lasts, the load running on the other invoker
    partition.heal();
    let healed = Instant::now();
    support::eventually(Duration::from_secs(20), "the cut invoker registered again", || async {
        let (_, list) = scheduler.get_url("/v1/invokers").await;
        support::done(listed(list.as_array().map_or(&[][..], Vec::as_slice), "cut1")).map_err(|_| list.to_string())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // load window: the load runs on after the heal
    let back = Instant::now();
    let timed = load.stop().await;
    let on = |id: &str, from: Instant, to: Instant| {
        timed.iter().filter(|(s, r, at)| *s == 200 && *at > from && *at < to && ran_on(r) == id).count()
    };
    let served_cut = on("cut1", cut_at + Duration::from_millis(500), gone);
    let after_gone = on("cut1", gone + Duration::from_millis(500), healed);
    let served_back = on("cut1", healed + Duration::from_secs(1), back);
    eprintln!(
        "cut from etcd: {} requests; the cut invoker answered {served_cut} in the {:?} it stayed in the view, \
         {after_gone} after, {served_back} once back",
        timed.len(),
        gone - cut_at
    );
    assert!(timed.iter().all(|(s, _, _)| *s == 200), "{:?}", timed.iter().find(|(s, _, _)| *s != 200));
    let ids: BTreeSet<&str> = timed.iter().filter_map(|(_, r, _)| r["activationId"].as_str()).collect();
    assert_eq!(ids.len(), timed.len(), "one answer per activation");
    assert!(served_cut > 0, "the cut invoker served nothing of what it was sent");
    assert_eq!(after_gone, 0, "work went to an invoker the scheduler no longer lists");
    assert!(served_back > 0, "the healed invoker got no work back");
}

/// With `wait_for_room`, an activation no invoker has room for waits for one instead of a 503,
/// and the scheduler's demand report (for the capacity manager) counts it as waiting meanwhile,
/// beside what it has in flight; both go back to zero when the work is done.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_activation_without_room_waits_for_it_and_the_demand_report_says_so() {
    let Some(etcd) = EtcdServer::start() else { return };
    let p = platform(etcd, &[("small", &[], 256)], "wait_for_room = \"20s\"\n").await;
    p.scheduler.put_action("slow", action(256, json!([]))).await;
    let scheduler = Arc::new(p.scheduler);
    let first = {
        let s = scheduler.clone();
        tokio::spawn(async move { s.try_invoke("slow", json!({ "sleep_ms": 2500 })).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await; // the first call holds the one invoker's room first (its own 2.5 s run is the window)
    let second = {
        let s = scheduler.clone();
        tokio::spawn(async move { s.try_invoke("slow", json!({ "sleep_ms": 10 })).await })
    };
    let kv = p.etcd.kv();
    let needs = support::eventually(Duration::from_secs(2), "a report of one waiting and one in flight", || async {
        let reports = kv.get_prefix("/invoker/demand/").await.unwrap();
        let needs: Option<Value> = reports.first().and_then(|(_, v)| serde_json::from_str::<Value>(v).ok());
        let untagged =
            needs.as_ref().and_then(|r| r["needs"].as_array()?.iter().find(|n| n["tags"] == json!([])).cloned());
        match untagged {
            Some(n) if n["waiting_mb"] == 256 && n["in_flight_mb"] == 256 => Ok(n),
            _ => Err(format!("{reports:?}")),
        }
    })
    .await;
    assert_eq!(needs["refused_mb"], 0);
    for call in [first, second] {
        let (status, record) = call.await.unwrap();
        assert_eq!(status, 200, "it waited for room instead of a 503: {record}");
    }
    // One activation waited, about two seconds: the histogram of waits for room says so.
    assert_eq!(counter(&scheduler, "scheduler_room_wait_seconds_count").await, 1);
    assert_eq!(counter(&scheduler, "scheduler_room_wait_seconds_bucket{le=\"1.0\"}").await, 0);
    assert_eq!(counter(&scheduler, "scheduler_room_wait_seconds_bucket{le=\"5.0\"}").await, 1);
    support::eventually(Duration::from_secs(3), "the demand back to zero", || async {
        let reports = kv.get_prefix("/invoker/demand/").await.unwrap();
        let report: Value = serde_json::from_str(&reports[0].1).unwrap();
        if report["needs"].as_array().unwrap().iter().all(|n| n["in_flight_mb"] == 0 && n["waiting_mb"] == 0) {
            Ok(())
        } else {
            Err(report.to_string())
        }
    })
    .await;
}

/// Issue 79: a blocking call that no invoker has room for within `wait_for_room` is not
/// refused: it is answered 202 with its activation id, kept in the scheduler's durable queue
/// (across a SIGKILL of the scheduler too), and runs once there is room; its record says it
/// ran. A call no invoker of the cluster could ever hold is still refused, naming why.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_blocking_call_past_its_wait_for_room_is_answered_202_and_runs_later() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("small", &[], 256)], "wait_for_room = \"1s\"\n").await;
    p.scheduler.put_action("slow", action(256, json!([]))).await;
    p.scheduler.put_action("huge", action(512, json!([]))).await;
    // An asynchronous call holds the one invoker's room for six seconds.
    let (status, holder) = p.scheduler.invoke("slow", "", json!({ "sleep_ms": 6000 })).await;
    assert_eq!(status, 202, "{holder}");
    p.wait_for(|list| list.len() == 1 && list[0]["nodes"][0]["launchable_mb"] == 0).await;

    let (status, kept) = p.scheduler.try_invoke("slow", json!({ "sleep_ms": 10, "n": 2 })).await;
    assert_eq!(status, 202, "past its wait, kept rather than refused: {kept}");
    let id = kept["activationId"].as_str().expect("its activation id").to_string();
    assert_eq!(counter(&p.scheduler, "scheduler_kept_queued_total").await, 1);
    let (status, record) = p.scheduler.get(&format!("activations/{id}")).await;
    assert_eq!(status, 404, "no record while it waits: {record}");

    let (status, refused) = p.scheduler.try_invoke("huge", json!({})).await;
    assert_eq!(status, 503, "no invoker can ever hold 512 MB: {refused}");
    let error = refused["response"]["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("no invoker fits 512 MB"), "{refused}");
    assert!(error.contains("the largest holds 256 MB): it can never run here"), "{refused}");

    // The scheduler killed while the call waits in its queue: the next start runs it.
    p.scheduler.signal(nix::sys::signal::Signal::SIGKILL);
    p.scheduler.wait_exit(Duration::from_secs(10));
    p.scheduler =
        Invoker::start_scheduler(p.scheduler_dir.path(), &scheduler_config(&p.etcd, "wait_for_room = \"1s\"\n"));
    let record = p.scheduler.record(&id).await;
    assert_eq!(record["response"]["success"], true, "{record}");
    assert_eq!(record["response"]["result"]["echo"]["n"], 2, "with its parameters: {record}");
    assert_eq!(ran_on(&record), "small");
}

/// Issue 61: a call waiting for room on a full invoker goes there as soon as a call this
/// scheduler sent there ends, not when the invoker next publishes a record showing the room
/// (the replay's calls refused at `wait_for_room` while the simulator's were placed). Here the
/// invoker is cut from etcd once its record shows both its calls running, so no later record
/// ever comes: only the scheduler's own sight of the first call's end can free the room.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_call_waiting_for_room_takes_it_when_a_call_there_ends_before_any_record_says_so() {
    let Some(etcd) = EtcdServer::start() else { return };
    let partition = support::partition::Partition::to(etcd.url().trim_start_matches("http://")).await;
    let (dir, scheduler_dir) = (tempdir(), tempdir());
    // A lease that outlasts the test: the record stays in etcd, as last published.
    let config = invoker_config_at(&partition.url(), &[], 512).replace("lease_ttl = \"3s\"", "lease_ttl = \"60s\"");
    let invoker = Invoker::start(dir.path(), "full", &config);
    let scheduler =
        Invoker::start_scheduler(scheduler_dir.path(), &scheduler_config(&etcd, "wait_for_room = \"8s\"\n"));
    let p = Platform { etcd, scheduler, scheduler_dir, invokers: vec![invoker], _dirs: vec![dir] };
    let launchable = |want: u64| {
        move |list: &[Value]| list.len() == 1 && list[0]["nodes"][0]["launchable_mb"].as_u64() == Some(want)
    };
    p.wait_for(launchable(512)).await;
    p.scheduler.put_action("slow", action(256, json!([]))).await;
    let call = |sleep_ms: u64| p.scheduler.try_invoke("slow", json!({ "sleep_ms": sleep_ms }));
    let (first, second, third) = (call(3000), call(3500), call(10));
    // The record showing the second call's container comes from a publish after the one that
    // showed the first call's: at least a publish interval (100 ms) after the first call was
    // sent, more than the scheduler's refresh, so it shows the first call running too.
    let (first, second, third) = tokio::join!(
        first,
        async {
            p.wait_for(launchable(256)).await;
            second.await
        },
        async {
            p.wait_for(launchable(256)).await;
            p.wait_for(launchable(0)).await;
            partition.cut();
            third.await
        }
    );
    for (name, (status, record)) in [("first", first), ("second", second), ("third", third)] {
        assert_eq!(status, 200, "the {name} call: {record}");
    }
    partition.heal();
}

/// Issue 58: the scheduler keeps an asynchronous call until an invoker says a container took
/// it. An invoker SIGKILLed while it held calls it had not started (its containers were still
/// starting) leaves them to the other invoker: each runs there exactly once, as its first
/// attempt, and none is failed, guessed or dead-lettered.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_killed_with_handed_over_unstarted_calls_leaves_them_to_the_other() {
    let Some(etcd) = EtcdServer::start() else { return };
    let (victim_dir, other_dir, scheduler_dir) = (tempdir(), tempdir(), tempdir());
    // The victim's containers take a minute to start: what it is handed waits there, unstarted.
    let slow = format!("{}start_latency = \"60s\"\n", invoker_config(&etcd, &["v"], 2048));
    let victim = Invoker::start(victim_dir.path(), "victim", &slow);
    let other = Invoker::start(other_dir.path(), "other", &invoker_config(&etcd, &[], 2048));
    let scheduler = Invoker::start_scheduler(scheduler_dir.path(), &scheduler_config(&etcd, ""));
    let mut p =
        Platform { etcd, scheduler, scheduler_dir, invokers: vec![victim, other], _dirs: vec![victim_dir, other_dir] };
    p.wait_for(|list| list.len() == 2 && list.iter().all(|i| i["nodes"][0]["capacity_mb"].as_u64() > Some(0))).await;
    // Prefers the victim while it has room; may run anywhere.
    let prefers_victim = json!([
        { "key": "invoker-resources", "value": ["v"] },
        { "key": "invoker-resources-strict-policy", "value": false },
    ]);
    p.scheduler.put_action("pinned", action(256, prefers_victim)).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        let (status, accepted) = p.scheduler.invoke("pinned", "", json!({ "i": i })).await;
        assert_eq!(status, 202, "{accepted}");
        ids.push(accepted["activationId"].as_str().unwrap().to_string());
    }
    let victim = p.invoker("victim");
    support::eventually(Duration::from_secs(20), "the four handed over, their containers starting", || async {
        let pool = victim.get_url("/v1/pool").await.1;
        if pool["starting"] == 4 {
            Ok(())
        } else {
            Err(pool.to_string())
        }
    })
    .await;
    victim.signal(nix::sys::signal::Signal::SIGKILL);
    victim.wait_exit(Duration::from_secs(10));

    for id in &ids {
        let record = p.scheduler.record(id).await;
        assert_eq!(record["response"]["statusCode"], 0, "{record}");
        assert_eq!(ran_on(&record), "other", "{record}");
        assert_eq!(annotation(&record, "retryOf"), &Value::Null, "its first attempt, not a retry: {record}");
    }
    // Exactly once: the other invoker ran each one once, and nothing was given up.
    let (status, ran) = p.invoker("other").get("activations?name=pinned&limit=200").await;
    assert_eq!(status, 200, "{ran}");
    let mut ran: Vec<String> =
        ran.as_array().unwrap().iter().map(|r| r["activationId"].as_str().unwrap().to_string()).collect();
    ran.sort();
    ids.sort();
    assert_eq!(ran, ids);
    let (status, letters) = p.scheduler.get("deadletters").await;
    assert_eq!((status, letters.as_array().map(Vec::len)), (200, Some(0)), "{letters}");
}

/// Issue 58: asynchronous calls a scheduler accepted and had not handed over (no invoker had
/// room) are kept through a SIGKILL of the scheduler: its restart hands them over, and each
/// runs once, as its first attempt.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_scheduler_killed_with_calls_in_line_hands_them_over_at_its_restart() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("one", &[], 256)], "").await;
    // The invoker's one node is held by a call of its own (not the scheduler's) for 4 s.
    let one = p.invoker("one");
    one.put_action("hog", action(256, json!([]))).await;
    let (status, _) = one.invoke("hog", "", json!({ "sleep_ms": 4000 })).await;
    assert_eq!(status, 202);
    p.wait_for(|list| list.len() == 1 && list[0]["nodes"][0]["free_mb"] == 0).await;
    p.scheduler.put_action("a", action(256, json!([]))).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let (status, accepted) = p.scheduler.invoke("a", "", json!({ "i": i })).await;
        assert_eq!(status, 202, "{accepted}");
        ids.push(accepted["activationId"].as_str().unwrap().to_string());
    }
    let (_, list) = p.scheduler.get_url("/v1/invokers").await;
    assert_eq!(list[0]["in_flight"], 0, "nothing handed over yet: {list}");
    p.scheduler.signal(nix::sys::signal::Signal::SIGKILL);
    p.scheduler.wait_exit(Duration::from_secs(10));
    let config = scheduler_config(&p.etcd, "");
    p.scheduler = Invoker::start_scheduler(p.scheduler_dir.path(), &config);
    for id in &ids {
        let record = support::eventually(Duration::from_secs(30), "its record", || async {
            let (status, record) = p.scheduler.get(&format!("activations/{id}")).await;
            if status == 200 {
                Ok(record)
            } else {
                Err(format!("{status} {record}"))
            }
        })
        .await;
        assert_eq!(record["response"]["statusCode"], 0, "{record}");
        assert_eq!(ran_on(&record), "one", "{record}");
        assert_eq!(annotation(&record, "retryOf"), &Value::Null, "{record}");
    }
}

/// A scheduler's `/metrics` value of `name` (its Prometheus text).
async fn scheduler_metric(scheduler: &Invoker, name: &str) -> f64 {
    let (status, _, body) = scheduler.send("GET", "/metrics", &scheduler.admin, &[], Vec::new()).await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body).to_string();
    let line = text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
}

/// The most records whose runs overlapped, from their own start and end.
fn most_at_once(records: &[Value]) -> usize {
    support::most_at_once(records.iter().map(|r| (r["start"].as_f64().unwrap(), r["end"].as_f64().unwrap())))
}

/// Issue 60: an action's `max-concurrency` across two schedulers in front of the same two
/// invokers. Each invoker has room for three of its containers (six in all) and holds the cap
/// only for itself; the schedulers share the cap of four, two each, so twenty-four calls
/// through both never run more than four at once, and all succeed.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn two_schedulers_share_an_actions_cap_and_together_never_exceed_it() {
    let Some(etcd) = EtcdServer::start() else { return };
    let p = platform(etcd, &[("one", &[], 384), ("two", &[], 384)], "wait_for_room = \"30s\"\n").await;
    let second_dir = tempdir();
    let config = scheduler_config(&p.etcd, "wait_for_room = \"30s\"\n").replace("id = \"s1\"", "id = \"s2\"");
    let second = Invoker::start_scheduler(second_dir.path(), &config);
    for scheduler in [&p.scheduler, &second] {
        support::eventually(Duration::from_secs(20), "two schedulers seen", || async {
            support::done(scheduler_metric(scheduler, "scheduler_schedulers").await == 2.0)
        })
        .await;
    }
    // Each scheduler keeps its own actions: the same action, saved in both.
    for scheduler in [&p.scheduler, &second] {
        scheduler.put_action("capped", action(128, json!([{ "key": "max-concurrency", "value": 4 }]))).await;
    }
    let (calls, more) = tokio::join!(
        burst(&p.scheduler, "capped", 12, json!({ "sleep_ms": 400 })),
        burst(&second, "capped", 12, json!({ "sleep_ms": 400 }))
    );
    let records: Vec<Value> = calls
        .into_iter()
        .chain(more)
        .map(|(status, record)| {
            assert_eq!(status, 200, "{record}");
            record
        })
        .collect();
    assert!(most_at_once(&records) <= 4, "{} at once", most_at_once(&records));
    let waited = scheduler_metric(&p.scheduler, "scheduler_capped_waits_total").await
        + scheduler_metric(&second, "scheduler_capped_waits_total").await;
    assert!(waited > 0.0, "the schedulers held calls for the cap");
}

/// The provisioned row of `action` on an invoker's pool: (count, up).
async fn provisioned_on(invoker: &Invoker, action: &str) -> (u64, u64) {
    let (_, pool) = invoker.get_url("/v1/pool").await;
    let rows = pool["provisioned"].as_array().cloned().unwrap_or_default();
    let row = rows.iter().find(|r| r["action"] == action);
    row.map_or((0, 0), |r| (r["count"].as_u64().unwrap_or(0), r["up"].as_u64().unwrap_or(0)))
}

/// Issue 60: an action's provisioned containers across a cluster. The scheduler spreads four
/// over two invokers, two each, and counts their memory as demand for the capacity manager;
/// calls through it find them warm; when an invoker dies its two move to the other; when the
/// action is deleted they all go.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn provisioned_containers_are_spread_over_the_invokers_and_move_when_one_dies() {
    let Some(etcd) = EtcdServer::start() else { return };
    let mut p = platform(etcd, &[("one", &[], 1024), ("two", &[], 1024)], "").await;
    p.scheduler.put_action("hot", action(128, json!([{ "key": "provisioned-concurrency", "value": 4 }]))).await;
    for id in ["one", "two"] {
        let invoker = &p.invokers.iter().find(|i| i.invoker_id == id).unwrap();
        support::eventually(Duration::from_secs(20), "two provisioned on each invoker", || async {
            let got = provisioned_on(invoker, "guest/hot").await;
            support::done(got == (2, 2)).map_err(|_| format!("{id}: {got:?}"))
        })
        .await;
    }
    // Their memory is demand, as if four calls were in flight.
    let kv = p.etcd.kv();
    support::eventually(Duration::from_secs(5), "the provisioned memory in the demand report", || async {
        let reports = kv.get_prefix("/invoker/demand/").await.unwrap();
        let report: Option<Value> = reports.first().and_then(|(_, v)| serde_json::from_str(v).ok());
        let untagged =
            report.as_ref().and_then(|r| r["needs"].as_array()?.iter().find(|n| n["tags"] == json!([])).cloned());
        support::done(untagged.is_some_and(|n| n["in_flight_mb"] == 512)).map_err(|_| format!("{reports:?}"))
    })
    .await;
    for _ in 0..4 {
        let (status, record) = p.scheduler.invoke("hot", "blocking=true", json!({})).await;
        assert_eq!(status, 200, "{record}");
        assert_eq!(annotation(&record, "startKind"), &json!("warm"), "{record}");
    }
    // One invoker dies: once its registration is gone, the other keeps all four.
    p.invoker("two").signal(nix::sys::signal::Signal::SIGKILL);
    p.invoker("two").wait_exit(Duration::from_secs(10));
    let one = &p.invokers.iter().find(|i| i.invoker_id == "one").unwrap();
    support::eventually(Duration::from_secs(30), "all four on the invoker left", || async {
        let got = provisioned_on(one, "guest/hot").await;
        support::done(got == (4, 4)).map_err(|_| format!("{got:?}"))
    })
    .await;
    // Deleted: they go.
    let (status, body) = p.scheduler.send_json("DELETE", "/api/v1/namespaces/_/actions/hot", Value::Null).await;
    assert_eq!(status, 200, "{body}");
    support::eventually(Duration::from_secs(20), "none provisioned once the action is deleted", || async {
        let got = provisioned_on(one, "guest/hot").await;
        support::done(got == (0, 0)).map_err(|_| format!("{got:?}"))
    })
    .await;
}
