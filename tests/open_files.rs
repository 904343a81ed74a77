//! The invoker raises its own soft limit of open files to the hard one (a few hundred
//! containers would exhaust 1,024), and its containers do not inherit that: each gets 1,024.
//! A file of its own: the test lowers its process's soft limit, which its invoker inherits.

mod support;

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use serde_json::json;
use support::{python, Invoker};

/// The soft and hard "Max open files" of process `pid`, from `/proc/<pid>/limits`.
fn open_files_of(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_invoker_raises_its_soft_limit_of_open_files_and_its_containers_get_their_own() {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if hard <= 256 {
        eprintln!("skipped: the hard limit of open files is {hard}");
        return;
    }
    setrlimit(Resource::RLIMIT_NOFILE, 256, hard).unwrap();
    let dir = tempfile::Builder::new().prefix("invoker-nofile-").tempdir().unwrap();
    let inv = Invoker::start(dir.path(), &format!("nofile-{}", std::process::id()), "");
    let (soft, hard_seen) = open_files_of(inv.child.id());
    assert_eq!(soft, hard_seen, "the soft limit was raised to the hard one");
    assert_eq!(soft, hard.to_string());

    let code =
        "import resource\ndef main(a):\n    return {'nofile': list(resource.getrlimit(resource.RLIMIT_NOFILE))}\n";
    inv.put_action("limits", python(code)).await;
    let (status, record) = inv.invoke("limits", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    let expected = 1024.min(hard);
    assert_eq!(record["response"]["result"]["nofile"], json!([expected, expected]), "{record}");
}
