//! The capacity manager end to end, against a real etcd: `invoker capacity` on the local control
//! plane (its invokers are real `invoker serve` processes on the mock factory, one node of the
//! group's memory each) and a scheduler that waits for room. Skipped with a message when no
//! `etcd` binary is installed; under `CI=true` that fails instead.

mod support;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::etcd::EtcdServer;
use support::Invoker;

const CONTROLLER: &str = "c0ffee00-0000-4000-8000-00000000c0de:the-capacity-tests-controller-secret";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-capacity-").tempdir().unwrap()
}

fn cluster_keys(etcd: &EtcdServer) -> String {
    format!(
        "[cluster]\netcd = [\"{}\"]\nlease_ttl = \"3s\"\npublish_interval = \"100ms\"\n\
         controller_key = \"{CONTROLLER}\"\n[admin]\ncontroller_keys = [\"{CONTROLLER}\"]\n",
        etcd.url()
    )
}

/// The manager's config (its invokers read the same file): the mock factory, and one group.
fn manager_config(etcd: &EtcdServer, group: &str) -> String {
    format!(
        "{}[factory]\nkind = \"mock\"\n[capacity]\ntick = \"200ms\"\n[capacity.groups.default]\n{group}",
        cluster_keys(etcd)
    )
}

/// The manager's `/metrics` (admin key).
async fn metrics(manager: &Invoker) -> String {
    let (user, pass) = manager.admin.split_once(':').unwrap();
    let response = reqwest::Client::new()
        .get(format!("{}/metrics", manager.base))
        .basic_auth(user, Some(pass))
        .send()
        .await
        .unwrap();
    response.text().await.unwrap()
}

/// Kills every invoker the manager in `dir` left (its pid files), at the end of a test.
struct Fleet(PathBuf);

