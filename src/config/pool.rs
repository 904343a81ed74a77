//! `[pool]`: the pure core's own settings, read straight into its types (`CoreConfig`,
//! `PrewarmSpec`): what this file adds is their validation against the rest of the config.

use super::error::{bad, ConfigError};
use super::limits::LimitsConfig;
use invoker_factory::kinds::KindConfig;
use std::collections::BTreeMap;

/// `[pool]`: the core's tunables.
pub type PoolConfig = invoker_core::pool::CoreConfig;

/// `[[pool.prewarm]]`: keep `count` containers of `kind` with `memory_mb` started and
/// uninitialised; with `reactive`, the count follows recent cold starts within min..=max.
pub type PrewarmConfig = invoker_core::pool::PrewarmSpec;

pub(super) fn validate(
    p: &PoolConfig,
    kinds: &BTreeMap<String, KindConfig>,
    limits: &LimitsConfig,
) -> Result<(), ConfigError> {
    if p.max_starts_per_action == 0 || p.max_starts_per_node == 0 {
        return Err(bad("pool.max_starts_per_*", "must be at least 1"));
    }
    for (key, d) in [
        ("pool.idle_timeout", p.idle_timeout),
        ("pool.wait_deadline", p.wait_deadline),
        ("pool.stats_ttl", p.stats_ttl),
        ("pool.tick", p.tick),
        ("pool.claim_after", p.claim_after),
    ] {
        if d.is_zero() {
            return Err(bad(key, "must be positive"));
        }
    }
    if p.keep_alive_params.max_idle.is_some_and(|d| d.is_zero()) {
        return Err(bad(
            "pool.keep_alive_params.max_idle",
            "must be positive (leave it out to keep while memory allows)",
        ));
    }
    let k = &p.keep_alive_params;
    if k.bin.is_zero() || k.range < k.bin || k.range.as_micros() / k.bin.as_micros().max(1) > 1440 {
        return Err(bad("pool.keep_alive_params.range", "must hold 1 to 1,440 bins of keep_alive_params.bin"));
    }
    let percent = |v: f64| (0.0..=100.0).contains(&v);
    if !percent(k.head_percentile) || !percent(k.tail_percentile) || k.head_percentile > k.tail_percentile {
        return Err(bad("pool.keep_alive_params.head_percentile", "need 0 <= head <= tail <= 100"));
    }
    if !(0.0..1.0).contains(&k.margin) {
        return Err(bad("pool.keep_alive_params.margin", "must be in 0..1"));
    }
    if !(k.start_second_worth_gb_s.is_finite() && k.start_second_worth_gb_s >= 0.0) {
        return Err(bad("pool.keep_alive_params.start_second_worth_gb_s", "must be a number of GB·s, 0 or more"));
    }
    if k.cv_threshold.is_nan() || k.cv_threshold < 0.0 || !(0.0..=1.0).contains(&k.out_of_range_threshold) {
        return Err(bad("pool.keep_alive_params.cv_threshold", "cv_threshold >= 0, out_of_range_threshold in 0..=1"));
    }
    for (i, w) in p.prewarm.iter().enumerate() {
        let at = |field: &str| format!("pool.prewarm[{i}].{field}");
        match kinds.get(&w.kind) {
            None => return Err(bad(&at("kind"), format!("'{}' is not a configured kind", w.kind))),
            Some(k) if !k.protocol.initialises() => {
                return Err(bad(
                    &at("kind"),
                    format!(
                        "'{}' starts each container with its function's code: no container of it fits any action",
                        w.kind
                    ),
                ))
            }
            Some(_) => {}
        }
        if w.memory_mb < limits.memory_min_mb || w.memory_mb > limits.memory_max_mb {
            return Err(bad(&at("memory_mb"), "must be within limits.memory_min_mb..=memory_max_mb"));
        }
        if w.disk_mb < limits.disk_min_mb || w.disk_mb > limits.disk_max_mb {
            return Err(bad(&at("disk_mb"), "must be within limits.disk_min_mb..=disk_max_mb"));
        }
        if p.prewarm[..i].iter().any(|q| q.kind == w.kind && q.memory_mb == w.memory_mb && q.disk_mb == w.disk_mb) {
            return Err(bad(&at("kind"), "this kind, memory_mb and disk_mb already have a prewarm entry"));
        }
        if let Some(r) = &w.reactive {
            if r.min > r.max || r.max > 1000 {
                return Err(bad(&at("reactive"), "need min <= max <= 1000"));
            }
            if r.threshold == 0 || r.window.is_zero() {
                return Err(bad(&at("reactive"), "threshold and window must be positive"));
            }
        } else if w.count > 1000 {
            return Err(bad(&at("count"), "must be at most 1000"));
        }
    }
    Ok(())
}
