//! `invoker replay` end to end, on a short slice: the 50-function sample's first three minutes at
//! 60× (three seconds of calls) through a live cluster of its own (etcd, a scheduler, the
//! capacity manager and its invokers on the process factory), then the simulator on the same
//! calls. Every call is answered, both verdicts are printed side by side, and nothing the replay
//! started outlives it. Skipped with a message when no `etcd` binary is installed; under
//! `CI=true` that fails instead.

use serde_json::Value;
use std::path::Path;

/// The processes whose command line names `dir`.
fn processes_naming(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!("{}: {cmdline}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

#[test]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
fn a_short_slice_replayed_through_a_live_cluster_beside_the_simulator() {
    let work = tempfile::Builder::new().prefix("irt-").tempdir_in("/tmp").unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/replay-50.toml");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_invoker"))
        .args(["replay", "--factor", "60", "--minutes", "3", "--max-calls", "80", "--scenario"])
        .arg(&scenario)
        .arg("--work-dir")
        .arg(work.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the replay failed: {stderr}");
    let verdict: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let row = |figure: &str| {
        let row = verdict["rows"].as_array().unwrap().iter().find(|r| r["figure"] == figure).unwrap();
        (row["replay"].as_f64().unwrap(), row["simulator"].as_f64().unwrap())
    };
    let calls = verdict["calls"].as_u64().unwrap() as f64;
    assert!(calls > 0.0, "{verdict}");
    // Every call ended: answered with a record or refused, on both sides; none failed.
    for side in [0, 1] {
        let pick = |(real, simulated): (f64, f64)| if side == 0 { real } else { simulated };
        assert_eq!(pick(row("calls")), calls, "{verdict}");
        assert_eq!(pick(row("completed")) + pick(row("refused")), calls, "{verdict}");
        assert_eq!(pick(row("failed")), 0.0, "{verdict}");
    }
    // The real fleet started invokers (the group's min is 0), and both sides counted them.
    assert!(row("invoker-seconds").0 > 0.0 && row("invoker-seconds").1 > 0.0, "{verdict}");
    assert!(verdict["measured"]["invoker_start_ms"].as_u64().unwrap() > 0, "{verdict}");
    assert!(stderr.contains("invoker-seconds"), "the side-by-side table is printed: {stderr}");
    // Nothing it started is left: no etcd, scheduler, manager, invoker or container.
    assert_eq!(processes_naming(work.path()), Vec::<String>::new());
}