/// The pids in the pid files of the manager in `dir`.
fn pids(dir: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(dir.join("data/invokers")) else { return Vec::new() };
    entries
        .filter_map(|e| {
            let path = e.ok()?.path();
            path.extension().is_some_and(|x| x == "pid").then_some(())?;
            std::fs::read_to_string(path).ok()?.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for pid in pids(&self.0) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

fn start_manager(dir: &Path, config: &str) -> Invoker {
    Invoker::start_command(dir, "capacity", config, &["capacity"])
}

/// As [`start_manager`], its spans (and those of the invokers it starts) sent to `traces`.
fn start_traced_manager(dir: &Path, config: &str, traces: &support::otlp::Receiver) -> Invoker {
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", traces.endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "50")];
    Invoker::start_with_env(dir, "capacity", config, &["capacity"], &env)
}

async fn capacity(manager: &Invoker) -> Value {
    let (status, body) = manager.get_url("/v1/capacity").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// A scheduler that holds what finds no invoker with room (`wait_for_room`), with the action
/// `work` (256 MB, answering with what it was given) created on it.
async fn waiting_scheduler_with_work(etcd: &EtcdServer, dir: &Path) -> Arc<Invoker> {
    let config = format!(
        "{}[scheduler]\nid = \"s1\"\nrefresh_interval = \"50ms\"\nwait_for_room = \"60s\"\n",
        cluster_keys(etcd)
    );
    let scheduler = Invoker::start_scheduler(dir, &config);
    scheduler
        .put_action(
            "work",
            json!({ "exec": { "kind": "python:3", "code": "def main(a):\n    return a" }, "limits": { "memory": 256 } }),
        )
        .await;
    Arc::new(scheduler)
}

/// `n` activations of `work` that run 2 s, at once; each must complete. The invokers they ran on.
async fn burst_of_work(scheduler: &Arc<Invoker>, n: usize) -> BTreeSet<String> {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let s = scheduler.clone();
            tokio::spawn(async move { s.try_invoke("work", json!({ "sleep_ms": 2000 })).await })
        })
        .collect();
    let mut ran_on = BTreeSet::new();
    for call in calls {
        let (status, record) = call.await.unwrap();
        assert_eq!(status, 200, "every activation completes: {record}");
        let invoker = record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == "invoker").unwrap();
        ran_on.insert(invoker["value"].as_str().unwrap().to_string());
    }
    ran_on
}

/// The actions of the group's last decisions (`provision default-1`, `drain default-2`, ...).
async fn decisions(manager: &Invoker) -> Vec<String> {
    let status = capacity(manager).await;
    let decisions = status["groups"][0]["decisions"].as_array().cloned().unwrap_or_default();
    decisions.iter().map(|d| d["action"].as_str().unwrap_or_default().to_string()).collect()
}

/// The registered invokers, as the scheduler lists them.
async fn registered(scheduler: &Invoker) -> BTreeSet<String> {
    let (_, list) = scheduler.get_url("/v1/invokers").await;
    list.as_array().map(|l| l.iter().filter_map(|i| i["id"].as_str().map(String::from)).collect()).unwrap_or_default()
}

/// Waits until the manager started in `dir` found the leader's key taken and stands by (not
/// for some time, which under load may pass before it even asked).
async fn stands_by(dir: &Path) {
    let log = dir.join("stderr.log");
    wait_until(Duration::from_secs(30), "the second manager stands by", || {
        let log = &log;
        async move { std::fs::read_to_string(log).unwrap_or_default().contains("standby: the active capacity manager") }
    })
    .await;
}

async fn wait_until<F: std::future::Future<Output = bool>>(bound: Duration, what: &str, mut check: impl FnMut() -> F) {
    let check = &mut check;
    support::eventually(bound, what, || {
        let pending = check();
        async move { support::done(pending.await) }
    })
    .await
}

/// An invoker's start is timed as its registration comes, not at the manager's next round:
/// with a tick of a minute, min's invoker is in `provisioning_seconds` long before the second
/// round. (Timed at the round, its count stayed 0 for the minute.)
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invokers_start_is_timed_as_it_registers_not_at_the_next_round() {
    let Some(etcd) = EtcdServer::start() else { return };
    let manager_dir = tempdir();
    let config = manager_config(&etcd, "min = 1\nmax = 2\ninvoker_memory_mb = 256\n");
    let config = config.replace("tick = \"200ms\"", "tick = \"60s\"");
    let _fleet = Fleet(manager_dir.path().to_path_buf());
    let manager = start_manager(manager_dir.path(), &config);
    wait_until(Duration::from_secs(30), "min's invoker timed", || {
        let m = &manager;
        async move { metrics(m).await.lines().any(|l| l.contains("provisioning_seconds_count") && l.ends_with(" 1")) }
    })
    .await;
    assert_eq!(decisions(&manager).await, ["provision default-0"], "one round so far");
}

/// A group at `min = 1` gets a burst one invoker cannot hold: the manager starts more (the
/// scheduler holds the activations meanwhile), every activation completes, and when the load is
/// gone the extra invokers are drained and removed after `scale_down_after`, back to `min`. The
/// group sets no hold: the local plane's is 2 s (a minute before, past this test's wait).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_burst_grows_the_group_and_the_quiet_after_it_shrinks_it_back_to_min() {
    let Some(etcd) = EtcdServer::start() else { return };
    let (manager_dir, scheduler_dir) = (tempdir(), tempdir());
    let group = "min = 1\nmax = 4\ninvoker_memory_mb = 256\ndrain_deadline = \"20s\"\npredictor = \"conservative\"\n";
    let _fleet = Fleet(manager_dir.path().to_path_buf());
    let traces = support::otlp::Receiver::start().await;
    let manager = start_traced_manager(manager_dir.path(), &manager_config(&etcd, group), &traces);
    let scheduler = waiting_scheduler_with_work(&etcd, scheduler_dir.path()).await;
    wait_until(Duration::from_secs(30), "the first invoker (min = 1) registered", || {
        let s = scheduler.clone();
        async move { registered(&s).await == BTreeSet::from(["default-0".to_string()]) }
    })
    .await;
    assert_eq!(capacity(&manager).await["groups"][0]["scale_down_after_ms"], 2000, "the local plane's hold");
    // The live view: the group's last rounds at once, then each round as it is decided.
    let (user, pass) = manager.admin.split_once(':').unwrap();
    let mut live = reqwest::Client::new()
        .get(format!("{}/v1/live", manager.base))
        .basic_auth(user, Some(pass))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let first = support::events_until(&mut live, Duration::from_secs(10), |e| !e.is_empty()).await;
    assert_eq!((first[0].0.as_str(), &first[0].1["snapshot"]), ("capacity", &json!(true)), "{first:?}");
    assert!(first[0].1["groups"][0]["history"].as_array().is_some_and(|h| !h.is_empty()), "{first:?}");

    // Six activations of 2 s at once; each invoker holds one.
    let started = Instant::now();
    let watcher = {
        let s = scheduler.clone();
        tokio::spawn(async move {
            let mut most = 0;
            while started.elapsed() < Duration::from_secs(20) {
                most = most.max(registered(&s).await.len());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            most
        })
    };
    let ran_on = burst_of_work(&scheduler, 6).await;
    let took = started.elapsed();
    let most = watcher.await.unwrap();
    eprintln!("the burst: 6 activations of 2 s in {took:?}, on {ran_on:?}; at most {most} invokers");
    assert_eq!(most, 4, "the group grew to its max");
    assert!(ran_on.len() >= 3, "new invokers took work: {ran_on:?}");
    let asked = decisions(&manager).await;
    assert!(asked.iter().any(|a| a.starts_with("provision")), "{asked:?}");
    let rounds = support::events_until(&mut live, Duration::from_secs(10), |events| {
        events.iter().any(|(_, v)| {
            v["groups"][0]["decisions"].as_array().is_some_and(|d| {
                d.iter().any(|d| d["action"].as_str().is_some_and(|a| a.starts_with("provision default-1")))
            })
        })
    })
    .await;
    assert!(rounds.iter().all(|(k, v)| k == "capacity" && v["snapshot"] == false), "{rounds:?}");
    drop(live);

    // Quiet: after scale_down_after the three are drained, and removed once drained.
    wait_until(Duration::from_secs(40), "back to min: one invoker registered, the others stopped", || {
        let (s, m) = (scheduler.clone(), &manager);
        async move {
            let counts = capacity(m).await["groups"][0]["counts"].clone();
            registered(&s).await.len() == 1
                && counts == json!({ "provisioning": 0, "active": 1, "draining": 0, "removing": 0 })
        }
    })
    .await;
    let actions = decisions(&manager).await;
    for id in ["default-1", "default-2", "default-3"] {
        assert!(actions.contains(&format!("drain {id}")), "{actions:?}");
        assert!(actions.contains(&format!("remove {id}")), "{actions:?}");
    }
    assert!(!actions.contains(&"drain default-0".to_string()), "never below min: {actions:?}");
    assert_eq!(pids(manager_dir.path()).len(), 1, "the removed invokers' pid files are gone");

    // Its decisions are spans, each with its reason and the demand and target it saw; the
    // invokers it started registered under a lease, each a moment of its own.
    support::eventually(Duration::from_secs(20), "the manager's spans exported", || async {
        let spans = traces.spans();
        let decided = |action: &str| {
            spans.iter().any(|s| {
                s.service == "invoker-capacity"
                    && s.name == "capacity.decision"
                    && s.attributes.get("action").is_some_and(|a| a.starts_with(action))
                    && s.attributes.get("reason").is_some_and(|r| !r.is_empty())
                    && s.attributes.contains_key("target_mb")
            })
        };
        let moment = |name: &str| spans.iter().any(|s| s.name == name && s.parent.is_empty());
        let all = ["provision", "drain default-1", "remove default-1"].into_iter().all(decided)
            && moment("capacity.leader")
            && moment("etcd.lease.granted");
        let seen: Vec<_> = spans.iter().map(|s| format!("{} {} {:?}", s.service, s.name, s.attributes)).collect();
        support::done(all).map_err(|_| format!("{seen:#?}"))
    })
    .await;
}

/// Every `invoker serve` process whose command line names `dir` (the invokers a manager with
/// that data dir started), by pid.
fn serving_under(dir: &Path) -> BTreeSet<i32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            text.contains(" serve ") && text.contains(&needle)
        })
        .collect()
}

/// A manager SIGKILLed while the invokers it asked for are still starting, then started again
/// on the same data dir: it adopts them (from their pid files, then their registrations), asks
/// for none again, and leaves no process it does not know.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_manager_killed_mid_scale_and_started_again_adopts_what_runs() {
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let _fleet = Fleet(dir.path().to_path_buf());
    let config = manager_config(&etcd, "min = 3\nmax = 3\ninvoker_memory_mb = 256\n");
    let mut manager = start_manager(dir.path(), &config);
    wait_until(Duration::from_secs(10), "three invokers asked for", || async { pids(dir.path()).len() == 3 }).await;
    manager.signal(nix::sys::signal::Signal::SIGKILL);
    manager.wait_exit(Duration::from_secs(10));
    let manager = start_manager(dir.path(), &config);
    wait_until(Duration::from_secs(30), "three active invokers", || {
        let m = &manager;
        async move {
            let status = capacity(m).await;
            status["leader"] == true && status["groups"][0]["counts"]["active"] == 3
        }
    })
    .await;
    let status = capacity(&manager).await;
    let decisions = status["groups"][0]["decisions"].as_array().unwrap();
    assert!(decisions.is_empty(), "it asked for nothing again: {decisions:?}");
    let running = serving_under(dir.path());
    assert_eq!(running.len(), 3, "three invoker processes, no more: {running:?}");
    assert_eq!(running, pids(dir.path()).into_iter().collect(), "each one known by its pid file");
}

