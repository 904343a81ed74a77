//! The provisioned comparison: what keeping the "latency-critical" functions provisioned saves
//! in cold starts and costs in idle memory, beside each keep-alive policy alone.
//!
//! Which functions are chosen is judged on the policy's own run without provisioning (the
//! functions that start cold most, or are called most), as an operator would choose from what
//! they saw; the chosen ones are then provisioned from the start of the same workload. So the
//! choice sees the day it is judged on: the figure says what provisioning buys where it is
//! placed well, not how well a function can be picked in advance.

use super::scenario::{ProvisionSelect, ProvisionedComparison, Scenario, ScenarioError};
use crate::pool::CoreConfig as PoolConfig;
use serde_json::{json, Value};

/// One run's summary, with what the comparison reads beside it.
pub(super) struct Outcome {
    pub(super) summary: Value,
    /// Per action: (cold starts, calls dispatched).
    pub(super) per_action: Vec<(u64, u64)>,
    /// Per action: its memory (0 for one never called).
    pub(super) memory_mb: Vec<u32>,
}

/// What runs the workload once: with this pool, on nodes of this size, these functions
/// (action, memory) provisioned, this many each.
pub(super) type Simulate<'a> = dyn FnMut(PoolConfig, u64, &[(u32, u32)], u32) -> Result<Outcome, ScenarioError> + 'a;

/// One section per node size, one per policy in it, one entry per `k` (`"none"` first).
pub(super) fn compare(
    scenario: &Scenario,
    comparison: &ProvisionedComparison,
    simulate: &mut Simulate<'_>,
) -> Result<Value, ScenarioError> {
    let sizes = scenario.node_sizes_mb.clone().unwrap_or_else(|| vec![scenario.cluster.node_memory_mb]);
    let policies: Vec<(String, PoolConfig)> = match &scenario.compare_keep_alive {
        Some(choices) => {
            choices.iter().map(|choice| (choice.name.clone(), choice.applied_to(&scenario.pool))).collect()
        }
        None => vec![("pool".to_string(), scenario.pool.clone())],
    };
    let mut out = serde_json::Map::new();
    for size in sizes {
        let mut section = serde_json::Map::new();
        for (name, pool) in &policies {
            let alone = simulate(pool.clone(), size, &[], 0)?;
            let ranked = rank(&alone, comparison.select);
            let mut entries = serde_json::Map::new();
            for &k in &comparison.top_k {
                let chosen: Vec<u32> = ranked.iter().take(k as usize).copied().collect();
                let provision: Vec<(u32, u32)> = chosen.iter().map(|&a| (a, alone.memory_mb[a as usize])).collect();
                let with = simulate(pool.clone(), size, &provision, comparison.count)?;
                entries.insert(format!("top{k}"), entry(&with, &alone, &chosen, comparison.count));
            }
            let mut none = alone.summary.clone();
            none["provisioned_functions"] = json!(0);
            entries.insert("none".into(), none);
            section.insert(name.clone(), Value::Object(entries));
        }
        out.insert(format!("{size}"), Value::Object(section));
    }
    Ok(json!({ "scenario": scenario.name, "node_mb": out }))
}

/// The functions called at least once, most deserving first (ties: the lower action first).
fn rank(alone: &Outcome, select: ProvisionSelect) -> Vec<u32> {
    let mut ranked: Vec<(u64, u32)> = alone
        .per_action
        .iter()
        .enumerate()
        .filter(|(_, (_, calls))| *calls > 0)
        .map(|(action, &(cold, calls))| {
            let score = match select {
                ProvisionSelect::MostColdStarts => cold,
                ProvisionSelect::MostCalls => calls,
            };
            (score, action as u32)
        })
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.into_iter().map(|(_, action)| action).collect()
}

/// A run with provisioning: its summary, with the chosen functions' cold starts with and
/// without, and the memory their containers hold.
fn entry(with: &Outcome, alone: &Outcome, chosen: &[u32], count: u32) -> Value {
    let cold_of = |o: &Outcome| chosen.iter().map(|&a| o.per_action[a as usize].0).sum::<u64>();
    let memory_mb: u64 = chosen.iter().map(|&a| u64::from(with.memory_mb[a as usize]) * u64::from(count)).sum();
    let mut summary = with.summary.clone();
    summary["provisioned_functions"] = json!(chosen.len());
    summary["provisioned_memory_mb"] = json!(memory_mb);
    summary["cold_starts_of_provisioned"] = json!(cold_of(with));
    summary["cold_starts_of_provisioned_alone"] = json!(cold_of(alone));
    let saved = alone.summary["cold_starts"].as_i64().unwrap_or(0) - with.summary["cold_starts"].as_i64().unwrap_or(0);
    let extra_idle = with.summary["idle_memory_gb_s"].as_f64().unwrap_or(0.0)
        - alone.summary["idle_memory_gb_s"].as_f64().unwrap_or(0.0);
    summary["cold_starts_saved"] = json!(saved);
    summary["idle_memory_added_gb_s"] = json!((extra_idle * 10.0).round() / 10.0);
    summary["idle_gb_s_per_cold_start_saved"] =
        json!((saved > 0).then(|| (extra_idle / saved as f64 * 10.0).round() / 10.0));
    summary
}
