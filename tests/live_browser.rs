//! The live view in a real browser: headless Chromium (Debian's) driven by playwright-core
//! (`tests/ui/live_view.mjs`, installed by `scripts/browser.sh`) against the real binary on its
//! mock factory, with 2,000 containers that start, run, go warm, run again and go away; the
//! page is checked through its DOM at each step, and its size and update cost measured. The
//! screenshots go to `target/ui-screenshots/` (docs/ui's are copies, shown in docs/observability.md).

mod support;

use serde_json::Value;
use std::process::Command;
use support::{Invoker, GUEST};

const CONTAINERS: u64 = 2000;

fn browser_ready() -> bool {
    let ready = std::path::Path::new("/usr/bin/chromium").exists()
        && std::path::Path::new("tests/ui/node_modules/playwright-core").exists();
    if !ready {
        assert!(
            std::env::var("CI").is_err(),
            "no chromium or playwright-core under CI: scripts/browser.sh installs them"
        );
        eprintln!("skipped: no chromium or playwright-core (scripts/browser.sh installs them)");
    }
    ready
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_follows_2000_containers_through_their_lives_in_headless_chromium() {
    if !browser_ready() {
        return;
    }
    let dir = tempfile::Builder::new().prefix("invoker-ui-").tempdir().unwrap();
    let config = "[factory]\nkind = \"mock\"\n[factory.mock]\nnodes = 8\nnode_memory_mb = 32768\n\
                  [limits]\nnamespace_concurrent = 5000\n[proxy]\npause_grace = \"0s\"\n\
                  [pool]\nkeep_alive = \"fixed\"\nidle_timeout = \"10m\"\n";
    let invoker = Invoker::start(dir.path(), &format!("ui-{}", std::process::id()), config);
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("../ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let base = invoker.base.clone();
    let (admin, shots_arg) = (invoker.admin.clone(), shots.to_string_lossy().into_owned());
    let run = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg("tests/ui/live_view.mjs")
            .args([&base, &admin, GUEST, &CONTAINERS.to_string(), &shots_arg])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{stdout}\n{stderr}\n{}", invoker.stderr());
    let out: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    eprintln!("the live view: {out}");

    assert_eq!(out["key_left_the_url"], true, "the key is taken out of the address: {out}");
    assert_eq!(out["busy"], CONTAINERS, "{out}");
    assert_eq!(out["warm"], CONTAINERS, "{out}");
    assert_eq!((out["groups"].as_u64(), out["node_bars"].as_u64()), (Some(20), Some(8)), "{out}");
    let title = out["titles_say_kept_until"].as_str().unwrap_or_default();
    assert!(title.contains("idle") && title.contains("kept until"), "{out}");
    assert_eq!(out["last_starts"], serde_json::json!(["warm", "warm", "warm", "warm", "warm"]), "{out}");
    assert_eq!(out["gone"], 0, "{out}");
    assert_eq!(out["errors"], serde_json::json!([]), "no error in the page: {out}");
    // Size and update cost: every container's changes reached the page as events, each a few
    // hundred bytes; a new viewer's snapshot holds all of them.
    let events = out["events"].as_u64().unwrap();
    assert!(events >= 3 * CONTAINERS, "start, busy and warm for each: {out}");
    assert!(out["bytes"].as_u64().unwrap() / events < 1024, "{out}");
    assert_eq!(out["snapshot_containers"], CONTAINERS, "{out}");
    for shot in ["busy.png", "warm.png"] {
        assert!(shots.join(shot).metadata().unwrap().len() > 10_000, "{shot}");
    }
}
