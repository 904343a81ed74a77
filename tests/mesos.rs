//! The Mesos factory against a fake master that speaks the real v1 scheduler HTTP API (see
//! `mesos_master`): the real `invoker` binary subscribes to it, turns its offers into node
//! stats, launches tasks that run the project's runtime as local processes on the offered
//! ports, and runs activations on them end to end.

mod mesos_master;
mod support;

use mesos_master::{AgentSpec, FakeMaster};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
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

/// A first port per test, so that tests running at once never offer the same ports.
fn ports(test: u64) -> u64 {
    20_000 + (std::process::id() as u64 % 200) * 200 + test * 40
}

fn mesos_config(master: &FakeMaster, extra: &str) -> String {
    format!(
        "[factory]\nkind = \"mesos\"\n[factory.mesos]\nmaster = \"{}\"\nlisten_host = \"127.0.0.1\"\n\
         offer_hold = \"2s\"\nrefuse = \"1s\"\nsuppress_after = \"3s\"\nlaunch_timeout = \"20s\"\n\
         kill_timeout = \"5s\"\n{extra}",
        master.url(0)
    )
}

async fn wait_for(what: &str, deadline: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
