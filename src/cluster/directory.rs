//! What a scheduler reads of the cluster: every registered invoker, and which of them hold
//! containers of an action revision. One prefix range each, from the keys invokers write
//! (`registry`); an entry that does not decode is skipped with a warning, never trusted.

use super::placement::InvokerView;
use super::{ClusterKv, InvokerRecord};
use std::collections::BTreeMap;

/// The registered invokers, by id.
pub async fn invokers<K: ClusterKv>(kv: &K, prefix: &str) -> Result<BTreeMap<String, InvokerRecord>, K::Error> {
    let entries = kv.get_prefix(&format!("{prefix}/invokers/")).await?;
    let mut found = BTreeMap::new();
    for (key, value) in entries {
        match serde_json::from_str::<InvokerRecord>(&value) {
            Ok(record) => {
                found.insert(record.id.clone(), record);
            }
            Err(e) => tracing::warn!(%key, "an invoker's registration does not decode: {e}"),
        }
    }
    Ok(found)
}

/// How many containers of `ns/action` at `revision` each invoker holds.
pub async fn warm<K: ClusterKv>(
    kv: &K,
    prefix: &str,
    ns: &str,
    action: &str,
    revision: u64,
) -> Result<BTreeMap<String, u32>, K::Error> {
    let under = format!("{prefix}/containers/{ns}/{action}/{revision}/invoker/");
    let mut counts = BTreeMap::new();
    for (key, _) in kv.get_prefix(&under).await? {
        if let Some((invoker, _)) = key[under.len()..].split_once("/container/") {
            *counts.entry(invoker.to_string()).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// The invokers as placement sees them for one action revision; `in_flight` says what this
/// scheduler has running there of it.
pub fn views(
    invokers: &BTreeMap<String, InvokerRecord>,
    warm: &BTreeMap<String, u32>,
    in_flight: &BTreeMap<String, u32>,
) -> Vec<InvokerView> {
    invokers
        .values()
        .map(|r| InvokerView {
            id: r.id.clone(),
            tags: r.tags.clone(),
            healthy: r.health == "healthy",
            launchable_mb: r.launchable_mb(),
            warm: warm.get(&r.id).copied().unwrap_or(0),
            in_flight: in_flight.get(&r.id).copied().unwrap_or(0),
        })
        .collect()
}
