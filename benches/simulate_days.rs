//! The day-long simulator replays the test suite only samples (its tests replay each trace's
//! first two hours): every shipped trace scenario whole, and a synthetic day of 1,000
//! functions (about 600,000 calls) with three keep-alive policies; then the fleet scenarios
//! (`fleet-50`, `fleet-200`, `fleet-burst`). Prints one line per scenario, policy and node size
//! (or plane), with the replay's wall time; fails if anything is lost, refused by the cluster
//! or placed beyond a node, if a managed fleet refuses or loses a call, or if a day-level claim
//! of BENCHMARKS.md stops holding.
//!
//! `cargo bench --bench simulate_days` (release; about three minutes on 2 cores)

use invoker_core::sim::scenario::Scenario;
use serde_json::Value;
use std::path::Path;
use std::time::Instant;

fn main() {
    // `cargo test --all-targets` runs benches once as tests: these replays are for `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("simulate_days: run with `cargo bench --bench simulate_days`");
        return;
    }
    let scenarios = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let azure = replay("azure-200", invoker::sim::load(&scenarios.join("azure-200.toml")).unwrap());
    assert_eq!(count(&azure, "activations"), 155_469);

    let keepalive_50 = replay("keepalive-50", invoker::sim::load(&scenarios.join("keepalive-50.toml")).unwrap());
    let roomy = &keepalive_50["node_mb"]["16384"];
    // Greedy-dual keeps what fixed lets go after 10 minutes: five times fewer cold starts.
    assert!(count(&roomy["greedy_dual"], "cold_starts") * 5 < count(&roomy["fixed-10m"], "cold_starts"), "{roomy}");
    assert!(count(&roomy["hybrid"], "cold_starts") < count(&roomy["fixed-10m"], "cold_starts"), "{roomy}");

    let keepalive_200 = replay("keepalive-200", invoker::sim::load(&scenarios.join("keepalive-200.toml")).unwrap());
    let roomy = &keepalive_200["node_mb"]["16384"];
    assert!(count(&roomy["hybrid"], "cold_starts") < count(&roomy["fixed-10m"], "cold_starts"), "{roomy}");

    let dir = tempfile::tempdir().unwrap();
    let (scenario, total) = invoker::sim::synthetic_fleet(dir.path(), 1000).unwrap();
    let synthetic = replay("synthetic-1000", scenario);
    for r in synthetic["node_mb"]["16384"].as_object().unwrap().values() {
        assert_eq!(count(r, "activations"), total);
    }

    for name in ["fleet-50", "fleet-200", "fleet-burst"] {
        replay_fleet(name, invoker::sim::load(&scenarios.join(format!("{name}.toml"))).unwrap());
    }
}

/// Replays a fleet scenario whole: a line per plane and policy with its cost against the
/// packing floor, its delays, cold starts and reversals; no managed fleet refuses or loses.
fn replay_fleet(name: &str, scenario: Scenario) {
    let started = Instant::now();
    let s = invoker::sim::run(&scenario).unwrap();
    for (plane, section) in s["planes"].as_object().unwrap() {
        for (policy, r) in section.as_object().unwrap() {
            if r.get("completed").is_none() {
                continue; // a bound, not a run
            }
            println!(
                "{name:<12} {plane:<18} {policy:<20} x{:<5} floor  delayed {:>6} %  cold {:>7}  reversals {:>5}  refused {}  lost {}",
                r["vs_packing_floor"],
                r["delayed_over_1s_pct"],
                count(r, "cold_starts"),
                count(r, "reversals"),
                count(r, "refused"),
                count(r, "lost"),
            );
            assert_eq!(count(r, "lost"), 0, "{name} {plane} {policy}");
            if !policy.starts_with("fixed") {
                assert_eq!(count(r, "refused"), 0, "{name} {plane} {policy}");
            }
        }
    }
    println!("{name:<12} replayed in {} ms", started.elapsed().as_millis());
}

/// Replays `scenario` whole, prints a line per result and checks that nothing was lost.
fn replay(name: &str, scenario: Scenario) -> Value {
    let started = Instant::now();
    let s = invoker::sim::run(&scenario).unwrap();
    let wall = started.elapsed();
    let results: Vec<(String, &Value)> = match s["node_mb"].as_object() {
        Some(sizes) => sizes
            .iter()
            .flat_map(|(size, section)| {
                section.as_object().unwrap().iter().map(move |(policy, r)| (format!("{size} MB {policy}"), r))
            })
            .collect(),
        None => vec![(String::new(), &s)],
    };
    for (what, r) in results {
        println!(
            "{name:<16} {what:<28} calls {:>7}  cold {:>6}  evicted {:>6}  lost {}  wall {:>6} ms",
            count(r, "activations"),
            count(r, "cold_starts"),
            count(r, "evictions"),
            count(r, "lost"),
            r["wall_ms"].as_u64().unwrap_or(wall.as_millis() as u64),
        );
        assert_eq!(count(r, "lost"), 0, "{name} {what}");
        assert_eq!(count(r, "launches_refused_by_cluster"), 0, "{name} {what}");
        assert_eq!(r["max_committed_within_capacity_minus_buffer"], true, "{name} {what}");
    }
    println!("{name:<16} replayed in {} ms", wall.as_millis());
    s
}

fn count(summary: &Value, key: &str) -> u64 {
    summary[key].as_u64().unwrap_or_else(|| panic!("{key} missing in {summary}"))
}
