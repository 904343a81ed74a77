//! How the process factory starts action processes faster than by running an interpreter from
//! nothing: the python zygote (the default for `python:3`), containers whose action process was
//! forked from a warm interpreter, with the isolation of a spawned one; and node started from a
//! startup snapshot of its launcher (`[kinds] snapshot`).

mod support;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::Duration;
use support::{alive, python, wait_gone, Invoker};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-zygote-").tempdir().unwrap()
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

/// What an action sees of itself: its pid, parent, process group, cgroups, uid, environment,
/// open descriptors and a random draw.
const SELF: &str = "import os, random, time\nopened = []\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    if a.get('secret'):\n        os.environ['SECRET'] = a['secret']\n        opened.append(open('/tmp/secret', 'w'))\n    return {'pid': os.getpid(), 'ppid': os.getppid(), 'pgrp': os.getpgrp(), 'sid': os.getsid(0), 'uid': os.getuid(), 'cgroup': open('/proc/self/cgroup').read(), 'secret': os.environ.get('SECRET'), 'fds': sorted(int(f) for f in os.listdir('/proc/self/fd') if os.path.lexists('/proc/self/fd/' + f)), 'random': random.random(), 'env': sorted(os.environ)}\n";

/// The zygote's pid, as the factory records it.
fn zygote_pid(inv: &Invoker) -> u32 {
    let file = inv.dir.join("data/processes").join(&inv.invoker_id).join("zygote.pid");
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())).trim().parse().unwrap()
}

/// The zygote's children that are no container's launcher: the spare it forked ahead for the
/// next request (`zygote.py`'s `fork_spare`), waiting on its pipe.
fn spares(zygote: u32, launchers: &[u32]) -> Vec<u32> {
    let children = std::fs::read_to_string(format!("/proc/{zygote}/task/{zygote}/children")).unwrap_or_default();
    children.split_whitespace().filter_map(|p| p.parse().ok()).filter(|p| !launchers.contains(p)).collect()
}

async fn run(inv: &Invoker, name: &str, params: Value) -> Value {
    let (status, record) = inv.invoke(name, "blocking=true", params).await;
    assert_eq!(status, 200, "{record}");
    record["response"]["result"].clone()
}