/// Two managers on one etcd (and one data dir): one leads, the other waits; the leader's
/// SIGKILL hands the group to the other within the lease TTL, which adopts its invokers.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn of_two_managers_one_leads_and_the_other_takes_over_when_it_dies() {
    let Some(etcd) = EtcdServer::start() else { return };
    let (dir, other) = (tempdir(), tempdir());
    let _fleet = Fleet(dir.path().to_path_buf());
    // Both use `dir`'s data (the second's is a link to it).
    let config = manager_config(&etcd, "min = 2\nmax = 2\ninvoker_memory_mb = 256\n");
    let mut first = start_manager(dir.path(), &config);
    wait_until(Duration::from_secs(30), "the first leads with two active", || {
        let m = &first;
        async move { capacity(m).await["groups"][0]["counts"]["active"] == 2 }
    })
    .await;
    std::os::unix::fs::symlink(dir.path().join("data"), other.path().join("data")).unwrap();
    let second = start_manager(other.path(), &config);
    stands_by(other.path()).await;
    let standby = capacity(&second).await;
    assert_eq!(standby["leader"], false, "{standby}");
    first.signal(nix::sys::signal::Signal::SIGKILL);
    first.wait_exit(Duration::from_secs(10));
    let killed = Instant::now();
    // Bounded, not timed: the lease's TTL is 3 s, and a loaded machine's etcd may take longer
    // to expire it.
    wait_until(Duration::from_secs(30), "the second leads with the two adopted", || {
        let m = &second;
        async move {
            let status = capacity(m).await;
            status["leader"] == true && status["groups"][0]["counts"]["active"] == 2
        }
    })
    .await;
    eprintln!("the standby led {:?} after the leader's SIGKILL (lease TTL 3 s)", killed.elapsed());
    let decisions = capacity(&second).await["groups"][0]["decisions"].clone();
    assert_eq!(decisions, json!([]), "nothing asked for again");
    assert_eq!(serving_under(dir.path()).len(), 2);
}

