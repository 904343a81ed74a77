use invoker_core::sim::fleet::{managed_run, Scale};
use std::time::Duration;
#[test]
fn probe() {
    let mut scenario = invoker::sim::load(std::path::Path::new("scenarios/replay-50.toml")).unwrap();
    scenario.replay_first_minutes(180);
    let host = invoker::sim::Machine::default();
    let calls = invoker_replay::compressed_calls(&scenario, 60.0, 100000, (128, 1024), &host).unwrap();
    scenario.cluster.start_latency = Duration::from_millis(9);
    scenario.cluster.remove_latency = Duration::from_millis(3);
    let fleet = scenario.fleet.as_ref().unwrap();
    let horizon = Duration::from_secs(180);
    for shift in [0u64, 3000, 6000] {
        let shifted: Vec<_> = calls
            .iter()
            .map(|c| invoker_core::sim::workload::Call { at: c.at + Duration::from_millis(shift), ..*c })
            .collect();
        let v = managed_run(
            &scenario,
            fleet,
            &shifted,
            horizon + Duration::from_millis(shift),
            Duration::from_millis(950),
            Scale::compressed(60.0),
            &host,
        );
        let by: Vec<f64> = v["invokers_by_minute"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        eprintln!(
            "shift {shift}: delayed {} refused {} reversals {} cold {} demand {} target {} by_minute {:?}",
            v["delayed_over_1s"],
            v["refused"],
            v["reversals"],
            v["cold_starts"],
            v["demand_mb_mean"],
            v["target_mb_mean"],
            &by[..12.min(by.len())]
        );
    }
}
