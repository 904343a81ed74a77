//! The Mesos factory against a fake master that speaks the real v1 scheduler HTTP API (see
//! `mesos_master`): the real `invoker` binary subscribes to it, turns its offers into node
//! stats, launches tasks that run the project's runtime as local processes on the offered
//! ports, and runs activations on them end to end.

mod mesos_master;
mod support;

use mesos_master::{AgentSpec, FakeMaster};
use serde_json::{json, Value};
use std::time::Duration;
use support::{python, Invoker};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-mesos-").tempdir().unwrap()
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

fn agent(id: &'static str, mem_mb: f64, first_port: u64) -> AgentSpec {
    AgentSpec { id, cpus: 4.0, mem_mb, ports: (first_port, first_port + 19) }
}

/// The first of the 40 ports test `test` offers (tests running at once never offer the same
/// ports), below the kernel's ephemeral range (32768 up):
/// a port there may be taken by any outgoing connection of this machine meanwhile (a runtime that
/// cannot bind its port fails its task, as one did in CI).
fn ports(test: u64) -> u64 {
    20_000 + (std::process::id() as u64 % 60) * 200 + test * 40
}

fn mesos_config(master: &FakeMaster, extra: &str) -> String {
    format!(
        "[factory]\nkind = \"mesos\"\n[factory.mesos]\nmaster = \"{}\"\nlisten_host = \"127.0.0.1\"\n\
         offer_hold = \"2s\"\nrefuse = \"1s\"\nsuppress_after = \"3s\"\nlaunch_timeout = \"20s\"\n\
         kill_timeout = \"5s\"\n{extra}",
        master.url(0)
    )
}

async fn wait_for(what: &str, bound: Duration, mut check: impl FnMut() -> bool) {
    support::eventually(bound, what, || std::future::ready(support::done(check()))).await
}

/// Polls the invoker's `/v1/pool` until `check` holds for it (20 s at most).
async fn wait_for_pool(inv: &Invoker, what: &str, check: impl Fn(&Value) -> bool) {
    support::eventually(Duration::from_secs(20), what, || async {
        let (_, pool) = inv.get_url("/v1/pool").await;
        if check(&pool) {
            Ok(())
        } else {
            Err(pool.to_string())
        }
    })
    .await
}

fn no_containers(pool: &Value) -> bool {
    pool["containers"].as_array().is_some_and(|cs| cs.is_empty())
}

fn statuses(answers: &[(u16, Value)]) -> (usize, usize) {
    for (status, record) in answers {
        assert!(*status == 200 || *status == 503, "{status}: {record}");
    }
    let done = answers.iter().filter(|(s, _)| *s == 200).count();
    (done, answers.len() - done)
}