/// Children of `pid` that exited and were not reaped (zombies), by pid.
fn zombies_of(pid: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`: the fields after the last ')'.
            let fields: Vec<&str> =
                stat.rsplit_once(')').map(|(_, f)| f.split_whitespace().collect()).unwrap_or_default();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&pid.to_string().as_str())
        })
        .collect()
}

/// Starts an activation of 30 s on the invoker at `api` (straight to it, not through a
/// scheduler): it keeps the invoker draining, not drained, while it runs.
async fn keep_busy(api: &str) {
    let http = reqwest::Client::new();
    let (user, pass) = support::GUEST.split_once(':').unwrap();
    let action =
        json!({ "exec": { "kind": "python:3", "code": "def main(a):\n    return a" }, "limits": { "memory": 128 } });
    let put = http.put(format!("{api}/api/v1/namespaces/_/actions/busy")).basic_auth(user, Some(pass)).json(&action);
    assert!(put.send().await.unwrap().status().is_success());
    let invoke = http.post(format!("{api}/api/v1/namespaces/_/actions/busy")).basic_auth(user, Some(pass));
    let answer = invoke.json(&json!({ "sleep_ms": 30000 })).send().await.unwrap();
    assert_eq!(answer.status(), 202);
}

/// Two managers on one data dir hand the group back and forth: the leader frozen, the standby
/// leads, drains one of the invokers (busy, so it stays draining) and forgets it when it is
/// killed; the first, thawed, steps down and reaps the child the other stopped; the second
/// killed, the first leads again from the pid files as they are now (not its handles from
/// before) and brings the group back to its min. At every step the counts are the processes
/// and the registrations, and a dead invoker leaves no pid file or data behind.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn managers_that_hand_over_stop_reap_and_clean_what_they_find() {
    use invoker_etcd::kv::ClusterKv;
    let Some(etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    let (dir, other) = (tempdir(), tempdir());
    let _fleet = Fleet(dir.path().to_path_buf());
    let first = start_manager(dir.path(), &manager_config(&etcd, "min = 2\nmax = 2\ninvoker_memory_mb = 256\n"));
    wait_until(Duration::from_secs(30), "the first leads with two active", || {
        let m = &first;
        async move { capacity(m).await["groups"][0]["counts"]["active"] == 2 }
    })
    .await;
    let registrations = || async {
        let kv = etcd.kv();
        kv.get_prefix("/invoker/invokers/").await.unwrap_or_default()
    };
    for (_, value) in registrations().await {
        let record: Value = serde_json::from_str(&value).unwrap();
        keep_busy(record["api"].as_str().unwrap()).await;
    }

    std::os::unix::fs::symlink(dir.path().join("data"), other.path().join("data")).unwrap();
    let shrinking = "min = 1\nmax = 2\ninvoker_memory_mb = 256\nscale_down_after = \"1s\"\ndrain_deadline = \"60s\"\n";
    let mut second = start_manager(other.path(), &manager_config(&etcd, shrinking));
    stands_by(other.path()).await;
    assert_eq!(capacity(&second).await["leader"], false, "one leader at a time");
    first.signal(nix::sys::signal::Signal::SIGSTOP);
    let drained = support::eventually(Duration::from_secs(30), "the second drains one", || async {
        let drains = kv.get_prefix("/invoker/drain/").await.unwrap_or_default();
        let ours = drains.iter().find(|(_, v)| v.contains("capacity"));
        ours.map(|(key, _)| key.rsplit('/').next().unwrap().to_string()).ok_or_else(|| format!("{drains:?}"))
    })
    .await;
    let invokers = dir.path().join("data/invokers");
    let pid_file = invokers.join(format!("{drained}.pid"));
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_until(Duration::from_secs(20), "the killed invoker's pid file and data removed once forgotten", || {
        let (pid_file, data) = (pid_file.clone(), invokers.join(&drained));
        async move { !pid_file.exists() && !data.exists() }
    })
    .await;
    wait_until(Duration::from_secs(20), "the second's counts are the processes and registrations", || {
        let (m, d) = (&second, dir.path());
        let registered = registrations();
        async move {
            let counts = capacity(m).await["groups"][0]["counts"].clone();
            let total = ["provisioning", "active", "draining", "removing"]
                .iter()
                .map(|k| counts[k].as_u64().unwrap_or(0))
                .sum::<u64>();
            total == 1 && serving_under(d).len() == 1 && registered.await.len() == 1 && pids(d).len() == 1
        }
    })
    .await;

    // Thawed, the first finds its lease gone, steps down, and reaps the child the other stopped.
    first.signal(nix::sys::signal::Signal::SIGCONT);
    wait_until(Duration::from_secs(20), "the first steps down", || {
        let m = &first;
        async move { capacity(m).await["leader"] == false }
    })
    .await;
    wait_until(Duration::from_secs(10), "no zombie left of the first manager's invokers", || {
        let pid = first.child.id();
        async move { zombies_of(pid).is_empty() }
    })
    .await;

    // The second killed, the first leads again on the pid files as they are now.
    second.signal(nix::sys::signal::Signal::SIGKILL);
    second.wait_exit(Duration::from_secs(10));
    wait_until(
        Duration::from_secs(30),
        "the first leads again with two active, each a process and a registration",
        || {
            let (m, d) = (&first, dir.path());
            let registered = registrations();
            async move {
                let status = capacity(m).await;
                let counts = status["groups"][0]["counts"].clone();
                status["leader"] == true
                    && counts["active"] == 2
                    && counts["removing"] == 0
                    && counts["draining"] == 0
                    && serving_under(d).len() == 2
                    && registered.await.len() == 2
                    && pids(d).len() == 2
            }
        },
    )
    .await;
}

/// Waits until `pid`'s exec has set its command line (the spawn returns a moment before).
async fn past_exec(pid: i32) {
    wait_until(Duration::from_secs(10), "the invoker past its exec", || async move {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
    })
    .await;
}

/// The local control plane of two managers on one data dir, each one's handles against the
/// other's doing: an invoker the first started is stopped by the second and reaped at once by
/// the first (its parent); started again under its name by the second, the first (leading
/// again) finds it by its pid file, sees it run, and stops it, the process that runs now, not
/// the one its old handle named; one that died is cleaned up once forgotten. The invoker is a
/// script whose command line reads as one (`serve ... --invoker-id <id>`).
#[tokio::test(flavor = "multi_thread")]
async fn the_local_plane_trusts_the_pid_files_not_its_handles_from_before() {
    use invoker_capacity::plane::local::LocalPlane;
    use invoker_factory::plane::{ControlPlane, InvokerSpec};
    let dir = tempdir();
    let _fleet = Fleet(dir.path().to_path_buf());
    let script = dir.path().join("fake-invoker.sh");
    std::fs::write(&script, "#!/bin/sh\ntrap 'exit 0' TERM\nwhile :; do sleep 0.1; done\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let plane = || {
        let config = dir.path().join("unused.toml");
        LocalPlane::new(script.clone(), config, vec![], dir.path().join("data"), Duration::from_secs(5)).unwrap()
    };
    let (first, second) = (plane(), plane());
    let spec = InvokerSpec { id: "default-1".into(), group: "default".into(), tags: vec![], memory_mb: 256 };
    let pid_of = |id: &str| -> i32 {
        let text = std::fs::read_to_string(dir.path().join(format!("data/invokers/{id}.pid"))).unwrap();
        text.split_whitespace().next().unwrap().parse().unwrap()
    };
    first.provision(&spec).await.unwrap();
    let started_by_first = pid_of("default-1");
    assert_eq!(first.running("default-1"), Some(true));
    // A leadership is taken a lease's TTL after the other's last spawn, not within its exec.
    past_exec(started_by_first).await;

    assert_eq!(second.found(), vec!["default-1".to_string()]);
    second.remove("default-1").await.unwrap();
    wait_until(Duration::from_secs(10), "the first reaps its child the second stopped", || async {
        zombies_of(std::process::id()).is_empty() && !Path::new(&format!("/proc/{started_by_first}")).exists()
    })
    .await;

    second.provision(&spec).await.unwrap();
    let started_by_second = pid_of("default-1");
    assert_ne!(started_by_first, started_by_second);
    past_exec(started_by_second).await;
    assert_eq!(first.found(), vec!["default-1".to_string()], "found again, whoever started it");
    assert_eq!(first.running("default-1"), Some(true));
    first.remove("default-1").await.unwrap();
    wait_until(Duration::from_secs(10), "the process that ran under the name stopped", || async {
        let stat = std::fs::read_to_string(format!("/proc/{started_by_second}/stat")).unwrap_or_default();
        stat.is_empty() || stat.rsplit_once(')').is_some_and(|(_, f)| f.trim_start().starts_with('Z'))
    })
    .await;

    // Died on its own: once forgotten, its pid file and data go (its log stays).
    first.provision(&InvokerSpec { id: "default-2".into(), ..spec }).await.unwrap();
    let died = pid_of("default-2");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(died), nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_until(Duration::from_secs(10), "it is not running", || async { first.running("default-2") == Some(false) })
        .await;
    first.forget("default-2");
    let invokers = dir.path().join("data/invokers");
    wait_until(Duration::from_secs(10), "its pid file and data removed", || {
        let invokers = invokers.clone();
        async move { !invokers.join("default-2.pid").exists() && !invokers.join("default-2").exists() }
    })
    .await;
    assert!(invokers.join("default-2.log").exists(), "the log stays, for why it ended");
}

/// A leader that stops (SIGTERM) revokes its lease, and the standby, watching the leader's
/// key, claims it as it goes: not a third of a TTL later (40 s with this 120 s TTL, past the
/// bounded wait).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_standby_leads_as_soon_as_the_leader_stops() {
    let Some(etcd) = EtcdServer::start() else { return };
    let (dir, other) = (tempdir(), tempdir());
    let config = manager_config(&etcd, "min = 0\nmax = 1\ninvoker_memory_mb = 256\n")
        .replace("lease_ttl = \"3s\"", "lease_ttl = \"120s\"");
    let mut first = start_manager(dir.path(), &config);
    wait_until(Duration::from_secs(30), "the first leads", || {
        let m = &first;
        async move { capacity(m).await["leader"] == true }
    })
    .await;
    let second = start_manager(other.path(), &config);
    stands_by(other.path()).await;
    assert_eq!(capacity(&second).await["leader"], false, "one leader at a time");
    first.signal(nix::sys::signal::Signal::SIGTERM);
    first.wait_exit(Duration::from_secs(20));
    wait_until(Duration::from_secs(30), "the standby leads", || {
        let m = &second;
        async move { capacity(m).await["leader"] == true }
    })
    .await;
}

/// An invoker killed under the manager is replaced (its name is free once it is gone).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_invoker_killed_under_the_manager_is_replaced() {
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempdir();
    let _fleet = Fleet(dir.path().to_path_buf());
    let manager = start_manager(dir.path(), &manager_config(&etcd, "min = 2\nmax = 2\ninvoker_memory_mb = 256\n"));
    wait_until(Duration::from_secs(30), "two active", || {
        let m = &manager;
        async move { capacity(m).await["groups"][0]["counts"]["active"] == 2 }
    })
    .await;
    let before = serving_under(dir.path());
    let victim = *before.iter().next().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim), nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_until(Duration::from_secs(30), "two invokers again, one of them new", || {
        let (m, d) = (&manager, dir.path());
        async move {
            let running = serving_under(d);
            running.len() == 2 && !running.contains(&victim) && capacity(m).await["groups"][0]["counts"]["active"] == 2
        }
    })
    .await;
    let decisions = capacity(&manager).await["groups"][0]["decisions"].clone();
    let provisions =
        decisions.as_array().unwrap().iter().filter(|d| d["action"].as_str().unwrap().starts_with("provision"));
    assert_eq!(provisions.count(), 2, "the first two, and one replacement: {decisions}");
}

/// A manager on the in-memory control plane with `capacity` (TOML of `[capacity]`), leading
/// against `kv` (the test writes the invokers' records and the demand reports itself).
#[cfg(feature = "test-util")]
struct FakeManaged {
    plane: invoker_capacity::plane::fake::FakePlane,
    status: Arc<parking_lot::Mutex<invoker_capacity::manager::CapacityStatus>>,
    stop: tokio_util::sync::CancellationToken,
    running: tokio::task::JoinHandle<()>,
}

#[cfg(feature = "test-util")]
impl FakeManaged {
    fn start(kv: &invoker_etcd::client::Etcd, capacity: &str) -> FakeManaged {
        use invoker_capacity::manager::{Manager, ManagerSettings};
        use invoker_capacity::plane::{fake::FakePlane, AnyPlane};
        let config = invoker::config::Config::from_toml(capacity).unwrap();
        config.validate().unwrap();
        let settings = ManagerSettings {
            prefix: "/invoker".into(),
            tick: config.capacity.tick,
            groups: config.capacity.groups.clone(),
            publish_interval: Duration::from_millis(100),
            lease_ttl: Duration::from_secs(3),
            api: "http://127.0.0.1:1".into(),
            lead: Duration::from_secs(1),
            newest_only: false,
            standby: false,
        };
        let plane = FakePlane::default();
        let manager = Manager::new(kv.clone(), settings, AnyPlane::Fake(plane.clone()));
        let status = manager.status.clone();
        let stop = tokio_util::sync::CancellationToken::new();
        let running = tokio::spawn(manager.run(stop.clone()));
        FakeManaged { plane, status, stop, running }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap();
    }
}

/// Writes invoker `id`'s registration as a healthy invoker of one node publishes it.
#[cfg(feature = "test-util")]
async fn register_healthy(kv: &invoker_etcd::client::Etcd, id: &str, node: invoker_wire::cluster::NodeHeadroom) {
    use invoker_etcd::kv::ClusterKv;
    use invoker_wire::cluster::{Health, InvokerRecord};
    let record = InvokerRecord {
        id: id.into(),
        api: "http://127.0.0.1:2".into(),
        tags: vec![],
        health: Health::Healthy,
        nodes: vec![node],
        boot_id: "b".into(),
        pid: 1,
    };
    kv.put(&format!("/invoker/invokers/{id}"), &serde_json::to_string(&record).unwrap(), None).await.unwrap();
}

/// A plane counted slow (the fake's 1 s) whose invokers come at once: once five starts were
/// timed under half a second, the group takes a quick plane's settings, its hold 2 s instead
/// of a minute, and says the lead it measured. (Before, a plane kept the lead it was counted
/// at, whatever its invokers did.)
#[cfg(feature = "test-util")]
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_plane_measured_quicker_than_counted_takes_a_quick_planes_settings() {
    use invoker_wire::cluster::NodeHeadroom;
    let Some(etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    let managed = FakeManaged::start(
        &kv,
        "[capacity]\ntick = \"100ms\"\n[capacity.groups.default]\nmin = 5\nmax = 5\ninvoker_memory_mb = 256\n\
         predictor = \"conservative\"\n",
    );
    let (plane, status) = (managed.plane.clone(), managed.status.clone());
    let group = move || serde_json::to_value(status.lock().groups.first().cloned()).unwrap_or(Value::Null);
    wait_until(Duration::from_secs(10), "min's five asked for", || {
        let asked = plane.calls().len();
        async move { asked == 5 }
    })
    .await;
    assert_eq!((group()["lead_ms"].as_u64(), group()["scale_down_after_ms"].as_u64()), (Some(1000), Some(60_000)));
    for i in 0..5 {
        let node = NodeHeadroom { node: "n".into(), launchable_mb: 256, free_mb: 256, capacity_mb: 256, idle_mb: 0 };
        register_healthy(&kv, &format!("default-{i}"), node).await;
    }
    wait_until(Duration::from_secs(10), "the quick plane's hold", || {
        let g = group();
        async move { g["scale_down_after_ms"] == 2000 && g["lead_ms"].as_u64().is_some_and(|ms| ms < 500) }
    })
    .await;
    managed.stop().await;
}

/// The manager step by step on the in-memory control plane, the test playing the invokers (it
/// writes their records into etcd) and the schedulers (their demand reports): the drains a
/// manager before left are taken back; an invoker is up only once it publishes headroom; an
/// unhealthy one is no capacity and the first drained; demand provisions; a start that fails is explained and
/// held back; a quiet group drains its newest and removes each once it reports drained.
#[cfg(feature = "test-util")]
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn the_manager_step_by_step_on_the_fake_control_plane() {
    use invoker_etcd::kv::ClusterKv;
    use invoker_wire::cluster::Health;
    use invoker_wire::cluster::{DemandReport, InvokerRecord, Needs, NodeHeadroom, TagNeeds};
    let Some(etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    // Drains a manager before this one left: its own are taken back, an operator's stay.
    kv.put("/invoker/drain/default-7", r#"{"since":1,"by":"capacity"}"#, None).await.unwrap();
    kv.put("/invoker/drain/default-8", r#"{"since":1}"#, None).await.unwrap();
    let managed = FakeManaged::start(
        &kv,
        "[capacity]\ntick = \"100ms\"\n[capacity.groups.default]\nmin = 1\nmax = 3\ninvoker_memory_mb = 256\n\
         scale_down_after = \"1s\"\ndrain_deadline = \"60s\"\npredictor = \"conservative\"\n",
    );
    let (plane, status) = (managed.plane.clone(), managed.status.clone());
    let group = |field: &str| {
        serde_json::to_value(status.lock().groups.first().cloned()).map(|g| g[field].clone()).unwrap_or(Value::Null)
    };
    let register = |id: &str, health: Health, with_nodes: bool| {
        let nodes = with_nodes.then(|| NodeHeadroom {
            node: "n".into(),
            launchable_mb: 256,
            free_mb: 256,
            capacity_mb: 256,
            idle_mb: 0,
        });
        let record = InvokerRecord {
            id: id.into(),
            api: "http://127.0.0.1:2".into(),
            tags: vec![],
            health,
            nodes: nodes.into_iter().collect(),
            boot_id: "b".into(),
            pid: 1,
        };
        let (kv, id) = (kv.clone(), id.to_string());
        async move {
            kv.put(&format!("/invoker/invokers/{id}"), &serde_json::to_string(&record).unwrap(), None).await.unwrap()
        }
    };
    let demand = |mb: u64| {
        let report = DemandReport {
            scheduler: "s1".into(),
            at_ms: 0,
            needs: vec![TagNeeds { tags: vec![], needs: Needs { in_flight_mb: mb, ..Default::default() } }],
        };
        let kv = kv.clone();
        async move { kv.put("/invoker/demand/s1", &serde_json::to_string(&report).unwrap(), None).await.unwrap() }
    };
    let counts = |provisioning: u32, active: u32, draining: u32, removing: u32| json!({ "provisioning": provisioning, "active": active, "draining": draining, "removing": removing });

    // min = 1: one asked for; claimed but without headroom it is not up yet.
    wait_until(Duration::from_secs(10), "default-0 asked for", || async { plane.calls() == ["provision default-0"] })
        .await;
    assert!(kv.get("/invoker/drain/default-7").await.unwrap().is_none(), "the manager before's drain");
    assert!(kv.get("/invoker/drain/default-8").await.unwrap().is_some(), "an operator's drain");
    register("default-0", Health::Healthy, false).await;
    // A window: registered without headroom for half a second, it must not count as up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(group("counts"), counts(1, 0, 0, 0), "claimed without headroom: not up");
    register("default-0", Health::Healthy, true).await;
    wait_until(Duration::from_secs(10), "default-0 up", || async { group("counts") == counts(0, 1, 0, 0) }).await;

    // 700 MB of demand: three invokers of 256 MB.
    demand(700).await;
    wait_until(Duration::from_secs(10), "two more asked for", || async { plane.started().len() == 3 }).await;
    assert_eq!(plane.calls()[1..3], ["provision default-1", "provision default-2"]);
    // default-2 cannot start: why is shown, and the next start waits a second.
    plane.exit("default-2", "Error: the process directory is too long");
    wait_until(Duration::from_secs(10), "the failed start explained", || async {
        group("last_failed_start")["reason"] == "Error: the process directory is too long"
    })
    .await;
    wait_until(Duration::from_secs(10), "default-2 asked for again", || async {
        plane.calls().iter().filter(|c| *c == "provision default-2").count() == 2
    })
    .await;
    for id in ["default-1", "default-2"] {
        register(id, Health::Healthy, true).await;
    }
    wait_until(Duration::from_secs(10), "three up", || async { group("counts") == counts(0, 3, 0, 0) }).await;

    // default-1 turns unhealthy: no capacity, so with 512 MB wanted (two invokers) it is the
    // one drained, not the newest.
    register("default-1", Health::Unhealthy, true).await;
    demand(512).await;
    let state = |id: &'static str| {
        let invokers = group("invokers");
        async move { invokers[id].as_str().map(String::from) }
    };
    wait_until(Duration::from_secs(10), "default-1 draining", || async {
        state("default-1").await.as_deref() == Some("draining")
    })
    .await;
    assert_eq!(state("default-2").await.as_deref(), Some("active"));
    // Quiet: after scale_down_after default-2 is drained too (the drain keys written), and each
    // is removed once its record says drained.
    demand(0).await;
    wait_until(Duration::from_secs(10), "two draining", || async { group("counts") == counts(0, 1, 2, 0) }).await;
    for id in ["default-1", "default-2"] {
        assert!(kv.get(&format!("/invoker/drain/{id}")).await.unwrap().is_some(), "{id}'s drain key");
    }
    assert!(kv.get("/invoker/drain/default-0").await.unwrap().is_none(), "never below min");
    // A drained report is trusted two publish intervals after the drain began.
    tokio::time::sleep(Duration::from_millis(300)).await;
    register("default-2", Health::Drained, true).await;
    wait_until(Duration::from_secs(10), "default-2 removed", || async {
        plane.calls().last().map(String::as_str) == Some("remove default-2")
    })
    .await;
    assert!(plane.started().contains_key("default-1"), "still draining: not removed");
    // Removed but still registered (a plane may keep it running a while, as a StatefulSet keeps
    // a pod below its highest): it stays drained.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(kv.get("/invoker/drain/default-2").await.unwrap().is_some(), "drained until it is gone");
    // Gone from the plane and from etcd: forgotten, and its drain key deleted.
    kv.delete("/invoker/invokers/default-2").await.unwrap();
    wait_until(Duration::from_secs(10), "default-2 forgotten", || async { group("counts") == counts(0, 1, 1, 0) })
        .await;
    assert!(kv.get("/invoker/drain/default-2").await.unwrap().is_none());
    managed.stop().await;
}

/// On a quick plane a shrinking group drains the invoker whose calls hold the least memory (as
/// its registration says), not the newest: it has the least to finish, so its memory is given
/// back soonest. The fake plane is counted slow (1 s), where the newest goes first; its five
/// invokers registering at once make it quick. (Drained newest-first, `default-4`, busy, went.)
#[cfg(feature = "test-util")]
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_shrinking_group_on_a_quick_plane_drains_its_least_busy_invoker() {
    use invoker_etcd::kv::ClusterKv;
    use invoker_wire::cluster::{DemandReport, Needs, NodeHeadroom, TagNeeds};
    let Some(etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    let managed = FakeManaged::start(
        &kv,
        "[capacity]\ntick = \"100ms\"\n[capacity.groups.default]\nmin = 0\nmax = 5\ninvoker_memory_mb = 256\n\
         scale_down_after = \"1s\"\npredictor = \"conservative\"\n",
    );
    let (plane, status) = (managed.plane.clone(), managed.status.clone());
    let demand = |mb: u64| {
        let needs = vec![TagNeeds { tags: vec![], needs: Needs { in_flight_mb: mb, ..Default::default() } }];
        let report = DemandReport { scheduler: "s1".into(), at_ms: 0, needs };
        let kv = kv.clone();
        async move { kv.put("/invoker/demand/s1", &serde_json::to_string(&report).unwrap(), None).await.unwrap() }
    };
    demand(1200).await;
    wait_until(Duration::from_secs(10), "five asked for", || async { plane.started().len() == 5 }).await;
    // Memory at work: 256, 40, 200, 256 and 256 MB (idle containers are not work).
    let busy = [(0, 0), (16, 200), (56, 0), (0, 0), (0, 0)];
    for (i, (free_mb, idle_mb)) in busy.into_iter().enumerate() {
        let node = NodeHeadroom { node: "n".into(), launchable_mb: free_mb, free_mb, capacity_mb: 256, idle_mb };
        register_healthy(&kv, &format!("default-{i}"), node).await;
    }
    let group = || status.lock().groups.first().cloned();
    wait_until(Duration::from_secs(10), "five up, the plane measured quick", || async {
        group().is_some_and(|g| g.counts.active == 5 && g.lead_ms < 500)
    })
    .await;
    demand(1000).await;
    wait_until(Duration::from_secs(10), "one drained", || async {
        kv.get_prefix("/invoker/drain/").await.unwrap().len() == 1
    })
    .await;
    let drained: Vec<String> = kv.get_prefix("/invoker/drain/").await.unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(drained, ["/invoker/drain/default-1"], "the least busy");
    managed.stop().await;
}

/// Neither `min` nor a burst waits for a tick: with a tick of a minute, the first round runs at
/// once, and demand past what the group has is answered at the next burst check (within the
/// bounded wait; a minute on the code before). The burst is five calls of 140 MB: 700 MB is
/// three invokers of 256 MB by memory, but one call fits in each, so five are asked for.
#[cfg(feature = "test-util")]
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_burst_is_answered_between_ticks() {
    use invoker_etcd::kv::ClusterKv;
    use invoker_wire::cluster::{DemandReport, Needs, TagNeeds};
    let Some(etcd) = EtcdServer::start() else { return };
    let kv = etcd.kv();
    let managed = FakeManaged::start(
        &kv,
        "[capacity]\ntick = \"60s\"\n[capacity.groups.default]\nmin = 1\nmax = 6\ninvoker_memory_mb = 256\n\
         predictor = \"conservative\"\n",
    );
    let plane = managed.plane.clone();
    wait_until(Duration::from_secs(10), "min = 1 at once", || async { plane.calls() == ["provision default-0"] }).await;
    let calls_by_mb = std::collections::BTreeMap::from([(140, 5)]);
    let needs = Needs { waiting_mb: 700, calls_by_mb, ..Default::default() };
    let report = DemandReport { scheduler: "s1".into(), at_ms: 0, needs: vec![TagNeeds { tags: vec![], needs }] };
    kv.put("/invoker/demand/s1", &serde_json::to_string(&report).unwrap(), None).await.unwrap();
    wait_until(Duration::from_secs(10), "four invokers asked for, long before the tick", || async {
        plane.calls()
            == [
                "provision default-0",
                "provision default-1",
                "provision default-2",
                "provision default-3",
                "provision default-4",
            ]
    })
    .await;
    managed.stop().await;
}

/// A manager on the Kubernetes plane of a fake API server (one node of 64 GiB, the image
/// `invoker:test`), whose fake kubelet runs each pod as a real `invoker serve` (with
/// `memory_args`) against the test's etcd, and a scheduler holding the action `work`; the
/// group `default` (1 to 3 invokers of 256 MB, a 3 s hold, `conservative`), with
/// `plane_keys` added to `[capacity.kubernetes]`.
#[cfg(feature = "kubernetes")]
struct KubeFleet {
    api: support::kube_api::FakeApiServer,
    manager: Invoker,
    scheduler: Arc<Invoker>,
    _dirs: [tempfile::TempDir; 3],
}

#[cfg(feature = "kubernetes")]
impl KubeFleet {
    async fn start(etcd: &EtcdServer, memory_args: &[&str], plane_keys: &str) -> KubeFleet {
        let api = support::kube_api::FakeApiServer::start().await;
        api.add_node("node-a", 64 * 1024);
        api.add_image("invoker:test");
        let (manager_dir, scheduler_dir, pods_dir) = (tempdir(), tempdir(), tempdir());
        let config_file = manager_dir.path().join("invoker.toml");
        let mut command = vec![env!("CARGO_BIN_EXE_invoker").to_string(), "serve".into(), "--config".into()];
        command.push(config_file.display().to_string());
        command.extend(["--etcd", "{etcd}", "--invoker-id", "$(POD_NAME)", "--tags={tags}"].map(String::from));
        command.extend(memory_args.iter().map(|a| a.to_string()));
        command.extend(["--listen", "127.0.0.1:0", "--data-dir"].map(String::from));
        command.push(pods_dir.path().join("$(POD_NAME)").display().to_string());
        let group = format!(
            "min = 1\nmax = 3\ninvoker_memory_mb = 256\nscale_down_after = \"3s\"\ndrain_deadline = \"20s\"\n\
             predictor = \"conservative\"\ncontrol_plane = \"kubernetes\"\n\
             [capacity.kubernetes]\napi_server = \"{}\"\nnamespace = \"invokers\"\nimage = \"invoker:test\"\n\
             termination_grace = \"20s\"\n{plane_keys}command = {}\n",
            api.url,
            json!(command)
        );
        let manager = start_manager(manager_dir.path(), &manager_config(etcd, &group));
        let scheduler = waiting_scheduler_with_work(etcd, scheduler_dir.path()).await;
        KubeFleet { api, manager, scheduler, _dirs: [manager_dir, scheduler_dir, pods_dir] }
    }
}

/// The burst of the first test through the Kubernetes control plane: the group is a StatefulSet
/// on the fake API server, whose controller makes a pod per ordinal and whose fake kubelet runs
/// each as a real `invoker serve` process against the test's etcd. The manager scales it through
/// its `scale` subresource, up for the burst and back down to `min` after it; the pods above
/// go (SIGTERM, as a kubelet ends a pod), the highest ordinals first.
#[cfg(feature = "kubernetes")]
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn the_burst_through_the_kubernetes_control_plane_scales_a_statefulset_up_and_back() {
    let Some(etcd) = EtcdServer::start() else { return };
    let KubeFleet { _dirs, api, manager, scheduler } = KubeFleet::start(&etcd, &["--memory-mb={memory_mb}"], "").await;
    let replicas = |api: &support::kube_api::FakeApiServer| {
        api.statefulset("invokers", "default").and_then(|s| s["spec"]["replicas"].as_u64())
    };
    wait_until(Duration::from_secs(30), "the StatefulSet at 1 and its pod's invoker registered", || {
        let (s, r) = (scheduler.clone(), replicas(&api));
        async move { r == Some(1) && registered(&s).await == BTreeSet::from(["default-0".to_string()]) }
    })
    .await;
    let template = api.statefulset("invokers", "default").unwrap()["spec"]["template"].clone();
    assert_eq!(template["spec"]["containers"][0]["resources"]["limits"]["memory"], "512Mi", "{template}");

    // Four activations of 2 s at once; each invoker holds one.
    let ran_on = burst_of_work(&scheduler, 4).await;
    assert!(ran_on.len() >= 2, "pods the manager asked for took work: {ran_on:?}");

    // Quiet: after scale_down_after the StatefulSet is back at 1, its pods above gone.
    wait_until(Duration::from_secs(60), "back to min: replicas 1, one pod, one invoker registered", || {
        let (s, m, r, pods) = (scheduler.clone(), &manager, replicas(&api), api.pods("invokers"));
        async move {
            let counts = capacity(m).await["groups"][0]["counts"].clone();
            r == Some(1)
                && pods.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>() == ["default-0"]
                && registered(&s).await.len() == 1
                && counts == json!({ "provisioning": 0, "active": 1, "draining": 0, "removing": 0 })
        }
    })
    .await;
    assert!(api.scale_changes() >= 2, "up and down through the scale subresource: {}", api.scale_changes());
    let actions = decisions(&manager).await;
    assert!(actions.iter().any(|a| a.starts_with("provision")), "{actions:?}");
    assert!(actions.contains(&"drain default-2".to_string()), "the highest ordinal went: {actions:?}");
    assert!(!actions.contains(&"drain default-0".to_string()), "never below min: {actions:?}");
}

/// `[capacity.kubernetes] standby` unset: two standby pods per group where the API server
/// serves pods' `resize` (its discovery lists `pods/resize`, as from Kubernetes 1.33) and the
/// invokers follow their pod's limit, none (a new pod per invoker, the 10 s lead) elsewhere; a
/// number set is taken as it is.
#[cfg(feature = "kubernetes")]
#[tokio::test(flavor = "multi_thread")]
async fn a_kubernetes_plane_keeps_standby_pods_where_its_cluster_can_resize_one() {
    use invoker_factory::settings::KubernetesPlaneConfig;
    use invoker_kubernetes::plane::KubernetesPlane;
    let groups = invoker::config::Config::from_toml("[capacity.groups.default]\ncontrol_plane = \"kubernetes\"\n")
        .unwrap()
        .capacity
        .groups;
    let standby_of = |api: &support::kube_api::FakeApiServer, standby: Option<u32>, follows: bool| {
        let mut config =
            KubernetesPlaneConfig { api_server: Some(api.url.clone()), standby, ..KubernetesPlaneConfig::default() };
        if !follows {
            config.command.retain(|a| !a.starts_with("--memory-limit-file"));
        }
        let groups = groups.clone();
        async move {
            let plane = KubernetesPlane::new(config, vec!["http://127.0.0.1:1".into()], groups).await.unwrap();
            (plane.standby(), plane.lead())
        }
    };
    let resizing = support::kube_api::FakeApiServer::start().await;
    assert_eq!(standby_of(&resizing, None, true).await, (2, Duration::from_millis(300)));
    assert_eq!(standby_of(&resizing, None, false).await, (0, Duration::from_secs(10)), "a command that cannot follow");
    assert_eq!(standby_of(&resizing, Some(0), true).await.0, 0);
    let older = support::kube_api::FakeApiServer::start().await;
    older.without_resize();
    assert_eq!(standby_of(&older, None, true).await, (0, Duration::from_secs(10)), "no resize served");
    assert_eq!(standby_of(&older, Some(3), true).await.0, 3, "as the config says");
}

/// The Kubernetes plane with standby pods: the StatefulSet runs two pods more than the invokers
/// wanted, at 32 MB, their invokers following their pod's memory limit and so out of the
/// cluster; a burst's invokers are those pods grown by an in-place resize (the fake's `resize`
/// subresource, its kubelet rewriting the container's `memory.max`), and the quiet after it
/// shrinks them back to standby, the StatefulSet back at the one invoker of `min` and two.
#[cfg(feature = "kubernetes")]
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn standby_pods_are_grown_for_a_burst_and_shrunk_back_after_it() {
    let Some(etcd) = EtcdServer::start() else { return };
    let follow = ["--memory-limit-file=/sys/fs/cgroup/memory.max", "--own-memory-mb={overhead_mb}"];
    // `standby` unset: the server serves pods' resize, so the plane keeps two.
    let standby = "overhead_mb = 64\nstandby_mb = 32\n";
    let KubeFleet { _dirs, api, manager, scheduler } = KubeFleet::start(&etcd, &follow, standby).await;
    let replicas = |api: &support::kube_api::FakeApiServer| {
        api.statefulset("invokers", "default").and_then(|s| s["spec"]["replicas"].as_u64())
    };
    let given = |api: &support::kube_api::FakeApiServer, pod: &str| api.pod_memory("invokers", pod).map(|(m, _)| m);
    wait_until(Duration::from_secs(30), "min's invoker grown and registered, two standby pods", || {
        let (s, r) = (scheduler.clone(), replicas(&api));
        let sizes: Vec<Option<String>> = (0..3).map(|i| given(&api, &format!("default-{i}"))).collect();
        async move {
            r == Some(3)
                && sizes == [Some("320Mi".into()), Some("32Mi".into()), Some("32Mi".into())]
                && registered(&s).await == BTreeSet::from(["default-0".to_string()])
        }
    })
    .await;
    let template = api.statefulset("invokers", "default").unwrap()["spec"]["template"].clone();
    assert_eq!(template["spec"]["containers"][0]["resources"]["limits"]["memory"], "32Mi", "{template}");
    assert_eq!(api.created_and_refused(), (3, 0), "min's pod grown in place, not made again");

    // Four activations of 2 s at once; each invoker holds one. The two standby pods become
    // invokers by a resize, and two new ones stand by behind them.
    let resized = api.resizes();
    let ran_on = burst_of_work(&scheduler, 4).await;
    assert!(ran_on.len() >= 2, "pods the manager grew took work: {ran_on:?}");
    assert!(api.resizes() >= resized + 2, "grown in place: {} resizes", api.resizes());

    // Quiet: after scale_down_after the invokers above min are shrunk back to standby, and the
    // StatefulSet keeps two of them beside min's.
    wait_until(Duration::from_secs(60), "back to min: one invoker, two pods standing by", || {
        let (s, m, r) = (scheduler.clone(), &manager, replicas(&api));
        let sizes: Vec<Option<String>> = (0..3).map(|i| given(&api, &format!("default-{i}"))).collect();
        let pods = api.pods("invokers").len();
        async move {
            let counts = capacity(m).await["groups"][0]["counts"].clone();
            r == Some(3)
                && pods == 3
                && sizes == [Some("320Mi".into()), Some("32Mi".into()), Some("32Mi".into())]
                && registered(&s).await.len() == 1
                && counts == json!({ "provisioning": 0, "active": 1, "draining": 0, "removing": 0 })
        }
    })
    .await;
    let actions = decisions(&manager).await;
    assert!(actions.iter().any(|a| a.starts_with("provision")), "{actions:?}");
    assert!(!actions.contains(&"drain default-0".to_string()), "never below min: {actions:?}");
    // Shrunk in place: none of the five pods was made again.
    assert_eq!(api.created_and_refused(), (5, 0), "{actions:?}");
}
