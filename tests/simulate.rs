//! The shipped scenarios, run through the simulator (the pool core in virtual time): counts
//! only, never wall-clock times.

use invoker::sim::scenario::Scenario;
use serde_json::Value;
use std::path::Path;

fn run(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(format!("{name}.toml"));
    invoker::sim::run(&Scenario::load(&path).unwrap()).unwrap()
}

fn count(summary: &Value, key: &str) -> u64 {
    summary[key].as_u64().unwrap_or_else(|| panic!("{key} missing in {summary}"))
}

#[test]
fn overprovision_never_places_beyond_the_cluster_and_loses_nothing() {
    let s = run("overprovision");
    assert_eq!(count(&s, "launches_refused_by_cluster"), 0, "{s}");
    assert_eq!(count(&s, "lost"), 0, "{s}");
    assert_eq!(s["max_committed_within_capacity_minus_buffer"], true, "{s}");
    assert_eq!(count(&s, "completed") + count(&s, "rejected_503"), count(&s, "activations"), "{s}");
    assert!(count(&s, "rejected_503") > 0, "the bursts want more than the cluster holds: {s}");
}

#[test]
fn a_herd_starts_far_fewer_containers_under_our_rule_than_one_per_caller() {
    let s = run("herd");
    let rules = &s["rules"];
    for rule in ["one_each", "first_up", "capped"] {
        assert_eq!(count(&rules[rule], "completed"), 1000, "{rule}: {s}");
        assert_eq!(count(&rules[rule], "lost"), 0, "{rule}");
    }
    let (ours, one_each) =
        (count(&rules["capped"], "containers_started"), count(&rules["one_each"], "containers_started"));
    assert_eq!(one_each, 1000, "one container per caller");
    assert!(ours * 4 <= one_each, "at most a quarter of one-per-caller's containers: {ours}");
    assert!(ours > 4, "more containers once the first starts are done: {ours}");
    let p99 = |rule: &str| rules[rule]["wait_p99_ms"].as_f64().unwrap();
    assert!(p99("capped") <= p99("one_each").min(p99("first_up")), "ours waits no longer at p99: {s}");
}

#[test]
fn the_azure_sample_replays_a_day_with_nothing_lost() {
    let s = run("azure-200");
    assert_eq!(count(&s, "activations"), 155_469, "{s}");
    assert_eq!(count(&s, "lost"), 0, "{s}");
    assert_eq!(count(&s, "launches_refused_by_cluster"), 0, "{s}");
    assert_eq!(s["max_committed_within_capacity_minus_buffer"], true, "{s}");
    assert!(count(&s, "cold_starts") > 0 && count(&s, "warm_starts") > count(&s, "cold_starts"), "{s}");
}

#[test]
fn with_a_pause_grace_idle_containers_pause_and_every_run_after_one_waits_for_its_resume() {
    // A few actions called every 3 s: their containers idle past the 1 s grace between bursts.
    let text = r#"
name = "pauses"
[pool]
idle_timeout = "60s"
[cluster]
nodes = 2
node_memory_mb = 4096
start_latency = "300ms"
pause_grace = "1s"
resume_latency = "50ms"
[workload]
kind = "bursts"
actions = 5
memory_mb = [128, 256]
run_ms = [50, 200]
bursts = 10
burst_size = 20
burst_every = "3s"
burst_spread = "200ms"
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pauses.toml");
    std::fs::write(&path, text).unwrap();
    let s = invoker::sim::run(&Scenario::load(&path).unwrap()).unwrap();
    assert!(count(&s, "pauses") > 0, "{s}");
    assert!(count(&s, "resumes") > 0 && count(&s, "resumes") <= count(&s, "pauses"), "{s}");
    assert_eq!(count(&s, "lost"), 0, "{s}");
    assert_eq!(count(&s, "completed"), count(&s, "activations"), "{s}");
    assert_eq!(count(&run("overprovision"), "pauses"), 0, "a scenario without a grace never pauses");
}