#[tokio::test(flavor = "multi_thread")]
async fn activations_run_on_tasks_and_a_burst_never_launches_beyond_the_offers() {
    let base = ports(0);
    let master = FakeMaster::start(
        vec![agent("agent-a", 600.0, base), agent("agent-b", 600.0, base + 20)],
        Duration::from_millis(200),
    )
    .await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("ms-burst"), &mesos_config(&master, "[pool]\nwait_deadline = \"30s\"\n"));
    for i in 0..3 {
        let mut action = python("import time\ndef main(a):\n    time.sleep(0.2)\n    return {'i': a['i']}\n");
        action["limits"] = json!({"memory": 256});
        inv.put_action(&format!("m{i}"), action).await;
    }
    let (status, first) = inv.invoke("m0", "blocking=true", json!({"i": -1})).await;
    assert_eq!(status, 200, "{first}\n{}", inv.stderr());
    assert_eq!(first["response"]["result"], json!({"i": -1}));

    // Memory for two 256 MB tasks per agent, four in all: 30 calls over 3 actions.
    let calls = (0..30).map(|i| inv.invoke(["m0", "m1", "m2"][i % 3], "blocking=true", json!({"i": i})));
    let answers = futures_util::future::join_all(calls).await;
    let (done, rejected) = statuses(&answers);
    assert!(done > 0, "some ran: {rejected} got 503");
    let counts = master.counts();
    assert_eq!(counts.refused, 0, "every ACCEPT held within its offers: {counts:?}");
    assert!(master.within_capacity());
    assert!(counts.launched <= 4 + counts.kills, "{counts:?}");
    assert!(counts.acknowledged > 0, "status updates with a uuid are acknowledged");

    // Idle: the held offers are declined and the framework suppresses.
    wait_for("suppress", Duration::from_secs(20), || master.counts().suppresses > 0).await;
    assert!(master.counts().declined_offers > 0, "unused offers are declined: {:?}", master.counts());
    // Work for a new action revives it.
    let mut action = python("def main(a):\n    return {'late': True}\n");
    action["limits"] = json!({"memory": 128});
    inv.put_action("late", action).await;
    let (status, late) = inv.invoke("late", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, &late), (200, &json!({"late": true})), "{}", inv.stderr());
    assert!(master.counts().revives > 0);
    assert_eq!(master.counts().refused, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_master_failover_and_a_dropped_stream_lose_no_activation() {
    let base = ports(1);
    let master = FakeMaster::start(vec![agent("agent-a", 1024.0, base)], Duration::from_millis(200)).await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("ms-failover"), &mesos_config(&master, ""));
    inv.put_action("echo", python("def main(a):\n    return {'n': a['n']}\n")).await;
    let (status, body) = inv.invoke("echo", "blocking=true&result=true", json!({"n": 1})).await;
    assert_eq!((status, &body), (200, &json!({"n": 1})), "{}", inv.stderr());

    master.fail_over();
    wait_for("a subscription on the new leader", Duration::from_secs(20), || master.counts().subscribes >= 2).await;
    let (status, body) = inv.invoke("echo", "blocking=true&result=true", json!({"n": 2})).await;
    assert_eq!((status, &body), (200, &json!({"n": 2})), "the warm task still serves");

    master.drop_stream();
    wait_for("a third subscription", Duration::from_secs(20), || master.counts().subscribes >= 3).await;
    let mut action = python("def main(a):\n    return {'fresh': True}\n");
    action["limits"] = json!({"memory": 128});
    inv.put_action("fresh", action).await;
    let (status, body) = inv.invoke("fresh", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, &body), (200, &json!({"fresh": true})), "a new task after the stream came back");
    assert_eq!(master.counts().refused, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rescinded_offer_is_never_used() {
    let base = ports(2);
    let master = FakeMaster::start(vec![agent("agent-a", 1024.0, base)], Duration::from_millis(200)).await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("ms-rescind"), &mesos_config(&master, ""));
    inv.put_action("echo", python("def main(a):\n    return {'n': a['n']}\n")).await;
    wait_for("an offer", Duration::from_secs(20), || master.counts().offers_sent > 0).await;
    master.pause_offers(true);
    assert!(master.rescind_all() > 0, "the offer the invoker holds");
    // The rescind reaches the invoker on its event stream: wait until its pool sees no room.
    wait_for_pool(&inv, "the invoker to stop counting the rescinded offer", |pool| {
        let free: Vec<u64> =
            pool["nodes"].as_array().into_iter().flatten().filter_map(|n| n["free_mb"].as_u64()).collect();
        !free.is_empty() && free.iter().all(|&f| f == 0)
    })
    .await;
    let call = inv.invoke("echo", "blocking=true&result=true", json!({"n": 1}));
    let resume = async {
        // A window: the call waits a second without offers, then they come back.
        tokio::time::sleep(Duration::from_secs(1)).await;
        master.pause_offers(false);
    };
    let ((status, body), ()) = tokio::join!(call, resume);
    assert_eq!((status, &body), (200, &json!({"n": 1})), "{}", inv.stderr());
    let counts = master.counts();
    assert_eq!(counts.refused, 0, "the rescinded offer was not accepted: {counts:?}");
    assert!(counts.offers_sent >= 2, "the task went out with a later offer");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_agents_activation_gets_a_clear_record_and_its_container_is_replaced() {
    let base = ports(3);
    let master = FakeMaster::start(
        vec![agent("agent-a", 512.0, base), agent("agent-b", 512.0, base + 20)],
        Duration::from_millis(200),
    )
    .await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("ms-lost"), &mesos_config(&master, ""));
    inv.put_action(
        "slow",
        python("import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'ok': True}\n"),
    )
    .await;
    assert_eq!(inv.invoke("slow", "blocking=true", json!({})).await.0, 200, "{}", inv.stderr());
    let running = master.running();
    assert_eq!(running.values().sum::<usize>(), 1, "{running:?}");
    let lost = running.keys().next().unwrap().clone();

    let in_flight = inv.invoke("slow", "blocking=true", json!({"sleep": 5}));
    let lose = async {
        // The fault's time: 1.5 s into the 5 s run.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        master.lose_agent(&lost);
    };
    let ((status, record), ()) = tokio::join!(in_flight, lose);
    assert_eq!(status, 502, "the activation on the lost agent fails clearly: {record}");
    assert_eq!(record["response"]["statusCode"], 2, "{record}");
    assert!(record["activationId"].is_string(), "it has a record: {record}");

    let (status, body) = inv.invoke("slow", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "a new container on the other agent: {body}");
    let running = master.running();
    assert!(!running.contains_key(&lost) && running.values().sum::<usize>() == 1, "{running:?}");
    assert_eq!(master.counts().refused, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_fails_to_start_releases_its_memory() {
    let base = ports(4);
    let master = FakeMaster::start(vec![agent("agent-a", 300.0, base)], Duration::from_millis(200)).await;
    let dir = tempdir();
    let broken = "[kinds.\"broken\"]\ncommand = [\"/nonexistent/runtime\", \"{listen}\"]\n";
    let inv = Invoker::start(dir.path(), &id("ms-fail"), &mesos_config(&master, broken));
    inv.put_action("bad", json!({"exec": {"kind": "broken", "code": "x"}, "limits": {"memory": 256}})).await;
    let mut good = python("def main(a):\n    return {'ok': True}\n");
    good["limits"] = json!({"memory": 256});
    inv.put_action("good", good).await;

    let (status, record) = inv.invoke("bad", "blocking=true", json!({})).await;
    assert!(status >= 500, "{status}: {record}");
    // Room for one 256 MB task on the agent: only if the failed launch gave its memory back.
    let (status, body) = inv.invoke("good", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, &body), (200, &json!({"ok": true})), "{}", inv.stderr());
    assert_eq!(master.counts().refused, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_invoker_subscribes_as_the_same_framework_and_kills_its_earlier_tasks() {
    let base = ports(5);
    let master = FakeMaster::start(vec![agent("agent-a", 1024.0, base)], Duration::from_millis(200)).await;
    let dir = tempdir();
    let invoker_id = id("ms-restart");
    let mut inv = Invoker::start(dir.path(), &invoker_id, &mesos_config(&master, ""));
    inv.put_action("echo", python("def main(a):\n    return {}\n")).await;
    assert_eq!(inv.invoke("echo", "blocking=true", json!({})).await.0, 200, "{}", inv.stderr());
    let earlier = master.task_ids();
    assert_eq!(master.running().values().sum::<usize>(), 1);
    inv.signal(nix::sys::signal::Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    assert_eq!(master.running().values().sum::<usize>(), 1, "a SIGKILL leaves the task running");

    let again = Invoker::start(dir.path(), &invoker_id, &mesos_config(&master, ""));
    wait_for("the earlier task killed", Duration::from_secs(20), || master.running().is_empty()).await;
    let counts = master.counts();
    assert_eq!(counts.subscribes, 2);
    assert!(counts.reconciles >= 2 && counts.kills >= 1, "{counts:?}");
    assert_eq!(master.frameworks(), 1, "the same framework id both times");
    assert_eq!(again.invoke("echo", "blocking=true", json!({})).await.0, 200);
    assert!(master.task_ids().len() > earlier.len(), "a new task for the new run");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_container_on_a_lost_agent_is_removed_before_work_reaches_it() {
    let base = ports(6);
    let master = FakeMaster::start(
        vec![agent("agent-a", 512.0, base), agent("agent-b", 512.0, base + 20)],
        Duration::from_millis(200),
    )
    .await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("ms-idle-lost"), &mesos_config(&master, ""));
    inv.put_action("echo", python("def main(a):\n    return {'n': a['n']}\n")).await;
    assert_eq!(inv.invoke("echo", "blocking=true", json!({"n": 0})).await.0, 200, "{}", inv.stderr());
    let lost = master.running().keys().next().unwrap().clone();
    master.lose_agent(&lost);
    wait_for_pool(&inv, "the lost container to leave the pool", no_containers).await;
    let (status, body) = inv.invoke("echo", "blocking=true&result=true", json!({"n": 1})).await;
    assert_eq!((status, &body), (200, &json!({"n": 1})), "a new container elsewhere, no failed activation");
    assert!(!master.running().contains_key(&lost));
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_offers_of_one_agent_are_combined_for_a_task_that_needs_more_than_one() {
    let base = ports(7);
    let master = FakeMaster::start(vec![agent("agent-a", 1024.0, base)], Duration::from_millis(200)).await;
    master.cap_offers(300.0);
    let dir = tempdir();
    // Offers never show the agent whole: its capacity comes from the configuration.
    let inv = Invoker::start(dir.path(), &id("ms-partial"), &mesos_config(&master, "agent_capacity_mb = 1024\n"));
    let mut big = python("def main(a):\n    return {'big': True}\n");
    big["limits"] = json!({"memory": 512});
    inv.put_action("big", big).await;
    let (status, body) = inv.invoke("big", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, &body), (200, &json!({"big": true})), "{}", inv.stderr());
    let counts = master.counts();
    assert_eq!(counts.refused, 0, "{counts:?}");
    assert!(counts.offers_sent >= 2, "512 MB came from two offers of at most 300: {counts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_fails_while_idle_is_replaced_and_a_failover_does_not_break_a_running_activation() {
    let base = ports(8);
    let master = FakeMaster::start(vec![agent("agent-a", 1024.0, base)], Duration::from_millis(200)).await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("ms-task-fail"), &mesos_config(&master, ""));
    inv.put_action(
        "slow",
        python("import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'n': a['n']}\n"),
    )
    .await;
    assert_eq!(inv.invoke("slow", "blocking=true", json!({"n": 0})).await.0, 200, "{}", inv.stderr());
    let first = master.task_ids();
    master.fail_task(&first[0]);
    wait_for("the failed task out of the pool", Duration::from_secs(20), || master.running().is_empty()).await;
    wait_for_pool(&inv, "the failed task's container to leave the pool", no_containers).await;
    let (status, body) = inv.invoke("slow", "blocking=true&result=true", json!({"n": 1})).await;
    assert_eq!((status, &body), (200, &json!({"n": 1})), "a new task took over");

    // An activation runs on its task while the master fails over: it is not disturbed.
    let running = inv.invoke("slow", "blocking=true&result=true", json!({"n": 2, "sleep": 2}));
    let fail_over = async {
        // The fault's time: half a second into the 2 s run.
        tokio::time::sleep(Duration::from_millis(500)).await;
        master.fail_over();
    };
    let ((status, body), ()) = tokio::join!(running, fail_over);
    assert_eq!((status, &body), (200, &json!({"n": 2})), "{}", inv.stderr());
    wait_for("a subscription on the new leader", Duration::from_secs(20), || master.counts().subscribes >= 2).await;
    assert_eq!(master.counts().refused, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn missed_heartbeats_make_the_invoker_subscribe_again() {
    let base = ports(9);
    let master = FakeMaster::start(vec![agent("agent-a", 1024.0, base)], Duration::from_millis(200)).await;
    let dir = tempdir();
    // The fake master beats every second: two missed, and the invoker subscribes again.
    let inv = Invoker::start(dir.path(), &id("ms-heartbeat"), &mesos_config(&master, "heartbeat_misses = 2\n"));
    wait_for("a subscription", Duration::from_secs(20), || master.counts().subscribes == 1).await;
    master.go_silent();
    wait_for("a second subscription", Duration::from_secs(20), || master.counts().subscribes >= 2).await;
    inv.put_action("echo", python("def main(a):\n    return {'n': a['n']}\n")).await;
    let (status, body) = inv.invoke("echo", "blocking=true&result=true", json!({"n": 1})).await;
    assert_eq!((status, &body), (200, &json!({"n": 1})), "{}", inv.stderr());
    assert!(inv.stderr().contains("subscribing again"), "{}", inv.stderr());
}
