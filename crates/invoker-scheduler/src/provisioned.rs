//! Provisioned containers across a cluster: each action's `provisioned-concurrency`, spread over
//! the invokers by the schedulers that hold the action.
//!
//! Every scheduler holds its own copy of an action (saved in each), so they share its count as
//! they share a cap, but exactly: the `n` containers are numbered, and the scheduler at place
//! `i` of the registered schedulers (by id) keeps its slice of them (`n / schedulers`, one more
//! for the first `n % schedulers`). Container `j` goes to the invoker at `j mod invokers` in
//! the action's own order of the invokers (each ranked by a hash of the action and its id), so
//! one action's containers are spread one per invoker before any gets two, and different
//! actions start on different invokers. Only invokers that take work are used (healthy or
//! overloaded, not drained or stalled), with the action's tags where it names any.
//!
//! A scheduler publishes what it asks of each invoker under `{prefix}/provisioned/{invoker}/`
//! ([`invoker_wire::cluster::provisioned_key`]), under a lease of its own: one that dies takes its
//! asks with it, and the others' slices grow to cover its part when they read it gone. Each
//! invoker follows its own keys and keeps what they say (the invoker's `cluster::provisioned`). The
//! memory of what a scheduler asks is demand it reports to the capacity manager, as if each
//! container were a call in flight: a fleet without room for them grows (`publish.rs` carries
//! the asks out).

use invoker_wire::model::Action;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::Notify;

/// An action by namespace and name.
type ActionName = (String, String);

/// The actions of this scheduler's store that keep provisioned containers, each with how many
/// (within its namespace's bound, as the intake decided).
#[derive(Default)]
pub struct Provisioned {
    actions: Mutex<BTreeMap<ActionName, (Arc<Action>, u32)>>,
    /// An action was saved or deleted: the asks are computed again.
    pub(super) changed: Notify,
}

impl Provisioned {
    /// `action` keeps `count` (none: forgotten).
    pub fn set(&self, action: Arc<Action>, count: u32) {
        let mut actions = self.actions.lock();
        let key = (action.namespace.clone(), action.name.clone());
        match count {
            0 => actions.remove(&key),
            _ => actions.insert(key, (action, count)),
        };
        self.changed.notify_one();
    }

    /// The action `ns/name` was deleted.
    pub fn forget(&self, ns: &str, name: &str) {
        self.actions.lock().remove(&(ns.to_string(), name.to_string()));
        self.changed.notify_one();
    }

    pub(super) fn all(&self) -> Vec<(Arc<Action>, u32)> {
        self.actions.lock().values().cloned().collect()
    }
}

/// How many of `wanted` containers of `action` the scheduler `me` asks of each invoker, with
/// `schedulers` registered (`me` counted whether or not it is yet) and `invokers` taking work.
pub fn assign(
    action: &str,
    wanted: u32,
    me: &str,
    schedulers: &BTreeSet<String>,
    invokers: &[&str],
) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    if invokers.is_empty() || wanted == 0 {
        return out;
    }
    let mut all: Vec<&str> = schedulers.iter().map(String::as_str).collect();
    if !all.contains(&me) {
        all.push(me);
        all.sort_unstable();
    }
    let (count, place) = (all.len() as u32, all.iter().position(|s| *s == me).unwrap_or(0) as u32);
    let (each, extra) = (wanted / count, wanted % count);
    let first = place * each + place.min(extra);
    let mine = each + u32::from(place < extra);
    let mut ranked: Vec<&str> = invokers.to_vec();
    ranked.sort_by_key(|invoker| (fnv(&[action.as_bytes(), &[0], invoker.as_bytes()]), *invoker));
    for j in first..first + mine {
        *out.entry(ranked[j as usize % ranked.len()].to_string()).or_insert(0) += 1;
    }
    out
}

/// FNV-1a: the same on every scheduler (the standard hasher promises no such thing).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parts.iter().copied().flatten() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_schedulers_slices_add_up_to_the_count_spread_one_per_invoker_first() {
        let invokers = ["i1", "i2", "i3"];
        for wanted in 0..12 {
            for schedulers in [set(&["s1"]), set(&["s1", "s2"]), set(&["s1", "s2", "s3"])] {
                let mut per_invoker: BTreeMap<String, u32> = BTreeMap::new();
                for me in &schedulers {
                    for (invoker, n) in assign("ns/a", wanted, me, &schedulers, &invokers) {
                        *per_invoker.entry(invoker).or_default() += n;
                    }
                }
                assert_eq!(per_invoker.values().sum::<u32>(), wanted, "{wanted} over {schedulers:?}");
                let (most, least) = (
                    per_invoker.values().max(),
                    (0..3).map(|i| per_invoker.get(invokers[i]).copied().unwrap_or(0)).min(),
                );
                assert!(most.copied().unwrap_or(0) <= least.unwrap_or(0) + 1, "{wanted}: {per_invoker:?}");
            }
        }
    }

    #[test]
    fn a_scheduler_not_yet_registered_counts_itself_and_no_invoker_means_no_ask() {
        let asks = assign("ns/a", 4, "s2", &set(&["s1"]), &["i1", "i2"]);
        assert_eq!(asks.values().sum::<u32>(), 2, "{asks:?}");
        assert!(assign("ns/a", 4, "s1", &set(&["s1"]), &[]).is_empty());
    }

    #[test]
    fn different_actions_start_on_different_invokers() {
        let invokers: Vec<String> = (0..8).map(|i| format!("i{i}")).collect();
        let invokers: Vec<&str> = invokers.iter().map(String::as_str).collect();
        let first: BTreeSet<String> = (0..20)
            .map(|a| assign(&format!("ns/a{a}"), 1, "s1", &set(&["s1"]), &invokers).into_keys().next().unwrap())
            .collect();
        assert!(first.len() > 3, "one container each of twenty actions lands on {first:?}");
    }
}
