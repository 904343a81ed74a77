//! What a scheduler knows of the cluster: every registered invoker, the containers each holds
//! (by action revision) and the drains, from the keys invokers and operators write, as the
//! scheduler's watch of its prefix keeps them (`cluster::mirror`), never read on an
//! activation's path. An entry that does not decode is skipped with a warning, never trusted.
//! etcd away freezes the picture: the invokers last seen keep their work, and those whose
//! leases expired meanwhile are placed on for a grace after etcd answers again (`Directory`).

use crate::sends::RoomCorrection;
use invoker_core::placement::InvokerView;
use invoker_etcd::kv::ClusterKv;
use invoker_wire::cluster::Health;
use invoker_wire::cluster::InvokerRecord;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The invokers' registrations as last decoded, by key: the text and what it decoded to (none
/// when it did not, so that a bad one is warned of once, not at every view).
#[derive(Debug, Default)]
pub struct RecordCache(HashMap<String, (String, Option<InvokerRecord>)>);

/// An action revision: namespace, name, cluster revision.
pub type RevisionKey = (String, String, u64);

/// The cluster as last read.
#[derive(Debug, Default)]
pub struct ClusterView {
    pub invokers: BTreeMap<String, InvokerRecord>,
    /// Invokers an operator drained (`{prefix}/drain/{id}`).
    pub drained: BTreeSet<String>,
    /// Containers per action revision, per invoker.
    pub warm: HashMap<RevisionKey, BTreeMap<String, u32>>,
    /// Containers per invoker, of every action.
    pub containers: BTreeMap<String, u32>,
    /// The schedulers registered (`{prefix}/schedulers/{id}`): an action's cap and its
    /// provisioned containers are shared between them.
    pub schedulers: BTreeSet<String>,
    /// When this scheduler first read each invoker's record as it now is ([`Directory`]): what
    /// it sent there before (less a refresh) the record may show; what it sent since, not.
    pub changed: BTreeMap<String, Instant>,
}

impl ClusterView {
    /// Reads it whole, in one range over the prefix; a failed read keeps nothing of it.
    pub async fn read<K: ClusterKv>(kv: &K, prefix: &str) -> Result<ClusterView, K::Error> {
        let pairs = kv.get_prefix(&format!("{prefix}/")).await?;
        let entries = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        Ok(ClusterView::from_entries(prefix, entries, &mut RecordCache::default()))
    }