fn pid_of(v: &Value, key: &str) -> u32 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key}: {v}")) as u32
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forked_container_has_its_own_pid_cgroup_group_and_uid_and_nothing_of_another() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("zfork"), "");
    let zygote = zygote_pid(&inv);
    inv.put_action("a", python(SELF)).await;
    inv.put_action("b", python(SELF)).await;
    let a = run(&inv, "a", json!({"secret": "of a"})).await;
    let b = run(&inv, "b", json!({})).await;
    for seen in [&a, &b] {
        assert_eq!(pid_of(seen, "ppid"), zygote, "forked from the zygote: {seen}");
        assert_ne!(pid_of(seen, "pgrp"), zygote, "not in the zygote's process group");
        assert_ne!(pid_of(seen, "pgrp"), pid_of(seen, "pid"), "in its container's group (the runtime's)");
        assert!(seen["uid"].as_u64().unwrap() >= 100_000, "its container's uid: {seen}");
        let cgroup = seen["cgroup"].as_str().unwrap();
        assert!(cgroup.contains(&format!("invoker-{}/c", inv.invoker_id)), "its container's cgroups: {cgroup}");
    }
    assert_eq!(a["fds"], json!([0, 1, 2, 3, 4]), "its own file and nothing of the zygote's: {a}");
    assert_eq!(b["fds"], json!([0, 1, 2, 3]), "nothing of the zygote's or of a's: {b}");
    assert_ne!(a["pgrp"], b["pgrp"]);
    assert_ne!(a["cgroup"], b["cgroup"]);
    assert_eq!(a["secret"], "of a");
    assert_eq!(b["secret"], Value::Null, "nothing of a's environment");
    let b = run(&inv, "b", json!({})).await;
    assert_eq!(b["fds"], json!([0, 1, 2, 3]), "nor a's open files: {b}");
    let env: Vec<&str> = b["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(
        !env.iter().any(|k| k.starts_with("CARGO") || *k == "USER" || *k == "SECRET"),
        "a fresh environment: {env:?}"
    );
    assert!(env.contains(&"__OW_ACTIVATION_ID") && env.contains(&"PATH"), "{env:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_containers_of_one_action_draw_different_random_numbers() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("zrandom"), "");
    let zygote = zygote_pid(&inv);
    inv.put_action("r", python(SELF)).await;
    let slow = json!({"sleep": 0.5});
    let (a, b) = tokio::join!(run(&inv, "r", slow.clone()), run(&inv, "r", slow));
    assert_ne!(a["pid"], b["pid"], "two containers");
    assert_eq!((pid_of(&a, "ppid"), pid_of(&b, "ppid")), (zygote, zygote), "both forked");
    assert_ne!(a["random"], b["random"], "re-seeded after the fork");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_zygote_is_started_again_and_what_it_forked_keeps_running() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("zkill"), "");
    let first = zygote_pid(&inv);
    inv.put_action("warm", python(SELF)).await;
    let before = run(&inv, "warm", json!({})).await;
    assert_eq!(pid_of(&before, "ppid"), first);
    let launcher = pid_of(&before, "pid");
    let spare = support::eventually(Duration::from_secs(5), "one spare waits for the next request", || async {
        let spare = spares(first, &[launcher]);
        if spare.len() == 1 {
            Ok(spare)
        } else {
            Err(format!("{spare:?}"))
        }
    })
    .await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), Signal::SIGKILL).unwrap();
    assert_eq!(wait_gone(&[first], Duration::from_secs(5)), Vec::<u32>::new());
    assert_eq!(wait_gone(&spare, Duration::from_secs(5)), Vec::<u32>::new(), "the spare goes with its zygote");

    let after = run(&inv, "warm", json!({})).await;
    assert_eq!(after["pid"], before["pid"], "the container forked before still runs, warm");
    inv.put_action("cold", python(SELF)).await;
    let cold = run(&inv, "cold", json!({})).await;
    let second = zygote_pid(&inv);
    assert_ne!(second, first, "a new zygote");
    assert_eq!(pid_of(&cold, "ppid"), second, "the next cold start is forked from it");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invoker_killed_leaves_no_zygote_and_no_fork() {
    let dir = tempdir();
    let mut inv = Invoker::start(dir.path(), &id("zcrash"), "");
    let zygote = zygote_pid(&inv);
    inv.put_action("a", python(SELF)).await;
    let a = run(&inv, "a", json!({})).await;
    let forked = [pid_of(&a, "pid"), pid_of(&a, "pgrp")];
    assert!(alive(zygote) && forked.iter().all(|&p| alive(p)));
    let spare = spares(zygote, &forked);
    inv.signal(Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    let left = wait_gone(&[&[zygote, forked[0], forked[1]], &spare[..]].concat(), Duration::from_secs(10));
    assert_eq!(left, Vec::<u32>::new(), "the zygote, its spare, the forked launcher and its runtime are gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_zygote_off_the_runtime_starts_the_interpreter_itself() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("zoff"), "[kinds.\"python:3\"]\ncommand = [\"{invoker}\", \"action-runtime\", \"--listen\", \"{listen}\", \"--launcher\", \"python\"]\nzygote = false\n");
    inv.put_action("a", python(SELF)).await;
    let a = run(&inv, "a", json!({})).await;
    assert_eq!(a["ppid"], a["pgrp"], "a child of its runtime, which leads the container's group: {a}");
    assert!(!inv.dir.join("data/processes").join(&inv.invoker_id).join("zygote.pid").exists(), "no zygote");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forked_launcher_whose_result_is_too_large_is_gone_and_the_next_run_gets_another() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("zdrop"), "");
    let zygote = zygote_pid(&inv);
    // A result past the runtime's 64 MB bound: the runtime stops reading and drops the process.
    let code = "import os\ndef main(a):\n    if a.get('big'):\n        return {'x': 'y' * (65 * 1024 * 1024)}\n    return {'pid': os.getpid(), 'ppid': os.getppid()}\n";
    let mut action = python(code);
    action["limits"] = json!({"memory": 512});
    inv.put_action("big", action).await;
    let first = run(&inv, "big", json!({})).await;
    assert_eq!(pid_of(&first, "ppid"), zygote, "forked");
    let (status, record) = inv.invoke("big", "blocking=true", json!({"big": true})).await;
    assert_eq!(status, 502, "{record}");
    let forked = pid_of(&first, "pid");
    assert_eq!(wait_gone(&[forked], Duration::from_secs(5)), Vec::<u32>::new(), "the dropped launcher is gone");
    let next = run(&inv, "big", json!({})).await;
    assert_ne!(pid_of(&next, "pid"), forked);
}

/// What a node action sees of itself: how node was started, whether it can write the snapshot,
/// a random draw; it logs a line.
const NODE_SELF: &str = "const fs = require('fs');\nconst os = require('os');\nasync function main(a) {\n  console.log('from the snapshot', a.name);\n  await new Promise((r) => setTimeout(r, a.sleep || 0));\n  let wrote = 'written';\n  try { fs.appendFileSync(process.execArgv[1], 'x'); } catch (e) { wrote = e.code; }\n  return {argv: process.execArgv, random: Math.random(), uid: process.getuid(), name: a.name, os: typeof os.hostname(), wrote};\n}\n";

#[tokio::test(flavor = "multi_thread")]
async fn node_started_from_the_launchers_snapshot_runs_the_action_and_draws_its_own_random_numbers() {
    let dir = tempdir();
    let config = "[kinds.\"nodejs:20\"]\ncommand = [\"{invoker}\", \"action-runtime\", \"--listen\", \"{listen}\", \"--launcher\", \"nodejs\"]\nsnapshot = true\n";
    let inv = Invoker::start(dir.path(), &id("zsnap"), config);
    let code = json!({"exec": {"kind": "nodejs:20", "code": NODE_SELF}});
    inv.put_action("n", code).await;
    let params = |name: &str| json!({"name": name, "sleep": 500});
    let (a, b) =
        tokio::join!(inv.invoke("n", "blocking=true", params("a")), inv.invoke("n", "blocking=true", params("b")));
    for (status, record) in [&a, &b] {
        assert_eq!(*status, 200, "{record}");
        let result = &record["response"]["result"];
        assert_eq!(result["argv"][0], "--snapshot-blob", "started from the snapshot: {result}");
        assert_eq!(result["os"], "string", "the action's require loads any module: {result}");
        assert!(result["wrote"] == "EROFS" || result["wrote"] == "EACCES", "the snapshot is read-only: {result}");
        assert!(result["uid"].as_u64().unwrap() >= 100_000, "its container's uid: {result}");
        let logs = record["logs"].to_string();
        assert!(logs.contains(&format!("from the snapshot {}", result["name"].as_str().unwrap())), "{logs}");
    }
    let (a, b) = (&a.1["response"]["result"], &b.1["response"]["result"]);
    assert_eq!((&a["name"], &b["name"]), (&json!("a"), &json!("b")));
    assert_ne!(a["random"], b["random"], "V8 seeds Math.random again when it deserializes the heap");
}