    /// The view of the keys under `prefix` (invokers, drains, containers); a registration read
    /// as it was at the last view is taken from `cache`, not decoded again.
    pub fn from_entries<'a>(
        prefix: &str,
        entries: impl Iterator<Item = (&'a str, &'a str)>,
        cache: &mut RecordCache,
    ) -> ClusterView {
        let mut view = ClusterView::default();
        let (invokers, drains, containers) =
            (format!("{prefix}/invokers/"), format!("{prefix}/drain/"), format!("{prefix}/containers/"));
        let schedulers = format!("{prefix}/schedulers/");
        let mut decoded = HashMap::with_capacity(cache.0.len());
        for (key, value) in entries {
            if key.starts_with(&invokers) {
                // Unchanged: the cached key, text and record move over as they are.
                let (owned_key, entry) = match cache.0.remove_entry(key) {
                    Some(cached) if cached.1 .0 == value => cached,
                    _ => {
                        let record = serde_json::from_str::<InvokerRecord>(value)
                            .map_err(|e| tracing::warn!(%key, "an invoker's registration does not decode: {e}"))
                            .ok();
                        (key.to_string(), (value.to_string(), record))
                    }
                };
                if let Some(record) = &entry.1 {
                    view.invokers.insert(record.id.clone(), record.clone());
                }
                decoded.insert(owned_key, entry);
            } else if let Some(id) = key.strip_prefix(&drains) {
                if invoker_wire::cluster::DrainMark::read(value).drained {
                    view.drained.insert(id.to_string());
                }
            } else if let Some(rest) = key.strip_prefix(&containers) {
                view.add_container(key, rest);
            } else if let Some(id) = key.strip_prefix(&schedulers) {
                view.schedulers.insert(id.to_string());
            }
        }
        cache.0 = decoded;
        view
    }

    /// `rest`: `{ns}/{action}/{revision}/invoker/{id}/container/{cid}`.
    fn add_container(&mut self, key: &str, rest: &str) {
        let parts: Vec<&str> = rest.split('/').collect();
        let [ns, action, revision, "invoker", invoker, "container", _] = parts.as_slice() else {
            tracing::warn!(%key, "a container key out of the layout");
            return;
        };
        let Ok(revision) = revision.parse::<u64>() else { return };
        let per_invoker = self.warm.entry((ns.to_string(), action.to_string(), revision)).or_default();
        *per_invoker.entry(invoker.to_string()).or_insert(0) += 1;
        *self.containers.entry(invoker.to_string()).or_insert(0) += 1;
    }

    /// The invokers as placement sees them for one action revision; `in_flight` says what this
    /// scheduler has running there of it, `corrections` how its sends there correct the room
    /// the invoker's record shows ([`crate::sends`]). A drained or stalled invoker is not
    /// healthy, whatever it says.
    pub fn views(
        &self,
        revision: &RevisionKey,
        in_flight: &BTreeMap<String, u32>,
        corrections: &BTreeMap<String, RoomCorrection>,
        stalled: &BTreeSet<String>,
    ) -> Vec<InvokerView> {
        let warm = self.warm.get(revision);
        self.invokers
            .values()
            .map(|r| {
                let correction = corrections.get(&r.id).copied().unwrap_or_default();
                InvokerView {
                    id: r.id.clone(),
                    tags: r.tags.clone(),
                    healthy: r.health == Health::Healthy && !self.drained.contains(&r.id) && !stalled.contains(&r.id),
                    launchable_mb: correction.apply(r.room_mb()),
                    free_mb: correction.apply_free(r.launchable_mb()),
                    warm: warm.and_then(|w| w.get(&r.id)).copied().unwrap_or(0),
                    in_flight: in_flight.get(&r.id).copied().unwrap_or(0),
                }
            })
            .collect()
    }
}

/// The view shared by every dispatch, and a token per invoker process that is cancelled when
/// another process takes its id (the one it replaced is gone, and with it what it ran).
///
/// An invoker whose registration went from etcd is not taken for dead: its lease may have
/// expired only because etcd was away (a partition, a long fsync stall), while it kept serving.
/// What was sent to it ends with its answer, a broken connection or the activation's deadline;
/// and one last read healthy stays in the view for `grace`, in which a live invoker registers
/// again (placing on one that is gone is refused at the connection, and tried elsewhere).
pub struct Directory {
    current: RwLock<Arc<ClusterView>>,
    /// Invoker id → (its process, as `boot_id:pid`; the token of that process).
    present: Mutex<HashMap<String, (String, CancellationToken)>>,
    /// Every invoker read, as last read, when that record was first read, and when a reading
    /// first missed it.
    last_seen: Mutex<HashMap<String, Seen>>,
    grace: Duration,
    /// Counts the readings taken, for those waiting for the picture to change.
    readings: tokio::sync::watch::Sender<u64>,
}

struct Seen {
    record: InvokerRecord,
    changed: Instant,
    missed_since: Option<Instant>,
}

fn process_of(record: &InvokerRecord) -> String {
    format!("{}:{}", record.boot_id, record.pid)
}

impl Directory {
    pub fn current(&self) -> Arc<ClusterView> {
        self.current.read().clone()
    }

    pub fn new(grace: Duration) -> Self {
        Directory {
            current: RwLock::default(),
            present: Mutex::default(),
            last_seen: Mutex::default(),
            grace,
            readings: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Changes with every reading taken from now on.
    pub fn readings(&self) -> tokio::sync::watch::Receiver<u64> {
        self.readings.subscribe()
    }

    /// Takes a new reading: keeps the invokers last read healthy that are gone from it for the
    /// grace, and cancels the tokens of processes another took the id of.
    pub fn update(&self, mut view: ClusterView) {
        let now = Instant::now();
        {
            let mut seen = self.last_seen.lock();
            for (id, record) in &view.invokers {
                match seen.get_mut(id) {
                    Some(s) if s.record == *record => s.missed_since = None,
                    _ => {
                        seen.insert(id.clone(), Seen { record: record.clone(), changed: now, missed_since: None });
                    }
                }
            }
            // The grace counts from the first reading without it (etcd away reads nothing).
            seen.retain(|id, s| {
                view.changed.insert(id.clone(), s.changed);
                if view.invokers.contains_key(id) {
                    return true;
                }
                let since = *s.missed_since.get_or_insert(now);
                let within = s.record.health == Health::Healthy && now.duration_since(since) < self.grace;
                if within {
                    view.invokers.insert(id.clone(), s.record.clone());
                } else {
                    tracing::warn!(invoker = %id, "an invoker's registration is gone past the grace; nothing new goes there");
                }
                within
            });
        }
        let mut present = self.present.lock();
        present.retain(|id, (process, token)| match view.invokers.get(id) {
            Some(r) if process_of(r) == *process => true,
            Some(_) => {
                tracing::warn!(invoker = %id, "another process holds the invoker's id; what the one before ran ends");
                token.cancel();
                false
            }
            // What it runs ends with its answer, a broken connection or its deadline.
            None => false,
        });
        drop(present);
        *self.current.write() = Arc::new(view);
        self.readings.send_modify(|n| *n += 1);
    }

    /// Cancelled when `id`, as the current view knows it, leaves; `None` when it already has.
    pub fn departure(&self, id: &str) -> Option<CancellationToken> {
        let view = self.current();
        let record = view.invokers.get(id)?;
        let mut present = self.present.lock();
        let entry = present.entry(id.to_string()).or_insert_with(|| (process_of(record), CancellationToken::new()));
        Some(entry.1.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, launchable_mb: u64) -> String {
        serde_json::json!({"id": id, "api": "http://127.0.0.1:1", "tags": [], "health": "healthy",
            "nodes": [{"node": "n", "launchable_mb": launchable_mb, "free_mb": 0, "capacity_mb": 0, "idle_mb": 0}],
            "boot_id": "b", "pid": 1})
        .to_string()
    }

    fn view(entries: &[(&str, String)], cache: &mut RecordCache) -> ClusterView {
        ClusterView::from_entries("/p", entries.iter().map(|(k, v)| (*k, v.as_str())), cache)
    }

    #[test]
    fn a_view_decodes_only_the_registrations_that_changed_and_forgets_those_that_went() {
        let mut cache = RecordCache::default();
        let first = [
            ("/p/invokers/a", record("a", 512)),
            ("/p/invokers/b", record("b", 256)),
            ("/p/invokers/bad", "{not json".to_string()),
            ("/p/drain/b", "{}".to_string()),
            ("/p/containers/guest/f/1/invoker/a/container/7", "{}".to_string()),
        ];
        let v = view(&first, &mut cache);
        assert_eq!(v.invokers.keys().collect::<Vec<_>>(), vec!["a", "b"], "the bad one is skipped");
        assert!(v.drained.contains("b"));
        assert_eq!(v.warm[&("guest".to_string(), "f".to_string(), 1)]["a"], 1);
        assert_eq!(cache.0.len(), 3, "the bad one is remembered as bad");
        assert!(cache.0["/p/invokers/bad"].1.is_none());

        let second = [("/p/invokers/a", record("a", 128)), ("/p/invokers/bad", "{not json".to_string())];
        let v = view(&second, &mut cache);
        assert_eq!(v.invokers["a"].launchable_mb(), 128, "a changed record is decoded again");
        assert!(!v.invokers.contains_key("b") && v.drained.is_empty() && v.warm.is_empty());
        assert_eq!(
            cache.0.keys().collect::<BTreeSet<_>>(),
            BTreeSet::from([&"/p/invokers/a".to_string(), &"/p/invokers/bad".to_string()])
        );
    }
}
